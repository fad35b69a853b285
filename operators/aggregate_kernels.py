"""numba kernels of the aggregate state: per-batch updates of (window row, group) cells.

Layout shared by every kernel: a state array is 2-D ``[row, group]`` where a *row* holds one
window (WID) or one slide (landmark) and a *group* is a dense group id from the group table.
A tuple ``i`` updates the cells ``(row_of[w - wid_base], gid[i])`` for every window id
``w`` in ``[wid_start[i], wid_end[i])`` (the range Bucket tagged it with). ``row_of`` is an int64
lookup array covering ``[wid_base, wid_base + len(row_of))``; -1 marks windows that need no row.

Costs are O(sum over tuples of wid_end - wid_start); none of the kernels allocates per tuple.
NaN inputs (nulls of float columns) are skipped by the value kernels, as SQL aggregates skip nulls.
Callers pass the arrays a kernel only reads through :func:`read_only`: numba compiles one version
per argument type, and read-only is part of the type.
"""

from __future__ import annotations

from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Arr = npt.NDArray[Any]


def read_only(array: Arr) -> Arr:
    """A read-only view of ``array``. A batch that came through shared memory is read-only, one
    built in this process is not: as kernel inputs both are one type, compiled once (a cold start
    compiles each kernel per dtype only)."""
    view = array.view()
    view.flags.writeable = False
    return view


@nb.njit(cache=True, nogil=True)
def update_count(wid_start: I64, wid_end: I64, wid_base: int, row_of: I64, gid: I64, state: I64) -> None:
    """count(*): ``state[row, group] += 1`` for each window of each tuple (state mutated)."""
    for i in range(gid.shape[0]):
        g = gid[i]
        for w in range(wid_start[i], wid_end[i]):
            state[row_of[w - wid_base], g] += 1


@nb.njit(cache=True, nogil=True)
def update_count_valid(
    wid_start: I64, wid_end: I64, wid_base: int, row_of: I64, gid: I64, values: Arr, state: I64
) -> None:
    """count(x): like :func:`update_count` but only for non-NaN ``values`` (state mutated)."""
    for i in range(gid.shape[0]):
        v = values[i]
        if v != v:
            continue
        g = gid[i]
        for w in range(wid_start[i], wid_end[i]):
            state[row_of[w - wid_base], g] += 1


@nb.njit(cache=True, nogil=True)
def update_sum(
    wid_start: I64, wid_end: I64, wid_base: int, row_of: I64, gid: I64, values: Arr, state: Arr
) -> None:
    """sum(x): ``state[row, group] += values[i]``; int64 or float64 state (mutated)."""
    for i in range(gid.shape[0]):
        v = values[i]
        if v != v:
            continue
        g = gid[i]
        for w in range(wid_start[i], wid_end[i]):
            state[row_of[w - wid_base], g] += v


@nb.njit(cache=True, nogil=True)
def update_min(
    wid_start: I64, wid_end: I64, wid_base: int, row_of: I64, gid: I64, values: Arr, state: Arr
) -> None:
    """min(x): state starts at the dtype's maximum (mutated)."""
    for i in range(gid.shape[0]):
        v = values[i]
        if v != v:
            continue
        g = gid[i]
        for w in range(wid_start[i], wid_end[i]):
            r = row_of[w - wid_base]
            if v < state[r, g]:
                state[r, g] = v


@nb.njit(cache=True, nogil=True)
def update_max(
    wid_start: I64, wid_end: I64, wid_base: int, row_of: I64, gid: I64, values: Arr, state: Arr
) -> None:
    """max(x): state starts at the dtype's minimum (mutated)."""
    for i in range(gid.shape[0]):
        v = values[i]
        if v != v:
            continue
        g = gid[i]
        for w in range(wid_start[i], wid_end[i]):
            r = row_of[w - wid_base]
            if v > state[r, g]:
                state[r, g] = v


@nb.njit(cache=True, nogil=True)
def update_moments(
    wid_start: I64,
    wid_end: I64,
    wid_base: int,
    row_of: I64,
    gid: I64,
    values: Arr,
    count: I64,
    mean: F64,
    m2: F64,
) -> None:
    """var/stddev: Welford's update of (count, mean, m2) per cell; numerically stable (mutated)."""
    for i in range(gid.shape[0]):
        v = np.float64(values[i])
        if v != v:
            continue
        g = gid[i]
        for w in range(wid_start[i], wid_end[i]):
            r = row_of[w - wid_base]
            c = count[r, g] + 1
            delta = v - mean[r, g]
            mean[r, g] += delta / c
            m2[r, g] += delta * (v - mean[r, g])
            count[r, g] = c


@nb.njit(cache=True, nogil=True)
def expand_cells(wid_start: I64, wid_end: I64, wid_base: int, row_of: I64, gid: I64) -> tuple[I64, I64, I64]:
    """One (row, group, tuple index) entry per window of each tuple: the log of holistic values.

    Returns three new int64 arrays of length ``sum(wid_end - wid_start)``.
    """
    total = 0
    for i in range(gid.shape[0]):
        total += max(wid_end[i] - wid_start[i], 0)
    rows = np.empty(total, np.int64)
    gids = np.empty(total, np.int64)
    index = np.empty(total, np.int64)
    k = 0
    for i in range(gid.shape[0]):
        for w in range(wid_start[i], wid_end[i]):
            rows[k] = row_of[w - wid_base]
            gids[k] = gid[i]
            index[k] = i
            k += 1
    return rows, gids, index


