"""Slide-by-tuple Aggregate (§5.1.5, §6.1.4): ``[RANGE r, RATTR ra, SLIDE n ROWS, SATTR row-num|rank(ra)]``.

Windows (Eq. 5.13-5.18). The k-th tuple to arrive here (row-num), or the tuple of rank k in
``(ra, arrival)`` order over the whole stream (rank(ra)), defines a window iff ``k % n == 0``; the
window id is its ``ra`` (a set: equal ``ra`` values define one window) and
``extent(w) = {u : w - r < u.ra <= w}`` over all groups. Each group with a tuple in the extent
gives one row; ``window_start = w - r + 1`` and ``window_end = w + 1`` bound the extent half-open.

Implementation. Window ids need forward context, so tuples are kept in two parts: *pending*
tuples (``ra >= p``, the last punctuation; arrival order) and *settled* tuples (``ra < p``, sorted
by ``(ra, arrival)``). Below ``p`` nothing more can arrive, so settled tuples, their ranks and the
windows they define are final, and punctuation ``p'`` only appends the pending tuples below
``p'``. The windows ``w < p'`` are then swept in increasing ``w`` by a sliding aggregate that
persists across punctuations: a tuple enters at ``ra <= w`` and leaves at ``ra <= w - r``; each
group is a FIFO under the two-stacks algorithm (suffix aggregates of the front, a running
aggregate of the back), so count, sum, min, max, avg and var cost O(1) amortised per tuple and
per output row, exactly: nothing is ever subtracted (no float cancellation). This replaces the
bins of Figure 6-7, which touch every bin in ``[Ss, Es)`` per tuple. Holistic aggregates gather
the values of each output cell's extent (O(extent) per row, chunked).

Punctuation contract. On ``Punctuation(p, ra)`` every window ``w < p`` is complete: its rows
are emitted once, in one batch (by window, then group id as in WID Aggregate), at ``revision`` 0, then
``Punctuation(p, "window_end")``: every later row has ``window_end > p``. Punctuation that does
not advance is ignored; END_OF_STREAM flushes everything and passes through. Input tuples must
have ``ra`` at or above the last punctuation (others are dropped, uncounted).

State. Settled tuples with ``ra > p - r`` (the only ones a window ``w >= p`` can need; dead ones
are compacted away once they are half the buffer), pending tuples and, for row-num, the ids of
pending windows; per group O(1) sweep state; groups without stored tuples are compacted. A
snapshot holds all of it, the store cut to its tuples. Placement: one worker (windows are
defined by arrival order or ranks over the whole stream).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numba as nb
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.errors import CorruptState
from lowtide.operators import aggregate_kernels as kernels
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.placement import ONE_WORKER, Placement
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType
from lowtide.snapshot import ARRAY, DATA, INT, NESTED, Field, State, Versioned, as_array, declare, fields
from lowtide.strings import NULL_CODE

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Arr = npt.NDArray[Any]
Having = Callable[[dict[str, Any]], npt.NDArray[np.bool_]]

_HEAD, _TAIL, _BND, _CNT, _POS = 0, 1, 2, 3, 4  # per-group sweep state columns
_SUM, _MIN, _MAX, _MOMENTS, _PART = 0, 1, 2, 3, 4  # ops of accumulator columns
_HOLISTIC_BUDGET = 1 << 22  # (cell, value) entries gathered per chunk of windows
_I64_MAX, _I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


@nb.njit(cache=True, nogil=True)
def _fold(
    iop: I64, fop: I64, xi: I64, xf: F64, x: int, yi: I64, yf: F64, y: int, zi: I64, zf: F64, z: int
) -> None:
    """Row ``z`` of (zi, zf) = row ``x`` ⊕ row ``y``; moments combine by Chan et al. (z may alias)."""
    for j in range(iop.shape[0]):
        a, b, o = xi[x, j], yi[y, j], iop[j]
        zi[z, j] = a + b if o == _SUM else (min(a, b) if o == _MIN else max(a, b))
    j = 0
    while j < fop.shape[0]:
        o = fop[j]
        if o == _MOMENTS:
            na, ma, sa = xf[x, j], xf[x, j + 1], xf[x, j + 2]
            nb_, mb, sb = yf[y, j], yf[y, j + 1], yf[y, j + 2]
            n, d = na + nb_, mb - ma
            zf[z, j] = n
            zf[z, j + 1] = ma + d * (nb_ / n) if n > 0 else 0.0
            zf[z, j + 2] = sa + sb + d * d * (na * nb_ / n) if n > 0 else 0.0
            j += 3
        else:
            a, b = xf[x, j], yf[y, j]
            zf[z, j] = a + b if o == _SUM else (min(a, b) if o == _MIN else max(a, b))
            j += 1


@nb.njit(cache=True, nogil=True)
def _link(gid: I64, nxt: I64, last: I64, start: int, end: int) -> None:
    """Chain appended tuples ``[start, end)`` to the previous tuple of their group (mutates)."""
    for i in range(start, end):
        g = gid[i]
        if last[g] >= 0:
            nxt[last[g]] = i
        last[g] = i
        nxt[i] = -1


# The kernels share the state tuple ``st`` = (ra, gid, nxt, iv, fv, fi, ff, iop, fop, iid, fid, gs, bi,
# bf, active, ptr, scratch): store columns (per settled tuple: ``ra``, group id, next tuple of its
# group, accumulator values ``iv``/``fv`` and front suffix aggregates ``fi``/``ff``), accumulator ops
# and identities, per-group state ``gs`` [HEAD, TAIL, BND (last front tuple, -1: front empty), CNT,
# POS in ``active``] with back aggregates ``bi``/``bf``, the active group ids, ``ptr`` = [lo, hi,
# active count] (tuples ``[lo, hi)`` are in the sliding window) and a scratch buffer.
@nb.njit(cache=True, nogil=True, inline="always")
def _add(i: int, st: tuple[Any, ...]) -> None:
    """Tuple ``i`` enters its group's FIFO at the back."""
    _, gid, _, iv, fv, _, _, iop, fop, iid, fid, gs, bi, bf, active, ptr, _ = st
    g = gid[i]
    if gs[g, _CNT] == 0:
        gs[g, _HEAD], gs[g, _BND], gs[g, _POS] = i, -1, ptr[2]
        active[ptr[2]] = g
        ptr[2] += 1
        bi[g, :] = iid
        bf[g, :] = fid
    gs[g, _TAIL] = i
    gs[g, _CNT] += 1
    _fold(iop, fop, bi, bf, g, iv, fv, i, bi, bf, g)


