"""Session Aggregate: session windows ``[SESSION gap, WA ts]`` per group, in any arrival order.

A session of a group is a maximal set of its tuples whose sorted values are each less than
``gap`` after the previous one - at most ``gap`` when the window is ``touching`` (Flink's
``SESSION``, Spark's ``session_window``: :class:`~lowtide.operators.windows.Session`); below,
``r`` is its ``reach``, 1 then, else 0. ``window_start`` = its first value, ``window_end`` = its
last value + ``gap``. Tuples arrive in any order: one may start a session, extend one, or merge two;
the sessions built are those of the tuples sorted, whatever the order and batch split. Each group's
sessions are sorted intervals in a :class:`~lowtide.operators.session_table.SessionTable`; their
aggregates are cells of a :class:`~lowtide.operators.aggregates.CellState` (row 0, one column per
session slot), merged exactly when sessions merge. No tuple is kept beyond its aggregates (the
value logs of holistic aggregates, as every window keeps them).

Punctuation contract. Input punctuation ``p`` on the window attribute completes every session
with ``window_end + r <= p``: no tuple at or above ``p`` can join it (less than ``gap`` after its
last value; at most ``gap`` when touching), so none can extend or merge it. Such sessions are
emitted then, once, at revision 0. A session is held until the *horizon* ``p - L`` completes it
likewise (``L``: the allowed lateness under ``late = update``, else 0: emitted and purged at
once), then purged; ``gone[g]`` keeps the largest end purged of each group ``g``. Then
``Punctuation(q, "window_end")`` is emitted with

    q = min(window_end of every session held and never shown,  floor + gap) = p - L + 1 - r

where ``floor = p - L - gap - r + 1`` is the smallest value a tuple may have and still count
(below). When a tuple joins a session is the session table's rule
(:class:`~lowtide.operators.session_table.SessionTable`); when a session is complete, the floor and
which tuples ``gone`` makes late are the window's logic
(:class:`~lowtide.operators.window_logic.SessionLogic`): this operator asks them.
Invariant (what makes ``q`` truthful): a session only grows, so one held never ends below its
current end, at least ``p - L + 1 - r`` (else it was purged); a session a counted tuple
``t >= floor`` starts or joins ends at ``t + gap >= floor + gap`` or later. So no row of revision
0 emitted after ``q`` has ``window_end < q``; ``q`` rises with ``p``. At the end of the stream
every session is emitted and ``q`` is END_OF_STREAM. Batches emit nothing, except under
``update`` (below): output punctuation moves with input punctuation only.

Behind punctuation (docs/design.md, "Punctuation and lateness"). A tuple ``t`` of group ``g`` counts
iff (a) its own session ``[t, t + gap)`` is not complete at the horizon (``t >= floor``) and (b)
``t - r >= gone[g]``. A purged session ``[s, e)`` has ``e + r <= p - L`` and ``s <= e - gap < t``,
so ``t`` would join it iff ``t < e + r``: (b) says exactly that ``t`` joins no purged session, so
the sessions stay those of every tuple counted, in any order. A counted tuple is placed as if it had
come in time: it joins, starts or merges held sessions (under ``drop`` those are all open at ``p``:
nothing emitted changes). Every other tuple is late for the query and goes to the late side
stream, once. Under ``error`` the query's Inputs reject every batch holding a tuple behind
punctuation: whether one is late depends on ``gone``, which a rule of punctuation alone
(:meth:`~lowtide.operators.window_logic.SessionLogic.late_for`, what the server's front
evaluates) cannot know.

Late policy ``update`` (allowed lateness ``L``, 0 when not given; Flink's allowed lateness): a
session stays held, after it was emitted, until ``p >= window_end + r + L``; a tuple counts by (a)
and (b) (Spark's watermark rule, ``t >= p - L``, counts fewer). A counted tuple that changes a
complete session re-emits it at once with ``revision`` + 1 (a new complete session comes out at
revision 0); a session it reopens (not complete at ``p`` any more) is re-emitted when
punctuation completes it again. When sessions merge, the survivor is the earliest one ever
shown (else the earliest): its next row is its next revision, whose ``[window_start,
window_end)`` holds every earlier revision's. Each other merged session that was shown is
withdrawn at once by a row with ``retracted = true``: its bounds and revision + 1 as last shown,
its aggregates as they stood when merged away. Only such queries have the ``retracted`` column.
HAVING decides which rows are shown; retractions always are.

Placement: by the group columns (a session is one group's); one worker without GROUP BY, where
the whole stream is one group (Flink's ``windowAll`` and Spark's ungrouped ``session_window`` do
the same). Early results (``EMIT EVERY``): the open sessions' current rows with ``final = false``.

A snapshot holds the group table, the session table (``gone`` with it) and the accumulators, and
the input punctuation. The rule (``touching``) is configuration, like the gap: the same query
planned again has it, and the state is the same under both rules (a session table saved under
the strict rule is one the touching rule reads: sessions exactly ``gap`` apart in it stay apart
until a tuple between them merges them). When the group table is compacted (key churn), a group
without sessions is forgotten once its ``gone`` can make no tuple at or above the floor late:
(a) then implies (b).
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
from lowtide.operators.result_rows import FINAL, RETRACTED, Having, apply_having, key_columns
from lowtide.operators.session_table import SessionTable
from lowtide.operators.window_logic import SessionLogic, logic_of
from lowtide.operators.window_operator import WindowOperator
from lowtide.operators.windows import Session
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.schema import ColumnType
from lowtide.snapshot import INT, NESTED, Field, declare

I64 = npt.NDArray[np.int64]
LateSink = Callable[[Batch], None]
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


class SessionAggregate(WindowOperator):
    label = "Session Aggregate"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
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
        ``allowed_lateness``: ``L`` under ``update``, None under drop and error (no revisions;
        sessions purged as they are emitted)."""
        super().__init__()
        self.window = window
        self.logic: SessionLogic = logic_of(window)
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
        self.table = SessionTable(window.gap, window.reach)
        self.cells = CellState(calls)
        self.progress_in = NO_PROGRESS  # the last input punctuation

    def placement(self) -> Placement:
        return self.placement_for(self.group_columns)

    @staticmethod
    def placement_for(group_columns: tuple[str, ...]) -> Placement:
        """By the group columns; one worker without them."""
        return Placement.by_keys(group_columns)

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

    def _horizon(self) -> int:
        """``p - L``: sessions ending at or below it are purged (emitted ones, or under
        ``update`` emitted ones kept ``L`` longer)."""
        return max(NO_PROGRESS, self.progress_in - (self.allowed_lateness or 0))

    def _floor(self) -> int:
        """The smallest value a tuple may have and still be counted: its own session is not
        complete at the horizon (module docstring, (a))."""
        return self.logic.floor(self._horizon())

    # -- input ------------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        ts = batch.columns[self.window.attribute].astype(np.int64, copy=False)
        table = self.table
        gid = self.groups.ids(key_matrix(batch, self.group_columns))
        table.fit(len(self.groups))
        p = self.progress_in
        if p > NO_PROGRESS:
            behind = ts < p  # only these can be late: gone + r <= p - L <= p
            if behind.any():
                late = behind & self.logic.missed(ts, table.gone[gid], self._horizon())
                if late.any():
                    if self.late_sink is not None:
                        self.late_sink(batch.select(late))
                    counted = ~late
                    batch, ts, gid = batch.select(counted), ts[counted], gid[counted]
                    if batch.n == 0:
                        return
        slot, merged, into = table.add(gid, ts)
        self.cells.ensure(1, table.used)
        if merged.shape[0]:
            if self.retracts:
                self._retract(merged, into)
            self.cells.fold_cells(0, into, merged)
            table.release(merged)
        self.cells.update(batch, *_one_window(batch.n), 0, _ROW, slot)
        if self.allowed_lateness is not None and p > NO_PROGRESS:
            behind = ts < p  # only these can touch a complete session
            if behind.any():
                touched = np.unique(slot[behind])
                self._emit(touched[table.end[touched] <= self.logic.close_for(p)])

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != self.window.attribute or punctuation.value <= self.progress_in:
            return
        p = self.progress_in = punctuation.value
        table = self.table
        self._emit(table.due(self.logic.close_for(p)))
        purged = table.purge(self.logic.close_for(END_OF_STREAM if p >= END_OF_STREAM else self._horizon()))
        if purged.shape[0]:
            self.cells.clear_cells(0, purged)
            table.release(purged)
            self._compact()
        if p >= END_OF_STREAM:
            self.emit_progress(END_OF_STREAM)
        else:  # = min(ends held never shown, floor + gap): no session held is complete at the horizon
            self.emit_progress(min(self._floor() + self.window.gap, END_OF_STREAM - 1))

    def _compact(self) -> None:
        """Forget the groups without a session, once they are at least half of many groups,
        unless their ``gone`` can still make a tuple at or above the floor late."""
        width = len(self.groups)
        if width < COMPACT_GROUPS:
            return
        table = self.table
        live = (table.head[:width] >= 0) | self.logic.joins_gone(self._floor(), table.gone[:width])
        if live.sum() * 2 <= width:
            table.regroup(self.groups.compact(live))

    # -- emission ---------------------------------------------------------------------------
    def emit_partials(self) -> None:
        """EMIT EVERY: the current rows of the sessions not complete yet, ``final = false``."""
        if FINAL in self.columns:
            self._emit(self.table.open(self.logic.close_for(self.progress_in)), final=False)

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
        if FINAL in self.columns and FINAL not in columns:  # else a column of the query's named so
            columns[FINAL] = np.full(slots.shape[0], final, np.bool_)
        return columns


__all__ = ["SessionAggregate"]