@nb.njit(cache=True, nogil=True)
def _lerp(a: float, b: float, t: float) -> float:
    """``a`` and ``b`` (``a <= b``) weighted ``1 - t`` and ``t``, as numpy's linear method.

    numpy's own interpolation turns infinities into NaN where the limit is defined (``inf - inf``
    when both neighbours are inf, ``0 * inf`` at weight 0: numpy issues #12282, #21091); here a
    neighbour of weight 0 takes no part and an infinite one wins, so ``q = 0.5`` gives what
    ``numpy.median`` (the mean of the middle pair) gives: NaN only between -inf and +inf.
    """
    if t == 0.0 or a == b:
        return a
    if np.isinf(a) or np.isinf(b):
        return a * (1.0 - t) + b * t  # the infinite end; -inf + inf = NaN
    d = b - a
    return a + d * t if t < 0.5 else b - d * (1.0 - t)  # numpy's _lerp: monotone in t


@nb.njit(cache=True, nogil=True)
def quantiles_of_segments(sorted_values: F64, starts: I64, ends: I64, q: float) -> F64:
    """Linear-interpolated quantile ``q`` of each sorted segment ``[starts[j], ends[j])``.

    ``numpy.quantile(..., method='linear')`` on finite values, with infinities as :func:`_lerp`
    takes them; NaN for an empty segment. O(segments).
    """
    out = np.empty(starts.shape[0], np.float64)
    for j in range(starts.shape[0]):
        n = ends[j] - starts[j]
        if n <= 0:
            out[j] = np.nan
            continue
        pos = q * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        out[j] = _lerp(sorted_values[starts[j] + lo], sorted_values[starts[j] + hi], pos - lo)
    return out


@nb.njit(cache=True, nogil=True)
def distinct_of_segments(sorted_values: Arr, starts: I64, ends: I64) -> I64:
    """Number of distinct values of each sorted segment (NaN entries never reach here)."""
    out = np.zeros(starts.shape[0], np.int64)
    for j in range(starts.shape[0]):
        c = 0
        for k in range(starts[j], ends[j]):
            if k == starts[j] or sorted_values[k] != sorted_values[k - 1]:
                c += 1
        out[j] = c
    return out


@nb.njit(cache=True, nogil=True)
def heavy_hitters_of_segments(sorted_values: Arr, starts: I64, ends: I64, phi: float) -> tuple[I64, Arr, I64]:
    """Values whose frequency is at least ``phi`` times their segment's size.

    Returns (offsets[segments + 1], hitter values, hitter counts); within a segment hitters are
    in ascending value order (the caller reorders by count).
    """
    nseg = starts.shape[0]
    offsets = np.zeros(nseg + 1, np.int64)
    hit_values = np.empty(ends[-1] - starts[0] if nseg else 0, sorted_values.dtype)
    hit_counts = np.empty(hit_values.shape[0], np.int64)
    k = 0
    for j in range(nseg):
        n = ends[j] - starts[j]
        threshold = phi * n
        run = 0
        for t in range(starts[j], ends[j]):
            run += 1
            if t + 1 == ends[j] or sorted_values[t + 1] != sorted_values[t]:
                if run >= threshold:
                    hit_values[k] = sorted_values[t]
                    hit_counts[k] = run
                    k += 1
                run = 0
        offsets[j + 1] = k
    return offsets, hit_values[:k], hit_counts[:k]


@nb.njit(cache=True, nogil=True)
def fold_sum(row: int, dst: I64, src: I64, state: Arr) -> None:
    """``state[row, dst[j]] += state[row, src[j]]`` in order (count, count(x) and sum cells of
    merged sessions). ``dst`` and ``src`` are [m] int64 group ids, no ``dst`` among ``src``;
    state mutated. O(m)."""
    for j in range(dst.shape[0]):
        state[row, dst[j]] += state[row, src[j]]


@nb.njit(cache=True, nogil=True)
def fold_min(row: int, dst: I64, src: I64, state: Arr) -> None:
    """``state[row, dst[j]] = min(it, state[row, src[j]])`` (see :func:`fold_sum`)."""
    for j in range(dst.shape[0]):
        if state[row, src[j]] < state[row, dst[j]]:
            state[row, dst[j]] = state[row, src[j]]


@nb.njit(cache=True, nogil=True)
def fold_max(row: int, dst: I64, src: I64, state: Arr) -> None:
    """``state[row, dst[j]] = max(it, state[row, src[j]])`` (see :func:`fold_sum`)."""
    for j in range(dst.shape[0]):
        if state[row, src[j]] > state[row, dst[j]]:
            state[row, dst[j]] = state[row, src[j]]


@nb.njit(cache=True, nogil=True)
def fold_moments(row: int, dst: I64, src: I64, count: I64, mean: F64, m2: F64) -> None:
    """var/stddev: Chan et al.'s combination of the (count, mean, m2) of cell ``src[j]`` into
    cell ``dst[j]``, in order (see :func:`fold_sum`); the three states mutated."""
    for j in range(dst.shape[0]):
        d, s = dst[j], src[j]
        nb_ = count[row, s]
        if nb_ == 0:
            continue
        na = count[row, d]
        total = na + nb_
        delta = mean[row, s] - mean[row, d]
        mean[row, d] += delta * nb_ / total
        m2[row, d] += m2[row, s] + delta * delta * na * nb_ / total
        count[row, d] = total