@nb.njit(cache=True, nogil=True, inline="always")
def _evict(i: int, st: tuple[Any, ...]) -> None:
    """Tuple ``i`` (the front of its group's FIFO) leaves; flips the back when the front is empty."""
    _, gid, nxt, iv, fv, fi, ff, iop, fop, iid, fid, gs, bi, bf, active, ptr, scratch = st
    g = gid[i]
    if gs[g, _BND] < 0:  # front empty: the back becomes the front, with suffix aggregates
        k, j, t = 1, gs[g, _HEAD], gs[g, _TAIL]
        scratch[0] = j
        while j != t:
            j = scratch[k] = nxt[j]
            k += 1
        fi[t, :] = iv[t, :]
        ff[t, :] = fv[t, :]
        for q in range(k - 2, -1, -1):
            _fold(iop, fop, iv, fv, scratch[q], fi, ff, scratch[q + 1], fi, ff, scratch[q])
        gs[g, _BND] = t
        bi[g, :] = iid
        bf[g, :] = fid
    if gs[g, _BND] == i:
        gs[g, _BND] = -1
    gs[g, _HEAD] = nxt[i]
    gs[g, _CNT] -= 1
    if gs[g, _CNT] == 0:
        ptr[2] -= 1
        moved = active[ptr[2]]
        active[gs[g, _POS]] = moved
        gs[moved, _POS] = gs[g, _POS]


