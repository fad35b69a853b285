"""Session table: the sessions held for every group, as per-group sorted intervals in slots.

A session (open, or kept for allowed lateness) is kept in a *slot* ``s`` (a column of Session
Aggregate's accumulators, which are ``[1, slots]``: row 0, group id = slot). Per slot, arrays of
the table's capacity (int64; ``dirty`` bool):

* ``sgid[s]``: the group the session belongs to, -1 for a free slot;
* ``start[s]``, ``end[s]``: ``[first value, last value + gap)``, the row's ``window_start`` and
  ``window_end`` (``end`` saturates at ``END_OF_STREAM``: such a session completes only at the
  end of the stream);
* ``nxt[s]``: the next session of the same group in ``start`` order, -1 after the last;
  ``head[g]`` the first session of group ``g`` (-1: none). A group's sessions are disjoint, its
  values in two of them at least ``gap + reach`` apart (``start`` of the next >= ``end`` of the
  previous + ``reach``), so its list is sorted by ``end`` too;
* ``rev[s]``: the revision last emitted (-1: never shown), ``dirty[s]``: changed since it was
  last evaluated for emission; ``shown_start[s]``, ``shown_end[s]``: the bounds last emitted (a
  session merged away is retracted with them).

The rule (``reach``: 0 for the dissertation's sessions, 1 for Flink's and Spark's, which merge
sessions that touch; :class:`~lowtide.operators.windows.Session`), decided here only: a value
``t`` joins the session ``[s, e)`` iff ``s - gap - reach < t < e + reach`` (strict: ``t`` is less
than ``gap`` from a member; touching: at most ``gap``); two sessions merge when the later one's
start is below the earlier one's end + ``reach``. A session is complete at punctuation ``p`` -
no value at or above ``p`` can join it - iff ``e + reach <= p``: ``e`` at most the window logic's
``close_for(p)`` (:class:`~lowtide.operators.window_logic.SessionLogic`), the *cutoff* that
:meth:`SessionTable.purge`, :meth:`SessionTable.due` and :meth:`SessionTable.open` take.

Per group ``g`` (arrays as long as ``head``): ``gone[g]``, the largest ``end`` of the group's
sessions purged so far (NO_PROGRESS: none). Purges take the prefix of a list complete at a
rising horizon ``h``: a value ``t`` at or above the floor of ``h`` (its own session is not
complete at ``h``: ``t + gap + reach > h``) would join a purged session ``[s, e)``
(``s - gap - reach < t < e + reach``, and ``s <= e - gap < t``) iff ``t < e + reach``, so
one iff ``t - reach < gone[g]`` (the logic's ``floor`` and ``joins_gone``; Session Aggregate takes
such a tuple as late).

Free slots are a stack (``free[:n_free]``); ``used`` slots were ever handed out; the capacity
doubles when a batch needs more (the kernel stops, the table grows, the kernel resumes), so it
follows the sessions held, not the batch size. At most two sessions of a group can take one
value (each is ``gap`` long at least, and they are ``reach`` or more apart), so each
tuple extends one session or merges two: a batch makes at most one merge per tuple.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.errors import CorruptState
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS
from lowtide.snapshot import ARRAY, INT, Field, Stateful, declare

I64 = npt.NDArray[np.int64]
B1 = npt.NDArray[np.bool_]
_END = END_OF_STREAM


@nb.njit(cache=True, nogil=True, inline="always")
def _end_of(t: int, gap: int) -> int:
    """``t + gap``, saturating at END_OF_STREAM (0 < gap <= 2^62: no overflow)."""
    return _END if t > _END - gap else t + gap


@nb.njit(cache=True, nogil=True)
def add_values(
    gid: I64,
    ts: I64,
    first: int,
    slot: I64,
    gone: I64,
    m: int,
    gap: int,
    reach: int,
    head: I64,
    nxt: I64,
    sgid: I64,
    start: I64,
    end: I64,
    rev: I64,
    dirty: B1,
    free: I64,
    n_free: int,
    used: int,
    moved: I64,
) -> tuple[int, int, int, int]:
    """Put the tuples ``(gid[i], ts[i])`` from ``first`` on in their group's sessions, in any
    order, until a new session finds no slot left.

    gid, ts   [n] int64 group ids and values, read only, any order.
    slot      [n] int64: the slot each tuple went to (written from ``first`` on).
    gone      [n] int64: the slots merged away, ``gone[:m]`` so far (appended to).
    head      [groups] int64, nxt/sgid/start/end/rev/dirty [capacity]: the table (module doc),
              mutated.
    free      [capacity] int64 stack of free slots, ``free[:n_free]``; popped from.
    moved     [capacity] int64: the survivor a slot merged away went into, -1 for the others.

    A value that joins a session by the rule of the module docstring (``reach``) extends its
    ``start`` or ``end``, else starts a session in a new slot; an extension that reaches the next
    session merges the two: the survivor is the earlier one unless only the later was ever shown
    (a shown session keeps its identity: its next row is a revision). Sessions merged away get
    ``sgid`` -1 but their slots are not reused: the caller folds their cells into the survivors'
    (see :func:`resolve_moves`), then frees them.

    Returns (the first tuple not placed, ``n`` when all were; m; n_free; used): the caller grows
    the table and calls again from there. Cost: O(tuples * sessions of the tuple's group before
    its value), walking the group's list.
    """
    capacity = sgid.shape[0]
    for i in range(first, gid.shape[0]):
        g, t = gid[i], ts[i]
        e = _end_of(t, gap)
        prev, s = -1, head[g]
        # Written as end[s] <= t - reach and start[s] - reach < e, not end[s] + reach <= t and
        # start[s] < e + reach: end and e may be END_OF_STREAM, t and start are in the domain.
        while s >= 0 and end[s] <= t - reach:  # a session t is too far after to join
            prev, s = s, nxt[s]
        if s >= 0 and start[s] - reach < e:  # t joins s
            if t < start[s]:
                start[s] = t  # the session before ends at or before t - reach: no merge on this side
            if e > end[s]:
                end[s] = e
                after = nxt[s]
                while after >= 0 and start[after] - reach < end[s]:  # reaches the next one: merge
                    keep, lost = s, after
                    if rev[s] < 0 and rev[after] >= 0:
                        keep, lost = after, s
                    start[keep] = start[s]
                    end[keep] = max(end[s], end[after])
                    nxt[keep] = nxt[after]
                    if prev < 0:
                        head[g] = keep
                    else:
                        nxt[prev] = keep
                    sgid[lost] = -1
                    moved[lost] = keep
                    gone[m] = lost
                    m += 1
                    s = keep
                    after = nxt[s]
            dirty[s] = True
            slot[i] = s
        else:  # a new session between prev and s (s, if any, starts too far after t to join)
            if n_free > 0:
                n_free -= 1
                new = free[n_free]
            elif used < capacity:
                new = used
                used += 1
            else:
                return i, m, n_free, used
            sgid[new], start[new], end[new], rev[new], dirty[new], nxt[new] = g, t, e, -1, True, s
            if prev < 0:
                head[g] = new
            else:
                nxt[prev] = new
            slot[i] = new
    return gid.shape[0], m, n_free, used


@nb.njit(cache=True, nogil=True)
def resolve_moves(slot: I64, gone: I64, moved: I64) -> I64:
    """After :func:`add_values` placed a batch: each tuple's slot (mutated) and each merged-away
    slot's survivor (returned, [m]) become the slot of the session they ended in - a survivor
    may itself be merged away later in the batch. ``moved`` is reset to -1. O(n + m) plus chains."""
    into = np.empty(gone.shape[0], np.int64)
    for j in range(gone.shape[0]):
        d = moved[gone[j]]
        while moved[d] >= 0:
            d = moved[d]
        into[j] = d
    for i in range(slot.shape[0]):
        s = slot[i]
        while moved[s] >= 0:
            s = moved[s]
        slot[i] = s
    for j in range(gone.shape[0]):
        moved[gone[j]] = -1
    return into


@nb.njit(cache=True, nogil=True)
def purge(cutoff: int, used: int, head: I64, nxt: I64, sgid: I64, end: I64, gone: I64) -> I64:
    """Take every session with ``end <= cutoff`` out of its group's list (a prefix of it: lists
    are sorted by ``end``), mark its slot free (``sgid`` -1; the caller pushes the slots) and
    raise its group's ``gone`` to its ``end``.

    Returns the slots taken out, in slot order. Mutates head, sgid, gone. O(used).
    """
    out = np.empty(used, np.int64)
    k = 0
    for s in range(used):
        if sgid[s] >= 0 and end[s] <= cutoff:
            out[k] = s
            k += 1
    for j in range(k):
        g = sgid[out[j]]
        if g >= 0:  # the first of its group seen here: move the head past every purged one
            h = head[g]
            while h >= 0 and end[h] <= cutoff:
                sgid[h] = -1
                gone[g] = max(gone[g], end[h])
                h = nxt[h]
            head[g] = h
    return out[:k]


class SessionTable(Stateful):
    """The open sessions of every group (see the module docstring for the layout)."""

    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        head=ARRAY,
        gone=ARRAY,
        nxt=ARRAY,
        sgid=ARRAY,
        start=ARRAY,
        end=ARRAY,
        rev=ARRAY,
        dirty=ARRAY,
        shown_start=ARRAY,
        shown_end=ARRAY,
        free=ARRAY,
        n_free=INT,
        used=INT,
    )
    _SLOTS = ("nxt", "sgid", "start", "end", "rev", "dirty", "shown_start", "shown_end", "free")

    def __init__(self, gap: int, reach: int = 0) -> None:
        """``reach``: 0 or 1, the rule (module docstring); configuration, no state."""
        self.gap = gap
        self.reach = reach
        self.head = np.full(0, -1, np.int64)
        self.gone = np.full(0, NO_PROGRESS, np.int64)
        self.nxt = np.full(0, -1, np.int64)
        self.sgid = np.full(0, -1, np.int64)
        self.start = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self.rev = np.full(0, -1, np.int64)
        self.dirty = np.zeros(0, np.bool_)
        self.shown_start = np.zeros(0, np.int64)
        self.shown_end = np.zeros(0, np.int64)
        self.free = np.zeros(0, np.int64)
        self.n_free = 0
        self.used = 0
        self.moved = np.full(0, -1, np.int64)  # scratch of add_values: no state

    @property
    def capacity(self) -> int:
        return int(self.sgid.shape[0])

    def live(self) -> int:
        """Sessions held (open, or kept for allowed lateness)."""
        return self.used - self.n_free

    def nbytes(self) -> int:
        return int(sum(getattr(self, name).nbytes for name in (*self._SLOTS, "head", "gone", "moved")))

    def fit(self, groups: int) -> None:
        """Room for ``groups`` groups (amortised doubling)."""
        if groups > self.head.shape[0]:
            size = max(groups, 2 * self.head.shape[0], 64)
            self.head = _grown(self.head, size, -1)
            self.gone = _grown(self.gone, size, NO_PROGRESS)

    def _grow(self) -> None:
        """Twice the slots (at least 8): the table grows with the sessions held, not the batch."""
        cap = max(2 * self.capacity, 8)
        for name in self._SLOTS:
            fill = -1 if name in ("nxt", "sgid", "rev") else 0
            setattr(self, name, _grown(getattr(self, name), cap, fill))
        self.moved = _grown(self.moved, cap, -1)

    def add(self, gid: I64, ts: I64) -> tuple[I64, I64, I64]:
        """Sessionize a batch (:func:`add_values`, growing the slots as it needs; groups fitted
        first): the slot of each tuple, the slots merged away and the survivor each went into.
        Free the merged-away slots with :meth:`release` once their cells are folded."""
        n = gid.shape[0]
        slot, gone = np.empty(n, np.int64), np.empty(n, np.int64)
        placed = m = 0
        while True:
            placed, m, self.n_free, self.used = add_values(
                gid, ts, placed, slot, gone, m, self.gap, self.reach, self.head, self.nxt, self.sgid,
                self.start, self.end, self.rev, self.dirty, self.free, self.n_free, self.used, self.moved,
            )  # fmt: skip
            if placed == n:
                return slot, gone[:m], resolve_moves(slot, gone[:m], self.moved)
            self._grow()

    def purge(self, cutoff: int) -> I64:
        """Take out the sessions ending at or below ``cutoff`` (complete: module docstring),
        returning their slots; free them with :meth:`release`."""
        slots: I64 = purge(cutoff, self.used, self.head, self.nxt, self.sgid, self.end, self.gone)
        return slots

    def release(self, slots: I64) -> None:
        """Slots of sessions gone (merged away or purged) back to the free stack."""
        k = slots.shape[0]
        self.free[self.n_free : self.n_free + k] = slots
        self.rev[slots] = -1
        self.dirty[slots] = False
        self.n_free += k

    def due(self, cutoff: int) -> I64:
        """Sessions changed since last evaluated that end at or below ``cutoff`` (complete), in
        slot order (the order of rows within a batch is no part of the results)."""
        used = self.used
        return np.flatnonzero((self.sgid[:used] >= 0) & self.dirty[:used] & (self.end[:used] <= cutoff))

    def open(self, cutoff: int) -> I64:
        """Sessions ending above ``cutoff`` (not complete), in slot order."""
        used = self.used
        return np.flatnonzero((self.sgid[:used] >= 0) & (self.end[:used] > cutoff))

    def regroup(self, remap: I64) -> None:
        """Group ids renumbered (the group table compacted; -1: a group forgotten, which has no
        session)."""
        live = self.sgid[: self.used] >= 0
        self.sgid[: self.used][live] = remap[self.sgid[: self.used][live]]
        kept = np.flatnonzero(remap >= 0)
        head = np.full(self.head.shape[0], -1, np.int64)
        head[remap[kept]] = self.head[kept]
        gone = np.full(self.gone.shape[0], NO_PROGRESS, np.int64)
        gone[remap[kept]] = self.gone[kept]
        self.head, self.gone = head, gone

    def adopt(self, saved: Mapping[str, Any], where: str) -> None:
        super().adopt(saved, where)
        sizes = {getattr(self, name).shape for name in self._SLOTS}
        if len(sizes) != 1 or not 0 <= self.n_free <= self.used <= self.capacity:
            raise CorruptState(f"state of {where} has slot arrays of unequal sizes")
        if self.gone.shape != self.head.shape:
            raise CorruptState(f"state of {where} has group arrays of unequal sizes")
        self.moved = np.full(self.capacity, -1, np.int64)


def _grown(a: npt.NDArray[Any], size: int, fill: int) -> npt.NDArray[Any]:
    out = np.full(size, fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


__all__ = ["SessionTable", "add_values", "purge", "resolve_moves"]
