"""Early results: ``EMIT EVERY d`` after a window specification (docs/design.md, "Query language").

Every ``d`` of processing time the open windows' current results are emitted, with ``final =
false``; the row emitted when punctuation covers a window has ``final = true`` (its revisions
too). A query without EMIT has no ``final`` column. Only the window aggregates' output changes:
partial rows are for windows their output punctuation does not cover yet, so the punctuation
they emit stays truthful for the rows that count (``final = true``); a partial row is the
reference over the tuples seen so far for its window, and the operators keep no state for it.

The pieces, and who owns them:

* the planner reads the clause with :func:`early_results` (time windows only: tumbling, sliding,
  landmark, sessions; never tuple windows) into the plan's :class:`Early`, and adds the column
  :data:`~lowtide.operators.result_rows.FINAL` after ``revision``;
* the engine keeps an :class:`EmitTimer` per such query on its clock (``Engine(clock=...)``,
  :class:`~lowtide.clock.ManualClock` in tests): whenever it runs its clock (``tick``) a due
  timer fires once, however many periods passed, and the plan's operators emit
  (``Plan.emit_partials`` -> :meth:`~lowtide.operators.base.Operator.emit_partials`, the hook a
  window operator overrides);
* in the server, firings are changes of the door like heartbeats: the front's ticker logs a
  ``Tick`` when a timer is due, applying it posts an ``EmitMessage`` to the query's workers, and
  their rows are melded with the query's other output. Replaying the input log fires the same
  timers at the same points, so output offsets name the same rows after a crash;
* a query's result stream carries its final rows only (a query reading it counts each window
  once): :func:`final_rows`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.errors import UnsupportedQuery
from lowtide.operators.result_rows import FINAL
from lowtide.operators.windows import Rows
from lowtide.query.ast import WindowSpec
from lowtide.query.windowing import SlideByTuple, to_units
from lowtide.schema import ColumnType

MILLISECONDS = ColumnType("timestamp[ms]")  # EMIT EVERY is counted in milliseconds of processing time


@dataclass(frozen=True)
class Early:
    """``EMIT EVERY``: the period in seconds of processing time, and as written."""

    every_s: float
    text: str

    def describe(self) -> str:
        """The line ``explain`` adds for it."""
        return (
            f"(early results: EMIT EVERY {self.text} of processing time, the open windows' current "
            "rows with final = false; the row punctuation releases has final = true)"
        )


def early_results(spec: WindowSpec, window: Any) -> Early | None:
    """The ``EMIT EVERY`` of ``spec`` over the planned ``window`` (None: none written); raises
    :class:`UnsupportedQuery` on a tuple window or a period without a unit of time."""
    every = spec.emit_every
    if every is None:
        return None
    if isinstance(window, Rows | SlideByTuple):
        raise UnsupportedQuery(
            "EMIT EVERY needs a time window (tumbling, sliding, landmark or session), not a tuple window"
        )
    if every.unit is None:
        raise UnsupportedQuery(
            f"EMIT EVERY is processing time: give {every.amount:g} a unit, e.g. EMIT EVERY {every.amount:g} s"
        )
    ms = to_units(every, MILLISECONDS, "EMIT EVERY")
    return Early(ms / 1000.0, f"{every.amount:g} {every.unit}")


@dataclass
class EmitTimer:
    """When a query's early results are next due: ``next_at`` (seconds, the engine's clock),
    then every ``every_s`` after it. A firing moves ``next_at`` past ``now`` on that grid: the
    periods missed meanwhile fire once, not one by one."""

    every_s: float
    next_at: float

    @staticmethod
    def started(early: Early, now: float) -> EmitTimer:
        return EmitTimer(early.every_s, now + early.every_s)

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def fire(self, now: float) -> None:
        """The firing at ``now`` (due) happened."""
        self.next_at += self.every_s * (math.floor((now - self.next_at) / self.every_s) + 1)
        if self.next_at <= now:  # rounding
            self.next_at = now + self.every_s


def final_rows(batch: Batch) -> Batch:
    """The rows of ``batch`` with ``final = true`` (all of them without the column)."""
    final = batch.columns.get(FINAL)
    if final is None or bool(np.all(final)):
        return batch
    keep = np.asarray(final, np.bool_)
    mask = pa.array(keep)
    columns = {
        name: v.filter(mask) if isinstance(v, pa.Array | pa.ChunkedArray) else v[keep]
        for name, v in batch.columns.items()
    }
    return Batch(columns, int(keep.sum()), batch.late)


__all__ = ["FINAL", "Early", "EmitTimer", "early_results", "final_rows"]
