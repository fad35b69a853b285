"""WID state (Figure 6-4): the cells of open windows and the results leaving them.

:class:`WIDState` is what WID Aggregate and Fused WID each own: a group table, accumulators with
one *row* per open window (for landmark windows one slide) and one column per group, which
window has which row, the first window not yet complete, and the :class:`ResultQueue` of the
results of complete windows. Rows are recycled: a window's row goes back to identity and to the
free list once its results are out. Its owner decides what punctuation completes (plain, landmark
or partitioned windows, revisions); the state adds tuples, finds the cells of windows, queues
or emits them and frees them.

Invariants: a window in ``row_of`` below ``first_open`` has its results queued still, is kept
for revisions (allowed lateness) or is a landmark slide not folded yet; a cell is non-empty iff
its count ``n`` is positive; group ids move (compaction) only while no queued cell waits.
The windows in ``row_of`` from ``first_open`` on are the open ones: early results
(:meth:`WIDState.emit_partials`) are their non-empty cells as they are, state left untouched.

Paned-WID reads the slices' cells instead, with a :class:`ResultQueue` of its own and the two
functions it shares with the slices, :func:`nonempty_cells` and :func:`compact_groups`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregates import CellState
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.result_queue import After, ResultQueue, SlowFlush
from lowtide.operators.result_rows import ResultRows
from lowtide.operators.window_ids import touched_windows, window_rows
from lowtide.punctuation.model import NO_PROGRESS
from lowtide.snapshot import INT, INT_MAP, INTS, NESTED, Field, Stateful, declare

I64 = npt.NDArray[np.int64]
Cells = tuple[I64, I64, I64]  # the cells (state rows, group ids, window ids) of some windows


class WIDState(Stateful):
    """The cells of ``operator``'s open windows and its queued results (an :class:`Outlet`
    of its queue). ``compacts``: whether groups without a cell in any open window are forgotten
    (not for a landmark, whose running prefix is in no window's row)."""

    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        groups=NESTED,
        cells=NESTED,
        row_of=INT_MAP,
        free_rows=INTS,
        rows_used=INT,
        first_open=INT,
        queue=NESTED,
    )

    def __init__(
        self,
        operator: Operator,
        results: ResultRows,
        flush: SlowFlush | None = None,
        track_revisions: bool = False,
        compacts: bool = True,
    ) -> None:
        self.operator = operator
        self.results = results
        self.compacts = compacts
        self.groups = GroupTable(len(results.group_columns))
        self.cells = CellState(results.calls, track_revisions=track_revisions)
        self.row_of: dict[int, int] = {}  # open window -> its row
        self.free_rows: list[int] = []
        self.rows_used = 0
        self.first_open = NO_PROGRESS  # windows below it were emitted (or queued)
        self.queue = ResultQueue(self, flush)

    # -- rows -------------------------------------------------------------------------------
    def new_row(self) -> int:
        """A row at identity (a recycled one first); grow the cells to it with :meth:`fit`."""
        if self.free_rows:
            return self.free_rows.pop()
        self.rows_used += 1
        return self.rows_used - 1

    def fit(self) -> None:
        """Grow the cells to every row and group in use."""
        self.cells.ensure(self.rows_used, len(self.groups))

    def release(self, wids: list[int]) -> None:
        """Forget the windows ``wids``: their rows go back to identity and to the free list."""
        rows = np.array([self.row_of.pop(w) for w in wids], dtype=np.int64)
        self.cells.reset_rows(rows)
        self.free_rows.extend(rows.tolist())

    def open_range(self, first: int, last: int) -> tuple[I64, list[int]]:
        """The rows of the windows ``[first, last)`` (``rows[w - first]``), opening those not
        open yet (returned, to :meth:`release` those no tuple reached); cells fitted."""
        new = [w for w in range(first, last) if w not in self.row_of]
        for w in new:
            self.row_of[w] = self.new_row()
        rows = np.array([self.row_of[w] for w in range(first, last)], dtype=np.int64)
        self.fit()
        return rows, new

    def open_windows(self) -> int:
        return len(self.row_of)

    def nbytes(self) -> int:
        return self.cells.nbytes() + self.groups.nbytes()

    # -- input ------------------------------------------------------------------------------
    def add(self, batch: Batch, ws: I64, we: I64) -> I64:
        """Add every tuple of ``batch`` to the cells of its windows ``[ws, we)``, opening the
        windows it is the first of; returns the tuples' group ids."""
        gid = self.groups.ids(key_matrix(batch, self.results.group_columns))
        touched = touched_windows(ws, we)
        if touched.shape[0] == 0:  # every tuple between windows (SLIDE > RANGE)
            return gid
        for w in touched.tolist():
            if w not in self.row_of:
                self.row_of[w] = self.new_row()
        rows = np.array([self.row_of[w] for w in touched.tolist()], dtype=np.int64)
        self.fit()
        self.cells.update(batch, *window_rows(ws, we, touched, rows), gid)
        return gid

    # -- results ----------------------------------------------------------------------------
    def ready(self, q: int) -> list[int]:
        """The open windows in ``[first_open, q)``, sorted: those punctuation ``q`` completes."""
        return sorted(w for w in self.row_of if self.first_open <= w < q)

    def cells_of(self, wids: list[int]) -> Cells:
        """The non-empty cells of the open windows ``wids``, window by window."""
        return nonempty_cells(self.cells, len(self.groups), [(w, self.row_of[w]) for w in wids])

    def queue_windows(self, wids: list[int]) -> None:
        """Queue the results of the complete windows ``wids``; their state is freed once out."""
        self.queue.put(self.cells_of(wids), len(wids), After.FREE_WINDOWS, np.array(wids, np.int64))

    def emit_cells(
        self, rows: I64, gids: I64, wids: I64, landmark_start: int = 0, final: bool = True
    ) -> None:
        """Emit the result rows of the cells ``(rows[j], gids[j])`` of windows ``wids`` now
        (``final`` false: partial rows of open windows)."""
        if rows.shape[0]:
            batch = self.results.of_cells(self.groups, self.cells, rows, gids, wids, landmark_start, final)
            self.operator.emit(batch)

    def emit_partials(self) -> None:
        """Early results: the current rows of every open window (``first_open`` and above), with
        ``final = false``, window by window; nothing changes (a time window's row is its whole
        window: landmark prefixes are their owner's)."""
        self.emit_cells(*self.cells_of(sorted(w for w in self.row_of if w >= self.first_open)), final=False)

    def emit_progress(self, value: int, attribute: str = "window_end") -> None:
        self.operator.emit_progress(value, attribute)

    def free(self, after: After, freed: I64) -> None:
        assert after is After.FREE_WINDOWS
        self.release(freed.tolist())
        if not self.queue.flushing:  # queued cells keep their group ids
            self.compact()

    def compact(self) -> None:
        """Forget groups that have no cell in any open window (bounded state under key churn)."""
        if self.compacts:
            compact_groups(self.groups, self.cells, list(self.row_of.values()))