@nb.njit(cache=True, nogil=True)
def _sweep(
    st: tuple[Any, ...], n: int, wins: I64, j0: int, j1: int, r: int, out: tuple[Any, ...]
) -> tuple[int, int]:
    """Rows of windows ``wins[j0:j1]`` (sorted) into ``out`` = (window index, group, count, int and
    float accumulators) until it is full. Returns (next window index, rows written); the sliding
    window covers the first ``n`` tuples of the store. O(tuples passed + rows written).
    """
    ra, _, _, _, _, fi, ff, iop, fop, _, _, gs, bi, bf, active, ptr, _ = st
    out_w, out_g, out_n, out_i, out_f = out
    m, j = 0, j0
    while j < j1:
        w = wins[j]
        while ptr[1] < n and ra[ptr[1]] <= w:
            _add(ptr[1], st)
            ptr[1] += 1
        while ptr[0] < ptr[1] and ra[ptr[0]] <= w - r:
            _evict(ptr[0], st)
            ptr[0] += 1
        if m + ptr[2] > out_w.shape[0]:
            break
        active[: ptr[2]].sort()  # rows by group id
        for q in range(ptr[2]):
            g = active[q]
            gs[g, _POS] = q
            out_w[m], out_g[m], out_n[m] = j, g, gs[g, _CNT]
            if gs[g, _BND] < 0:
                out_i[m, :] = bi[g, :]
                out_f[m, :] = bf[g, :]
            else:
                _fold(iop, fop, fi, ff, gs[g, _HEAD], bi, bf, g, out_i, out_f, m)
            m += 1
        j += 1
    return j, m


@nb.njit(cache=True, nogil=True)
def _expire(st: tuple[Any, ...], n: int, bound: int) -> None:
    """Move the sliding window past every tuple with ``ra <= bound`` (no window needs them)."""
    ra, ptr = st[0], st[15]
    while ptr[0] < ptr[1] and ra[ptr[0]] <= bound:
        _evict(ptr[0], st)
        ptr[0] += 1
    if ptr[0] == ptr[1]:
        while ptr[0] < n and ra[ptr[0]] <= bound:
            ptr[0] += 1
        ptr[1] = ptr[0]


class _ColumnQueue(Versioned):
    """Columns with amortised append at the back and drop at the front (first axis = tuples)."""

    VERSION = 1

    def __init__(self, spec: dict[str, tuple[np.dtype[Any], int]]) -> None:
        self.cols: dict[str, Arr] = {
            name: np.empty((0,) if width < 0 else (0, width), dtype) for name, (dtype, width) in spec.items()
        }
        self.n = 0

    def append(self, parts: dict[str, Arr], m: int) -> None:
        need = self.n + m
        for name, col in self.cols.items():
            if need > col.shape[0]:
                # zeros, not empty: a column no part fills (the kernel's scratch) is saved in
                # checkpoints, which must hold no stray bytes of the process's memory
                grown = np.zeros((max(need, 2 * col.shape[0], 1024), *col.shape[1:]), col.dtype)
                grown[: self.n] = col[: self.n]
                self.cols[name] = col = grown
            if name in parts:
                col[self.n : need] = parts[name]
        self.n = need

    def drop_front(self, k: int) -> None:
        for col in self.cols.values():
            col[: self.n - k] = col[k : self.n]
        self.n -= k

    def nbytes(self) -> int:
        return int(sum(col.nbytes for col in self.cols.values()))

    def save_fields(self) -> dict[str, State]:
        return {name: col[: self.n].copy() for name, col in self.cols.items()}

    def load_fields(self, saved: dict[str, State], where: str) -> None:
        found = fields(saved, self.cols, where)
        cols = {
            name: as_array(found[name], f"{where}.{name}", col.dtype, col.ndim)
            for name, col in self.cols.items()
        }
        n = cols["ra"].shape[0]
        if any(col.shape[0] != n or col.shape[1:] != self.cols[name].shape[1:] for name, col in cols.items()):
            raise CorruptState(f"state of {where} does not fit the aggregate: saved by another plan?")
        self.cols, self.n = cols, n


def _filled(old: Arr, rows: int, fill: Any) -> Arr:
    """``old`` resized to ``rows`` rows, new rows set to ``fill``."""
    out = np.empty((rows, *old.shape[1:]), old.dtype)
    out[...] = fill
    out[: min(rows, old.shape[0])] = old[:rows]
    return out


