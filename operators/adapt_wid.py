"""AdaptWID Aggregate (§6.3, Figures 6-17/6-18): per group, eager WID partials or lazy tuples.

Input and output are WID Aggregate's: tuples tagged ``[wid_start, wid_end)`` by
:class:`~lowtide.operators.bucket.Bucket`, ``Punctuation(q, "wid")`` for the windows ``< q``.
Each group is evaluated one of two ways, chosen at run time and switched per group:

* eager (the WID implementation): partial aggregates per open window, in a dense
  ``[window row, eager id]`` :class:`~lowtide.operators.aggregates.CellState`. Only eager groups
  have an eager id; ids are recycled and the matrix is compacted (and shrunk) as groups go lazy,
  so lazy groups cost no cells.
* lazy (the buffering implementation): the group's tuples are kept once each in the shared
  columnar buffer B (group id, ``wid_start``, number of windows, the aggregated columns) and
  aggregated when punctuation closes their windows - a tuple of a sliding window is stored once,
  where eager keeps a cell (and, for holistic aggregates, a copy of the value) in every window.

Per group, arrays over all groups hold the mode, the eager id and ``winVol``: the number of the
group's tuples still active (in a window not yet closed), counted up on arrival and down as
punctuation expires them (eager partials keep ``tupleCnt``, the tuples whose last window they
are, as in Figure 6-17). The choice is Cond. 6.9: eager once ``winVol`` exceeds
``high = (aggr * wed / SLIDE + 16) / tup``, where ``aggr`` is the bytes of one eager cell (all
accumulators plus ``tupleCnt``), ``wed / SLIDE`` the windows open when the last window closed
(from the newest window seen down to the punctuation: arrival-time skew between the sources of a
union lengthens it) - at least the rows of the dense eager state, since an eager group has a cell
in each -, 16 the bytes of an eager id's bookkeeping, and ``tup`` the bytes of one buffered tuple
less what eager stores per tuple (holistic value logs: one entry per window of the tuple; when
that is as much, lazy always wins and ``high`` is infinite). ``winVol`` is measured,
so it already is Eq. 6.7's ``vol * wed - sum(vol_K * offset_K)``: the tuples a lagging source
has not sent yet are not counted, which is what Cond. 6.9's offset term subtracts. Two
thresholds against thrashing: lazy -> eager on arrival when ``winVol > high``; eager -> lazy at
punctuation when ``winVol < low = hysteresis * high``. Both can also be fixed by the caller.

Switching (Figure 6-18). Lazy -> eager: the group's tuples in B are aggregated into its
partials for the windows still open and leave B (at once when the switched groups' tuples are an
eighth of B, else at the next punctuation, before any result: one scan of B serves many
switches). Eager -> lazy: new tuples go to B while the
existing partials stay until their windows are emitted (a *transitional* group); its result for
a window combines both: the partial is copied into a scratch state over the closing windows and
the buffered tuples are added to it, as WID would have added them. A group whose ``winVol``
drops to 0 is forgotten. Results are exact in every state (the same accumulators and kernels as
WID).

Punctuation contract (WID Aggregate's, without allowed lateness). On ``Punctuation(q, "wid")``
every window ``< q`` is complete: its non-empty groups - eager, lazy or in transition - are
emitted once, at ``revision`` 0, in one batch per punctuation, then
``Punctuation(end(q), "window_end")``. State is bounded by the open windows: partials of eager
groups, tuples of lazy ones, and per-group statistics of the groups with active tuples.
Tuples behind punctuation (docs/design.md, "Punctuation and lateness") count in their windows from
``first_open`` on, as WID Aggregate counts them; those that missed an emitted window go to the late
side stream once.
Early results (``EMIT EVERY``, :meth:`AdaptWIDAggregate.emit_partials`): every open window's
current rows - exactly what punctuation would emit for them now - with ``final = false``: the
windows are those ``first_open`` and above, which the output punctuation does not cover. Only the
folding of switched groups' tuples that punctuation would do first may happen earlier; results
are the same either way.
Time-based sliding and tumbling windows only. A snapshot holds all of the above: the group
table and per-group arrays, the eager state and its ids, B, the thresholds and the counters.
Placement: by the group columns (one worker without them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numba as nb
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.errors import CorruptState
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.placement import Placement
from lowtide.operators.result_rows import Having, ResultRows
from lowtide.operators.window_ids import admit_behind, touched_windows, window_rows
from lowtide.operators.window_logic import WidLogic, logic_of
from lowtide.operators.window_operator import WindowOperator
from lowtide.operators.windows import Sliding, Window
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType
from lowtide.snapshot import (
    ARRAY,
    FLOAT,
    INT,
    INT_MAP,
    INTS,
    NESTED,
    OPTIONAL_ARRAY,
    Field,
    State,
    Versioned,
    as_array,
    as_dict,
    declare,
    fields,
)

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
Arr = npt.NDArray[Any]

LAZY, EAGER, SWITCHING = 0, 1, 2
_EAGER_ID_BYTES = 16  # eid -> group id and the eager id's last window (int64 each)
_MIN_COMPACT = 64
_NO_EXPIRE = np.zeros((0, 0), np.int32)
_FOLD_SHARE = 8  # fold switched groups' tuples out of B at once when they are 1/8 of it


# -- kernels ------------------------------------------------------------------------------------
@nb.njit(cache=True, nogil=True)
def _arrive(gid: I64, vol: I64, mode: I8, high: float) -> tuple[I64, I64, I64]:
    """``winVol += 1`` per tuple; lazy groups passing ``high`` switch (marked SWITCHING, mode
    mutated). Returns (switching groups once each, indexes of eager tuples, of lazy tuples)."""
    n = gid.shape[0]
    switching = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        g = gid[i]
        vol[g] += 1
        if mode[g] == LAZY and vol[g] > high:
            mode[g] = SWITCHING
            switching[k] = g
            k += 1
    eager = np.empty(n, np.int64)
    lazy = np.empty(n, np.int64)
    e = z = 0
    for i in range(n):
        if mode[gid[i]] == LAZY:
            lazy[z] = i
            z += 1
        else:
            eager[e] = i
            e += 1
    return switching[:k], eager[:e], lazy[:z]


@nb.njit(cache=True, nogil=True)
def _admit(ws: I64, we: I64, first_open: int) -> tuple[bool, int]:
    """(some tuple starts below ``first_open``, max wid_end)."""
    below = False
    hw = we[0]
    for i in range(ws.shape[0]):
        if ws[i] < first_open:
            below = True
        if we[i] > hw:
            hw = we[i]
    return below, hw


@nb.njit(cache=True, nogil=True)
def _decrement(vol: I64, gid: Arr) -> None:
    """``winVol -= 1`` for each expired tuple of group ``gid[i]`` (vol mutated)."""
    for i in range(gid.shape[0]):
        vol[gid[i]] -= 1


@nb.njit(cache=True, nogil=True)
def _bookkeep(
    end: I64, wid_base: int, row_of: I64, we: I64, eid: I64, expire: I32, count: bool, until: I64
) -> None:
    """Per eager tuple: ``tupleCnt`` of the partial of its last window (if ``count``; at
    ``row_of[end - 1 - wid_base]``, see :func:`window_rows`) and the last window end ``we`` of its
    eager id (expire, until mutated)."""
    for i in range(eid.shape[0]):
        if count:
            expire[row_of[end[i] - 1 - wid_base], eid[i]] += 1
        if we[i] > until[eid[i]]:
            until[eid[i]] = we[i]


@nb.njit(cache=True, nogil=True)
def _eager_entries(gid: I32, n: int, mode: I8) -> npt.NDArray[np.bool_]:
    """Which of the first ``n`` buffered tuples belong to a group now eager."""
    out = np.empty(n, np.bool_)
    for i in range(n):
        out[i] = mode[gid[i]] == EAGER
    return out


@nb.njit(cache=True, nogil=True)
def _pack(a: Arr, drop: npt.NDArray[np.bool_]) -> None:
    """Move the entries of ``a`` not dropped to its front, in order (mutated)."""
    k = 0
    for i in range(drop.shape[0]):
        if not drop[i]:
            a[k] = a[i]
            k += 1


@nb.njit(cache=True, nogil=True)
def _local_ids(gid: I64, scratch: I64) -> tuple[I64, I64]:
    """Dense ids in order of first appearance: (local id of each entry, group of each local id).
    ``scratch`` is -1 over every group id and is left so."""
    local = np.empty(gid.shape[0], np.int64)
    groups = np.empty(gid.shape[0], np.int64)
    m = 0
    for i in range(gid.shape[0]):
        g = gid[i]
        if scratch[g] < 0:
            scratch[g] = m
            groups[m] = g
            m += 1
        local[i] = scratch[g]
    for j in range(m):
        scratch[groups[j]] = -1
    return local, groups[:m]


def _grown(a: Arr, n: int, fill: Any) -> Arr:
    """``a`` with room for at least ``n`` entries (growing by half), new entries ``fill``."""
    if n <= a.shape[0]:
        return a
    out = np.full(max(n, a.shape[0] + a.shape[0] // 2, 16), fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


class LazyBuffer(Versioned):
    """B: the tuples of lazy groups, each once, as columns.

    ``gid`` int32 (global group id), ``ws`` int64 (first window), ``span`` (windows of the tuple:
    it belongs to ``[ws, ws + span)``; the narrowest unsigned type that holds ``max_span``) and
    every aggregated column in its own dtype. Capacity grows by half and shrinks when half of
    it is unused.
    """

    VERSION = 1

    def __init__(self, value_columns: tuple[str, ...], max_span: int) -> None:
        self.value_columns = value_columns
        self.n = 0
        self.gid = np.empty(0, np.int32)
        self.ws = np.empty(0, np.int64)
        span_type = np.uint8 if max_span < 1 << 8 else np.uint16 if max_span < 1 << 16 else np.int64
        self.span = np.empty(0, span_type)
        self.values: dict[str, Arr] = {}

    def entry_bytes(self) -> int:
        """Bytes per buffered tuple (value columns of unknown dtype count 8)."""
        fixed = self.gid.itemsize + self.ws.itemsize + self.span.itemsize
        return fixed + sum(self.values[c].itemsize if c in self.values else 8 for c in self.value_columns)

    def nbytes(self) -> int:
        fixed = self.gid.nbytes + self.ws.nbytes + self.span.nbytes
        return int(fixed + sum(a.nbytes for a in self.values.values()))

    @property
    def we(self) -> I64:
        """``wid_end`` of every buffered tuple."""
        return self.ends(slice(0, self.n))

    def ends(self, index: I64 | slice) -> I64:
        """``wid_end`` of the buffered tuples ``index``."""
        we: I64 = self.ws[index] + self.span[index].astype(np.int64)
        return we

    def _arrays(self) -> list[Arr]:
        return [self.gid, self.ws, self.span, *self.values.values()]

    def _reallocate(self, cap: int) -> None:
        m = min(cap, self.n)

        def moved(a: Arr) -> Arr:
            out = np.empty(cap, a.dtype)
            out[:m] = a[:m]
            return out

        self.gid, self.ws, self.span = moved(self.gid), moved(self.ws), moved(self.span)
        self.values = {c: moved(a) for c, a in self.values.items()}

    def append(self, gid: I64, ws: I64, we: I64, values: dict[str, Arr]) -> None:
        m = gid.shape[0]
        if m == 0:
            return
        for col in self.value_columns:
            if col not in self.values:
                self.values[col] = np.empty(self.gid.shape[0], values[col].dtype)
        need = self.n + m
        if need > self.gid.shape[0]:
            self._reallocate(max(need, self.gid.shape[0] + self.gid.shape[0] // 2, 64))
        s = slice(self.n, need)
        self.gid[s] = gid
        self.ws[s] = ws
        self.span[s] = we - ws
        for col in self.value_columns:
            self.values[col][s] = values[col]
        self.n = need

    def drop(self, drop: npt.NDArray[np.bool_]) -> None:
        """Remove the entries where ``drop`` (over the first ``n``) holds; the rest keep their order."""
        for a in self._arrays():
            _pack(a, drop)
        self.n -= int(np.count_nonzero(drop))
        if 2 * self.n < self.gid.shape[0] and self.gid.shape[0] > 64:
            self._reallocate(max(self.n + self.n // 4, 64))

    def take(self, index: I64) -> dict[str, Arr]:
        return {c: a[index] for c, a in self.values.items()}

    def save_fields(self) -> dict[str, State]:
        values: dict[str, State] = {c: a[: self.n].copy() for c, a in self.values.items()}
        return {
            "gid": self.gid[: self.n].copy(),
            "ws": self.ws[: self.n].copy(),
            "span": self.span[: self.n].copy(),
            "values": values,
        }

    def load_fields(self, saved: dict[str, State], where: str) -> None:
        found = fields(saved, ("gid", "ws", "span", "values"), where)
        self.gid = as_array(found["gid"], f"{where}.gid", np.int32, 1)
        self.ws = as_array(found["ws"], f"{where}.ws", np.int64, 1)
        self.span = as_array(found["span"], f"{where}.span", self.span.dtype, 1)
        values = as_dict(found["values"], f"{where}.values")
        self.values = {c: as_array(a, f"{where}.values.{c}", ndim=1) for c, a in values.items()}
        self.n = self.gid.shape[0]
        columns = [self.ws, self.span, *self.values.values()]
        if any(a.shape[0] != self.n for a in columns) or not self.values.keys() <= set(self.value_columns):
            raise CorruptState(f"state of {where} does not fit the aggregate: saved by another plan?")


class AdaptWIDAggregate(WindowOperator):
    """WID Aggregate's signature (no lateness) plus the switching thresholds.

    ``high`` / ``low``: fixed ``winVol`` thresholds (lazy -> eager above ``high``, eager -> lazy
    below ``low``); ``None`` derives them from Cond. 6.9 at every punctuation, ``low`` as
    ``hysteresis * high``.
    """

    label = "AdaptWID Aggregate"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE,
        groups=NESTED,
        mode=ARRAY.at("_mode"),
        eid=ARRAY.at("_eid"),
        vol=ARRAY.at("_vol"),
        cells=NESTED,
        expire=OPTIONAL_ARRAY.at("_expire"),
        eid_gid=ARRAY.at("_eid_gid"),
        until=ARRAY.at("_until"),
        eager_width=INT.at("_eager_width"),
        free_eids=INTS.at("_free_eids"),
        row_of=INT_MAP.at("_row_of"),
        free_rows=INTS.at("_free_rows"),
        rows_used=INT.at("_rows_used"),
        buffer=NESTED,
        unfolded=INT.at("_unfolded"),
        first_open=INT,
        hw_end=INT.at("_hw_end"),
        windows_open=INT,
        high=FLOAT,
        low=FLOAT,
        to_eager=INT,
        to_lazy=INT,
        combined=INT,
    )

    def __init__(
        self,
        window: Window,
        group_columns: tuple[str, ...],
        group_types: tuple[ColumnType, ...],
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        decode: Callable[[I64], Any] | None = None,
        high: float | None = None,
        low: float | None = None,
        hysteresis: float = 0.5,
        late_sink: Callable[[Batch], None] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(window, Sliding):
            raise ValueError("AdaptWID evaluates time-based sliding and tumbling windows")
        self.window = window
        self.logic: WidLogic = logic_of(window)
        self.group_columns = group_columns
        self.calls = calls
        self.decode = decode
        self.late_sink = late_sink
        self.results = ResultRows(window, group_columns, group_types, calls, columns, having, decode)
        self.hysteresis = hysteresis
        self.fixed = (high, low)
        # All groups: key -> global id, and per global id mode, eager id and winVol.
        self.groups = GroupTable(len(group_columns))
        self._mode = np.zeros(0, np.int8)
        self._eid = np.zeros(0, np.int32)
        self._vol = np.zeros(0, np.int64)
        # Eager groups: partials per (window row, eager id).
        self.cells = CellState(calls)
        # One window per tuple (RANGE <= SLIDE): tupleCnt is the count n itself.
        self._expire: I32 | None = None if window.range <= window.slide else np.zeros((0, 0), np.int32)
        self._eid_gid = np.zeros(0, np.int64)  # -1: a free eager id
        self._until = np.zeros(0, np.int64)  # exclusive end of the last window of an eager id's partials
        self._eager_width = 0
        self._free_eids: list[int] = []
        self._row_of: dict[int, int] = {}
        self._free_rows: list[int] = []
        self._rows_used = 0
        # Lazy groups: their tuples (the columns the calls read, FILTER's too).
        read = (col for c in calls for col in (c.column, c.valid) if col is not None)
        values = tuple(dict.fromkeys(read))
        self.buffer = LazyBuffer(values, math.ceil(window.range / window.slide))
        self._unfolded = 0  # (about) the tuples of eager groups still in B
        self.first_open = NO_PROGRESS
        self._hw_end = NO_PROGRESS  # exclusive end of the newest window seen
        self.windows_open = math.ceil(window.range / window.slide)  # wed / SLIDE, wed starts at RANGE
        self.overlap = max(window.range / window.slide, 1.0)  # windows per tuple, on average
        self.high = math.inf
        self.low = 0.0
        self._thresholds()
        # What happened, for tests and benchmarks.
        self.to_eager = 0
        self.to_lazy = 0
        self.combined = 0  # results of a group in transition (partial + buffered tuples)

    # -- accounting -------------------------------------------------------------------------
    def state_bytes(self) -> int:
        per_group = self._mode.nbytes + self._eid.nbytes + self._vol.nbytes
        eager = self.cells.nbytes() + self._eid_gid.nbytes + self._until.nbytes + 8 * len(self._free_eids)
        if self._expire is not None:
            eager += self._expire.nbytes
        return int(self.groups.nbytes() + per_group + eager + self.buffer.nbytes())

    def open_windows(self) -> int:
        wids = set(self._row_of)
        if self.buffer.n:
            wids.update(touched_windows(self.buffer.ws[: self.buffer.n], self.buffer.we).tolist())
        return len(wids)

    def eager_groups(self) -> int:
        return int(np.count_nonzero(self._mode[: len(self.groups)] == EAGER))

    def lazy_groups(self) -> int:
        return len(self.groups) - self.eager_groups()

    def describe(self) -> str:
        return f"AdaptWID Aggregate {self.results.describe()}: eager or lazy per group (Cond. 6.9)"

    def placement(self) -> Placement:
        return self.placement_for(self.group_columns)

    @staticmethod
    def placement_for(group_columns: tuple[str, ...]) -> Placement:
        """By the group columns (a time window); one worker without them."""
        return Placement.by_keys(group_columns)

    def _thresholds(self) -> None:
        """Cond. 6.9: eager pays ``aggr`` per open window, lazy ``tup`` per active tuple."""
        high, low = self.fixed
        if high is None:
            aggr = sum(a.itemsize for a in self.cells.arrays.values())
            aggr += self._expire.itemsize if self._expire is not None else 0
            eager_per_tuple = sum(16 + log.values.itemsize for log in self.cells.logs.values()) * self.overlap
            tup = self.buffer.entry_bytes() - eager_per_tuple
            # Every eager group has a cell in every row of the dense state: at least wed / SLIDE.
            cost = aggr * max(self.windows_open, self.cells.shape[0]) + _EAGER_ID_BYTES
            high = cost / tup if tup > 0 else math.inf
        self.high = high
        self.low = low if low is not None else self.hysteresis * high

    # -- input ------------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        ws, we = batch.columns["wid_start"], batch.columns["wid_end"]
        below, hw = _admit(ws, we, self.first_open)
        if below:  # behind punctuation: their open windows only, late for the emitted ones
            batch, ws, we = admit_behind(batch, ws, we, self.first_open, self.late_sink, self.logic)
            if batch.n == 0:
                return
        self._hw_end = max(self._hw_end, int(hw))
        gid = self.groups.ids(key_matrix(batch, self.group_columns))
        self._grow_groups()
        switching, eager, lazy = _arrive(gid, self._vol, self._mode, self.high)
        moved = None
        if switching.shape[0]:
            self._to_eager(switching)
            if _FOLD_SHARE * self._unfolded >= self.buffer.n:
                moved = self._fold()
        value_columns = self.buffer.value_columns
        if lazy.shape[0] == 0:
            values, eid = {c: batch.columns[c] for c in value_columns}, self._eid[gid].astype(np.int64)
        else:
            self.buffer.append(
                gid[lazy], ws[lazy], we[lazy], {c: batch.columns[c][lazy] for c in value_columns}
            )
            values = {c: batch.columns[c][eager] for c in value_columns}
            ws, we, eid = ws[eager], we[eager], self._eid[gid[eager]].astype(np.int64)
        if moved is not None:  # one update for the batch's eager tuples and the groups switching
            values = {c: np.concatenate([values[c], moved[0][c]]) for c in value_columns}
            ws, we, eid = (np.concatenate([a, b]) for a, b in zip((ws, we, eid), moved[1:], strict=True))
        self._add_eager(values, ws, we, eid)

    def _grow_groups(self) -> None:
        n = len(self.groups)
        if n > self._mode.shape[0]:
            self._mode = _grown(self._mode, n, LAZY)
            self._eid = _grown(self._eid, n, -1)
            self._vol = _grown(self._vol, n, 0)

    def _to_eager(self, gids: I64) -> None:
        """Lazy -> eager: each group gets an eager id; its tuples still in B are folded into its
        partials by :meth:`_fold` - at once when they are a fair share of B, else at the next
        punctuation (one scan of B serves many switches)."""
        self.to_eager += gids.shape[0]
        need = gids[self._eid[gids] < 0]
        if need.shape[0]:
            self._eid[need] = self._new_eids(need)
        self._mode[gids] = EAGER
        self._unfolded += int(self._vol[gids].sum())

    def _fold(self) -> tuple[dict[str, Arr], I64, I64, I64] | None:
        """Take the buffered tuples of eager groups out of B: (values, wid_start, wid_end, eid)."""
        self._unfolded = 0
        buffer = self.buffer
        if not buffer.n:
            return None
        moving = _eager_entries(buffer.gid, buffer.n, self._mode)
        index = np.flatnonzero(moving)
        if not index.shape[0]:
            return None
        ws = np.maximum(buffer.ws[index], self.first_open)
        we = buffer.ends(index)
        eid = self._eid[buffer.gid[index]].astype(np.int64)
        moved = (buffer.take(index), ws, we, eid)
        buffer.drop(moving)
        return moved

    def _new_eids(self, gids: I64) -> I64:
        """Eager ids for ``gids``: free ones first, then new columns."""
        k = min(len(self._free_eids), gids.shape[0])
        reused = np.array(self._free_eids[len(self._free_eids) - k :], dtype=np.int64)
        del self._free_eids[len(self._free_eids) - k :]
        fresh = np.arange(self._eager_width, self._eager_width + gids.shape[0] - k, dtype=np.int64)
        self._eager_width += fresh.shape[0]
        self._eid_gid = _grown(self._eid_gid, self._eager_width, -1)
        self._until = _grown(self._until, self._eager_width, NO_PROGRESS)
        eids = np.concatenate([reused, fresh])
        self._eid_gid[eids] = gids
        self._until[eids] = NO_PROGRESS
        return eids

    def _add_eager(self, values: dict[str, Arr], ws: I64, we: I64, eid: I64) -> None:
        """WID's update (Figure 6-4) of the partials ``(window, eid)`` of each tuple."""
        if eid.shape[0] == 0:
            return
        touched = touched_windows(ws, we)
        for w in touched.tolist():
            if w not in self._row_of:
                self._row_of[w] = self._new_row()
        rows = np.array([self._row_of[w] for w in touched.tolist()], dtype=np.int64)
        self.cells.ensure(self._rows_used, self._eager_width)
        self._fit_expire()
        first, end, base, row_of = window_rows(ws, we, touched, rows)
        self.cells.update(Batch(values, eid.shape[0]), first, end, base, row_of, eid)
        expire = self._expire if self._expire is not None else _NO_EXPIRE
        _bookkeep(end, base, row_of, we, eid, expire, self._expire is not None, self._until)

    def _fit_expire(self) -> None:
        if self._expire is None:
            return
        shape = self.cells.shape
        if self._expire.shape != shape:
            grown = np.zeros(shape, np.int32)
            r, c = min(shape[0], self._expire.shape[0]), min(shape[1], self._expire.shape[1])
            grown[:r, :c] = self._expire[:r, :c]
            self._expire = grown

    def _new_row(self) -> int:
        if self._free_rows:
            return self._free_rows.pop()
        self._rows_used += 1
        return self._rows_used - 1

    # -- punctuation ------------------------------------------------------------------------
    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != "wid":
            return
        q = punctuation.value
        if q <= self.first_open:
            return
        if q < END_OF_STREAM and self._hw_end > NO_PROGRESS:
            self.windows_open = max(1, self._hw_end - q + 1)  # wed / SLIDE of the closing window
        if self._unfolded:
            moved = self._fold()
            if moved is not None:
                self._add_eager(*moved)
        self._emit_ready(q)
        self._expire_below(q)
        self.first_open = q
        self._thresholds()
        self._switch_to_lazy()
        self._compact()
        self.emit_progress(END_OF_STREAM if q >= END_OF_STREAM else self.window.end_of(q))

    def _expire_below(self, q: int) -> None:
        """Drop the state of the windows ``< q``: winVol loses the tuples whose last window closed."""
        done = sorted(w for w in self._row_of if w < q)
        width = self._eager_width
        if done:
            rows = np.array([self._row_of.pop(w) for w in done], dtype=np.int64)
            if width:
                counts = self._expire if self._expire is not None else self.cells.arrays["n"]
                expired = counts[rows, :width].sum(axis=0)
                e = np.flatnonzero(expired)
                self._vol[self._eid_gid[e]] -= expired[e]
            self.cells.reset_rows(rows)
            if self._expire is not None:
                self._expire[rows] = 0
            self._free_rows.extend(rows.tolist())
        buffer = self.buffer
        if buffer.n:
            gone = buffer.we <= q
            if gone.any():
                _decrement(self._vol, buffer.gid[: buffer.n][gone])
                buffer.drop(gone)
        # Eager ids whose partials were all emitted: groups with no active tuple, and groups
        # in transition whose last partial is out.
        if width:
            live = np.flatnonzero(self._eid_gid[:width] >= 0)
            g = self._eid_gid[live]
            done_e = live[(self._vol[g] == 0) | ((self._mode[g] == LAZY) & (self._until[live] <= q))]
            if done_e.shape[0]:
                dg = self._eid_gid[done_e]
                self._eid[dg] = -1
                self._mode[dg] = LAZY
                self._eid_gid[done_e] = -1
                self._free_eids.extend(done_e.tolist())

    def _switch_to_lazy(self) -> None:
        width = self._eager_width
        if not width:
            return
        live = np.flatnonzero(self._eid_gid[:width] >= 0)
        g = self._eid_gid[live]
        going = g[(self._mode[g] == EAGER) & (self._vol[g] < self.low)]
        if going.shape[0]:
            self._mode[going] = LAZY  # in transition until its partials are out
            self.to_lazy += going.shape[0]

    def _compact(self) -> None:
        """Forget groups with nothing active (once a third of the table); renumber eager ids when
        half of them are free."""
        width = self._eager_width
        free = len(self._free_eids)
        if width >= _MIN_COMPACT and 2 * free > width:
            keep = self._eid_gid[:width] >= 0
            remap = np.full(width, -1, np.int64)
            kept = np.flatnonzero(keep)
            m = kept.shape[0]
            remap[kept] = np.arange(m)
            self.cells.remap_groups(remap, m)
            cap = max(16, m + m // 4)
            rows_cap = self.cells.shape[0]
            for name, array in self.cells.arrays.items():
                self.cells.arrays[name] = np.ascontiguousarray(array[:, :cap])
            if self._expire is not None:
                shrunk = np.zeros((rows_cap, cap), np.int32)
                shrunk[:, :m] = self._expire[:, kept]
                self._expire = shrunk
            g = self._eid_gid[kept]
            self._eid[g] = np.arange(m, dtype=np.int32)
            self._eid_gid = np.concatenate([g, np.full(cap - m, -1, np.int64)])
            self._until = np.concatenate([self._until[kept], np.full(cap - m, NO_PROGRESS, np.int64)])
            self._eager_width = m
            self._free_eids = []
        n = len(self.groups)
        if n >= _MIN_COMPACT:
            alive = (self._vol[:n] > 0) | (self._eid[:n] >= 0)
            if 3 * int(alive.sum()) < 2 * n:
                kept = np.flatnonzero(alive)
                m = kept.shape[0]
                remap = np.full(n, -1, np.int64)
                remap[kept] = np.arange(m)
                # A new table sized for the groups kept (compact() would keep the old capacity).
                table = GroupTable(self.groups.width)
                table.ids(np.ascontiguousarray(self.groups.keys[kept]))
                self.groups = table
                cap = max(16, m + m // 4)
                self._mode = np.concatenate([self._mode[kept], np.zeros(cap - m, np.int8)])
                self._eid = np.concatenate([self._eid[kept], np.full(cap - m, -1, np.int32)])
                self._vol = np.concatenate([self._vol[kept], np.zeros(cap - m, np.int64)])
                if self.buffer.n:
                    self.buffer.gid[: self.buffer.n] = remap[self.buffer.gid[: self.buffer.n]]
                live = self._eid_gid[: self._eager_width] >= 0
                self._eid_gid[: self._eager_width][live] = remap[self._eid_gid[: self._eager_width][live]]

    # -- emission ---------------------------------------------------------------------------
    def emit_partials(self) -> None:
        """Early results: the rows of every open window as they stand, ``final = false``."""
        if self._unfolded:  # eager groups' tuples leave B first, as before any result
            moved = self._fold()
            if moved is not None:
                self._add_eager(*moved)
        self._emit_ready(END_OF_STREAM, final=False)

    def _emit_ready(self, q: int, final: bool = True) -> None:
        """Emit every non-empty (window < q, group): eager partials straight from the eager
        state; lazy groups and groups in transition from a scratch state T (Figure 6-18).
        ``final`` false: the partial rows of open windows, nothing counted."""
        parts: list[tuple[I64, I64, dict[str, Any]]] = []
        width = self._eager_width
        ready = sorted(w for w in self._row_of if w < q)
        t_cells = (np.empty(0, np.int64),) * 3  # (window, eager row, eager id) of transitional partials
        if ready and width:
            rows = np.array([self._row_of[w] for w in ready], dtype=np.int64)
            wids = np.array(ready, dtype=np.int64)
            owner = self._eid_gid[:width]
            mode = np.where(owner >= 0, self._mode[np.maximum(owner, 0)], -1)
            filled = self.cells.arrays["n"][rows, :width] > 0
            r, e = np.nonzero(filled & (mode == EAGER))
            if r.shape[0]:
                parts.append((wids[r], owner[e], self.cells.finalize(rows[r], e, self.decode)))
            r, e = np.nonzero(filled & (mode == LAZY))
            t_cells = (wids[r], rows[r], e)
        buffer = self.buffer
        index = np.flatnonzero(buffer.ws[: buffer.n] < q) if buffer.n else np.empty(0, np.int64)
        if index.shape[0] or t_cells[0].shape[0]:
            parts.append(self._lazy_results(q, index, *t_cells, count=final))
        if not parts:
            return
        wids = np.concatenate([p[0] for p in parts])
        gids = np.concatenate([p[1] for p in parts])
        values = {
            name: _concat([p[2][name] for p in parts]) for name in parts[0][2]
        }  # calls' outputs, in the same order in every part
        self.emit(self.results.batch(wids, self.groups.keys[gids], values, final=final)[0])

    def _lazy_results(
        self, q: int, index: I64, t_wids: I64, t_rows: I64, t_eids: I64, count: bool = True
    ) -> tuple[I64, I64, dict[str, Any]]:
        """Aggregates of the closing windows of lazy and transitional groups: T starts from the
        transitional partials; the buffered tuples ``index`` are added with WID's kernels.
        ``count``: add the transitional cells to ``combined``."""
        buffer = self.buffer
        b_gid = buffer.gid[index].astype(np.int64)
        ws = np.maximum(buffer.ws[index], self.first_open)
        we = np.minimum(buffer.ends(index), q)
        local, groups = _local_ids(
            np.concatenate([b_gid, self._eid_gid[t_eids]]), np.full(len(self.groups), -1, np.int64)
        )
        b_local, t_local = local[: b_gid.shape[0]], local[b_gid.shape[0] :]
        wins = touched_windows(np.concatenate([ws, t_wids]), np.concatenate([we, t_wids + 1]))
        scratch = CellState(self.calls)
        scratch.ensure(wins.shape[0], groups.shape[0])
        if t_wids.shape[0]:
            self.combined += t_wids.shape[0] if count else 0
            t_row = np.searchsorted(wins, t_wids)
            for name, array in self.cells.arrays.items():
                scratch.arrays[name][t_row, t_local] = array[t_rows, t_eids]
            self._copy_logs(scratch, t_row, t_local, t_rows, t_eids)
        if index.shape[0]:
            addressed = window_rows(ws, we, wins, np.arange(wins.shape[0], dtype=np.int64))
            scratch.update(Batch(buffer.take(index), index.shape[0]), *addressed, b_local)
        r, g = np.nonzero(scratch.arrays["n"][: wins.shape[0], : groups.shape[0]] > 0)
        return wins[r], groups[g], scratch.finalize(r, g, self.decode)

    def _copy_logs(self, scratch: CellState, t_row: I64, t_local: I64, t_rows: I64, t_eids: I64) -> None:
        """Holistic partials of transitional cells: their values, re-addressed to T's cells."""
        width = self._eager_width
        wanted = t_rows * width + t_eids
        order = np.argsort(wanted)
        wanted = wanted[order]
        for col, log in self.cells.logs.items():
            if not log.n:
                continue
            keys = log.rows[: log.n] * width + log.gids[: log.n]
            pos = np.minimum(np.searchsorted(wanted, keys), wanted.shape[0] - 1)
            hit = wanted[pos] == keys
            cell = order[pos[hit]]
            scratch.logs[col].append(t_row[cell], t_local[cell], log.values[: log.n][hit])


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], pa.Array):
        return pa.concat_arrays(parts)
    return np.concatenate(parts)


__all__ = ["AdaptWIDAggregate", "LazyBuffer"]
