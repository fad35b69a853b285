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
Partitioned tuple windows complete partition by partition: a cell is emitted as soon as its
partition has seen the window's last row. Their only output punctuation is end of stream: the
minimum over partitions includes the partitions not seen yet, which are still at row 0.

A snapshot holds the group table, the accumulators (one row per open window), which window has
which row, the landmark and partition progress, and the results still queued by slow flush.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.errors import CorruptState
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.state import (
    ARRAY,
    INT,
    INT_MAP,
    INTS,
    NESTED,
    OPTIONAL_INT,
    Keep,
    State,
    as_array,
    as_int,
    as_list,
    as_str,
    declare,
    fields,
)
from lowtide.operators.windows import Landmark, Rows, Window
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType

I64 = npt.NDArray[np.int64]
Having = Callable[[dict[str, Any]], npt.NDArray[np.bool_]]
LateSink = Callable[[Batch], None]


@dataclass(frozen=True)
class SlowFlush:
    """Smooth emission (§8.3.3): complete windows leave at ``every`` input tuples per result row,
    spread over the batches after their punctuation, but never more than ``max_windows``
    windows behind it (OOP needs no order among windows, so nothing else waits for them)."""

    every: int = 1
    max_windows: int = 2


class After(Enum):
    """What follows queued results once they are out: data, so that a snapshot holds it."""

    FREE_WINDOWS = "free windows"  # forget the state of the windows ``freed`` (WID)
    FREE_ROWS = "free rows"  # give the scratch rows ``freed`` back to the slices (Paned-WID)
    PUNCTUATE = "punctuate"  # emit Punctuation(value, "window_end")


@dataclass
class Pending:
    """Results waiting to leave, in order: the cells of complete windows, then what to do once
    they are out (free their state, punctuate past them)."""

    rows: I64
    gids: I64
    wids: I64
    windows: int
    after: After
    freed: I64  # FREE_WINDOWS: window ids; FREE_ROWS: state rows; PUNCTUATE: empty
    value: int = NO_PROGRESS  # PUNCTUATE: the punctuation's value
    done: int = 0


class _Queue(Keep):
    """The results queued by slow flush, each as its arrays, counts and what follows it."""

    _ARRAYS = ("rows", "gids", "wids", "freed")
    _NUMBERS = ("windows", "value", "done")

    def save(self, value: Any) -> State:
        return [
            {
                **{name: getattr(item, name).copy() for name in self._ARRAYS},
                **{name: getattr(item, name) for name in self._NUMBERS},
                "after": item.after.value,
            }
            for item in value
        ]

    def load(self, fresh: Any, state: State, where: str) -> Any:
        queue: deque[Pending] = deque()
        for i, item in enumerate(as_list(state, where)):
            at = f"{where}[{i}]"
            found = fields(item, (*self._ARRAYS, *self._NUMBERS, "after"), at)
            arrays = {name: as_array(found[name], f"{at}.{name}", np.int64, 1) for name in self._ARRAYS}
            numbers = {name: as_int(found[name], f"{at}.{name}") for name in self._NUMBERS}
            after = as_str(found["after"], f"{at}.after")
            if after not in {a.value for a in After}:
                raise CorruptState(
                    f"state of {at}.after is {after[:30]!r}, not one of {[a.value for a in After]}"
                )
            rows, gids, wids, freed = (arrays[name] for name in self._ARRAYS)
            windows, value, done = (numbers[name] for name in self._NUMBERS)
            queue.append(Pending(rows, gids, wids, windows, After(after), freed, value, done))
        return queue


QUEUE = _Queue()


_DENSE_SPAN = 1 << 16


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


