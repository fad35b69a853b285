"""Aggregate functions over (window row, group) cells: their state, updates and final values.

Every aggregate call is served by primitive accumulators, each a 2-D array ``[row, group]``
(see :mod:`lowtide.operators.aggregate_kernels` for the layout): ``count`` for count(*), count(x)
and the emptiness of a cell, ``sum``, ``min``, ``max``, Welford moments for var/stddev, and for
holistic aggregates (median, quantile, count_distinct, heavy_hitters) a log of
``(row, group, value)`` entries. Rows are recycled: ``reset_rows`` puts them back to identity.
Results are exact; sample variance (ddof 1) like SQL's VAR_SAMP; quantiles interpolate linearly.
Nulls - NaN floats and the null code of strings - are skipped, as SQL aggregates skip them.
A call with a ``valid`` column (SQL's ``FILTER (WHERE cond)``) is fed only the rows where that
bool column holds; it has a count of its own, so an empty set of such rows finalizes as an empty
cell would (NaN for floats; count 0, integer sum 0).
A snapshot holds every accumulator array whole, the value logs and the string columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.batch import Batch
from lowtide.errors import CorruptState
from lowtide.operators import aggregate_kernels as k
from lowtide.schema import FLOAT64, INT64, ColumnType
from lowtide.snapshot import State, Versioned, as_array, as_dict, as_list, as_str, fields
from lowtide.strings import NULL_CODE

I64 = npt.NDArray[np.int64]
Arr = npt.NDArray[Any]


class AggFunc(Enum):
    COUNT_STAR = "count(*)"
    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    VAR = "var"
    STDDEV = "stddev"
    MEDIAN = "median"
    QUANTILE = "quantile"
    COUNT_DISTINCT = "count_distinct"
    HEAVY_HITTERS = "heavy_hitters"

    @property
    def holistic(self) -> bool:
        return self in (AggFunc.MEDIAN, AggFunc.QUANTILE, AggFunc.COUNT_DISTINCT, AggFunc.HEAVY_HITTERS)


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate of a query: ``func(column[, param]) [FILTER (WHERE valid)] AS output``.

    Accumulators are named by column, so calls on one column share them: calls with different
    ``valid`` columns must read different columns (the planner gives each its own).
    """

    func: AggFunc
    column: str | None
    input_type: ColumnType | None
    param: float | None
    output: str
    valid: str | None = None  # a bool column: only the rows where it holds feed this call

    def describe(self) -> str:
        return self.output

    def result_type(self) -> ColumnType:
        func, kind = self.func, self.input_type
        if func in (AggFunc.COUNT_STAR, AggFunc.COUNT, AggFunc.COUNT_DISTINCT):
            return INT64
        if func is AggFunc.SUM:
            return FLOAT64 if kind is None or kind.name == "float64" else INT64
        if func in (AggFunc.MIN, AggFunc.MAX) and kind is not None:
            return kind
        if func is AggFunc.HEAVY_HITTERS and kind is not None:
            return ColumnType(f"list<{kind.name}>")
        return FLOAT64


def fusable(calls: tuple[AggregateCall, ...], group_types: tuple[ColumnType, ...]) -> bool:
    """Whether Fused WID's kernel (:mod:`lowtide.operators.fused_wid`) computes these aggregates
    by these groups: count(*), and count and sum of integer columns, by one column that is not a
    float. The planner reads it to choose Fused WID, so it lives here and not beside the kernel."""
    if len(group_types) != 1 or group_types[0].name == "float64":
        return False
    return all(
        call.func is AggFunc.COUNT_STAR
        or (
            call.func in (AggFunc.COUNT, AggFunc.SUM)
            and call.input_type is not None
            and call.input_type.is_integer  # strings (codes) and floats count their nulls apart
        )
        for call in calls
    )


# +inf + -inf in a sum, inf - inf in a mean make NaN on purpose (numpy's answer): no warning.
_NONFINITE_QUIET = np.errstate(invalid="ignore")

