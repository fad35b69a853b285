"""Window-id ranges of tagged tuples: the windows a batch touches, and its (window, tuple) pairs.

A tuple tagged by :class:`~lowtide.operators.bucket.Bucket` belongs to the windows
``[wid_start, wid_end)``. The aggregates (WID, AdaptWID, the shared slices and their readers) find
the rows of state a batch needs with :func:`touched_windows` and address them with
:func:`window_rows`, and revisions of late tuples walk every pair with :func:`expand_ranges`.
They take int64 arrays of one length and never loop over tuples in Python. Tuples behind
punctuation enter through :func:`admit_behind` (docs/design.md, "Punctuation and lateness").
"""

from __future__ import annotations

from collections.abc import Callable

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.window_logic import WidLogic

I64 = npt.NDArray[np.int64]

_DENSE_SPAN = 1 << 16


def window_rows(ws: I64, we: I64, windows: I64, rows: I64) -> tuple[I64, I64, int, I64]:
    """How the update kernels find the state rows of the ranges ``[ws[i], we[i])``, given the
    sorted ``windows`` that have rows (``rows[j]`` is the row of ``windows[j]``): ``(ws, we,
    base, row_of)`` such that each window ``w`` in a returned range has its row at
    ``row_of[w - base]`` (-1: a window without a row, skipped).

    Dense over the ids when the windows lie close together (the common case: the ranges as they
    are). Far apart (tuples far apart in event time: ids billions apart in one batch), on the
    windows' ranks instead, each range narrowed to the ranks of its windows that have rows, so
    memory follows the number of windows, never the distance between them."""
    if windows.shape[0] == 0:
        return ws, ws, 0, rows
    base = int(windows[0])
    span = int(windows[-1]) - base + 1
    if span <= max(_DENSE_SPAN, 4 * windows.shape[0]):
        row_of = np.full(span, -1, dtype=np.int64)
        row_of[windows - base] = rows
        return ws, we, base, row_of
    first = np.searchsorted(windows, ws).astype(np.int64)
    return first, np.maximum(np.searchsorted(windows, we).astype(np.int64), first), 0, rows


def touched_windows(ws: I64, we: I64) -> I64:
    """Sorted window ids covered by at least one range ``[ws[i], we[i])``."""
    lo, hi = _span(ws, we)
    if hi <= lo:
        return np.empty(0, np.int64)
    if hi - lo <= max(_DENSE_SPAN, 4 * ws.shape[0]):
        covered: I64 = _covered(ws, we, lo, hi - lo)
        return covered
    return np.unique(expand_ranges(ws, we)[0])


@nb.njit(cache=True, nogil=True)
def _span(ws: I64, we: I64) -> tuple[int, int]:
    """``min(ws)`` and ``max(we)`` in one pass."""
    lo, hi = ws[0], we[0]
    for i in range(ws.shape[0]):
        lo = min(lo, ws[i])
        hi = max(hi, we[i])
    return lo, hi


@nb.njit(cache=True, nogil=True)
def _covered(ws: I64, we: I64, lo: int, span: int) -> I64:
    """The ids in ``[lo, lo + span)`` some range covers: range ends marked, then one scan."""
    edges = np.zeros(span + 1, np.int64)
    for i in range(ws.shape[0]):
        if we[i] > ws[i]:
            edges[ws[i] - lo] += 1
            edges[we[i] - lo] -= 1
    out = np.empty(span, np.int64)
    found = depth = 0
    for j in range(span):
        depth += edges[j]
        if depth > 0:
            out[found] = lo + j
            found += 1
    return out[:found]


def expand_ranges(ws: I64, we: I64) -> tuple[I64, I64]:
    """Every ``(window id, tuple index)`` with ``ws[i] <= w < we[i]``, as two int64 arrays."""
    lengths = np.where(we > ws, we - ws, 0)  # ends may be NO_PROGRESS: never subtract across it
    index = np.repeat(np.arange(ws.shape[0], dtype=np.int64), lengths)
    first = np.cumsum(lengths) - lengths
    return ws[index] + (np.arange(index.shape[0], dtype=np.int64) - first[index]), index


def admit_behind(
    batch: Batch, ws: I64, we: I64, floor: int, late: Callable[[Batch], None] | None, logic: WidLogic
) -> tuple[Batch, I64, I64]:
    """Tuples behind punctuation count in their windows from ``floor`` (the first not emitted)
    on, as if they had come in time; those that missed a window below it are late for the query
    and go to ``late`` once (a sliding window may count them still). Both as the window's
    ``logic`` says (:meth:`~lowtide.operators.window_logic.WidLogic.missed`,
    :meth:`~lowtide.operators.window_logic.WidLogic.still_open`). Returns the tuples still
    counted (``wid_start``/``wid_end`` set to their clipped ranges) and the ranges."""
    missed = logic.missed(ws, we, floor)
    if not missed.any():
        return batch, ws, we
    if late is not None:
        late(batch.select(missed))
    ws, we = logic.still_open(ws, we, floor)
    alive = ws < we
    if not alive.all():
        batch, ws, we = batch.select(alive), ws[alive], we[alive]
    return batch.with_columns({"wid_start": ws, "wid_end": we}), ws, we


__all__ = ["admit_behind", "expand_ranges", "touched_windows"]