class WIDAggregate(Operator):
    label = "WID Aggregate"
    STATE: ClassVar[Mapping[str, Keep]] = declare(
        Operator.STATE,
        groups=NESTED,
        cells=NESTED,
        _row_of=INT_MAP,
        _free=INTS,
        _rows_used=INT,
        first_open=INT,
        retained_from=INT,
        _pending=QUEUE,
        _next_landmark=OPTIONAL_INT,
        _landmark_start=INT,
        _partition_rows=ARRAY,
        _group_partition=ARRAY,
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
    ) -> None:
        super().__init__()
        self.window = window
        self.flush = flush  # None: results leave as soon as punctuation completes their window
        self._pending: deque[Pending] = deque()
        self.window_out: Window = window  # the windows reported (Paned-WID's rows are panes)
        self.group_columns = group_columns
        self.group_types = group_types
        self.calls = calls
        self.columns = columns
        self.having = having
        self.allowed_lateness = allowed_lateness
        self.late_sink = late_sink
        self.decode = decode
        self.groups = GroupTable(len(group_columns))
        self.cells = CellState(calls, track_revisions=allowed_lateness)
        self._row_of: dict[int, int] = {}
        self._free: list[int] = []
        self._rows_used = 0
        self.first_open = NO_PROGRESS
        self.retained_from = NO_PROGRESS
        self.landmark = isinstance(window, Landmark)
        self.partitioned = isinstance(window, Rows) and bool(window.partition)
        if self.landmark:
            self._base = self._new_row()  # the running prefix of a landmark window
        self._next_landmark: int | None = None  # landmark: the next slide to emit (None: not started)
        self._landmark_start = 0  # landmark: the first slide
        self._partition_rows = np.zeros(0, np.int64)  # tuples seen per partition
        self._group_partition = np.zeros(0, np.int64)

    # -- rows -------------------------------------------------------------------------------
    def _new_row(self) -> int:
        if self._free:
            return self._free.pop()
        self._rows_used += 1
        return self._rows_used - 1

    def _release(self, wids: list[int]) -> None:
        rows = np.array([self._row_of.pop(w) for w in wids], dtype=np.int64)
        self.cells.reset_rows(rows)
        self._free.extend(rows.tolist())

    def open_windows(self) -> int:
        return len(self._row_of)

    def state_bytes(self) -> int:
        return self.cells.nbytes() + self.groups.nbytes()

    def describe(self) -> str:
        by = f" by {', '.join(self.group_columns)}" if self.group_columns else ""
        aggs = ", ".join(call.describe() for call in self.calls)
        return f"WID Aggregate {aggs}{by}"

    # -- input ------------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        ws, we = batch.columns["wid_start"], batch.columns["wid_end"]
        if batch.late:
            batch, ws, we = self._admit_late(batch, ws, we)
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
        gid = self.groups.ids(key_matrix(batch, self.group_columns))
        touched = touched_windows(ws, we)
        for w in touched.tolist():
            if w not in self._row_of:
                self._row_of[w] = self._new_row()
        base = int(touched[0])
        row_of = np.full(int(touched[-1]) - base + 1, -1, dtype=np.int64)
        row_of[touched - base] = [self._row_of[w] for w in touched.tolist()]
        self.cells.ensure(self._rows_used, len(self.groups))
        self.cells.update(batch, ws, we, base, row_of, gid)
        self.flush_some(batch.n)
        if self.partitioned:
            self._map_groups(batch.columns["partition"], gid)
            self._emit_partitions()
        if batch.late:
            self._revise(ws, np.minimum(we, self.first_open), gid)

    def _admit_late(self, batch: Batch, ws: I64, we: I64) -> tuple[Batch, I64, I64]:
        """Clip late tuples to the windows still retained; the rest go to the late side stream."""
        ws = np.maximum(ws, self.retained_from)
        alive = ws < we
        if not alive.all():
            if self.late_sink is not None:
                self.late_sink(batch.select(~alive))
            batch, ws, we = batch.select(alive), ws[alive], we[alive]
        return batch.with_columns({"wid_start": ws}), ws, we

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute == "wid_retain":
            self._forget_below(punctuation.value)
            return
        if punctuation.attribute != "wid":
            return
        q = punctuation.value
        if q <= self.first_open:
            return
        if self.landmark:
            self._emit_landmark(q)
        elif self.partitioned:
            if q >= END_OF_STREAM:
                self._emit_partitions(final=True)
        else:
            # Windows below first_open were emitted already (retained ones re-emit only as revisions).
            ready = sorted(w for w in self._row_of if self.first_open <= w < q)
            if self.allowed_lateness:
                self._emit_windows(ready)
            else:
                freed = np.array(ready, np.int64)
                self._queue(*self._window_cells(ready), len(ready), After.FREE_WINDOWS, freed)
        self.first_open = q
        if not self.partitioned:
            self._queue_punctuation(END_OF_STREAM if q >= END_OF_STREAM else self.window.end_of(q))

    def _free_windows(self, wids: list[int]) -> None:
        self._release(wids)
        if not self.flushing:  # queued cells keep their group ids
            self._compact_groups()

    def _forget_below(self, retain: int) -> None:
        if retain <= self.retained_from:
            return
        self.retained_from = retain
        self._release(sorted(w for w in self._row_of if w < min(retain, self.first_open)))
        self._compact_groups()

    # -- emission ---------------------------------------------------------------------------
    def _queue(
        self,
        rows: I64,
        gids: I64,
        wids: I64,
        windows: int,
        after: After,
        freed: I64,
        value: int = NO_PROGRESS,
    ) -> None:
        """Emit the cells of ``windows`` complete windows (all at once, or slowly), then do ``after``."""
        self._pending.append(Pending(rows, gids, wids, windows, after, freed, value))

    def _queue_punctuation(self, value: int) -> None:
        """Punctuate once the windows queued before are out; bound how far behind they are."""
        empty = np.empty(0, np.int64)
        self._queue(empty, empty, empty, 0, After.PUNCTUATE, empty, value)
        if self.flush is None or value >= END_OF_STREAM:
            self._drain(None)
            return
        while sum(item.windows for item in self._pending) > self.flush.max_windows:
            self._drain(self._pending[0].rows.shape[0] - self._pending[0].done)

    def flush_some(self, tuples_in: int) -> None:
        """Slow flush: ``tuples_in`` tuples arrived, so this many result rows may leave."""
        if self._pending and self.flush is not None:
            self._drain(-(-tuples_in // self.flush.every))

    @property
    def flushing(self) -> bool:
        """Whether result rows are waiting (group ids must stay as they are until they leave)."""
        return any(item.done < item.rows.shape[0] for item in self._pending)

    def _drain(self, budget: int | None) -> None:
        """Emit queued results in order, at most ``budget`` rows (None: all of them)."""
        while self._pending:
            item = self._pending[0]
            take = item.rows.shape[0] - item.done
            if budget is not None:
                take = min(take, budget)
                budget -= take
            if take:
                part = slice(item.done, item.done + take)
                self._emit_cells(item.rows[part], item.gids[part], item.wids[part])
                item.done += take
            if item.done < item.rows.shape[0]:
                return
            self._pending.popleft()
            self._after(item)

    def _after(self, item: Pending) -> None:
        """What follows queued results once they are out."""
        if item.after is After.PUNCTUATE:
            self.emit_progress(item.value)
        else:
            assert item.after is After.FREE_WINDOWS
            self._free_windows(item.freed.tolist())

    def _cells_of(self, windows: list[tuple[int, int]]) -> tuple[I64, I64, I64]:
        """The non-empty cells of ``(window id, state row)`` pairs: rows, group ids, window ids."""
        n, width = self.cells.arrays["n"], len(self.groups)
        pairs = np.array(windows, np.int64).reshape(-1, 2)
        rows, gids, wids = [pairs[:0, 1]], [pairs[:0, 1]], [pairs[:0, 0]]
        for lo in range(0, pairs.shape[0], 64):  # 64 rows of counts at a time: no copy of them all
            part = pairs[lo : lo + 64]
            which, groups = np.nonzero(n[part[:, 1], :width] > 0)
            rows.append(part[which, 1])
            gids.append(groups.astype(np.int64, copy=False))
            wids.append(part[which, 0])
        return np.concatenate(rows), np.concatenate(gids), np.concatenate(wids)

    def _window_cells(self, wids: list[int]) -> tuple[I64, I64, I64]:
        return self._cells_of([(w, self._row_of[w]) for w in wids])

    def _emit_windows(self, wids: list[int]) -> None:
        self._emit_cells(*self._window_cells(wids))

    def _emit_cells(self, rows: I64, gids: I64, wids: I64, revision: I64 | None = None) -> None:
        if rows.shape[0] == 0:
            return
        rev = self.cells.arrays.get("rev")
        if rev is not None:
            revision = rev[rows, gids] + 1
        columns: dict[str, Any] = {}
        reported = self.window_out
        if isinstance(reported, Landmark):
            columns["window_start"] = np.full(wids.shape[0], self._landmark_start * reported.slide, np.int64)
            columns["window_end"] = (wids + 1) * reported.slide
        else:
            columns["window_start"], columns["window_end"] = reported.bounds(wids)
        columns.update(key_columns(self.groups.keys[gids], self.group_columns, self.group_types))
        columns.update(self.cells.finalize(rows, gids, self.decode, self.calls))
        columns["revision"] = revision if revision is not None else np.zeros(rows.shape[0], np.int64)
        columns, keep = apply_having(self.having, columns)
        if rev is not None:  # a revision counts emitted rows only: HAVING may hold one back
            shown = slice(None) if keep is None else keep
            rev[rows[shown], gids[shown]] = columns["revision"]
        size = len(columns["revision"])
        self.emit(Batch({name: columns[name] for name in self.columns}, size))

    def _revise(self, ws: I64, we_emitted: I64, gid: I64) -> None:
        """Re-emit the cells of already emitted windows that late tuples changed."""
        wids, index = expand_ranges(ws, we_emitted)
        if wids.shape[0] == 0:
            return
        cells = np.unique(np.stack([wids, gid[index]], axis=1), axis=0)  # by window, then group
        wids, gids = cells[:, 0], cells[:, 1]
        windows = np.unique(wids)
        row_of = np.array([self._row_of[w] for w in windows.tolist()], np.int64)
        self._emit_cells(row_of[np.searchsorted(windows, wids)], gids, wids)

    def _emit_landmark(self, q: int) -> None:
        if self._next_landmark is None:
            # The first slide is fixed only once it is complete: until then a tuple of an
            # earlier slide (still at or above the punctuation) may arrive and start the landmark.
            if not self._row_of or min(self._row_of) >= q:
                return
            self._next_landmark = self._landmark_start = min(self._row_of)
        upper = q if q < END_OF_STREAM else (max(self._row_of) + 1 if self._row_of else self._next_landmark)
        n = self.cells.arrays["n"]
        for w in range(self._next_landmark, upper):
            if w in self._row_of:
                self.cells.merge_row(self._base, self._row_of[w])
                self._release([w])
            g = np.flatnonzero(n[self._base, : len(self.groups)] > 0)
            if "rev" in self.cells.arrays:
                self.cells.arrays["rev"][self._base, g] = -1
            self._emit_cells(np.full(g.shape[0], self._base, np.int64), g, np.full(g.shape[0], w, np.int64))
        self._next_landmark = max(self._next_landmark, upper)

    def _count_partitions(self, partition: I64) -> None:
        n_part = int(partition.max()) + 1
        if n_part > self._partition_rows.shape[0]:
            grown = np.zeros(max(n_part, 2 * self._partition_rows.shape[0]), np.int64)
            grown[: self._partition_rows.shape[0]] = self._partition_rows
            self._partition_rows = grown
        self._partition_rows[:n_part] += np.bincount(partition, minlength=n_part)

    def _map_groups(self, partition: I64, gid: I64) -> None:
        """Remember the partition of each group (PA columns are part of every group key)."""
        if len(self.groups) > self._group_partition.shape[0]:
            grown = np.zeros(max(len(self.groups), 2 * self._group_partition.shape[0]), np.int64)
            grown[: self._group_partition.shape[0]] = self._group_partition
            self._group_partition = grown
        self._group_partition[gid] = partition

    def _emit_partitions(self, final: bool = False) -> None:
        """Emit every cell whose partition has passed the cell's window (tuple windows, PA)."""
        assert isinstance(self.window, Rows)
        if not self._row_of:
            if final:
                self.emit_progress(END_OF_STREAM)
            return
        n = self.cells.arrays["n"]
        width = len(self.groups)
        frontier = self.window.first_open_many(self._partition_rows)[self._group_partition[:width]]
        rows_l, gids_l, wids_l = [], [], []
        for w in sorted(self._row_of):
            row = self._row_of[w]
            g = np.flatnonzero((n[row, :width] > 0) & ((frontier > w) | final))
            rows_l.append(np.full(g.shape[0], row, np.int64))
            gids_l.append(g)
            wids_l.append(np.full(g.shape[0], w, np.int64))
        rows, gids, wids = np.concatenate(rows_l), np.concatenate(gids_l), np.concatenate(wids_l)
        self._emit_cells(rows, gids, wids)
        self.cells.reset_cells(rows, gids)
        empty = [w for w in self._row_of if not n[self._row_of[w], :width].any()]
        self._release(empty)
        # A partition not seen yet starts at row 0, below every partition seen: until the end
        # of the stream no window end can be promised, whatever the seen partitions reached.
        if final:
            self.emit_progress(END_OF_STREAM)

    def _compact_groups(self) -> None:
        """Forget groups that have no cell in any open window (bounded state under key churn)."""
        if not self.landmark:
            compact_groups(self.groups, self.cells, list(self._row_of.values()))


def key_columns(keys: I64, names: tuple[str, ...], types: tuple[ColumnType, ...]) -> dict[str, Any]:
    """Result columns of group keys ``[n, k]``, back in their types (floats from bit patterns)."""
    return {
        name: keys[:, j].astype(kind.dtype, copy=False)
        if kind.name != "float64"
        else keys[:, j].view(np.float64)
        for j, (name, kind) in enumerate(zip(names, types, strict=True))
    }


def apply_having(
    having: Having | None, columns: dict[str, Any]
) -> tuple[dict[str, Any], npt.NDArray[np.bool_] | None]:
    """The result rows HAVING keeps, and which they were (None: all)."""
    if having is None:
        return columns, None
    keep = np.asarray(having(columns), dtype=np.bool_)
    kept = {name: v.filter(keep) if hasattr(v, "filter") else v[keep] for name, v in columns.items()}
    return kept, keep


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
