"""Input: where a stream enters one query; applies the query's late policy.

Tuples at or above the stream's published progress pass on unchanged. Late tuples (below it)
follow the policy: ``drop`` hands them to the late side stream, ``update`` passes them on
marked ``late`` (a downstream aggregate revises its windows), ``error`` never gets here (the
engine rejects the whole batch first). Punctuation passes on unchanged: the stream's progress,
the minimum over its live sources, never regressing. Its state: its counters. Placement: any
split by row position; its rows pass on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.operators.state import INT, Keep, declare
from lowtide.punctuation.model import Punctuation
from lowtide.punctuation.policies import LatePolicy


class Input(Operator):
    label = "Input"
    STATE: ClassVar[Mapping[str, Keep]] = declare(Operator.STATE, late_tuples=INT)

    def __init__(self, stream: str, policy: LatePolicy, on_drop: Callable[[Batch], None]) -> None:
        super().__init__()
        self.stream = stream
        self.policy = policy
        self.on_drop = on_drop
        self.late_tuples = 0

    def describe(self) -> str:
        return f"Input {self.stream}"

    def placement(self) -> Placement:
        return Placement.by_row(passes_rows=True)

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        self.emit(batch)

    def process_late(self, batch: Batch) -> None:
        self.late_tuples += batch.n
        if self.policy is LatePolicy.UPDATE:
            self.emit(Batch(batch.columns, batch.n, late=True))
        else:
            self.on_drop(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.emit_punctuation(punctuation)