class SlideByTupleAggregate(Operator):
    label = "Slide-by-tuple Aggregate"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE,
        groups=NESTED,
        store=NESTED.at("_store"),
        ptr=ARRAY.at("_ptr"),
        gs=ARRAY.at("_gs"),
        bi=ARRAY.at("_bi"),
        bf=ARRAY.at("_bf"),
        last=ARRAY.at("_last"),
        active=ARRAY.at("_active"),
        pending=DATA.at("_pending"),
        pending_wins=DATA.at("_pending_wins"),
        seen=INT.at("_seen"),
        p=INT.at("_p"),
        groups_compacted=INT.at("_groups_compacted"),
    )

    def __init__(
        self,
        range_: int,
        rattr: str,
        slide_rows: int,
        by_rank: bool,
        group_columns: tuple[str, ...],
        group_types: tuple[ColumnType, ...],
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        decode: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        super().__init__()
        if range_ < 1 or slide_rows < 1:
            raise ValueError("RANGE and SLIDE must be positive")
        self.range, self.rattr, self.slide_rows, self.by_rank = range_, rattr, slide_rows, by_rank
        self.group_columns, self.group_types, self.calls = group_columns, group_types, calls
        self._string_columns = {
            c.column for c in calls if c.input_type is not None and c.input_type.is_string
        }
        self.columns, self.having, self.decode = columns, having, decode
        self.groups = GroupTable(len(group_columns))
        cells = CellState(calls)
        self._holistic = {col: log.values.dtype for col, log in cells.logs.items()}
        self._filters = cells.filters  # column -> the bool column whose rows feed it (FILTER)
        read = {c.column for c in calls if c.column is not None}
        self._value_cols = sorted(read | set(self._filters.values()))
        # CellState's accumulators (but "n") as columns of an int64 and a float64 matrix:
        # (name, kind, matrix, column); moments take three float columns (count, mean, m2).
        self._prims: list[tuple[str, str, str, int]] = []
        ops: dict[str, list[int]] = {"i": [], "f": []}
        ids: dict[str, list[Any]] = {"i": [], "f": []}
        for name, array in cells.arrays.items():
            kind, _, col = name.partition(":")
            if kind in ("n", "mean", "m2"):
                continue
            if kind == "mcount":
                for j, part in enumerate(("mcount", "mean", "m2")):
                    self._prims.append((f"{part}:{col}", part, "f", len(ops["f"]) + j))
                ops["f"] += [_MOMENTS, _PART, _PART]
                ids["f"] += [0.0, 0.0, 0.0]
                continue
            matrix = "i" if array.dtype == np.int64 else "f"
            op = {"min": _MIN, "max": _MAX}.get(kind, _SUM)
            self._prims.append((name, kind, matrix, len(ops[matrix])))
            ops[matrix].append(op)
            ids[matrix].append([0, _I64_MAX, _I64_MIN][op] if matrix == "i" else [0.0, np.inf, -np.inf][op])
        self._iop, self._fop = np.array(ops["i"], np.int64), np.array(ops["f"], np.int64)
        self._iid, self._fid = np.array(ids["i"], np.int64), np.array(ids["f"], np.float64)
        i64, f64, pi, pf = np.dtype(np.int64), np.dtype(np.float64), len(ops["i"]), len(ops["f"])
        spec: dict[str, tuple[np.dtype[Any], int]] = dict.fromkeys(("ra", "gid", "nxt", "scratch"), (i64, -1))
        spec |= {"iv": (i64, pi), "fi": (i64, pi), "fv": (f64, pf), "ff": (f64, pf)}
        spec |= {f"h:{col}": (dtype, -1) for col, dtype in self._holistic.items()}
        self._masks = {col: self._filters[col] for col in self._holistic if col in self._filters}
        spec |= {f"h:{mask}": (np.dtype(np.bool_), -1) for mask in self._masks.values()}
        self._store = _ColumnQueue(spec)
        self._ptr = np.zeros(3, np.int64)  # sliding window [lo, hi) of the store; active groups
        self._gs = np.zeros((0, 5), np.int64)
        self._bi, self._bf = np.zeros((0, pi), np.int64), np.zeros((0, pf), np.float64)
        self._last = np.zeros(0, np.int64)  # last stored tuple of each group (-1: none)
        self._active = np.zeros(0, np.int64)
        self._pending: list[dict[str, Arr]] = []
        self._pending_wins: list[I64] = []  # row-num: ids of windows not yet complete
        self._seen = 0  # tuples arrived (row-num) / settled (rank)
        self._p = NO_PROGRESS
        self._groups_compacted = 0

    # -- reporting ------------------------------------------------------------------------
    def placement(self) -> Placement:
        return self.placement_for()

    @staticmethod
    def placement_for() -> Placement:
        return ONE_WORKER  # ranks and row numbers are over the whole stream

    def describe(self) -> str:
        by = f" by {', '.join(self.group_columns)}" if self.group_columns else ""
        aggs = ", ".join(call.describe() for call in self.calls)
        sattr = f"rank({self.rattr})" if self.by_rank else "row-num"
        return (
            f"Slide-by-tuple Aggregate {aggs}{by} RANGE {self.range} on {self.rattr}, "
            f"SLIDE {self.slide_rows} rows by {sattr}"
        )

    def state_bytes(self) -> int:
        arrays = [self._gs, self._bi, self._bf, self._last, self._active, *self._pending_wins]
        arrays += [a for part in self._pending for a in part.values()]
        return int(self._store.nbytes() + sum(a.nbytes for a in arrays) + self.groups.nbytes())

    def open_windows(self) -> int:
        """Pending window ids (rank(ra): the defining ranks among pending tuples, an upper bound)."""
        if self.by_rank:
            pending = sum(len(part["ra"]) for part in self._pending)
            return (self._seen + pending) // self.slide_rows - self._seen // self.slide_rows
        return int(np.unique(np.concatenate(self._pending_wins)).shape[0]) if self._pending_wins else 0

    # -- input ----------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        ra = batch.columns[self.rattr].astype(np.int64, copy=False)
        if ra.min() < self._p:  # late: the caller's contract says this does not happen
            batch, ra = batch.select(ra >= self._p), ra[ra >= self._p]
            if batch.n == 0:
                return
        gid = self.groups.ids(key_matrix(batch, self.group_columns))
        if len(self.groups) > self._gs.shape[0]:
            self._resize_groups(max(len(self.groups), 2 * self._gs.shape[0], 16))
        self._pending.append({"ra": ra, "gid": gid, **{c: batch.columns[c] for c in self._value_cols}})
        if not self.by_rank:
            first = -(self._seen + 1) % self.slide_rows
            self._pending_wins.append(ra[first :: self.slide_rows])
            self._seen += batch.n

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != self.rattr or punctuation.value <= self._p:
            return
        p = punctuation.value
        start, end = self._settle(p)
        if self.by_rank:
            first = -(self._seen + 1) % self.slide_rows
            wins = np.unique(self._store.cols["ra"][start + first : end : self.slide_rows])
            self._seen += end - start
        else:
            ids = np.concatenate(self._pending_wins) if self._pending_wins else np.zeros(0, np.int64)
            wins = np.unique(ids[ids < p])
            self._pending_wins = [np.unique(ids[ids >= p])]
        if wins.shape[0]:
            self._emit_windows(wins)
        self._p = p
        _expire(self._state(), self._store.n, max(NO_PROGRESS, p - self.range))
        self._compact()
        self.emit_punctuation(Punctuation(min(p, END_OF_STREAM), "window_end"))

    def _settle(self, p: int) -> tuple[int, int]:
        """Append the pending tuples below ``p`` to the store in (ra, arrival) order."""
        start = self._store.n
        if not self._pending:
            return start, start
        pend = {name: np.concatenate([part[name] for part in self._pending]) for name in self._pending[0]}
        below = pend["ra"] < p
        rest = {name: values[~below] for name, values in pend.items()}
        self._pending = [rest] if rest["ra"].shape[0] else []
        m = int(below.sum())
        if m == 0:
            return start, start
        order = np.flatnonzero(below)[np.argsort(pend["ra"][below], kind="stable")]
        new = {name: values[order] for name, values in pend.items()}
        iv, fv = self._matrices(m)
        for name, kind, matrix, j in self._prims:  # accumulator values; nulls are the identity
            column = name.partition(":")[2]
            col = new[column]
            valid = self._valid(column, col)
            if column in self._filters:  # FILTER: the rows it drops are nulls here
                valid &= new[self._filters[column]]
                col = np.where(valid, col, self._iid[j]) if matrix == "i" and kind != "count" else col
            if matrix == "i":
                iv[:, j] = valid if kind == "count" else col
            elif kind in ("min", "max"):
                fv[:, j] = np.where(valid, col, np.inf if kind == "min" else -np.inf)
            else:
                fv[:, j] = valid if kind == "mcount" else 0.0 if kind == "m2" else np.where(valid, col, 0.0)
        parts = {"ra": new["ra"], "gid": new["gid"], "iv": iv, "fv": fv}
        parts |= {f"h:{col}": new[col].astype(dtype, copy=False) for col, dtype in self._holistic.items()}
        parts |= {f"h:{mask}": new[mask] for mask in self._masks.values()}
        self._store.append(parts, m)
        _link(self._store.cols["gid"], self._store.cols["nxt"], self._last, start, start + m)
        return start, start + m

    def _matrices(self, m: int) -> tuple[I64, F64]:
        return np.empty((m, self._iop.shape[0]), np.int64), np.empty((m, self._fop.shape[0]), np.float64)

    def _state(self) -> tuple[Any, ...]:
        c = self._store.cols
        return (
            c["ra"], c["gid"], c["nxt"], c["iv"], c["fv"], c["fi"], c["ff"], self._iop, self._fop, self._iid,
            self._fid, self._gs, self._bi, self._bf, self._active, self._ptr, c["scratch"],
        )  # fmt: skip

    # -- emission -------------------------------------------------------------------------
    def _emit_windows(self, wins: I64) -> None:
        """One batch with the rows of the sorted windows ``wins`` (all complete)."""
        ra = self._store.cols["ra"][: self._store.n]
        bounds = [0, wins.shape[0]]
        if self._holistic:  # chunks of windows whose extents hold at most the budget of entries
            sizes = np.searchsorted(ra, wins, "right") - np.searchsorted(ra, wins - self.range, "right")
            cut = np.cumsum(sizes) // _HOLISTIC_BUDGET
            bounds = [0, *(np.flatnonzero(np.diff(cut)) + 1).tolist(), wins.shape[0]]
        parts: list[dict[str, Any]] = []
        cap = max(1 << 15, len(self.groups))  # every window fits: at most one row per group
        for a, b in itertools.pairwise(bounds):
            j = a
            while j < b:
                out = (*(np.empty(cap, np.int64) for _ in range(3)), *self._matrices(cap))
                nxt_j, m = _sweep(self._state(), self._store.n, wins, j, b, self.range, out)
                parts.append(self._finalize(wins, j, nxt_j, tuple(column[:m] for column in out)))
                j = nxt_j
        columns = {
            name: pa.concat_arrays(vals) if isinstance(vals[0], pa.Array) else np.concatenate(vals)
            for name in parts[0]
            for vals in [[part[name] for part in parts]]
        }
        if self.having is not None:
            keep = self.having(columns)
            columns = {k: v.filter(keep) if isinstance(v, pa.Array) else v[keep] for k, v in columns.items()}
        self.emit(Batch({name: columns[name] for name in self.columns}, len(columns["revision"])))

    def _finalize(self, wins: I64, j0: int, j1: int, out: tuple[Arr, ...]) -> dict[str, Any]:
        """Output columns of the cells ``(wins[out_w], out_g)`` of windows ``[j0, j1)``."""
        out_w, out_g, out_n, out_i, out_f = out
        m = out_w.shape[0]
        carrier = CellState(self.calls)  # CellState.finalize over one row per output cell
        carrier.arrays = {"n": out_n.reshape(m, 1)}
        for name, kind, matrix, j in self._prims:
            col = out_i[:, j] if matrix == "i" else out_f[:, j]
            carrier.arrays[name] = (col.astype(np.int64) if kind == "mcount" else col).reshape(m, 1)
        if self._holistic:
            self._gather(carrier, wins[j0:j1], out_w - j0, out_g)
        w = wins[out_w]
        columns: dict[str, Any] = {"window_start": w - self.range + 1, "window_end": w + 1}
        keys = self.groups.keys[out_g]
        for j, (name, ctype) in enumerate(zip(self.group_columns, self.group_types, strict=True)):
            key = keys[:, j]
            columns[name] = key.view(np.float64) if ctype.name == "float64" else key.astype(ctype.dtype)
        columns.update(carrier.finalize(np.arange(m, dtype=np.int64), np.zeros(m, np.int64), self.decode))
        columns["revision"] = np.zeros(m, np.int64)
        return columns

    def _gather(self, carrier: CellState, wins: I64, out_w: I64, out_g: I64) -> None:
        """Log the values of every tuple under each output cell of its windows (holistic calls)."""
        cols = self._store.cols
        ra = cols["ra"][: self._store.n]
        lo = int(np.searchsorted(ra, wins[0] - self.range, "right"))
        hi = int(np.searchsorted(ra, wins[-1], "right"))
        t_ra, t_gid = ra[lo:hi], cols["gid"][lo:hi]
        ws = np.searchsorted(wins, t_ra, "left").astype(np.int64)
        we = np.searchsorted(wins, t_ra + self.range, "left").astype(np.int64)
        rows, gids, index = kernels.expand_cells(ws, we, 0, np.arange(wins.shape[0], dtype=np.int64), t_gid)
        width = len(self.groups)
        cell = np.searchsorted(out_w * width + out_g, rows * width + gids).astype(np.int64)
        for col in self._holistic:
            values = cols[f"h:{col}"][lo:hi][index]
            valid = self._valid(col, values)
            if col in self._filters:
                valid &= cols[f"h:{self._filters[col]}"][lo:hi][index]
            carrier.logs[col].append(cell[valid], np.zeros(int(valid.sum()), np.int64), values[valid])

    def _valid(self, column: str, values: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
        """Non-null entries: NaN is a null float, NULL_CODE a null string."""
        if column in self._string_columns:
            return np.asarray(values != NULL_CODE)
        return np.asarray(values == values)

    # -- state ----------------------------------------------------------------------------
    def _resize_groups(self, rows: int) -> None:
        self._gs, self._last = _filled(self._gs, rows, 0), _filled(self._last, rows, -1)
        self._bi, self._bf = _filled(self._bi, rows, self._iid), _filled(self._bf, rows, self._fid)
        self._active = _filled(self._active, rows, 0)

    def _compact(self) -> None:
        """Drop dead tuples once they are half the store; forget groups without stored tuples."""
        lo, store = int(self._ptr[0]), self._store
        if lo and (lo == store.n or (lo >= 4096 and 2 * lo >= store.n)):
            self._drop_dead()
        width = len(self.groups)
        if width < 4096 or width < 2 * self._groups_compacted:
            return
        self._groups_compacted = width
        self._drop_dead()
        live = np.zeros(width, np.bool_)
        for gids in (store.cols["gid"][: store.n], *(part["gid"] for part in self._pending)):
            live[gids] = True
        if live.sum() * 2 > width:
            return
        remap = self.groups.compact(live)
        kept = np.flatnonzero(remap >= 0)
        store.cols["gid"][: store.n] = remap[store.cols["gid"][: store.n]]
        for part in self._pending:
            part["gid"] = remap[part["gid"]]
        na, old = int(self._ptr[2]), (self._gs, self._last, self._bi, self._bf, self._active)
        self._resize_groups(0)  # then back to the same size, every row at identity
        self._resize_groups(old[0].shape[0])
        self._active[:na] = remap[old[4][:na]]
        for new, before in zip((self._gs, self._last, self._bi, self._bf), old[:4], strict=True):
            new[remap[kept]] = before[kept]
        self._groups_compacted = len(self.groups)

    def _drop_dead(self) -> None:
        """Remove the store's tuples below the sliding window and shift every index into it."""
        lo, store = int(self._ptr[0]), self._store
        if not lo:
            return
        store.drop_front(lo)
        self._ptr[:2] -= lo
        for index in (store.cols["nxt"][: store.n], self._gs[:, :3], self._last):
            index[index >= 0] -= lo
        self._last[self._last < 0] = -1
