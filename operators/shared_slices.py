"""Shared Slices: the pane-level tumbling aggregate of Paned-WID (§6.2), shared across queries.

Stream slicing (Traub et al., "Efficient Window Aggregation with General Stream Slicing"
(EDBT 2019), section 4) generalises panes: every sliding-window query on a stream reads one set of
slices whose edges include all of their window edges, so a tuple updates exactly one slice cell
``(slice, group)`` however many queries and overlapping windows read it - and, for holistic
aggregates, one entry of its slice's value log (the slice's exact summary). Here a slice is a
tumbling window of ``width`` (the Bucket before this operator tags each tuple with it), and
``width`` divides every reader's pane ``gcd(RANGE, SLIDE)``, so each reader's windows are unions of
whole slices. The readers, one :class:`~lowtide.operators.paned_wid.PanedWIDAggregate` per query,
combine slices into windows when punctuation completes them.

A query registered while the stream runs must not count tuples that arrived before it. So the
slices are kept per *generation*: a reader that joins after tuples arrived starts a new
generation, tuples update only the newest, and a reader combines the generations from its own
on. Old generations empty out as their slices expire.

Punctuation contract. On ``Punctuation(q, "wid")`` (slices ``< q`` complete) every reader gets it
first and emits its complete windows; then the slices no reader needs any more - below every
reader's first open window and running window - are dropped. State is bounded by the slices of
the open windows of the widest reader, plus one slide. Placement: by the group columns.

Behind punctuation (docs/design.md, "Punctuation and lateness"). A tuple below its stream's
punctuation (``batch.late``) is late or not per query, not for the slices: each reader judges it in
its own windows - it counts in those not yet emitted, and goes to that reader's late side stream
once if it missed an emitted one. Its slice takes it when some reader counts it - then some reader
still needs the slice: the slice is held, or made again in the newest generation, which every reader
reads - and every reader's running window that has summed the slice takes it too. A tuple no reader
counts is counted nowhere. The Input of shared slices forwards tuples behind punctuation for that
(its late rule is any reader's: slices are shared only under ``drop``).

A snapshot holds the group table, the accumulators (slices, readers' running windows and
scratch rows alike) and which slice of which generation has which row; the readers are not in
it: each query planned again joins anew, and its own snapshot holds what it read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.placement import Placement
from lowtide.operators.result_queue import ResultQueue
from lowtide.operators.wid_state import compact_groups
from lowtide.operators.window_ids import touched_windows, window_rows
from lowtide.operators.window_operator import WindowOperator
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType
from lowtide.snapshot import INT, INT_MAP, INTS, NESTED, Field, MapOf, declare

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


class SliceReader(Protocol):
    """What the slices ask of a reader (a :class:`~lowtide.operators.paned_wid.PanedWIDAggregate`,
    which imports this module: the slices know their readers by this much only)."""

    calls: tuple[AggregateCall, ...]
    summaries: tuple[str, ...]  # the columns whose value logs it reads (holistic aggregates)
    invertible: tuple[str, ...]  # the accumulators its running window keeps
    queue: ResultQueue

    def late_mask(self, batch: Batch, punctuation: int) -> Mask: ...

    def judge_behind(self, batch: Batch) -> Mask: ...

    def running_holds(self, slices: I64) -> Mask: ...

    def absorb(self, added: Mapping[str, I64], width: int) -> None: ...

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None: ...

    def keep_from(self) -> int: ...


class SharedSlices(WindowOperator):
    label = "Shared Slices"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE,
        groups=NESTED,
        cells=NESTED,
        generation=INT,
        rows=MapOf(INT_MAP).at("_rows"),
        free=INTS.at("_free"),
        rows_used=INT.at("_rows_used"),
        first_open=INT,
    )

    def __init__(
        self, width: int, group_columns: tuple[str, ...], group_types: tuple[ColumnType, ...]
    ) -> None:
        super().__init__()
        self.width = width
        self.group_columns = group_columns
        self.group_types = group_types
        self.groups = GroupTable(len(group_columns))
        self.cells = CellState(())
        self.readers: list[SliceReader] = []
        self.generation = 0
        self._rows: dict[int, dict[int, int]] = {0: {}}  # generation -> slice -> row
        self._live: dict[int, tuple[I64, I64]] = {}  # generation -> its readers' slices and rows
        self._free: list[int] = []
        self._rows_used = 0
        self.first_open = NO_PROGRESS  # slices below it are complete

    def describe(self) -> str:
        return self.describe_shared(len(self.readers))

    def describe_shared(self, readers: int) -> str:
        """What ``explain`` says of these slices while ``readers`` queries read them."""
        by = f" by {', '.join(self.group_columns)}" if self.group_columns else ""
        shared = f", shared with {readers} {'query' if readers == 1 else 'queries'}" if readers else ""
        return f"Shared Slices of {self.width}{by}{shared}: each tuple updates one slice"

    def placement(self) -> Placement:
        return self.placement_for(self.group_columns)

    @staticmethod
    def placement_for(group_columns: tuple[str, ...]) -> Placement:
        """By the group columns: each worker keeps the slices of its groups."""
        return Placement.by_keys(group_columns)

    def adopt(self, saved: Mapping[str, Any], where: str) -> None:
        super().adopt(saved, where)
        self._live.clear()  # a cache of _rows

    # -- readers --------------------------------------------------------------------------------
    def join(self, reader: SliceReader) -> int:
        """Add a reader; returns the first generation it reads."""
        if self._rows[self.generation]:  # tuples arrived before this reader: they are not its own
            self.generation += 1
            self._rows[self.generation] = {}
        self.cells.declare(reader.calls)
        self.readers.append(reader)
        return self.generation

    def leave(self, reader: SliceReader) -> None:
        self.readers.remove(reader)
        # A value log no reader needs would only grow with every tuple.
        self.cells.forget_logs({col for r in self.readers for col in r.summaries})

    def new_row(self) -> int:
        if self._free:
            return self._free.pop()
        self._rows_used += 1
        self.cells.ensure(self._rows_used, len(self.groups))
        return self._rows_used - 1

    def free_rows(self, rows: list[int]) -> None:
        self.cells.reset_rows(np.array(rows, dtype=np.int64))
        self._free.extend(rows)

    def live(self, generation: int) -> tuple[I64, I64]:
        """The slices of generations ``>= generation``, sorted, and their rows (a slice appears
        once per generation holding it)."""
        cached = self._live.get(generation)
        if cached is None:
            pairs = [(s, r) for g, rows in self._rows.items() if g >= generation for s, r in rows.items()]
            pairs.sort()
            cached = (
                np.array([s for s, _ in pairs], dtype=np.int64),
                np.array([r for _, r in pairs], dtype=np.int64),
            )
            self._live[generation] = cached
        return cached

    # -- input ----------------------------------------------------------------------------------
    def late_mask(self, batch: Batch, punctuation: int) -> Mask:
        """Which tuples (behind punctuation) missed a window some reader has emitted once the
        input punctuation is ``punctuation``: late for that reader's query."""
        late = np.zeros(batch.n, np.bool_)
        for reader in self.readers:
            late |= reader.late_mask(batch, punctuation)
        return late

    def emit_partials(self) -> None:
        """Nothing: the slices are no query's windows; each reader emits its own."""

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.late:
            counted = np.zeros(batch.n, np.bool_)
            for reader in self.readers:  # each sends those late for its query to its side stream
                counted |= reader.judge_behind(batch)
            if not counted.all():
                batch = batch.select(counted)  # in no reader's open window: counted nowhere
        if batch.n == 0:
            return
        ws, we = batch.columns["wid_start"], batch.columns["wid_end"]
        gid = self.groups.ids(key_matrix(batch, self.group_columns))
        rows = self._rows[self.generation]
        touched = touched_windows(ws, we)
        for s in touched.tolist():
            if s not in rows:
                rows[s] = self.new_row()
                self._live.clear()
        touched_rows = np.array([rows[s] for s in touched.tolist()], dtype=np.int64)
        self.cells.ensure(self._rows_used, len(self.groups))
        addressed = window_rows(ws, we, touched, touched_rows)
        if batch.late:
            self._update_behind(batch, addressed, gid, touched, touched_rows)
        else:
            self.cells.update(batch, *addressed, gid)
        for reader in self.readers:
            reader.queue.flush_some(batch.n)

    def _update_behind(
        self, batch: Batch, addressed: tuple[I64, I64, int, I64], gid: I64, touched: I64, rows: I64
    ) -> None:
        """Tuples behind punctuation into their slices, and into every reader's running window
        that has summed their slice already: what it subtracts when the slice leaves is the
        slice's content then, tuples behind punctuation included."""
        holding = [(reader, reader.running_holds(touched)) for reader in self.readers]
        holding = [(reader, held) for reader, held in holding if held.any()]
        arrays, width = self.cells.arrays, len(self.groups)
        names = {name for reader, _ in holding for name in reader.invertible}
        before = {name: arrays[name][rows, :width].copy() for name in names}
        self.cells.update(batch, *addressed, gid)
        for reader, held in holding:
            added = {
                name: (arrays[name][rows[held], :width] - before[name][held]).sum(axis=0)
                for name in reader.invertible
            }
            reader.absorb(added, width)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != "wid" or punctuation.value <= self.first_open:
            return
        self.first_open = punctuation.value
        for reader in self.readers:
            reader.punctuate(punctuation)
        keep_from = min((reader.keep_from() for reader in self.readers), default=END_OF_STREAM)
        self._release(END_OF_STREAM if self.first_open >= END_OF_STREAM else keep_from)

    def _release(self, keep_from: int) -> None:
        expired: list[int] = []
        for generation, rows in list(self._rows.items()):
            for s in [s for s in rows if s < keep_from]:
                expired.append(rows.pop(s))
            if not rows and generation < self.generation:
                del self._rows[generation]
        if expired:
            self.free_rows(expired)
            self._live.clear()
            if not any(reader.queue.flushing for reader in self.readers):  # their queued cells keep group ids
                self._compact_groups()

    def _compact_groups(self) -> None:
        # A reader's running window holds only slices still live: its groups are kept too.
        compact_groups(self.groups, self.cells, [r for rows in self._rows.values() for r in rows.values()])

    def open_windows(self) -> int:
        return sum(len(rows) for rows in self._rows.values())

    def state_bytes(self) -> int:
        return self.cells.nbytes() + self.groups.nbytes()


__all__ = ["SharedSlices"]