_KINDS = ("n", "rev", "count", "sum", "min", "max", "mcount", "mean", "m2")  # accumulator name = kind:column


def _identity(name: str, dtype: np.dtype[Any]) -> Any:
    """The value of an empty cell of accumulator ``name`` (``kind:column``) of ``dtype``."""
    kind = name.partition(":")[0]
    if kind == "min":
        return np.inf if dtype == np.float64 else np.iinfo(np.int64).max
    if kind == "max":
        return -np.inf if dtype == np.float64 else np.iinfo(np.int64).min
    return -1 if kind == "rev" else 0  # rev: the revision last emitted, -1 for never


def _value_dtype(kind: ColumnType | None) -> np.dtype[Any]:
    if kind is None or kind.name == "float64":
        return np.dtype(np.float64)
    return np.dtype(np.int64)


@dataclass
class _ValueLog:
    """Holistic state: one entry per (cell, tuple) - the values of each open cell."""

    rows: I64
    gids: I64
    values: Arr
    n: int = 0

    def append(self, rows: I64, gids: I64, values: Arr) -> None:
        need = self.n + rows.shape[0]
        if need > self.rows.shape[0]:
            cap = max(need, 2 * self.rows.shape[0])
            self.rows = _grown(self.rows, cap)
            self.gids = _grown(self.gids, cap)
            self.values = _grown(self.values, cap)
        self.rows[self.n : need] = rows
        self.gids[self.n : need] = gids
        self.values[self.n : need] = values
        self.n = need

    def keep(self, mask: npt.NDArray[np.bool_]) -> None:
        kept = np.flatnonzero(mask)
        m = kept.shape[0]
        self.rows[:m] = self.rows[kept]
        self.gids[:m] = self.gids[kept]
        self.values[:m] = self.values[kept]
        self.n = m

    def snapshot(self) -> State:
        n = self.n
        return {"rows": self.rows[:n].copy(), "gids": self.gids[:n].copy(), "values": self.values[:n].copy()}

    @staticmethod
    def restored(state: State, where: str) -> _ValueLog:
        found = fields(state, ("rows", "gids", "values"), where)
        rows = as_array(found["rows"], f"{where}.rows", np.int64, 1)
        gids = as_array(found["gids"], f"{where}.gids", np.int64, 1)
        values = as_array(found["values"], f"{where}.values", ndim=1)
        if not rows.shape == gids.shape == values.shape or values.dtype not in (np.int64, np.float64):
            raise CorruptState(f"state of {where} is not three equal int64/value columns")
        return _ValueLog(rows, gids, values, rows.shape[0])


