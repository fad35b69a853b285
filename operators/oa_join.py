"""OA-Join: the order-agnostic window join of chapter 7 (Figures 7-1 and 7-2), columnar.

Port 0 is the left input S0, port 1 the right input S1; each has a progressing attribute ``ts``
(int64) and zero or more int64 equality keys. A left tuple ``l`` and a right tuple ``r`` match iff
their keys are equal and

* band join ``S0 [RANGE r0], S1 [RANGE r1]``: ``l.ts - r1 <= r.ts <= l.ts + r0`` (both inclusive);
* tumbling join ``[RANGE TUMBLING d]``: ``l.ts // d == r.ts // d`` (floor division);
* until join ``Until(side, column, low, high)``, an interval bounded by a column of one input
  (Nexmark's ``B.dateTime BETWEEN A.dateTime AND A.expires``): with ``x`` the tuple of input
  ``side`` and ``y`` the other, ``x.ts + low <= y.ts <= x.column + high``. Nothing relates
  ``x.column`` to ``x.ts``: a bound below ``x.ts + low`` pairs with nothing.

Every matching pair is emitted exactly once, whatever the arrival order, batch split,
interleaving and (honest) punctuation: a tuple probes the tuples stored from the other input,
then is stored itself if a future tuple of the other input can still match it. With tuples behind
punctuation, a pair is emitted at most once, and one that is not has a tuple in the late side
stream (see Behind punctuation).

Ends. A stored tuple has an *end*, the largest ts of a partner it can meet as far as its input's
bound goes: its ts for a band or tumbling join and for the unbounded input of an until join,
``x.end = x.column + high`` for the bounded input ``side`` of an until join. Purging compares ends.

Bounds. ``b0``/``b1`` is the latest punctuation of the left/right input (``NO_PROGRESS`` at first);
every future tuple of input i has ``ts >= b_i``. Call ``T0`` (``T1``) the smallest left (right) end
that a future right (left) tuple can still match:

* band: a future right ``r`` (``r.ts >= b1``) meets ``l`` only if ``l.ts + r0 >= r.ts >= b1``, so
  ``T0 = b1 - r0``; symmetrically ``l.ts <= r.ts + r1`` gives ``T1 = b0 - r1``;
* tumbling: ``floor(l.ts/d) = floor(r.ts/d) >= floor(b1/d)``, so ``T0 = floor(b1/d)*d`` and
  ``T1 = floor(b0/d)*d``;
* until (x on input ``side``, y on the other): a future y meets x only if ``x.end >= y.ts >= b_y``,
  so ``T_x = b_y`` (on ends); a future x meets y only if ``y.ts >= x.ts + low >= b_x + low``, so
  ``T_y = b_x + low``.

A new tuple of input i is stored only if its end is ``>= T_i`` and its partner range is not empty
(ProcessTuple); a stored tuple of input i is purgeable once its end is ``< T_i``
(ProcessPunctuation), and the purge is amortised (the storage is compacted when at least a quarter
of it is purgeable): a purgeable tuple left in store can no longer match, because every partner
in time asks for an end ``>= T_i`` and one behind punctuation skips stored ends below ``T_i``.

Output punctuation (individual punctuation, one per input timestamp, ProducePunctuation). A
future output row carries a future tuple of input i (``ts >= b_i``), a stored one that a future
tuple of the other input matches (end ``>= T_i``), or a tuple behind punctuation, which forms
pairs only at or above the output punctuation published (below). After every input punctuation:

* band, on ``{left.prefix}.{left.ts}``:   ``out0 = min(b0, T0) = min(b0, b1 - r0)``;
  on ``{right.prefix}.{right.ts}``: ``out1 = min(b1, T1) = min(b1, b0 - r1)``;
* tumbling, on both columns: ``out0 = out1 = min(floor(b0/d)*d, floor(b1/d)*d)``, the start of
  the first bucket still open on either input (``<= min(b_i, T_i)``, at bucket granularity so
  that a tuple behind punctuation in a bucket still open, whose partners are all held, is in time);
* until, on y's column ``out_y = min(b_y, T_y) = min(b_y, b_x + low)``; on x's column
  ``out_x = min(b_x, oldest)``, ``oldest`` the smallest ts among the stored x still live
  (end ``>= T_x``; ``END_OF_STREAM`` if none): only they and future x meet a future y - but
  ``b_y`` where that is ``END_OF_STREAM`` (x has ended and none is live: no row is to come, yet
  the output ends with both inputs, as for the other joins; a value that may fall below the one
  published, which then stands). ``oldest`` is kept exactly by a binary min-heap on ts of the
  stored x's (ts, end) with lazy deletion: at punctuation the top is popped while its end is
  below ``T_x`` (a tuple once dead stays dead: ``T_x`` only rises), so the top is the oldest
  live one; numba kernels, O(log n) per stored x. The heap is rebuilt from the store (sorted by
  ts) when the store is compacted, so it never holds more rows than the store (dead ones held
  under a long-lived one go with the compaction);

each emitted only when it rises above the last value emitted for that column (never repeated,
never regressing, never ``NO_PROGRESS``). ``NO_PROGRESS`` and ``END_OF_STREAM`` saturate as -inf and
+inf (``NO_PROGRESS - r = NO_PROGRESS``, ``floor(END_OF_STREAM/d)*d = END_OF_STREAM``), and finite
results are clamped into the int64 domain; so when both inputs have ended both outputs are
``END_OF_STREAM``, and when the other input has ended nothing more is stored and its partner
store is emptied. ``T_i`` and ``out_i`` are functions of ``(b0, b1)`` alone (monotone, so the last
value published is the current one) - but for ``out_x`` of an until join, which depends on the
stored tuples; for a tuple behind punctuation the join takes ``mute_x = b_x`` in its place (below),
elsewhere ``mute_i = out_i``.

Behind punctuation (docs/design.md, "Punctuation and lateness"). A tuple ``x`` of input i with
``x.ts < b_i`` (``batch.late`` from the query's Input; any tuple below ``b_i`` is taken alike) may
no longer meet partners whose end is below ``T_j`` (j the other input): they may be purged already,
or were never stored. So it meets only stored partners with end ``>= T_j`` (purgeable ones not yet
compacted must not match: results do not depend on when compaction ran), and only if ``x.ts >=
mute_i`` (else a pair would fall below the punctuation published on its column). It is *late for the
query* iff its partner floor - the smallest end a partner of it can have: band ``x.ts - r1`` (left)
or ``x.ts - r0`` (right), tumbling its bucket start, until ``x.ts + low`` (bounded input) or
``y.ts`` (the other) - is below ``T_j``, which holds for every behind tuple of a band or until join
(tumbling: its bucket is no longer open); or if ``x.ts < mute_i``, which implies the former (band:
``out_i <= b_i``; tumbling: ``out_i <= floor(b_i/d)*d = T_j``; until: ``mute_i <= b_i``). A late
tuple goes to its input's late sink (the query's ``<query>.late``, in its stream's columns) once; if
``x.ts >= mute_i`` it still forms its pairs with the partners held (a tuple may so be split, like
one a sliding window counts in its open windows). It is stored by the usual rule (end ``>= T_i``, a
partner range not emptied by the mute). :meth:`OAJoin.late_mask` is this test as a function of
``(b0, b1)``: the door's late rule for ``late='error'`` (:func:`late_mask_of`).

So for an until join every tuple behind punctuation is late; a behind x of the bounded input
(``mute_x = b_x``) takes no part at all - it neither probes nor is stored, since its pairs would
carry an ``x.ts`` below ``b_x`` and ``out_x`` may already be above it, by a value that depends on
the store - while a behind y still meets the live stored x if ``y.ts >= out_y``, as with a band.
A pair that is not emitted has its behind tuple in the late stream: for a band or tumbling join
its later tuple, for an until join maybe the earlier one (a behind x that a later y would meet).

Implementation. Each input keeps columnar storage (numpy arrays with amortised doubling) and a
chained hash index: ``heads[hash & mask]`` is the first row of a slot, ``next[row]`` the next row
of the same slot; the stored 64-bit hash and then every key column are verified on a hit. For a
tumbling join the bucket ``ts // d`` is hashed and verified as an extra key. Rows are stored
grouped by hash (each appended batch, and the whole store whenever it is compacted or its index
grows), so a chain is a few contiguous runs and a probe reads memory sequentially. A batch is
probed in one numba kernel that writes (probe row, stored row) pairs into reused buffers, for
each probe row a range of stored ts and a floor of stored ends (the store of an until join's
bounded input keeps the ends beside the ts); the output columns are gathered with numpy.
Timestamps are assumed to stay clear of the int64 ends by more than the ranges (the band limits
saturate, the store predicates do not overflow).

A snapshot holds both inputs' bounds and stores, index included (and the ends and heap of an
until join's bounded input): chains keep their order, so a restored join emits its pairs in the
same order as the join it was taken from. Placement: each input by its equality keys, one worker
without keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import numpy.typing as npt
from numba import njit

from lowtide.batch import Batch, Column
from lowtide.errors import CorruptState
from lowtide.operators.base import Operator
from lowtide.operators.group_table import hash_rows
from lowtide.operators.join_windows import Band, JoinSide, JoinWindow, Tumbling, Until
from lowtide.operators.placement import Placement
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.snapshot import (
    EACH,
    INT,
    INTS,
    Field,
    State,
    Versioned,
    as_array,
    as_dict,
    as_int,
    declare,
    fields,
)

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
LateSink = Callable[[Batch], None]
_F = TypeVar("_F", bound=Callable[..., Any])

_MIN_SLOTS = 1024
_MIN_ROWS = 1024


def _jit(fn: _F) -> _F:
    return cast(_F, njit(cache=True, nogil=True)(fn))


@_jit
def _link(heads: I64, nxt: I64, hashes: U64, start: int, stop: int) -> None:
    """Insert stored rows ``start..stop-1`` at the front of their slot chains.

    Rows are linked from ``stop-1`` down, so rows of a slot that are adjacent in storage are
    adjacent, in ascending order, in its chain.
    heads: (S,) int64, S a power of two, mutated (slot -> first row, -1 if empty).
    nxt: (cap,) int64, mutated at rows start..stop-1 (row -> next row of its slot, -1 ends).
    hashes: (cap,) uint64, read only (hash of each stored row). Cost O(stop - start).
    """
    mask = np.uint64(heads.size - 1)
    for i in range(stop - 1, start - 1, -1):
        s = hashes[i] & mask
        nxt[i] = heads[s]
        heads[s] = i


@_jit
def _cluster(hashes: U64, rows: I64, slots: int) -> I64:
    """``rows`` stably ordered by hash slot (counting sort), so each chain is one contiguous run.

    hashes: (cap,) uint64, read only; rows: (k,) int64 row numbers into ``hashes``, read only;
    slots: the index size S (a power of two). Returns a new (k,) int64 array. Cost O(k + S).
    """
    mask = np.uint64(slots - 1)
    start = np.zeros(slots + 1, np.int64)
    for i in range(rows.size):
        start[np.int64(hashes[rows[i]] & mask) + 1] += 1
    for s in range(slots):
        start[s + 1] += start[s]
    out = np.empty(rows.size, np.int64)
    for i in range(rows.size):
        s = hashes[rows[i]] & mask
        out[start[s]] = rows[i]
        start[s] += 1
    return out


@_jit
def _probe(
    p_hash: U64,
    p_keys: I64,
    p_lo: I64,
    p_hi: I64,
    p_need: I64,
    heads: I64,
    nxt: I64,
    s_hash: U64,
    s_keys: I64,
    s_ts: I64,
    s_end: I64,
    out_p: I64,
    out_s: I64,
    start: int,
    filled: int,
) -> tuple[int, int]:
    """Pairs (probe row i, stored row j) with equal keys, ``p_lo[i] <= s_ts[j] <= p_hi[i]`` and
    ``s_end[j] >= p_need[i]``.

    p_hash: (m,) uint64; p_keys: (m, k) int64; p_lo, p_hi, p_need: (m,) int64 -- the probe batch.
    heads: (S,) int64; nxt: (cap,) int64; s_hash: (cap,) uint64; s_keys: (cap, k) int64;
    s_ts, s_end: (cap,) int64 (the same array where the ends are the ts) -- the other input's
    store and index. None of these is mutated.
    out_p, out_s: (B,) int64, mutated from index ``filled`` on. Probes rows ``start..m-1`` and
    stops before the first probe row whose pairs no longer fit; returns (next probe row, pairs
    filled): rows below it are complete, probe rows ascending. Cost O(m * k + rows visited + P);
    a chain holds the rows of one hash slot, so the rows visited are ~ the stored rows with the
    probe's keys (every stored row when k = 0).
    """
    mask = np.uint64(heads.size - 1)
    k = p_keys.shape[1]
    n = filled
    for i in range(start, p_hash.size):
        h = p_hash[i]
        lo = p_lo[i]
        hi = p_hi[i]
        need = p_need[i]
        first = n
        j = heads[h & mask]
        while j >= 0:
            if s_hash[j] == h and lo <= s_ts[j] <= hi and s_end[j] >= need:
                same = True
                for c in range(k):
                    if s_keys[j, c] != p_keys[i, c]:
                        same = False
                        break
                if same:
                    if n == out_p.size:
                        return i, first
                    out_p[n] = i
                    out_s[n] = j
                    n += 1
            j = nxt[j]
    return p_hash.size, n


@_jit
def _heap_push(h_ts: I64, h_end: I64, n: int, ts: I64, end: I64) -> int:
    """Push the rows ``(ts[i], end[i])`` into the binary min-heap on ts ``h_ts[:n]``/``h_end[:n]``.

    h_ts, h_end: (cap,) int64, cap >= n + ts.size, mutated. ts, end: (m,) int64, read only.
    Returns the new size n + m. Cost O(m log(n + m)).
    """
    for i in range(ts.size):
        c = n
        n += 1
        while c > 0:
            parent = (c - 1) // 2
            if h_ts[parent] <= ts[i]:
                break
            h_ts[c] = h_ts[parent]
            h_end[c] = h_end[parent]
            c = parent
        h_ts[c] = ts[i]
        h_end[c] = end[i]
    return n


@_jit
def _heap_drop(h_ts: I64, h_end: I64, n: int, threshold: int) -> int:
    """Pop the top of the min-heap ``h_ts[:n]``/``h_end[:n]`` while its end is below ``threshold``.

    h_ts, h_end: (cap,) int64, mutated. Returns the new size; the top is then the smallest ts
    whose end is >= threshold, if the ends of rows popped before were below earlier thresholds
    (dead rows below the top are left for later). Cost O(popped * log n).
    """
    while n > 0 and h_end[0] < threshold:
        n -= 1
        t = h_ts[n]
        e = h_end[n]
        c = 0
        while True:
            child = 2 * c + 1
            if child >= n:
                break
            if child + 1 < n and h_ts[child + 1] < h_ts[child]:
                child += 1
            if h_ts[child] >= t:
                break
            h_ts[c] = h_ts[child]
            h_end[c] = h_end[child]
            c = child
        h_ts[c] = t
        h_end[c] = e
    return n


def _plus(b: int, c: int) -> int:
    """``b + c`` with ``NO_PROGRESS``/``END_OF_STREAM`` as -inf/+inf, clamped into int64."""
    if b <= NO_PROGRESS or b >= END_OF_STREAM:
        return b
    return min(max(b + c, NO_PROGRESS), END_OF_STREAM)


def _shifted(ts: I64, c: int) -> I64:
    """``ts + c``, a new array, saturating at the int64 ends instead of wrapping."""
    if c >= 0:
        return np.minimum(ts, END_OF_STREAM - c) + c
    return np.maximum(ts, NO_PROGRESS - c) + c


def _floor_to(b: int, d: int) -> int:
    """``floor(b/d)*d`` with ``NO_PROGRESS``/``END_OF_STREAM`` saturating, clamped into int64."""
    if b <= NO_PROGRESS or b >= END_OF_STREAM:
        return b
    return max((b // d) * d, NO_PROGRESS)


def threshold_of(window: JoinWindow, side: int, bounds: Sequence[int]) -> int:
    """``T_side`` for the input bounds ``(b0, b1)``: the smallest end of input ``side`` that a
    future tuple of the other input can match."""
    other = bounds[1 - side]
    if isinstance(window, Tumbling):
        return _floor_to(other, window.d)
    if isinstance(window, Until):
        return other if side == window.side else _plus(other, window.low)
    return _plus(other, -(window.r0 if side == 0 else window.r1))


def output_bound_of(window: JoinWindow, side: int, bounds: Sequence[int]) -> int:
    """``out_side``, the output punctuation on input ``side``'s ts column for ``(b0, b1)``; for
    an until join's bounded input ``mute_x = b_x``, which its output punctuation stays below."""
    if isinstance(window, Until) and side == window.side:
        return bounds[side]
    own = _floor_to(bounds[side], window.d) if isinstance(window, Tumbling) else bounds[side]
    return min(own, threshold_of(window, side, bounds))


