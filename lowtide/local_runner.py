"""The in-process runner: every query's operator graph runs here, fed directly by the door.

A query's graph is built here from its description, with the door's string pool and this
runner's live shared slices; its Inputs are the subscribers of its input streams, and its output
operator feeds the door's sink. A configured limit the query passes while it runs (windows per step) fails the
queries reading through the Input it came in by, and only those: their Inputs take nothing more
and the door hears of it (:attr:`~lowtide.runner.PlannedQuery.fail`); the stream and every other
query go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.errors import ResourceExhausted
from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.query.build import BuildContext, build
from lowtide.query.description import Fields, PlanDescription
from lowtide.query.live_shares import Shares
from lowtide.query.plan import Plan
from lowtide.results import to_table
from lowtide.runner import PlannedQuery, Subscribers
from lowtide.strings import StringPool


@dataclass
class _Local:
    query: PlannedQuery
    plan: Plan
    subscribers: Subscribers
    failed: bool = False

    @property
    def operators(self) -> list[Operator]:
        return [*self.plan.operators, self.query.sink]


class LocalRunner:
    def __init__(self, pool: StringPool) -> None:
        """``pool``: the door's (the graphs decode and compile with it)."""
        self.pool = pool
        self.shares = Shares()  # the live slices queries share here
        self._queries: dict[str, _Local] = {}

    def check(self, description: PlanDescription) -> None:
        """Every planned query runs here: its strings are coded with the door's own pool."""

    def register(self, query: PlannedQuery) -> Subscribers:
        plan = build(query.description, BuildContext(self.pool, partial(self._late, query), self.shares))
        plan.output.connect(query.sink)
        plan.start()
        self.shares.enter(plan)
        for _, op in plan.inputs:
            op.on_failure = partial(self._fail_readers, op)
        self._queries[query.name] = _Local(query, plan, list(plan.inputs))
        return list(plan.inputs)

    def plan(self, name: str) -> Plan:
        """The operator graph a query runs here."""
        return self._queries[name].plan

    def _late(self, query: PlannedQuery, batch: Batch, fields: Fields) -> None:
        query.on_late(to_table(batch, fields, self.pool), batch.n)

    def _fail_readers(self, op: Input, exc: ResourceExhausted) -> None:
        """A limit was passed below ``op``: every query reading through it fails (those reading
        shared slices too: their input is gone)."""
        for local in self._queries.values():
            if any(o is op for _, o in local.subscribers):
                self._fail(local, exc)

    def _fail(self, local: _Local, exc: ResourceExhausted) -> None:
        if not local.failed:
            local.failed = True
            for _, op in local.subscribers:
                op.failed = True
            local.query.fail(exc)

    def drop(self, name: str) -> None:
        self.shares.leave(self._queries.pop(name).plan)

    def emit_early(self, name: str) -> None:
        local = self._queries[name]
        if local.failed:
            return
        try:
            local.plan.emit_partials()
        except ResourceExhausted as exc:
            self._fail(local, exc)

    def strings_released(self, codes: npt.NDArray[np.int64]) -> None:
        """Nothing to tell: the graphs here decode with the door's own pool."""

    def placement(self, description: PlanDescription) -> str:
        return ""

    def operators(self, name: str) -> list[tuple[str, int, int]]:
        return [(op.label, op.tuples_in, op.tuples_out) for op in self._queries[name].operators]

    def open_windows(self, name: str) -> int:
        return sum(op.open_windows() for op in self._queries[name].operators)

    def state_bytes(self, name: str) -> int:
        return int(sum(op.state_bytes() for op in self._queries[name].operators))


__all__ = ["LocalRunner"]