def _grown(a: Arr, cap: int) -> Arr:
    out = np.empty(cap, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


class CellState(Versioned):
    """Accumulators of all aggregate calls of one operator, as ``[row, group]`` arrays."""

    VERSION = 1

    def __init__(self, calls: tuple[AggregateCall, ...], track_revisions: bool = False) -> None:
        self.calls = calls
        self._identity: dict[str, Any] = {}
        self._dtype: dict[str, np.dtype[Any]] = {}
        self._add("n", np.dtype(np.int64))
        if track_revisions:
            # Revision last emitted per cell, for allowed lateness.
            self._add("rev", np.dtype(np.int64))
        self.string_columns: set[str] = set()
        self.filters: dict[str, str] = {}  # column -> the bool column whose rows feed it (FILTER)
        self.logs: dict[str, _ValueLog] = {}
        for call in calls:
            self._declare(call)
        self.arrays: dict[str, Arr] = {
            name: np.full((0, 0), self._identity[name], dtype=self._dtype[name]) for name in self._identity
        }

    def declare(self, calls: tuple[AggregateCall, ...]) -> None:
        """Add the accumulators ``calls`` need and do not have yet, at identity in every cell;
        a holistic call's column gets an empty value log if it has none."""
        before = set(self._identity)
        rows, groups = self.shape
        self.calls = (*self.calls, *[call for call in calls if call not in self.calls])
        for call in calls:
            if not (call.func.holistic and call.column in self.logs):
                self._declare(call)
        for name in self._identity.keys() - before:
            self.arrays[name] = np.full((rows, groups), self._identity[name], dtype=self._dtype[name])

    def _declare(self, call: AggregateCall) -> None:
        col, dtype = call.column, _value_dtype(call.input_type)
        if call.func is AggFunc.COUNT_STAR or col is None:
            return
        if call.input_type is not None and call.input_type.is_string:
            self.string_columns.add(col)  # codes; NULL_CODE is a null
        if call.valid is not None:
            self.filters[col] = call.valid
        if call.func.holistic:
            self.logs[col] = _ValueLog(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, dtype))
            return
        if dtype == np.float64 or col in self.string_columns or col in self.filters:
            self._add(f"count:{col}", np.dtype(np.int64))
        if call.func is AggFunc.SUM or call.func is AggFunc.AVG:
            self._add(f"sum:{col}", dtype)
        elif call.func is AggFunc.MIN:
            self._add(f"min:{col}", dtype)
        elif call.func is AggFunc.MAX:
            self._add(f"max:{col}", dtype)
        elif call.func in (AggFunc.VAR, AggFunc.STDDEV):
            self._add(f"mcount:{col}", np.dtype(np.int64))
            self._add(f"mean:{col}", np.dtype(np.float64))
            self._add(f"m2:{col}", np.dtype(np.float64))

    def _add(self, name: str, dtype: np.dtype[Any]) -> None:
        self._identity[name] = _identity(name, dtype)
        self._dtype[name] = dtype

    def save_fields(self) -> dict[str, State]:
        """Every accumulator array whole (capacity too), every value log, the string columns."""
        return {
            "arrays": {name: array.copy() for name, array in self.arrays.items()},
            "logs": {col: log.snapshot() for col, log in self.logs.items()},
            "strings": [col for col in sorted(self.string_columns)],
        }

    def load_fields(self, saved: dict[str, State], where: str) -> None:
        """The accumulators and logs saved, which may be more than this operator's calls
        declare (shared slices keep those of every query that read them)."""
        found = fields(saved, ("arrays", "logs", "strings"), where)
        arrays = {
            name: as_array(array, f"{where}.arrays.{name}", ndim=2)
            for name, array in as_dict(found["arrays"], f"{where}.arrays").items()
        }
        if "n" not in arrays:
            raise CorruptState(f"state of {where} lacks the cell counts")
        shape = arrays["n"].shape
        for name, array in arrays.items():
            if name.partition(":")[0] not in _KINDS or array.shape != shape or array.dtype.kind not in "if":
                raise CorruptState(f"state of {where}.arrays.{name} does not fit the accumulators")
        self.arrays = arrays
        self._dtype = {name: array.dtype for name, array in arrays.items()}
        self._identity = {name: _identity(name, array.dtype) for name, array in arrays.items()}
        logs = as_dict(found["logs"], f"{where}.logs")
        self.logs = {col: _ValueLog.restored(log, f"{where}.logs.{col}") for col, log in logs.items()}
        strings = as_list(found["strings"], f"{where}.strings")
        self.string_columns = {as_str(col, f"{where}.strings") for col in strings}

    @property
    def shape(self) -> tuple[int, int]:
        rows, groups = self.arrays["n"].shape
        return int(rows), int(groups)

    def nbytes(self) -> int:
        logs = sum(log.n * (16 + log.values.itemsize) for log in self.logs.values())
        return int(sum(a.nbytes for a in self.arrays.values()) + logs)

    def ensure(self, rows: int, groups: int) -> None:
        """Grow to at least ``rows`` x ``groups`` cells (amortised doubling)."""
        have_rows, have_groups = self.shape
        if rows <= have_rows and groups <= have_groups:
            return
        new_rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        new_groups = max(groups, 2 * have_groups, 16) if groups > have_groups else have_groups
        for name, old in self.arrays.items():
            grown = np.full((new_rows, new_groups), self._identity[name], dtype=old.dtype)
            grown[:have_rows, :have_groups] = old
            self.arrays[name] = grown

    def reset_rows(self, rows: I64) -> None:
        """Put ``rows`` back to identity and forget their holistic entries."""
        if rows.shape[0] == 0:
            return
        for name, array in self.arrays.items():
            array[rows] = self._identity[name]
        for log in self.logs.values():
            if log.n:
                log.keep(~np.isin(log.rows[: log.n], rows))

    def reset_cells(self, rows: I64, gids: I64) -> None:
        """Put single cells back to identity (partitioned windows emit cell by cell)."""
        if rows.shape[0] == 0:
            return
        for name, array in self.arrays.items():
            array[rows, gids] = self._identity[name]
        width = self.shape[1]
        for log in self.logs.values():
            if log.n:
                log.keep(~np.isin(log.rows[: log.n] * width + log.gids[: log.n], rows * width + gids))

    def remap_groups(self, remap: I64, n_groups: int) -> None:
        """Move group columns to their new ids after the group table compacted (-1: dropped)."""
        kept = np.flatnonzero(remap >= 0)
        for name, array in self.arrays.items():
            fresh = np.full_like(array, self._identity[name])
            fresh[:, remap[kept]] = array[:, kept]
            self.arrays[name] = fresh
        for log in self.logs.values():
            if log.n:
                new = remap[log.gids[: log.n]]
                log.gids[: log.n] = new
                log.keep(new >= 0)
        del n_groups

    def update(self, batch: Batch, ws: I64, we: I64, wid_base: int, row_of: I64, gid: I64) -> None:
        """Add every tuple of ``batch`` to the cells of its windows ``[ws, we)``."""
        a = self.arrays
        ws, we = k.read_only(ws), k.read_only(we)
        k.update_count(ws, we, wid_base, row_of, gid, a["n"])
        for name in a:
            kind, _, col = name.partition(":")
            if not col:
                continue
            if kind in ("mean", "m2"):  # mcount's companions, updated with it
                continue
            values = batch.columns[col]
            valid = batch.columns[self.filters[col]] if col in self.filters else None
            if kind == "count":
                if col in self.string_columns or valid is not None:  # the kernel skips NaN
                    present = values != NULL_CODE if col in self.string_columns else values == values
                    values = np.where(present if valid is None else present & valid, 0.0, np.nan)
                k.update_count_valid(ws, we, wid_base, row_of, gid, k.read_only(values), a[name])
                continue
            if valid is not None:
                values = _filtered(kind, values, valid, a[name].dtype)
            values = k.read_only(values)
            if kind == "sum":
                k.update_sum(ws, we, wid_base, row_of, gid, values, a[name])
            elif kind == "min":
                k.update_min(ws, we, wid_base, row_of, gid, values, a[name])
            elif kind == "max":
                k.update_max(ws, we, wid_base, row_of, gid, values, a[name])
            elif kind == "mcount":
                k.update_moments(
                    ws, we, wid_base, row_of, gid, values, a[name], a[f"mean:{col}"], a[f"m2:{col}"]
                )
        for col, log in self.logs.items():
            rows, gids, index = k.expand_cells(ws, we, wid_base, row_of, gid)
            values = batch.columns[col][index]
            valid = values != NULL_CODE if col in self.string_columns else values == values
            if col in self.filters:
                valid &= batch.columns[self.filters[col]][index]
            if not valid.all():
                rows, gids, values = rows[valid], gids[valid], values[valid]
            log.append(rows, gids, values.astype(log.values.dtype, copy=False))

    @_NONFINITE_QUIET
    def merge_row(self, dst: int, src: int) -> None:
        """Fold row ``src`` into row ``dst`` for every group (landmark prefixes)."""
        a = self.arrays
        for name, array in a.items():
            kind, _, col = name.partition(":")
            if kind in ("n", "count", "sum"):
                array[dst] += array[src]
            elif kind == "min":
                np.minimum(array[dst], array[src], out=array[dst])
            elif kind == "max":
                np.maximum(array[dst], array[src], out=array[dst])
            elif kind == "mcount":
                # Chan et al.: combine (count, mean, m2) of two disjoint parts.
                na, nb_ = array[dst].astype(np.float64), array[src].astype(np.float64)
                total = na + nb_
                mean, m2 = a[f"mean:{col}"], a[f"m2:{col}"]
                delta = mean[src] - mean[dst]
                with np.errstate(invalid="ignore", divide="ignore"):
                    share = np.where(total > 0, nb_ / total, 0.0)
                    m2[dst] += m2[src] + delta * delta * na * share
                    mean[dst] += delta * share
                array[dst] += array[src]
        for log in self.logs.values():
            log.rows[: log.n][log.rows[: log.n] == src] = dst

    def copy_logs(self, dst: int, sources: I64) -> None:
        """Add to row ``dst`` a copy of the value-log entries of rows ``sources`` (a holistic
        partial combined into a scratch row; the sources keep theirs)."""
        for log in self.logs.values():
            if log.n:
                index = np.flatnonzero(np.isin(log.rows[: log.n], sources))
                log.append(np.full(index.shape[0], dst, np.int64), log.gids[index], log.values[index])

    def fold_cells(self, row: int, dst: I64, src: I64) -> None:
        """Fold each cell ``(row, src[j])`` into ``(row, dst[j])`` - the cells of sessions merged
        into one (Session Aggregate) - and put the ``src`` cells back to identity. Every
        accumulator combines exactly (sums, minima, maxima, Chan's moments) and value-log entries
        move; no ``dst`` may be among ``src``."""
        if src.shape[0] == 0:
            return
        a = self.arrays
        for name, array in a.items():
            kind, _, col = name.partition(":")
            if kind in ("n", "count", "sum"):
                k.fold_sum(row, dst, src, array)
            elif kind == "min":
                k.fold_min(row, dst, src, array)
            elif kind == "max":
                k.fold_max(row, dst, src, array)
            elif kind == "mcount":
                k.fold_moments(row, dst, src, array, a[f"mean:{col}"], a[f"m2:{col}"])
        for log in self.logs.values():
            if log.n:
                moved = np.arange(self.shape[1], dtype=np.int64)
                moved[src] = dst
                at = log.rows[: log.n] == row
                log.gids[: log.n][at] = moved[log.gids[: log.n][at]]
        self.clear_cells(row, src)

    def clear_cells(self, row: int, gids: I64) -> None:
        """Put the cells ``(row, gids[j])`` back to identity and forget their holistic entries
        (:meth:`reset_cells` for cells of one row)."""
        for name, array in self.arrays.items():
            array[row, gids] = self._identity[name]
        width = self.shape[1]
        for log in self.logs.values():
            if log.n:
                gone = np.zeros(width, np.bool_)
                gone[gids] = True
                log.keep(~((log.rows[: log.n] == row) & gone[log.gids[: log.n]]))

    def forget_logs(self, keep: set[str]) -> None:
        """Drop the value logs of columns not in ``keep`` (no reader of them is left)."""
        for col in [col for col in self.logs if col not in keep]:
            del self.logs[col]
        self.calls = tuple(c for c in self.calls if not c.func.holistic or c.column in keep)

    def invertible(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Those of the accumulators ``names`` a subtraction undoes exactly: counts and
        integer sums."""
        return tuple(
            name
            for name in names
            if name.partition(":")[0] in ("n", "count", "sum") and self.arrays[name].dtype.kind == "i"
        )

    def shift_row(self, dst: int, add: I64, remove: I64, width: int, names: tuple[str, ...]) -> None:
        """Row ``dst`` plus rows ``add`` minus rows ``remove``, for the invertible ``names``."""
        for name in names:
            array = self.arrays[name]
            if add.shape[0]:
                array[dst, :width] += array[add, :width].sum(axis=0)
            if remove.shape[0]:
                array[dst, :width] -= array[remove, :width].sum(axis=0)

    def copy_row(self, dst: int, src: int, width: int, names: tuple[str, ...]) -> None:
        for name in names:
            self.arrays[name][dst, :width] = self.arrays[name][src, :width]

    @_NONFINITE_QUIET
    def combine_rows(self, dst: int, sources: I64, width: int, names: tuple[str, ...]) -> None:
        """Set the accumulators ``names`` of row ``dst`` (groups ``< width``) to the combination
        of rows ``sources``, all at once: sums, minima, maxima, and Chan's combination of
        (count, mean, m2). Holistic aggregates have no partials to combine: their callers keep
        them out."""
        a = self.arrays
        for name in names:
            array = a[name]
            kind, _, col = name.partition(":")
            block = array[sources, :width]
            if kind in ("n", "count", "sum"):
                array[dst, :width] = block.sum(axis=0)
            elif kind == "min":
                array[dst, :width] = block.min(axis=0, initial=self._identity[name])
            elif kind == "max":
                array[dst, :width] = block.max(axis=0, initial=self._identity[name])
            elif kind == "mcount":
                counts = block.astype(np.float64)
                means, m2s = a[f"mean:{col}"][sources, :width], a[f"m2:{col}"][sources, :width]
                total = counts.sum(axis=0)
                with np.errstate(invalid="ignore", divide="ignore"):
                    mean = np.where(total > 0, (counts * means).sum(axis=0) / total, 0.0)
                a[f"m2:{col}"][dst, :width] = m2s.sum(axis=0) + (counts * (means - mean) ** 2).sum(axis=0)
                a[f"mean:{col}"][dst, :width] = mean
                array[dst, :width] = block.sum(axis=0)

    def finalize(
        self, rows: I64, gids: I64, pool_decode: Any, calls: tuple[AggregateCall, ...] | None = None
    ) -> dict[str, Any]:
        """Final value of every call (or of ``calls``) for the cells ``(rows[j], gids[j])``.

        numpy columns (a null float is NaN; integer results are never null because only
        non-empty cells are finalized), heavy hitters as an Arrow list array.
        """
        a = self.arrays
        out: dict[str, Any] = {}
        n = a["n"][rows, gids]
        for call in self.calls if calls is None else calls:
            col = call.column
            if call.func is AggFunc.COUNT_STAR:
                out[call.output] = n
                continue
            assert col is not None
            count = a[f"count:{col}"][rows, gids] if f"count:{col}" in a else n
            if call.func is AggFunc.COUNT:
                out[call.output] = count
            elif call.func in (AggFunc.SUM, AggFunc.MIN, AggFunc.MAX):
                state = a[f"{call.func.value}:{col}"][rows, gids]
                out[call.output] = _typed(state, count == 0, call.input_type, call.func)
            elif call.func is AggFunc.AVG:
                total = a[f"sum:{col}"][rows, gids].astype(np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[call.output] = np.where(count > 0, total / count, np.nan)
            elif call.func in (AggFunc.VAR, AggFunc.STDDEV):
                c = a[f"mcount:{col}"][rows, gids]
                with np.errstate(invalid="ignore", divide="ignore"):
                    var = a[f"m2:{col}"][rows, gids] / (c - 1)
                value = np.sqrt(np.maximum(var, 0.0)) if call.func is AggFunc.STDDEV else var
                out[call.output] = np.where(c >= 2, value, np.nan)
            else:
                out[call.output] = self._holistic(call, rows, gids, pool_decode)
        return out

    def _holistic(self, call: AggregateCall, rows: I64, gids: I64, pool_decode: Any) -> Any:
        assert call.column is not None
        log = self.logs[call.column]
        width = max(int(gids.max(initial=0)) + 1, int(log.gids[: log.n].max(initial=0)) + 1)
        wanted = rows * width + gids
        entry_keys = log.rows[: log.n] * width + log.gids[: log.n]
        selected = np.isin(entry_keys, wanted)
        keys, values = entry_keys[selected], log.values[: log.n][selected]
        order = np.lexsort((values, keys))
        keys, values = keys[order], values[order]
        uniq, starts = np.unique(keys, return_index=True)
        ends = np.append(starts[1:], keys.shape[0]).astype(np.int64)
        starts = starts.astype(np.int64)
        # Cells whose values were all null have no entries: an empty segment.
        seg_start = np.zeros(wanted.shape[0], np.int64)
        seg_end = np.zeros(wanted.shape[0], np.int64)
        if uniq.shape[0]:
            position = np.minimum(np.searchsorted(uniq, wanted), uniq.shape[0] - 1)
            present = uniq[position] == wanted
            seg_start[present] = starts[position[present]]
            seg_end[present] = ends[position[present]]
        if call.func in (AggFunc.MEDIAN, AggFunc.QUANTILE):
            q = 0.5 if call.func is AggFunc.MEDIAN else float(call.param or 0.0)
            return k.quantiles_of_segments(values.astype(np.float64), seg_start, seg_end, q)
        if call.func is AggFunc.COUNT_DISTINCT:
            return k.distinct_of_segments(values, seg_start, seg_end)
        return self._heavy_hitters(call, values, seg_start, seg_end, pool_decode)

    def _heavy_hitters(
        self, call: AggregateCall, values: Arr, seg_start: I64, seg_end: I64, pool_decode: Any
    ) -> pa.Array:
        # Segments must be laid out contiguously for the kernel: gather each cell's values.
        lengths = seg_end - seg_start
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        gather = (
            np.concatenate([np.arange(s, e) for s, e in zip(seg_start, seg_end, strict=True)])
            if lengths.sum()
            else np.empty(0, np.int64)
        )
        laid = values[gather.astype(np.int64)]
        hit_offsets, hit_values, hit_counts = k.heavy_hitters_of_segments(
            laid, offsets[:-1], offsets[1:], float(call.param or 0.0)
        )
        # Within each window, most frequent first; ties by value (strings by their text, not
        # by their pool codes, which follow first appearance).
        segment = np.repeat(np.arange(hit_offsets.shape[0] - 1), np.diff(hit_offsets))
        kind = call.input_type
        if kind is not None and kind.is_string:
            decoded = pool_decode(hit_values.astype(np.int64))
            by_text = np.asarray(pc.rank(decoded, sort_keys="ascending", tiebreaker="dense"), np.int64)
            order = np.lexsort((by_text, -hit_counts, segment))
            return pa.ListArray.from_arrays(pa.array(hit_offsets, type=pa.int32()), decoded.take(order))
        order = np.lexsort((hit_values, -hit_counts, segment))
        ordered = hit_values[order]
        items = pa.array(
            ordered.astype(kind.dtype if kind else np.float64), type=kind.arrow if kind else None
        )
        return pa.ListArray.from_arrays(pa.array(hit_offsets, type=pa.int32()), items)


def _filtered(kind: str, values: Arr, valid: npt.NDArray[np.bool_], dtype: np.dtype[Any]) -> Arr:
    """``values`` as accumulator ``kind`` (sum, min, max, mcount) of ``dtype`` takes them when only
    the rows where ``valid`` holds count: the others become NaN, which the kernels skip, or for
    an integer accumulator its identity, which leaves a cell as it is."""
    if kind == "mcount" or dtype == np.float64:
        return np.where(valid, values, np.nan)
    if kind in ("min", "max"):  # an integer column's: the identity leaves the cell as it is
        return np.where(valid, values, _identity(f"{kind}:", dtype))
    return np.where(valid, values, 0)


def _typed(state: Arr, empty: npt.NDArray[np.bool_], kind: ColumnType | None, func: AggFunc) -> Arr:
    """sum over integers is int64 (SQL's widening); min/max keep the input's numpy type."""
    if kind is None or kind.name == "float64":
        return np.where(empty, np.nan, state.astype(np.float64))
    if func is AggFunc.SUM:
        return state.astype(np.int64, copy=False)
    return state.astype(kind.dtype, copy=False)