def partner_floor(window: JoinWindow, side: int, ts: I64) -> I64:
    """The smallest end a partner of tuples ``ts`` of input ``side`` can have (saturating):
    band ``ts - below``, tumbling the bucket start, until ``ts + low`` on the bounded input and
    ``ts`` on the other."""
    if isinstance(window, Tumbling):
        return (ts // window.d) * window.d
    if isinstance(window, Until):
        return _shifted(ts, window.low) if side == window.side else ts
    return _shifted(ts, -(window.r1 if side == 0 else window.r0))


def partner_range(window: JoinWindow, side: int, ts: I64, end: I64) -> tuple[I64, I64, I64]:
    """``(lo, hi, need)``: tuples ``ts`` (ends ``end``) of input ``side`` can match the other
    input's tuples with ts in ``[lo, hi]`` and end ``>= need`` (saturating). Band ``[ts - below,
    ts + above]``; tumbling the bucket from its start (the bucket itself is hashed as a key);
    until ``[ts + low, end]`` on the bounded input, ``ts <= y.ts - low`` with ``x.end >= y.ts`` on
    the other. ``lo`` and ``hi`` are new arrays; ``need`` may be ``lo`` or ``ts`` itself."""
    need = partner_floor(window, side, ts)
    if isinstance(window, Until):
        if side != window.side:
            return np.full(ts.size, NO_PROGRESS, np.int64), _shifted(ts, -window.low), need
        return need, end.copy(), need
    if isinstance(window, Tumbling):
        return need, np.full(ts.size, END_OF_STREAM, np.int64), need
    return need, _shifted(ts, window.r0 if side == 0 else window.r1), need


def late_mask_of(window: JoinWindow, side: int, ts: I64, bounds: Sequence[int]) -> npt.NDArray[np.bool_]:
    """Which tuples ``ts`` of input ``side`` are late for the query at input bounds ``(b0, b1)``:
    their partner floor is below ``T_other`` (partners maybe gone). That covers the tuples
    below ``mute_side`` too (no pair of theirs may be emitted): ``ts < mute_side`` puts a band
    or until tuple behind ``b_side``, a tumbling one in a bucket below ``T_other``. False for
    every tuple at or above ``b_side``; for band and until joins true for every one below it."""
    return partner_floor(window, side, ts) < threshold_of(window, 1 - side, bounds)


def _offset(c: int) -> str:
    """`` + c`` or `` - |c|``, as ``explain`` writes a constant added to a time (``- 0`` for 0)."""
    return f" + {c}" if c > 0 else f" - {-c}"


class _IndexedInput(Versioned):
    """The stored tuples of one input: columnar rows plus the chained hash index on the keys.

    ``bounded``: the rows have ends of their own (an until join's bounded input), kept in ``ends``
    beside the ts, with the min-heap on ts that finds the oldest live row; otherwise a row's end
    is its ts (:attr:`end` is ``ts``)."""

    VERSION = 1

    def __init__(self, n_keys: int, payload: tuple[str, ...], bounded: bool = False) -> None:
        self.n_keys = n_keys
        self.names = payload
        self.bounded = bounded
        self.n = 0
        self._release()

    def _release(self) -> None:
        self.ts: I64 = np.empty(0, np.int64)
        self.ends: I64 = np.empty(0, np.int64)  # bounded only
        self.keys: I64 = np.empty((0, self.n_keys), np.int64)
        self.hashes: U64 = np.empty(0, np.uint64)
        self.nxt: I64 = np.empty(0, np.int64)
        self.payload: dict[str, Column] = {}
        self.heads: I64 = np.full(_MIN_SLOTS, -1, np.int64)
        self.scan_n = 0  # rows when ``purge_at`` was last computed
        self.purge_at = END_OF_STREAM  # compact once the threshold passes this end
        # bounded only: min-heap on ts of (ts, end) of stored rows, dead ones popped lazily
        self.heap_ts: I64 = np.empty(0, np.int64)
        self.heap_end: I64 = np.empty(0, np.int64)
        self.heap_n = 0

    @property
    def end(self) -> I64:
        """Each row's end (the capacity's worth, valid below ``n``): ``ends``, or ``ts``."""
        return self.ends if self.bounded else self.ts

    def _resize(self, capacity: int) -> None:
        n = self.n

        def moved(old: Any, shape: tuple[int, ...]) -> Any:
            new = np.empty(shape, old.dtype)
            new[:n] = old[:n]
            return new

        self.ts = moved(self.ts, (capacity,))
        if self.bounded:
            self.ends = moved(self.ends, (capacity,))
        self.keys = moved(self.keys, (capacity, self.n_keys))
        self.hashes = moved(self.hashes, (capacity,))
        self.nxt = moved(self.nxt, (capacity,))
        self.payload = {c: moved(v, (capacity,)) for c, v in self.payload.items()}

    def _rebuild(self, rows: I64) -> None:
        """Keep only ``rows``, reordered by hash slot, and rebuild the index; O(k + S) per column."""
        k = rows.size
        slots = _MIN_SLOTS
        while slots < 2 * k:
            slots *= 2
        order = _cluster(self.hashes, rows, slots)
        capacity = self.ts.size
        if 4 * max(k, _MIN_ROWS) < capacity:
            capacity = 2 * max(k, _MIN_ROWS)

        def kept(old: Any) -> Any:
            new = old if old.shape[0] == capacity else np.empty((capacity, *old.shape[1:]), old.dtype)
            new[:k] = old[order]
            return new

        self.ts, self.keys, self.hashes = kept(self.ts), kept(self.keys), kept(self.hashes)
        if self.bounded:
            self.ends = kept(self.ends)
        self.nxt = self.nxt if capacity == self.nxt.size else np.empty(capacity, np.int64)
        self.payload = {c: kept(v) for c, v in self.payload.items()}
        self.n = k
        self.heads = np.full(slots, -1, np.int64)
        _link(self.heads, self.nxt, self.hashes, 0, k)

    def _plan_purge(self) -> None:
        """Remember the end below which a quarter of the rows lie; O(n), once per doubling."""
        self.scan_n = self.n
        if self.n == 0:
            self.purge_at = END_OF_STREAM
        else:
            k = self.n // 4
            self.purge_at = int(np.partition(self.end[: self.n], k)[k])

    def _reheap(self) -> None:
        """The heap from the stored rows: sorted by ts, which is a min-heap; O(n log n), after a
        compaction: amortised O(log n) per row, each compaction dropping a quarter of them at least."""
        order = np.argsort(self.ts[: self.n], kind="stable")
        capacity = max(2 * self.n, _MIN_ROWS)
        self.heap_ts, self.heap_end = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
        self.heap_ts[: self.n], self.heap_end[: self.n] = self.ts[order], self.ends[order]
        self.heap_n = self.n

    def append(
        self, ts: I64, end: I64, keys: I64, hashes: U64, payload: dict[str, Column], rows: I64
    ) -> None:
        """Store ``rows`` of a batch, grouped by hash slot so that each key's rows are adjacent;
        ``end``: the batch's ends (read when bounded)."""
        m = rows.size
        if m == 0:
            return
        if not self.payload:
            self.payload = {c: np.empty(self.ts.size, np.asarray(payload[c]).dtype) for c in self.names}
        start, stop = self.n, self.n + m
        if stop > self.ts.size:
            self._resize(max(stop, 2 * self.ts.size, _MIN_ROWS))
        slots = _MIN_SLOTS
        while slots < 2 * m:
            slots *= 2
        order = _cluster(hashes, rows, slots)
        self.ts[start:stop] = ts[order]
        self.keys[start:stop] = keys[order]
        self.hashes[start:stop] = hashes[order]
        for c in self.names:
            self.payload[c][start:stop] = payload[c][order]
        if self.bounded:
            self.ends[start:stop] = end[order]
        self.n = stop
        if 2 * stop > self.heads.size:
            self._rebuild(np.arange(stop, dtype=np.int64))
        else:
            _link(self.heads, self.nxt, self.hashes, start, stop)
        if self.bounded:
            self._push(ts[rows], end[rows])
        if stop >= 2 * self.scan_n:
            self._plan_purge()

    def _push(self, ts: I64, end: I64) -> None:
        """Rows just stored into the heap (it holds no row the store has not: rebuilt whenever
        the store is compacted, it holds at most the rows stored since)."""
        n, m = self.heap_n, ts.size
        if n + m > self.heap_ts.size:
            size = max(2 * self.heap_ts.size, n + m, _MIN_ROWS)
            grown_ts, grown_end = np.empty(size, np.int64), np.empty(size, np.int64)
            grown_ts[:n], grown_end[:n] = self.heap_ts[:n], self.heap_end[:n]
            self.heap_ts, self.heap_end = grown_ts, grown_end
        self.heap_n = _heap_push(self.heap_ts, self.heap_end, n, ts, end)

    def purge(self, threshold: int) -> None:
        """Drop rows with an end below ``threshold`` once at least a quarter of the rows qualify."""
        if self.n == 0 or threshold <= self.purge_at:
            return
        if threshold >= END_OF_STREAM:
            self.n = 0
            self._release()
            return
        self._rebuild(np.flatnonzero(self.end[: self.n] >= threshold))
        self._plan_purge()
        if self.bounded:
            self._reheap()

    def oldest(self, threshold: int) -> int:
        """The smallest ts among the rows whose end is ``>= threshold`` (``END_OF_STREAM`` if
        none), for a bounded store; ``threshold`` must never go down between calls."""
        self.heap_n = _heap_drop(self.heap_ts, self.heap_end, self.heap_n, threshold)
        return int(self.heap_ts[0]) if self.heap_n else END_OF_STREAM

    def nbytes(self) -> int:
        row = 8 * (3 + self.n_keys + self.bounded) + sum(v.dtype.itemsize for v in self.payload.values())
        return self.n * row + int(self.heads.nbytes) + 16 * self.heap_n

    def save_fields(self) -> dict[str, State]:
        """The stored rows (ts, keys, hash, chain link, carried columns; ends when bounded), the
        slot heads, when to purge next, and when bounded the heap."""
        n = self.n
        payload: dict[str, State] = {c: v[:n].copy() for c, v in self.payload.items()}
        rows: dict[str, State] = {"ts": self.ts[:n].copy(), "keys": self.keys[:n].copy()}
        rows |= {"hashes": self.hashes[:n].copy(), "nxt": self.nxt[:n].copy(), "payload": payload}
        state: dict[str, State] = {**rows, "heads": self.heads.copy(), "scan_n": self.scan_n}
        state["purge_at"] = self.purge_at
        if self.bounded:
            state["ends"] = self.ends[:n].copy()
            state["heap_ts"] = self.heap_ts[: self.heap_n].copy()
            state["heap_end"] = self.heap_end[: self.heap_n].copy()
        return state

    def load_fields(self, saved: dict[str, State], where: str) -> None:
        names = ["ts", "keys", "hashes", "nxt", "payload", "heads", "scan_n", "purge_at"]
        found = fields(saved, names + (["ends", "heap_ts", "heap_end"] if self.bounded else []), where)
        self.ts = as_array(found["ts"], f"{where}.ts", np.int64, 1)
        self.keys = as_array(found["keys"], f"{where}.keys", np.int64, 2)
        self.hashes = as_array(found["hashes"], f"{where}.hashes", np.uint64, 1)
        self.nxt = as_array(found["nxt"], f"{where}.nxt", np.int64, 1)
        self.heads = as_array(found["heads"], f"{where}.heads", np.int64, 1)
        payload = as_dict(found["payload"], f"{where}.payload")
        self.payload = {c: as_array(v, f"{where}.payload.{c}", ndim=1) for c, v in payload.items()}
        n = self.ts.shape[0]
        columns = [self.keys, self.hashes, self.nxt, *self.payload.values()]
        if self.bounded:
            self.ends = as_array(found["ends"], f"{where}.ends", np.int64, 1)
            self.heap_ts = as_array(found["heap_ts"], f"{where}.heap_ts", np.int64, 1)
            self.heap_end = as_array(found["heap_end"], f"{where}.heap_end", np.int64, 1)
            self.heap_n = self.heap_ts.shape[0]
            columns.append(self.ends)
        heads = self.heads.shape[0]
        if (
            any(a.shape[0] != n for a in columns)
            or self.heap_end.shape[0] != self.heap_n
            or self.keys.shape[1] != self.n_keys
            or (self.payload and self.payload.keys() != set(self.names))
            or heads < _MIN_SLOTS
            or heads & (heads - 1)
        ):
            raise CorruptState(f"state of {where} does not fit the join: saved by another plan?")
        self.n = n
        self.scan_n = as_int(found["scan_n"], f"{where}.scan_n")
        self.purge_at = as_int(found["purge_at"], f"{where}.purge_at")


class OAJoin(Operator):
    """Order-agnostic band, tumbling or until window join with equality keys (see the module docstring).

    Output rows: ``{left.prefix}.{c}`` for ``c`` in ``left.columns``, then ``{right.prefix}.{c}`` for
    ``c`` in ``right.columns``. Output punctuation: individual punctuation on
    ``{left.prefix}.{left.ts}`` (``out0``) and ``{right.prefix}.{right.ts}`` (``out1``).
    ``late_sinks``: per input, where its tuples late for the query go (None: nowhere).
    """

    label = "OA-Join"
    # _need sizes the reused probe buffers (their content is scratch).
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE, stores=EACH.at("_stores"), bounds=INTS.at("_bounds"), need=INT.at("_need")
    )

    def __init__(
        self,
        left: JoinSide,
        right: JoinSide,
        window: JoinWindow,
        late_sinks: tuple[LateSink | None, LateSink | None] = (None, None),
    ) -> None:
        super().__init__()
        if len(left.keys) != len(right.keys):
            raise ValueError("OA-Join needs as many left keys as right keys")
        if isinstance(window, Band) and (window.r0 < 0 or window.r1 < 0):
            raise ValueError("band ranges must be >= 0")
        if isinstance(window, Tumbling) and window.d <= 0:
            raise ValueError("tumbling range must be > 0")
        if isinstance(window, Until) and (
            window.side not in (0, 1) or window.column not in (left, right)[window.side].columns
        ):
            raise ValueError(f"an until join is bounded by a column its side carries, not {window.column!r}")
        names = [f"{left.prefix}.{c}" for c in left.columns] + [f"{right.prefix}.{c}" for c in right.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate output columns in {names}")
        self.sides = (left, right)
        self.window = window
        self.late_sinks = late_sinks
        n_keys = len(left.keys) + (1 if isinstance(window, Tumbling) else 0)
        bounded = window.side if isinstance(window, Until) else None
        self._stores = (
            _IndexedInput(n_keys, left.columns, bounded == 0),
            _IndexedInput(n_keys, right.columns, bounded == 1),
        )
        self._bounds = [NO_PROGRESS, NO_PROGRESS]  # b0, b1
        # probe output buffers, reused across batches: about the largest recent probe output
        self._need = 0
        self._pairs: tuple[I64, I64] = (np.empty(_MIN_ROWS, np.int64), np.empty(_MIN_ROWS, np.int64))

    def threshold(self, side: int) -> int:
        """``T_side``: smallest end of input ``side`` that a future tuple of the other can match."""
        return threshold_of(self.window, side, self._bounds)

    def late_mask(self, side: int, ts: I64, bounds: Sequence[int]) -> npt.NDArray[np.bool_]:
        """Which tuples ``ts`` of input ``side`` this join takes as late once its input bounds are
        ``bounds`` = ``(b0, b1)`` (see the module): a function of punctuation alone."""
        return late_mask_of(self.window, side, ts, bounds)

    def process(self, batch: Batch, port: int = 0) -> None:
        m = batch.n
        if m == 0:
            return
        self.tuples_in += m
        side = self.sides[port]
        ts = np.ascontiguousarray(batch[side.ts], dtype=np.int64)
        keys = np.empty((m, self._stores[port].n_keys), np.int64)
        for c, name in enumerate(side.keys):
            keys[:, c] = batch[name]
        window = self.window
        if isinstance(window, Tumbling):
            keys[:, -1] = ts // window.d
        end = ts
        if self._stores[port].bounded:
            assert isinstance(window, Until)
            end = _shifted(np.ascontiguousarray(batch[window.column], dtype=np.int64), window.high)
        lo, hi, need = partner_range(window, port, ts, end)
        late = None
        if int(ts.min()) < self._bounds[port]:  # behind punctuation (see the module)
            late = self.late_mask(port, ts, self._bounds)
            # Partners ending below T_other may be purged already: none counts, compacted or not.
            need = np.maximum(need, self.threshold(1 - port))
            muted = ts < output_bound_of(window, port, self._bounds)
            lo[muted], hi[muted] = END_OF_STREAM, NO_PROGRESS  # its pairs would be below mute_port
        hashes = hash_rows(keys)
        other = self._stores[1 - port]
        if other.n:
            rows, stored = self._probe(hashes, keys, lo, hi, need, other)
            if rows.size:
                self._emit_pairs(batch, rows, other, stored, port)
        sink = self.late_sinks[port]
        if late is not None and sink is not None and late.any():
            sink(batch.select(late))
        threshold = self.threshold(port)
        if threshold >= END_OF_STREAM:
            return
        keep = None if threshold <= NO_PROGRESS else end >= threshold
        if isinstance(window, Until):  # an empty partner range (muted, or x.end < x.ts + low): no pair
            keep = hi >= lo if keep is None else keep & (hi >= lo)
        rows = np.arange(m, dtype=np.int64) if keep is None else np.flatnonzero(keep)
        payload = {c: batch[c] for c in side.columns}
        self._stores[port].append(ts, end, keys, hashes, payload, rows)

    def _probe(
        self, hashes: U64, keys: I64, lo: I64, hi: I64, need: I64, other: _IndexedInput
    ) -> tuple[I64, I64]:
        """Probe ``other`` with a batch into the reused pair buffers, doubling them as needed."""
        buf_p, buf_s = self._pairs
        index = (other.heads, other.nxt, other.hashes, other.keys, other.ts, other.end)
        i = n = 0
        while True:
            i, n = _probe(hashes, keys, lo, hi, need, *index, buf_p, buf_s, i, n)
            if i == hashes.size:
                break
            grown_p, grown_s = np.empty(2 * buf_p.size, np.int64), np.empty(2 * buf_p.size, np.int64)
            grown_p[:n], grown_s[:n] = buf_p[:n], buf_s[:n]
            buf_p, buf_s = grown_p, grown_s
        self._need = max(n, int(0.9 * self._need))  # give back buffers far above recent needs
        keep = 2 * max(self._need, _MIN_ROWS)
        self._pairs = (buf_p[:keep].copy(), buf_s[:keep].copy()) if buf_p.size > 2 * keep else (buf_p, buf_s)
        return buf_p[:n], buf_s[:n]

    def _emit_pairs(self, batch: Batch, rows: I64, other: _IndexedInput, stored: I64, port: int) -> None:
        parts: list[dict[str, Column]] = [{}, {}]
        mine, theirs = self.sides[port], self.sides[1 - port]
        parts[port] = {f"{mine.prefix}.{c}": batch[c][rows] for c in mine.columns}
        parts[1 - port] = {f"{theirs.prefix}.{c}": other.payload[c][stored] for c in theirs.columns}
        self.emit(Batch({**parts[0], **parts[1]}, int(rows.size)))

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        value = min(int(punctuation.value), END_OF_STREAM)
        if value <= self._bounds[port]:
            return
        self._bounds[port] = value
        self._stores[1 - port].purge(self.threshold(1 - port))
        for side in (0, 1):
            bound = output_bound_of(self.window, side, self._bounds)
            if self._stores[side].bounded:  # out_x: below the oldest stored x still live
                bound = min(bound, self._stores[side].oldest(self.threshold(side)))
                if bound >= END_OF_STREAM:  # no x to come: the end waits for the other input's
                    bound = self._bounds[1 - side]
            if bound > NO_PROGRESS:
                s = self.sides[side]
                self.emit_progress(bound, f"{s.prefix}.{s.ts}")

    def placement(self) -> Placement:
        left, right = self.sides
        return self.placement_for(left, right)

    @staticmethod
    def placement_for(left: JoinSide, right: JoinSide) -> Placement:
        """By each side's equality keys (matching tuples meet on one worker); one worker
        without keys."""
        return Placement.by_keys(left.keys, right.keys)

    def describe(self) -> str:
        (lp, lts), (rp, rts) = ((s.prefix, s.ts) for s in self.sides)
        window = self.window
        if isinstance(window, Tumbling):
            d = window.d
            text = f"{self.label} tumbling {lp}.{lts} // {d} = {rp}.{rts} // {d}"
        elif isinstance(window, Until):
            x, y = self.sides[window.side], self.sides[1 - window.side]
            bound = f"{x.prefix}.{window.column}" + (_offset(window.high) if window.high else "")
            since = f"{x.prefix}.{x.ts}{_offset(window.low)}"
            text = f"{self.label} until {y.prefix}.{y.ts} <= {bound}, {since} <= {y.prefix}.{y.ts}"
        else:
            r0, r1 = window.r0, window.r1
            text = f"{self.label} band {lp}.{lts} - {r1} <= {rp}.{rts} <= {lp}.{lts} + {r0}"
        left, right = self.sides
        on = " and ".join(f"{lp}.{a} = {rp}.{b}" for a, b in zip(left.keys, right.keys, strict=True))
        return f"{text} on {on}" if on else text

    def state_bytes(self) -> int:
        """Bytes of the stored rows (ts, keys, hash, chain link, carried columns) and hash heads."""
        return sum(s.nbytes() for s in self._stores)

    def open_windows(self) -> int:
        """Number of stored tuples over both inputs."""
        return sum(s.n for s in self._stores)
