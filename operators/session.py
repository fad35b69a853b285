"""Session Aggregate: session windows ``[SESSION gap, WA ts]`` per group, in any arrival order.

A session of a group is a maximal set of its tuples whose sorted values are each less than
``gap`` after the previous one: ``window_start`` = its first value, ``window_end`` = its last
value + ``gap``. Tuples arrive in any order: one may start a session, extend one, or merge two;
the sessions built are those of the tuples sorted, whatever the order and batch split. Each group's
sessions are sorted intervals in a :class:`~lowtide.operators.session_table.SessionTable`; their
aggregates are cells of a :class:`~lowtide.operators.aggregates.CellState` (row 0, one column per
session slot), merged exactly when sessions merge. No tuple is kept beyond its aggregates (the
value logs of holistic aggregates, as every window keeps them).

Punctuation contract. Input punctuation ``p`` on the window attribute completes every session
with ``window_end <= p``: no tuple at or above ``p`` is within ``gap`` of it, so none can extend
or merge it. Such sessions are emitted then, once, at revision 0, and their state is purged.
Then ``Punctuation(q, "window_end")`` is emitted with

    q = min(window_end of every session held and never shown,  floor(p) + gap)

where ``floor(p)`` is the smallest value a tuple arriving later may still have and be counted:
``p``, or ``p - L`` under ``late = update`` with allowed lateness ``L``. Invariant (what makes
``q`` truthful): a session only grows, so an open one never ends below its current end; a
session a later tuple ``t >= floor(p)`` starts or joins ends at ``t + gap`` or later. So no row
of revision 0 emitted after ``q`` has ``window_end < q``; ``q`` never goes back. At the end of
the stream every session is emitted and ``q`` is END_OF_STREAM. Batches emit nothing, except
under ``update`` (below): output punctuation moves with input punctuation only.

Late tuples (below the stream's punctuation): ``drop`` and ``error`` keep them from the operator.
Under ``update`` with allowed lateness ``L`` (0 when not given) a tuple counts iff its value is
at least ``p - L`` (the watermark rule of Spark; Flink's allowed lateness), and a session stays
held until ``p >= window_end + L``; together they guarantee that a tuple that counts finds every
session it is within ``gap`` of, so the sessions stay exact. A tuple below ``p - L`` goes to the
late side stream. A counted late tuple that changes a complete session re-emits it at once with
``revision`` + 1 (a new complete session comes out at revision 0); a session it reopens (its
new end above ``p``) is re-emitted when punctuation completes it again. When sessions merge, the
survivor is the earliest one ever shown (else the earliest): its next row is its next revision,
whose ``[window_start, window_end)`` holds every earlier revision's. Each other merged session
that was shown is withdrawn at once by a row with ``retracted = true``: its bounds and revision +
1 as last shown, its aggregates as they stood when merged away. Only such queries have the
``retracted`` column. HAVING decides which rows are shown; retractions always are.

Placement: by the group columns (a session is one group's); one worker without GROUP BY, where
the whole stream is one group (Flink's ``windowAll`` and Spark's ungrouped ``session_window`` do
the same). Early results (``EMIT EVERY``): the open sessions' current rows with ``final = false``.

A snapshot holds the group table, the session table and the accumulators, and the input
punctuation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.placement import Placement
from lowtide.operators.result_rows import FINAL, Having, apply_having, key_columns
from lowtide.operators.session_table import SessionTable
from lowtide.operators.state import INT, NESTED, Keep, declare
from lowtide.operators.windows import Session
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType

I64 = npt.NDArray[np.int64]
LateSink = Callable[[Batch], None]
RETRACTED = "retracted"  # the column of queries under late = update: true on a withdrawn session
_ROW = np.zeros(1, np.int64)  # every session's cells are in accumulator row 0
COMPACT_GROUPS = 4096  # group tables this large drop the groups without sessions (key churn)
_WINDOWS = np.zeros((2, 0), np.int64)


def _one_window(n: int) -> tuple[I64, I64]:
    """``[0, 1)`` for ``n`` tuples: every tuple updates one cell, row 0 (views of a cached pair,
    read only)."""
    global _WINDOWS
    if _WINDOWS.shape[1] < n:
        _WINDOWS = np.zeros((2, max(n, 2 * _WINDOWS.shape[1])), np.int64)
        _WINDOWS[1] = 1
        _WINDOWS.setflags(write=False)
    return _WINDOWS[0, :n], _WINDOWS[1, :n]


class SessionAggregate(Operator):
    label = "Session Aggregate"
    STATE: ClassVar[Mapping[str, Keep]] = declare(
        Operator.STATE, groups=NESTED, table=NESTED, cells=NESTED, progress_in=INT
    )

    def __init__(
        self,
        window: Session,
        group_columns: tuple[str, ...],
        group_types: tuple[ColumnType, ...],
        calls: tuple[AggregateCall, ...],
        columns: tuple[str, ...],
        having: Having | None = None,
        allowed_lateness: int | None = None,
        late_sink: LateSink | None = None,
        decode: Callable[[I64], Any] | None = None,
    ) -> None:
        """``columns``: the output columns in order (``retracted`` among them under ``update``);
        ``allowed_lateness`` None: late tuples never reach it (drop, error)."""
        super().__init__()
        self.window = window
        self.group_columns = group_columns
        self.group_types = group_types
        self.calls = calls
        self.columns = columns
        self.having = having
        self.allowed_lateness = allowed_lateness
        self.late_sink = late_sink
        self.decode = decode
        self.retracts = RETRACTED in columns
        self.groups = GroupTable(len(group_columns))
        self.table = SessionTable(window.gap)
        self.cells = CellState(calls)
        self.progress_in = NO_PROGRESS  # the last input punctuation

    def placement(self) -> Placement:
        """By the group columns; one worker without them."""
        return Placement.by_keys(self.group_columns)

    def describe(self) -> str:
        by = f" by {', '.join(self.group_columns)}" if self.group_columns else ""
        aggs = ", ".join(call.describe() for call in self.calls)
        late = ""
        if self.allowed_lateness is not None:
            late = f", keeps sessions {self.allowed_lateness} past punctuation (revisions, retractions)"
        return f"Session Aggregate {aggs}{by}, {self.window.describe()}{late}"

    def open_windows(self) -> int:
        return self.table.live()

    def state_bytes(self) -> int:
        return self.table.nbytes() + self.cells.nbytes() + self.groups.nbytes()

    def _floor(self) -> int:
        """The smallest value a tuple may have and still be counted exactly."""
        return max(NO_PROGRESS, self.progress_in - (self.allowed_lateness or 0))

    # -- input ------------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        ts = batch.columns[self.window.attribute].astype(np.int64, copy=False)
        floor = self._floor()
        if floor > NO_PROGRESS:
            counted = ts >= floor
            if not counted.all():
                if self.late_sink is not None:
                    self.late_sink(batch.select(~counted))
                batch, ts = batch.select(counted), ts[counted]
                if batch.n == 0:
                    return
        table = self.table
        gid = self.groups.ids(key_matrix(batch, self.group_columns))
        table.fit(len(self.groups))
        slot, gone, into = table.add(gid, ts)
        self.cells.ensure(1, table.used)
        if gone.shape[0]:
            if self.retracts:
                self._retract(gone, into)
            self.cells.fold_cells(0, into, gone)
            table.release(gone)
        self.cells.update(batch, *_one_window(batch.n), 0, _ROW, slot)
        if self.allowed_lateness is not None and self.progress_in > NO_PROGRESS:
            behind = ts < self.progress_in  # only these can touch a complete session
            if behind.any():
                touched = np.unique(slot[behind])
                self._emit(touched[table.end[touched] <= self.progress_in])

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != self.window.attribute or punctuation.value <= self.progress_in:
            return
        p = self.progress_in = punctuation.value
        table = self.table
        self._emit(table.due(p))
        cutoff = END_OF_STREAM if p >= END_OF_STREAM else self._floor()
        purged, lowest = table.purge(cutoff)
        if purged.shape[0]:
            self.cells.clear_cells(0, purged)
            table.release(purged)
            self._compact()
        if p >= END_OF_STREAM:
            self.emit_progress(END_OF_STREAM)
        else:
            self.emit_progress(min(lowest, self._floor() + self.window.gap, END_OF_STREAM - 1))

    def _compact(self) -> None:
        """Forget groups without a session once they are at least half of many groups."""
        width = len(self.groups)
        if width < COMPACT_GROUPS:
            return
        live = self.table.head[:width] >= 0
        if live.sum() * 2 <= width:
            self.table.regroup(self.groups.compact(live))

    # -- emission ---------------------------------------------------------------------------
    def emit_partials(self) -> None:
        """EMIT EVERY: the current rows of the sessions not complete yet, ``final = false``."""
        if FINAL in self.columns:
            self._emit(self.table.open(self.progress_in), final=False)

    def _emit(self, slots: I64, final: bool = True) -> None:
        """Emit the rows of the sessions ``slots`` (at their next revision) that HAVING lets
        out; unless partial (``final`` false), they count as shown and are evaluated."""
        k = slots.shape[0]
        if k == 0:
            return
        table = self.table
        revision = table.rev[slots] + 1
        columns = self._row_columns(
            table.start[slots], table.end[slots], table.sgid[slots], slots, revision, final
        )
        if self.retracts:
            columns[RETRACTED] = np.zeros(k, np.bool_)
        columns, keep = apply_having(self.having, columns)
        if final:
            shown = slots if keep is None else slots[keep]
            table.rev[shown] = table.rev[shown] + 1
            table.shown_start[shown] = table.start[shown]
            table.shown_end[shown] = table.end[shown]
            table.dirty[slots] = False
        self.emit(Batch({name: columns[name] for name in self.columns}, len(columns["revision"])))

    def _retract(self, gone: I64, into: I64) -> None:
        """Withdraw the shown sessions among ``gone`` (merged into ``into``), as last shown."""
        table = self.table
        shown = table.rev[gone] >= 0
        if not shown.any():
            return
        slots = gone[shown]
        revision = table.rev[slots] + 1
        columns = self._row_columns(
            table.shown_start[slots], table.shown_end[slots], table.sgid[into[shown]], slots, revision, True
        )
        columns[RETRACTED] = np.ones(slots.shape[0], np.bool_)
        self.emit(Batch({name: columns[name] for name in self.columns}, slots.shape[0]))

    def _row_columns(
        self, start: I64, end: I64, gids: I64, slots: I64, revision: I64, final: bool
    ) -> dict[str, Any]:
        columns: dict[str, Any] = {"window_start": start, "window_end": end}
        columns.update(key_columns(self.groups.keys[gids], self.group_columns, self.group_types))
        columns.update(
            self.cells.finalize(np.zeros(slots.shape[0], np.int64), slots, self.decode, self.calls)
        )
        columns["revision"] = revision
        if FINAL in self.columns:
            columns[FINAL] = np.full(slots.shape[0], final, np.bool_)
        return columns


__all__ = ["RETRACTED", "SessionAggregate"]
