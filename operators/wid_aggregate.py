"""WID Aggregate (Figure 6-4): aggregates per (group, window id), emitted when punctuation covers them.

Input tuples carry ``[wid_start, wid_end)`` from :class:`~lowtide.operators.bucket.Bucket`. Each
tuple updates the cell ``(window, group)`` of every window in its range; a *row* of state holds
one window (for landmark windows one slide, folded into a running prefix at emission).

Punctuation contract. On ``Punctuation(q, "wid")`` every window ``< q`` is complete: its
non-empty groups are emitted once, at ``revision`` 0, in one batch per punctuation, and then
``Punctuation(end(q), "window_end")`` is emitted - no later row of revision 0 has a smaller
``window_end`` (late tuples aside). Without allowed lateness a window's state is dropped as it is
emitted, so state is bounded by the open windows. Under the late policy ``update`` a window's
state stays until ``"wid_retain"`` passes it; late tuples landing in such a window re-emit the
corrected row with ``revision`` + 1 (a group new to an emitted window comes out late, at
``revision`` 0); tuples later than that go to the late side stream.
Behind punctuation (docs/design.md, "Punctuation and lateness"): a tuple below its stream's
punctuation (``batch.late``) counts in every window of it from the first not emitted on, as if it
had come in time; only the windows already emitted see it late
(:func:`~lowtide.operators.window_ids.admit_behind`: once in the late side stream; a landmark counts
it in its first open slide, which every later prefix holds), so no row of revision 0 ever comes
below an output punctuation already published. Under ``update`` the windows retained take it as
revisions; only forgotten ones see it late.
Early results (``EMIT EVERY``): :meth:`WIDAggregate.emit_partials` emits the current rows of
the open windows - ``first_open`` and above, which the output punctuation ``end(first_open)`` does
not cover - with ``final = false`` and changes no state; the row punctuation releases (and each
revision) has ``final = true``. A landmark's open windows are the slides from the first not
emitted to the last holding a tuple, each the running prefix plus the slides up to it, combined in
a scratch row. Tuple windows have none (the planner refuses EMIT on them).
Partitioned tuple windows complete partition by partition: a cell is emitted as soon as its
partition has seen the window's last row. Their only output punctuation is end of stream: the
minimum over partitions includes the partitions not seen yet, which are still at row 0.

Placement: by the group columns of a time window, by the PA columns of a partitioned tuple window,
on one worker otherwise (landmark and unpartitioned tuple windows need every tuple).

A snapshot holds its :class:`~lowtide.operators.wid_state.WIDState` (the group table, the
accumulators with one row per open window, which window has which row, the results still queued
by slow flush) and the landmark and partition progress.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggregateCall
from lowtide.operators.base import Operator
from lowtide.operators.placement import ONE_WORKER, Placement
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.result_rows import Having, ResultRows
from lowtide.operators.wid_state import WIDState
from lowtide.operators.window_ids import admit_behind, expand_ranges
from lowtide.operators.window_logic import WidLogic, logic_of
from lowtide.operators.window_operator import WindowOperator
from lowtide.operators.windows import Landmark, Rows, Sliding, Whole, Window, WindowLimits
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType
from lowtide.snapshot import ARRAY, INT, NESTED, OPTIONAL_INT, Field, declare

I64 = npt.NDArray[np.int64]
LateSink = Callable[[Batch], None]
LANDMARK_CHUNK = 1 << 16  # result rows per batch of a landmark's windows emitted together


class WIDAggregate(WindowOperator):
    label = "WID Aggregate"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE,
        state=NESTED,
        retained_from=INT,
        next_landmark=OPTIONAL_INT.at("_next_landmark"),
        landmark_start=INT.at("_landmark_start"),
        partition_rows=ARRAY.at("_partition_rows"),
        group_partition=ARRAY.at("_group_partition"),
    )

    def __init__(
        self,
        window: Window,
        group_columns: tuple[str, ...],
        group_types: tuple[ColumnType, ...],
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        allowed_lateness: bool = False,
        late_sink: LateSink | None = None,
        decode: Callable[[I64], Any] | None = None,
        flush: SlowFlush | None = None,
        limits: WindowLimits | None = None,
    ) -> None:
        super().__init__()
        self.window = window
        self.logic: WidLogic = logic_of(window)
        self.limits = limits or WindowLimits()
        self.group_columns = group_columns
        self.allowed_lateness = allowed_lateness
        self.late_sink = late_sink
        self.landmark = isinstance(window, Landmark)
        self.partitioned = isinstance(window, Rows) and bool(window.partition)
        results = ResultRows(window, group_columns, group_types, calls, columns, having, decode)
        # flush None: results leave as soon as punctuation completes their window.
        self.state = WIDState(self, results, flush, allowed_lateness, compacts=not self.landmark)
        self.retained_from = NO_PROGRESS
        if self.landmark:
            self._base = self.state.new_row()  # the running prefix of a landmark window
        self._next_landmark: int | None = None  # landmark: the next slide to emit (None: not started)
        self._landmark_start = 0  # landmark: the first slide
        self._partition_rows = np.zeros(0, np.int64)  # tuples seen per partition
        self._group_partition = np.zeros(0, np.int64)

    def placement(self) -> Placement:
        return self.placement_for(self.window, self.group_columns)

    @staticmethod
    def placement_for(window: Window, group_columns: tuple[str, ...]) -> Placement:
        """By the PA columns (a partition's rows are counted on one worker), by the group
        columns of a time window; one worker for landmark and unpartitioned tuple windows."""
        if isinstance(window, Rows):
            return Placement.by_keys(window.partition)
        if isinstance(window, Sliding | Whole):
            return Placement.by_keys(group_columns)
        return ONE_WORKER

    def open_windows(self) -> int:
        return self.state.open_windows()

    def state_bytes(self) -> int:
        return self.state.nbytes()

    def describe(self) -> str:
        return f"WID Aggregate {self.state.results.describe()}"

    # -- input ------------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        ws, we = batch.columns["wid_start"], batch.columns["wid_end"]
        if batch.late:
            # Behind punctuation: emitted windows (under update: forgotten ones) missed it.
            batch, ws, we = admit_behind(batch, ws, we, self._floor(), self.late_sink, self.logic)
            if batch.n == 0:
                return
        if self.partitioned:
            # Every row of a partition counts towards its progress, also rows in no window.
            self._count_partitions(batch.columns["partition"])
            inside = ws < we
            if not inside.all():
                batch, ws, we = batch.select(inside), ws[inside], we[inside]
            if batch.n == 0:
                self._emit_partitions()
                return
        gid = self.state.add(batch, ws, we)
        self.state.queue.flush_some(batch.n)
        if self.partitioned:
            self._map_groups(batch.columns["partition"], gid)
            self._emit_partitions()
        if batch.late and self.allowed_lateness:
            self._revise(ws, np.minimum(we, self.state.first_open), gid)

    def _floor(self) -> int:
        """The first window a tuple behind punctuation still counts in: the first not emitted,
        or under allowed lateness the first retained (emitted ones take it as a revision)."""
        return self.retained_from if self.allowed_lateness else self.state.first_open

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute == "wid_retain":
            self._forget_below(punctuation.value)
            return
        if punctuation.attribute != "wid":
            return
        state, q = self.state, punctuation.value
        if q <= state.first_open:
            return
        if self.landmark:
            self._emit_landmark(q)
        elif self.partitioned:
            if q >= END_OF_STREAM:
                self._emit_partitions(final=True)
        elif self.allowed_lateness:
            # Windows below first_open were emitted already (retained ones re-emit only as revisions).
            state.emit_cells(*state.cells_of(state.ready(q)))
        else:
            state.queue_windows(state.ready(q))
        state.first_open = q
        if not self.partitioned:
            state.queue.punctuate(END_OF_STREAM if q >= END_OF_STREAM else self.window.end_of(q))

    def _forget_below(self, retain: int) -> None:
        if retain <= self.retained_from:
            return
        self.retained_from = retain
        state = self.state
        state.release(sorted(w for w in state.row_of if w < min(retain, state.first_open)))
        state.compact()

    # -- emission ---------------------------------------------------------------------------
    def emit_partials(self) -> None:
        """Early results: the open windows' current rows, ``final = false`` (see the module)."""
        if self.landmark:
            self._landmark_partials()
        elif not isinstance(self.window, Rows):
            self.state.emit_partials()

    def _landmark_partials(self) -> None:
        """The open landmark windows, from the first slide not emitted (or the first slide seen,
        before the landmark starts) to the last slide holding a tuple: a scratch row starts as
        the running prefix and takes in each slide's row in turn; the windows up to the next
        slide holding a tuple are all that row."""
        state = self.state
        if not state.row_of:
            return  # every slide seen is in the prefix already: no open window holds a tuple
        first = self._next_landmark if self._next_landmark is not None else min(state.row_of)
        start = self._landmark_start if self._next_landmark is not None else first
        upper = max(state.row_of) + 1
        self.limits.check_step(self.window, upper - first, "one EMIT EVERY round")
        scratch = state.new_row()
        state.fit()
        self._absorb(scratch, self._base)
        for lo, hi in self._runs(first, upper):
            if lo in state.row_of:
                self._absorb(scratch, state.row_of[lo])
            self._emit_prefix(scratch, lo, hi, start, final=False)
        state.cells.reset_rows(np.array([scratch], np.int64))
        state.free_rows.append(scratch)

    def _runs(self, first: int, upper: int) -> list[tuple[int, int]]:
        """``[first, upper)`` cut at each slide holding a tuple: within a run every window is the
        same prefix (a run starts at ``first`` or at such a slide)."""
        cuts = sorted(w for w in self.state.row_of if first < w < upper)
        bounds = [first, *cuts, upper]
        return [(lo, hi) for lo, hi in pairwise(bounds) if lo < hi]

    def _emit_prefix(self, row: int, lo: int, hi: int, start: int, final: bool = True) -> None:
        """Emit the landmark windows ``[lo, hi)``, each the non-empty groups of prefix ``row``,
        window by window, in batches of about ``LANDMARK_CHUNK`` result rows."""
        state = self.state
        g = np.flatnonzero(state.cells.arrays["n"][row, : len(state.groups)] > 0)
        if g.shape[0] == 0:
            return
        per_chunk = max(1, LANDMARK_CHUNK // g.shape[0])
        rev = state.cells.arrays.get("rev")
        for first in range(lo, hi, per_chunk):
            wids = np.arange(first, min(hi, first + per_chunk), dtype=np.int64)
            if rev is not None and final:
                rev[row, g] = -1  # every window is the prefix's first emission
            rows = np.full(wids.shape[0] * g.shape[0], row, np.int64)
            state.emit_cells(rows, np.tile(g, wids.shape[0]), np.repeat(wids, g.shape[0]), start, final)

    def _absorb(self, scratch: int, row: int) -> None:
        """Combine row ``row`` into the scratch row ``scratch`` (``row`` keeps its cells)."""
        cells = self.state.cells
        both = np.array([scratch, row], np.int64)
        cells.combine_rows(scratch, both, len(self.state.groups), tuple(cells.arrays))
        cells.copy_logs(scratch, both[1:])

    def _revise(self, ws: I64, we_emitted: I64, gid: I64) -> None:
        """Re-emit the cells of already emitted windows that late tuples changed."""
        wids, index = expand_ranges(ws, we_emitted)
        if wids.shape[0] == 0:
            return
        cells = np.unique(np.stack([wids, gid[index]], axis=1), axis=0)  # by window, then group
        wids, gids = cells[:, 0], cells[:, 1]
        windows = np.unique(wids)
        row_of = np.array([self.state.row_of[w] for w in windows.tolist()], np.int64)
        self.state.emit_cells(row_of[np.searchsorted(windows, wids)], gids, wids)

    def _emit_landmark(self, q: int) -> None:
        """Emit every landmark window below ``q``: a run of slides without tuples is the same
        prefix, emitted in chunks; more windows than ``max_windows_per_step`` fail the query
        before anything is emitted."""
        state = self.state
        first = self._next_landmark
        if first is None:
            # The first slide is fixed only once it is complete: until then a tuple of an
            # earlier slide (still at or above the punctuation) may arrive and start the landmark.
            if not state.row_of or min(state.row_of) >= q:
                return
            first = min(state.row_of)
        upper = q if q < END_OF_STREAM else (max(state.row_of) + 1 if state.row_of else first)
        window = self.window
        assert isinstance(window, Landmark)
        what = (
            "the end of the stream"
            if q >= END_OF_STREAM
            else f"punctuation {window.attribute} = {q * window.slide}"
        )
        self.limits.check_step(window, upper - first, what)
        if self._next_landmark is None:
            self._next_landmark = self._landmark_start = first
        for lo, hi in self._runs(first, upper):
            if lo in state.row_of:
                state.cells.merge_row(self._base, state.row_of[lo])
                state.release([lo])
            self._emit_prefix(self._base, lo, hi, self._landmark_start)
        self._next_landmark = max(first, upper)

    def _count_partitions(self, partition: I64) -> None:
        n_part = int(partition.max()) + 1
        if n_part > self._partition_rows.shape[0]:
            grown = np.zeros(max(n_part, 2 * self._partition_rows.shape[0]), np.int64)
            grown[: self._partition_rows.shape[0]] = self._partition_rows
            self._partition_rows = grown
        self._partition_rows[:n_part] += np.bincount(partition, minlength=n_part)

    def _map_groups(self, partition: I64, gid: I64) -> None:
        """Remember the partition of each group (PA columns are part of every group key)."""
        groups = len(self.state.groups)
        if groups > self._group_partition.shape[0]:
            grown = np.zeros(max(groups, 2 * self._group_partition.shape[0]), np.int64)
            grown[: self._group_partition.shape[0]] = self._group_partition
            self._group_partition = grown
        self._group_partition[gid] = partition

    def _emit_partitions(self, final: bool = False) -> None:
        """Emit every cell whose partition has passed the cell's window (tuple windows, PA)."""
        assert isinstance(self.window, Rows)
        state = self.state
        if not state.row_of:
            if final:
                self.emit_progress(END_OF_STREAM)
            return
        n = state.cells.arrays["n"]
        width = len(state.groups)
        frontier = self.window.first_open_many(self._partition_rows)[self._group_partition[:width]]
        rows_l, gids_l, wids_l = [], [], []
        for w in sorted(state.row_of):
            row = state.row_of[w]
            g = np.flatnonzero((n[row, :width] > 0) & ((frontier > w) | final))
            rows_l.append(np.full(g.shape[0], row, np.int64))
            gids_l.append(g)
            wids_l.append(np.full(g.shape[0], w, np.int64))
        rows, gids, wids = np.concatenate(rows_l), np.concatenate(gids_l), np.concatenate(wids_l)
        state.emit_cells(rows, gids, wids)
        state.cells.reset_cells(rows, gids)
        state.release([w for w in state.row_of if not n[state.row_of[w], :width].any()])
        # A partition not seen yet starts at row 0, below every partition seen: until the end
        # of the stream no window end can be promised, whatever the seen partitions reached.
        if final:
            self.emit_progress(END_OF_STREAM)


__all__ = ["WIDAggregate"]
