"""Paned-WID Aggregate (§6.2): a sliding window's aggregates combined from pane partials.

A sliding window ``[RANGE r, SLIDE s]`` is cut into panes of ``p = gcd(r, s)``: the Bucket
before this operator tags each tuple with its pane (a tumbling window of ``p``), and each tuple
updates exactly one cell ``(pane, group)``, however many windows overlap it - where plain WID
updates ``r / s`` cells. A window is the combination of its ``r / p`` panes, computed when it is
emitted. Counts and integer sums are kept differentially: a running window slides to the next
by adding the panes that enter and subtracting those that leave, ``s / p`` panes each way
whatever ``r``. Minima, maxima, float sums and variances are combined from the window's panes
(Chan's formula for variances): exact, with no subtraction of floats. Holistic aggregates
(median, quantile, distinct counts, heavy hitters) keep plain WID.

Punctuation contract. On ``Punctuation(q, "wid")`` (panes ``< q`` complete) every window whose
panes are all complete - ``end(w) <= q * p`` - is emitted once, at ``revision`` 0, its non-empty
groups in one batch, and then ``Punctuation(end(first open window), "window_end")``. A pane's
state is dropped once no open window contains it (and the running window has slid past it), so
state is bounded by the panes of the open windows plus one slide.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from lowtide.operators.aggregates import AggregateCall
from lowtide.operators.wid_aggregate import I64, Having, WIDAggregate, touched_windows
from lowtide.operators.windows import Sliding
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType


def pane_of(window: Sliding) -> Sliding:
    """The tumbling window of panes that ``window`` is cut into."""
    pane = math.gcd(window.range, window.slide)
    return Sliding(pane, pane, window.attribute)


class PanedWIDAggregate(WIDAggregate):
    label = "Paned-WID Aggregate"

    def __init__(
        self,
        window: Sliding,
        group_columns: tuple[str, ...],
        group_types: tuple[ColumnType, ...],
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        decode: Callable[[I64], Any] | None = None,
    ) -> None:
        if any(call.func.holistic for call in calls):
            raise ValueError("holistic aggregates have no pane partials to combine")
        panes = pane_of(window)
        super().__init__(panes, group_columns, group_types, calls, columns, having, decode=decode)
        self.window_out = window
        self.pane = panes.range
        self.panes_per_window = window.range // self.pane
        self.panes_per_slide = window.slide // self.pane
        self._next_window = NO_PROGRESS  # windows below this one were emitted
        self._invertible = self.cells.invertible()
        self._running = self._new_row()  # the invertible accumulators of window _running_window
        self._running_window: int | None = None

    def describe(self) -> str:
        return (
            f"Paned-{super().describe()}: panes of {self.pane}, "
            f"{self.panes_per_window} per window, each tuple updates one pane"
        )

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != "wid" or punctuation.value <= self.first_open:
            return
        q = self.first_open = punctuation.value
        complete = END_OF_STREAM if q >= END_OF_STREAM else q * self.pane
        first_open = self.window_out.first_open(complete)
        self._emit_complete(first_open)
        # A pane is kept while an open window holds it, or the running window must subtract it.
        keep_from = first_open * self.panes_per_slide
        if self._running_window is not None:
            keep_from = min(keep_from, self._running_window * self.panes_per_slide)
        expired = [p for p in self._row_of if first_open >= END_OF_STREAM or p < keep_from]
        self._release(expired)
        self._compact_groups()
        self._punctuate_out(END_OF_STREAM if q >= END_OF_STREAM else self.window_out.end_of(first_open))

    def _emit_complete(self, first_open: int) -> None:
        """Emit the non-empty windows in ``[_next_window, first_open)``, each combined from its panes."""
        if not self._row_of:
            self._next_window = max(self._next_window, first_open)
            return
        panes = np.array(sorted(self._row_of), dtype=np.int64)
        # Windows holding at least one live pane: the windows of each pane's start time.
        ws, we = self.window_out.wids(panes * self.pane)
        candidates = touched_windows(ws, we)
        ready = candidates[(candidates >= self._next_window) & (candidates < first_open)].tolist()
        self._next_window = max(self._next_window, first_open)
        if not ready:
            return
        width = len(self.groups)
        pane_rows = np.array([self._row_of[p] for p in panes.tolist()], dtype=np.int64)
        scratch = [self._new_row() for _ in ready]
        self.cells.ensure(self._rows_used, width)
        n = self.cells.arrays["n"]
        rows_l, gids_l, wids_l = [], [], []
        for w, row in zip(ready, scratch, strict=True):
            self._slide_running(w, panes, pane_rows, width)
            self.cells.copy_row(row, self._running, width, self._invertible)
            lo, hi = self._panes_of(w, panes)
            self.cells.combine_rows(row, pane_rows[lo:hi], width, skip=self._invertible)
            g = np.flatnonzero(n[row, :width] > 0)
            rows_l.append(np.full(g.shape[0], row, np.int64))
            gids_l.append(g)
            wids_l.append(np.full(g.shape[0], w, np.int64))
        self._emit_cells(np.concatenate(rows_l), np.concatenate(gids_l), np.concatenate(wids_l))
        rows = np.array(scratch, dtype=np.int64)
        self.cells.reset_rows(rows)
        self._free.extend(scratch)

    def _panes_of(self, w: int, panes: I64) -> tuple[int, int]:
        """Where the panes of window ``w`` are in the sorted live ``panes``."""
        first = w * self.panes_per_slide
        lo, hi = np.searchsorted(panes, [first, first + self.panes_per_window])
        return int(lo), int(hi)

    def _slide_running(self, w: int, panes: I64, pane_rows: I64, width: int) -> None:
        """Move the running window to ``w``: add the panes that enter, subtract those that leave;
        from scratch when no pane is shared (the first window, or after a gap)."""
        if not self._invertible:
            return
        last = self._running_window
        step = (w - last) * self.panes_per_slide if last is not None else self.panes_per_window
        lo, hi = self._panes_of(w, panes)
        if step >= self.panes_per_window:
            self.cells.reset_rows(np.array([self._running], dtype=np.int64))
            self.cells.shift_row(self._running, pane_rows[lo:hi], pane_rows[:0], width, self._invertible)
        else:
            assert last is not None
            old_lo, old_hi = self._panes_of(last, panes)
            self.cells.shift_row(
                self._running, pane_rows[old_hi:hi], pane_rows[old_lo:lo], width, self._invertible
            )
        self._running_window = w


__all__ = ["PanedWIDAggregate", "pane_of"]
