"""Paned-WID Aggregate (§6.2): a sliding window's aggregates combined from pane partials.

A sliding window ``[RANGE r, SLIDE s]`` is split into a pane-level tumbling query and a
window-level query over its partials. The pane-level query is
:class:`~lowtide.operators.shared_slices.SharedSlices`: each tuple updates exactly one cell
``(slice, group)``, however many windows overlap it - where plain WID updates ``r / s`` cells -
and the slices may serve several queries on the same stream. This operator is the window-level
query: a window is the combination of its ``r / p`` slices (``p`` the slice width, dividing
``gcd(r, s)``), computed when it is emitted. Counts and integer sums are kept differentially: a
running window slides to the next by adding the slices that enter and subtracting those that
leave, ``s / p`` slices each way whatever ``r``. Minima, maxima, float sums and variances are
combined from the window's slices (Chan's formula for variances): exact, with no subtraction of
floats. Holistic aggregates (median, quantile, distinct counts, heavy hitters) read per-slice
summaries that merge: each slice keeps its values once (the exact summary), and a window's
summary is the union of its slices', gathered when it is emitted and freed once it is out.

Punctuation contract. On ``Punctuation(q, "wid")`` from the slices (slices ``< q`` complete)
every window whose slices are all complete - ``end(w) <= q * p`` - is emitted once, at
``revision`` 0, its non-empty groups in one batch, and then ``Punctuation(end(first open
window), "window_end")``. It reads only the slices' generations from its own on, so it counts the
tuples that arrived after it started, like any query. Early results (``EMIT EVERY``,
:meth:`PanedWIDAggregate.emit_partials`): the open windows - from the first not emitted, above that
punctuation - combined from their slices as at emission, with ``final = false``; nothing they
read changes. Its :meth:`keep_from` tells the slices
which it still needs: those of its open windows and of its running window.

Invariant: every window not yet emitted is the combination of its slices' current contents, and
the running window holds the sum of its slices' current contents, so whatever a slice takes
before its last window is emitted counts exactly; queued results of emitted windows are in
scratch rows of their own and never change.

Behind punctuation (docs/design.md, "Punctuation and lateness"). A tuple below its stream's
punctuation (``batch.late``) reaches the slices like any other;
:meth:`PanedWIDAggregate.judge_behind` tells them whether it counts here - it does in each of its
windows from the first not emitted on, as if it had come in time - and sends it once to this query's
late side stream if it missed an emitted window (a sliding window may do both). The slice takes it
when some reader counts it, and this reader's running window takes it too if it has summed the slice
already (:meth:`PanedWIDAggregate.absorb`), so the windows emitted later are exact and no row of
revision 0 ever comes below an output punctuation already published. Its windows end on slice edges,
so under ``error`` :meth:`PanedWIDAggregate.late_mask` tells the same from the punctuation alone.

It reads the slices' group table and accumulators; its own are a
:class:`~lowtide.operators.result_queue.ResultQueue` of the results of complete windows, each
window's cells in a scratch row of the slices until they are out. Placement: the slices', by
their group columns.

A snapshot holds this reader's progress, generation, the row of its running window and the
results it has queued; the rows themselves (running window, scratch) are the slices' state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregate_kernels import expand_cells
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.operators.result_queue import After, ResultQueue, SlowFlush
from lowtide.operators.result_rows import Having, ResultRows
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.wid_state import Cells, nonempty_cells
from lowtide.operators.window_ids import touched_windows, window_rows
from lowtide.operators.window_logic import WidLogic, logic_of
from lowtide.operators.window_operator import WindowOperator
from lowtide.operators.windows import Sliding
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.snapshot import INT, NESTED, OPTIONAL_INT, Field, declare

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

# Windows emitted together at most: a burst (the end of the stream) reuses this many scratch rows.
EMIT_CHUNK = 64


class PanedWIDAggregate(WindowOperator):
    label = "Paned-WID Aggregate"
    # The group table and accumulators it reads are the slices' state, not its own.
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE,
        first_open=INT,
        queue=NESTED,
        next_window=INT.at("_next_window"),
        running=OPTIONAL_INT.at("_running"),
        running_window=OPTIONAL_INT.at("_running_window"),
        generation=INT,
    )

    def __init__(
        self,
        window: Sliding,
        slices: SharedSlices,
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        decode: Callable[[I64], Any] | None = None,
        flush: SlowFlush | None = None,
        late_sink: Callable[[Batch], None] | None = None,
    ) -> None:
        if window.range % slices.width or window.slide % slices.width:
            raise ValueError(f"slices of {slices.width} do not tile windows of {window.describe()}")
        super().__init__()
        self.window = window
        self.logic: WidLogic = logic_of(window)
        self.slices = slices
        self.calls = calls
        self.late_sink = late_sink  # this query's late side stream
        self.results = ResultRows(
            window, slices.group_columns, slices.group_types, calls, columns, having, decode
        )
        self.queue = ResultQueue(self, flush)  # flush None: results leave at their punctuation
        self.pane = slices.width
        self.panes_per_window = window.range // self.pane
        self.panes_per_slide = window.slide // self.pane
        own = CellState(calls)  # names the accumulators this query reads from the shared slices
        names = tuple(own.arrays)
        self.invertible = own.invertible(names)  # kept in the running window
        self._combined = tuple(name for name in names if name not in self.invertible)
        self.summaries = tuple(sorted({c.column for c in calls if c.func.holistic and c.column}))
        self.first_open = NO_PROGRESS  # slices below it are complete
        self._next_window = NO_PROGRESS  # windows below this one were emitted
        self._running: int | None = None  # the row of the invertible accumulators of _running_window
        self._running_window: int | None = None
        self.generation = 0

    def placement(self) -> Placement:
        return self.placement_for(self.slices.group_columns)

    @staticmethod
    def placement_for(group_columns: tuple[str, ...]) -> Placement:
        """The slices': by their group columns (each worker's slices hold whole groups)."""
        return SharedSlices.placement_for(group_columns)

    def attach(self) -> None:
        """Start reading the shared slices: from now on (a new generation if tuples arrived
        before), with the windows the slices' punctuation has completed counted as emitted."""
        self.generation = self.slices.join(self)
        self._running = self.slices.new_row()
        if self.slices.first_open > NO_PROGRESS:
            self.punctuate(Punctuation(self.slices.first_open, "wid"))

    def detach(self) -> None:
        self.slices.leave(self)
        if self._running is not None:
            self.slices.free_rows([self._running])
            self._running = None

    def describe(self) -> str:
        aggregate = f"Paned-WID Aggregate {self.results.describe()}"
        return f"{aggregate}: windows of {self.panes_per_window} slices"

    def keep_from(self) -> int:
        """The first slice this query may still read: its first open window's, or the running
        window's (whose leaving slices are subtracted)."""
        first = self._next_window
        if self._running_window is not None:
            first = min(first, self._running_window)
        return first * self.panes_per_slide

    def process(self, batch: Batch, port: int = 0) -> None:
        raise TypeError("Paned-WID reads its shared slices: tuples go to them")

    # -- tuples behind punctuation (docs/design.md, "Punctuation and lateness") -----------------
    def judge_behind(self, batch: Batch) -> Mask:
        """Which tuples behind punctuation count in a window of this query not yet emitted;
        those that missed an emitted one go to its late side stream, once (a sliding window
        may count them in its open windows too). Its windows end on slice edges, so the slices'
        punctuation ``p // width`` completes exactly the windows ending at or before ``p``: those
        its ``late_mask`` (its logic's ``late_for``) finds at ``p``."""
        values = batch.columns[self.window.attribute].astype(np.int64, copy=False)
        ws, we = self.logic.open_for(values)
        missed = self.logic.missed(ws, we, self._next_window)
        if self.late_sink is not None and missed.any():
            self.late_sink(batch.select(missed))
        ws, we = self.logic.still_open(ws, we, self._next_window)
        counted: Mask = ws < we
        return counted

    def running_holds(self, slices: I64) -> Mask:
        """Which of the ``slices`` the running window has summed already."""
        if self._running_window is None:
            return np.zeros(slices.shape[0], np.bool_)
        first = self._running_window * self.panes_per_slide
        return (slices >= first) & (slices < first + self.panes_per_window)

    def absorb(self, added: Mapping[str, I64], width: int) -> None:
        """Add to the running window what tuples behind punctuation ``added`` to slices it has
        summed already (:meth:`running_holds`): it subtracts a slice's whole content when the
        slice leaves, and the windows it slides to that hold the slice count them."""
        arrays, running = self.slices.cells.arrays, self._running_row()
        for name in self.invertible:
            arrays[name][running, :width] += added[name]

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != "wid" or punctuation.value <= self.first_open:
            return
        q = self.first_open = punctuation.value
        complete = END_OF_STREAM if q >= END_OF_STREAM else q * self.pane
        first_open = self.logic.close_for(complete)
        if first_open > self._next_window:
            self._emit_complete(first_open)
        self.queue.punctuate(END_OF_STREAM if q >= END_OF_STREAM else self.window.end_of(first_open))

    # -- the queue's outlet ---------------------------------------------------------------------
    def emit_cells(self, rows: I64, gids: I64, wids: I64, final: bool = True) -> None:
        slices = self.slices
        if rows.shape[0]:
            self.emit(self.results.of_cells(slices.groups, slices.cells, rows, gids, wids, final=final))

    def free(self, after: After, freed: I64) -> None:
        assert after is After.FREE_ROWS
        self.slices.free_rows(freed.tolist())

    def _emit_complete(self, first_open: int) -> None:
        """Emit the non-empty windows in ``[_next_window, first_open)``, each combined from its slices."""
        panes, pane_rows = self.slices.live(self.generation)
        if not panes.shape[0]:
            self._next_window = max(self._next_window, first_open)
            return
        candidates = self._windows_of(panes)
        ready = candidates[(candidates >= self._next_window) & (candidates < first_open)].tolist()
        self._next_window = max(self._next_window, first_open)
        if not ready:
            return
        width = len(self.slices.groups)
        # Sliding the running window costs about 2 * SLIDE / p + 1 slice rows per window, prefix
        # sums one per live slice: many windows at once (a gap, the end of the stream) take those.
        bulk = len(ready) * (2 * self.panes_per_slide + 1) >= panes.shape[0]
        prefix = self._prefix_sums(pane_rows, width) if bulk else None
        for part in range(0, len(ready), EMIT_CHUNK):
            chunk = ready[part : part + EMIT_CHUNK]
            scratch = [self.slices.new_row() for _ in chunk]
            done = self._combine(chunk, scratch, panes, pane_rows, width, prefix)
            self.queue.put(done, len(chunk), After.FREE_ROWS, np.array(scratch, np.int64))
            if self.queue.flush is None:
                self.queue.drain(None)  # out at once: the next chunk reuses the scratch rows
        if bulk:
            self._running_window = None  # the running window starts afresh

    def emit_partials(self) -> None:
        """Early results: the current rows of the open windows (``_next_window`` and above, each
        holding a live slice), ``final = false``, combined in scratch rows freed at once: the
        running window, the queue and the slices stay as they were."""
        panes, pane_rows = self.slices.live(self.generation)
        if not panes.shape[0]:
            return
        candidates = self._windows_of(panes)
        open_windows = candidates[candidates >= self._next_window].tolist()
        if not open_windows:
            return
        width = len(self.slices.groups)
        prefix = self._prefix_sums(pane_rows, width)
        for part in range(0, len(open_windows), EMIT_CHUNK):
            chunk = open_windows[part : part + EMIT_CHUNK]
            scratch = [self.slices.new_row() for _ in chunk]
            self.emit_cells(*self._combine(chunk, scratch, panes, pane_rows, width, prefix), final=False)
            self.slices.free_rows(scratch)

    def _windows_of(self, panes: I64) -> I64:
        """The windows holding at least one of the sorted live slices ``panes``, sorted."""
        ws, we = self.logic.open_for(panes * self.pane)
        return touched_windows(ws, we)

    def _combine(
        self,
        chunk: list[int],
        scratch: list[int],
        panes: I64,
        pane_rows: I64,
        width: int,
        prefix: dict[str, I64] | None,
    ) -> Cells:
        """Give each window of ``chunk`` (sorted) its accumulators in its ``scratch`` row: the
        invertible ones as differences of ``prefix`` sums (None: by sliding the running window to
        it), the others combined from its slices, its summaries merged; returns the non-empty
        cells, window by window."""
        cells = self.slices.cells
        if prefix is not None:
            self._from_prefix(chunk, scratch, panes, prefix, width)
        for w, row in zip(chunk, scratch, strict=True):
            if prefix is None:
                self._slide_running(w, panes, pane_rows, width)
                cells.copy_row(row, self._running_row(), width, self.invertible)
            if self._combined:
                lo, hi = self._panes_of(w, panes)
                cells.combine_rows(row, pane_rows[lo:hi], width, self._combined)
        if self.summaries:
            self._merge_summaries(chunk, scratch, panes, pane_rows)
        return nonempty_cells(cells, width, list(zip(chunk, scratch, strict=True)))

    def _prefix_sums(self, pane_rows: I64, width: int) -> dict[str, I64]:
        """Per invertible accumulator, the sums of the first ``i`` live slices (row ``i``)."""
        prefix = {}
        for name in self.invertible:
            array = self.slices.cells.arrays[name]
            prefix[name] = np.zeros((pane_rows.shape[0] + 1, width), array.dtype)
            np.cumsum(array[pane_rows, :width], axis=0, out=prefix[name][1:])
        return prefix

    def _from_prefix(
        self, ready: list[int], scratch: list[int], panes: I64, prefix: dict[str, I64], width: int
    ) -> None:
        """The invertible accumulators of the ready windows as differences of prefix sums
        (exact: integers)."""
        first = np.array(ready, np.int64) * self.panes_per_slide
        lo, hi = np.searchsorted(panes, first), np.searchsorted(panes, first + self.panes_per_window)
        rows = np.array(scratch, np.int64)
        for name, sums in prefix.items():
            self.slices.cells.arrays[name][rows, :width] = sums[hi] - sums[lo]

    def _merge_summaries(self, ready: list[int], scratch: list[int], panes: I64, pane_rows: I64) -> None:
        """Give each ready window's scratch row the union of its slices' values, in one pass
        over the value logs: an entry of slice ``s`` goes to every ready window holding ``s``."""
        windows = np.array(ready, np.int64)
        first, last = ready[0], ready[-1] + 1
        # The logs share the slices' rows: one map from row to live slice serves them all.
        logs = [self.slices.cells.logs[col] for col in self.summaries]
        size = max([int(pane_rows.max())] + [int(log.rows[: log.n].max(initial=-1)) for log in logs]) + 1
        slice_of, live = np.zeros(size, np.int64), np.zeros(size, np.bool_)
        slice_of[pane_rows] = panes
        live[pane_rows] = True  # not rows of other generations, readers' running windows or scratch
        for log in logs:
            entries = np.flatnonzero(live[log.rows[: log.n]])
            ws, we = self.logic.open_for(slice_of[log.rows[entries]] * self.pane)
            ws, we = np.maximum(ws, first), np.minimum(we, last)
            rows, gids, index = expand_cells(
                *window_rows(ws, we, windows, np.array(scratch, np.int64)), log.gids[entries]
            )
            log.append(rows, gids, log.values[entries[index]])

    def _running_row(self) -> int:
        assert self._running is not None, "attach() before punctuation"
        return self._running

    def _panes_of(self, w: int, panes: I64) -> tuple[int, int]:
        """Where the panes of window ``w`` are in the sorted live ``panes``."""
        first = w * self.panes_per_slide
        lo, hi = np.searchsorted(panes, [first, first + self.panes_per_window])
        return int(lo), int(hi)

    def _slide_running(self, w: int, panes: I64, pane_rows: I64, width: int) -> None:
        """Move the running window to ``w``: add the slices that enter, subtract those that
        leave; from scratch when none is shared (the first window, or after a gap)."""
        if not self.invertible:
            return
        running, last = self._running_row(), self._running_window
        step = (w - last) * self.panes_per_slide if last is not None else self.panes_per_window
        lo, hi = self._panes_of(w, panes)
        cells = self.slices.cells
        if step >= self.panes_per_window:
            for name in self.invertible:
                cells.arrays[name][running, :width] = 0
            cells.shift_row(running, pane_rows[lo:hi], pane_rows[:0], width, self.invertible)
        else:
            assert last is not None
            old_lo, old_hi = self._panes_of(last, panes)
            cells.shift_row(running, pane_rows[old_hi:hi], pane_rows[old_lo:lo], width, self.invertible)
        self._running_window = w


__all__ = ["PanedWIDAggregate"]