def nonempty_cells(cells: CellState, width: int, windows: list[tuple[int, int]]) -> Cells:
    """The non-empty cells of the ``(window id, state row)`` pairs among the first ``width``
    groups: rows, group ids, window ids, in the order of ``windows`` then of groups."""
    n = cells.arrays["n"]
    pairs = np.array(windows, np.int64).reshape(-1, 2)
    rows, gids, wids = [pairs[:0, 1]], [pairs[:0, 1]], [pairs[:0, 0]]
    for lo in range(0, pairs.shape[0], 64):  # 64 rows of counts at a time: no copy of them all
        part = pairs[lo : lo + 64]
        which, groups = np.nonzero(n[part[:, 1], :width] > 0)
        rows.append(part[which, 1])
        gids.append(groups.astype(np.int64, copy=False))
        wids.append(part[which, 0])
    return np.concatenate(rows), np.concatenate(gids), np.concatenate(wids)


def compact_groups(groups: GroupTable, cells: CellState, live_rows: list[int]) -> None:
    """Renumber the groups densely without those that have no cell in ``live_rows``, once they
    are at least half of many groups (compaction copies every cell)."""
    width = len(groups)
    if width < 4096:
        return
    rows = np.array(live_rows, dtype=np.int64)
    live = np.zeros(width, np.bool_)
    if rows.size:
        live = np.asarray(cells.arrays["n"][rows, :width].any(axis=0), dtype=np.bool_)
    if live.sum() * 2 > width:
        return
    remap = groups.compact(live)
    cells.remap_groups(remap, len(groups))


__all__ = ["Cells", "WIDState", "compact_groups", "nonempty_cells"]
