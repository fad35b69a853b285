"""Fused WID Aggregate: Select, Bucket and WID Aggregate in one kernel per batch, fused as in
"Grizzly: Efficient Stream Processing Through Adaptive Query Compilation" (Grulich et al., 2020).

For the commonest filtered window query - a time window counting and summing integer columns, grouped by
one non-float column, behind a WHERE of any conjuncts - the WHERE becomes a mask over the batch
(numpy, no copy of the batch), and one numba loop over the tuples that pass computes each
tuple's window ids (``wids()`` of chapter 5, as Bucket would) and updates count and sums of every
window it falls in: no filtered batch, no window-id columns, one pass over the state instead of
one per accumulator. A batch whose tuples spread over far more windows than it has tuples takes
the unfused path (Bucket's sparse window ranges), with the same result.

Punctuation contract: WID Aggregate's (this is one, fed directly). Stream punctuation ``p`` on
the window attribute completes the windows ``< first_open(p)``: their non-empty groups are
emitted once at ``revision`` 0, then ``Punctuation(end(first open window), "window_end")`` -
exactly what Select -> Bucket -> WID Aggregate promise together. Tuples behind punctuation
(``batch.late``, docs/design.md, "Punctuation and lateness") take Bucket's path and count in their
windows not yet emitted, as WID Aggregate counts them; those that missed an emitted window go to the
late side stream once (:func:`~lowtide.operators.window_ids.admit_behind`). Early results (``EMIT
EVERY``) are WID Aggregate's too: the open windows' rows, ``final = false``, above that
punctuation, no state changed.

Placement: by its group column, as WID Aggregate's for a time window.

It owns a :class:`~lowtide.operators.wid_state.WIDState` as WID Aggregate does, and that is its
whole state (``STATE``): the predicates are configuration, and nothing of a batch outlives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggFunc, AggregateCall, fusable
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.result_rows import Having, ResultRows
from lowtide.operators.select import Predicate
from lowtide.operators.wid_state import WIDState
from lowtide.operators.window_ids import admit_behind
from lowtide.operators.window_logic import WidLogic, logic_of
from lowtide.operators.window_operator import WindowOperator
from lowtide.operators.windows import Sliding
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.schema import ColumnType
from lowtide.snapshot import NESTED, Field, declare

I64 = npt.NDArray[np.int64]
B1 = npt.NDArray[np.bool_]
_SPARSE = 4  # windows per tuple beyond which a batch takes the unfused path


@nb.njit(cache=True, nogil=True)
def _ts_range(ts: I64, rows: I64) -> tuple[int, int]:
    """Smallest and largest ``ts`` of the tuples ``rows`` (not empty)."""
    lo = hi = ts[rows[0]]
    for j in range(rows.shape[0]):
        t = ts[rows[j]]
        lo = min(lo, t)
        hi = max(hi, t)
    return lo, hi


@nb.njit(cache=True, nogil=True)
def _fused_count(
    ts: I64, rows: I64, gid: I64, slide: int, range_: int, wid_base: int, row_of: I64, count: I64, touched: B1
) -> None:
    """count(*) of every window of every tuple ``rows[j]`` (group ``gid[j]``); ``count`` mutated,
    ``touched[w - wid_base]`` set for every window that got a tuple."""
    for j in range(rows.shape[0]):
        t = ts[rows[j]]
        g = gid[j]
        for w in range((t - range_) // slide + 1, t // slide + 1):
            count[row_of[w - wid_base], g] += 1
            touched[w - wid_base] = True


@nb.njit(cache=True, nogil=True)
def _fused_count_sums(
    ts: I64,
    rows: I64,
    gid: I64,
    slide: int,
    range_: int,
    wid_base: int,
    row_of: I64,
    count: I64,
    values: Any,
    sums: Any,
    touched: B1,
) -> None:
    """count(*) and ``sums[a] += values[a]`` (tuples of int64 arrays) in one pass (mutated)."""
    for j in range(rows.shape[0]):
        i = rows[j]
        t = ts[i]
        g = gid[j]
        for w in range((t - range_) // slide + 1, t // slide + 1):
            r = row_of[w - wid_base]
            count[r, g] += 1
            touched[w - wid_base] = True
            for a in range(len(sums)):
                sums[a][r, g] += values[a][i]


class FusedWIDAggregate(WindowOperator):
    label = "Fused WID Aggregate"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(Operator.STATE, state=NESTED)

    def __init__(
        self,
        window: Sliding,
        predicates: list[tuple[Predicate, str]],
        group_columns: tuple[str, ...],
        group_types: tuple[ColumnType, ...],
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        decode: Callable[[I64], Any] | None = None,
        flush: SlowFlush | None = None,
        late_sink: Callable[[Batch], None] | None = None,
    ) -> None:
        assert fusable(calls, group_types) and predicates
        super().__init__()
        self.window = window
        self.logic: WidLogic = logic_of(window)
        self.predicates = predicates
        self.group_columns = group_columns
        self.late_sink = late_sink
        self.sum_columns = tuple(dict.fromkeys(c.column for c in calls if c.func is AggFunc.SUM and c.column))
        results = ResultRows(window, group_columns, group_types, calls, columns, having, decode)
        self.state = WIDState(self, results, flush)

    def placement(self) -> Placement:
        return self.placement_for(self.group_columns)

    @staticmethod
    def placement_for(group_columns: tuple[str, ...]) -> Placement:
        """WID Aggregate's for a time window: by the group column."""
        return Placement.by_keys(group_columns)

    def open_windows(self) -> int:
        return self.state.open_windows()

    def state_bytes(self) -> int:
        return self.state.nbytes()

    def describe(self) -> str:
        where = f" where {' AND '.join(text for _, text in self.predicates)}"
        aggregate = f"WID Aggregate {self.state.results.describe()}"
        return f"Fused Select + Bucket + {aggregate}{where}, {self.window.describe()}: one kernel"

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        columns = batch.columns
        mask = np.ones(batch.n, dtype=np.bool_)
        for predicate, _ in self.predicates:
            mask &= np.asarray(predicate(columns), dtype=np.bool_)
        rows = np.flatnonzero(mask)
        if rows.shape[0] == 0:
            return
        window, state = self.window, self.state
        ts = columns[window.attribute].astype(np.int64, copy=False)
        lo, hi = _ts_range(ts, rows)
        first, last = (lo - window.range) // window.slide + 1, hi // window.slide + 1
        if batch.late:  # behind punctuation: Bucket's path, from the first window not emitted
            ws, we = self.logic.open_for(ts[rows])
            kept, ws, we = admit_behind(
                batch.select(rows), ws, we, state.first_open, self.late_sink, self.logic
            )
            if kept.n:
                state.add(kept, ws, we)
        elif last - first > _SPARSE * rows.shape[0] + 64:
            # Far-apart tuples: Bucket's path allocates rows only for windows holding tuples.
            ws, we = self.logic.open_for(ts[rows])
            state.add(batch.select(rows), ws, we)
        else:
            keys = columns[self.group_columns[0]][rows].astype(np.int64, copy=False)
            gid = state.groups.ids(keys.reshape(-1, 1))
            row_of, new = state.open_range(first, last)
            count = state.cells.arrays["n"]
            touched = np.zeros(last - first, np.bool_)
            if self.sum_columns:
                values = tuple(columns[c].astype(np.int64, copy=False) for c in self.sum_columns)
                sums = tuple(state.cells.arrays[f"sum:{c}"] for c in self.sum_columns)
                _fused_count_sums(
                    ts, rows, gid, window.slide, window.range, first, row_of, count, values, sums, touched
                )
            else:
                _fused_count(ts, rows, gid, window.slide, window.range, first, row_of, count, touched)
            state.release([w for w in new if not touched[w - first]])  # windows between tuples, empty
        state.queue.flush_some(rows.shape[0])

    def emit_partials(self) -> None:
        """Early results: the open windows' current rows, ``final = false``."""
        self.state.emit_partials()

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        """Stream punctuation on the window attribute, as Bucket would turn it into window ids."""
        if punctuation.attribute != self.window.attribute:
            return
        state, q = self.state, self.logic.close_for(punctuation.value)
        if q <= state.first_open:
            return
        state.queue_windows(state.ready(q))
        state.first_open = q
        state.queue.punctuate(END_OF_STREAM if q >= END_OF_STREAM else self.window.end_of(q))


__all__ = ["FusedWIDAggregate"]
