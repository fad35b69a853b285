"""Input: where a stream enters one query; applies the query's late policy.

Tuples at or above the stream's published progress pass on unchanged. Tuples *behind* it
(docs/design.md, "Punctuation and lateness") pass on marked ``late`` when the query's window
operator counts them (it has a ``late_rule``, compiled from the query's description by
:mod:`lowtide.query.late_rules`; always under ``update``): that operator counts each in every window
of it not yet emitted and treats only the rest as late for the query. Otherwise they are
late here and follow the policy: ``drop`` hands them to the late side stream, ``error`` never
gets here (the door rejects the whole batch first, by the same rule compiled from the query's
description: it tells from the punctuation alone which tuples the window operator could no longer
count, so the door answers as the operator would, wherever the operator runs).
Punctuation passes on unchanged: the stream's progress, the minimum over its live sources, never
regressing. Its state: its counters. Placement: any split by row position; its rows pass on.
With ``on_failure`` set (the in-process engine), a configured limit the query passes downstream
(:class:`~lowtide.errors.ResourceExhausted`) goes there instead of to the caller, and the Input
takes nothing more: the query fails alone, the stream's other queries go on. Without it the
error reaches the caller (a worker fails the query it was handling).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.errors import ResourceExhausted
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.punctuation.model import Punctuation
from lowtide.punctuation.policies import LatePolicy
from lowtide.snapshot import INT, Field, declare

# Which tuples behind punctuation are late for a query, given every stream's published progress.
LateRule: TypeAlias = Callable[[Batch, Mapping[str, int]], npt.NDArray[np.bool_]]


class Input(Operator):
    label = "Input"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(Operator.STATE, late_tuples=INT)

    def __init__(self, stream: str, policy: LatePolicy, on_drop: Callable[[Batch], None]) -> None:
        super().__init__()
        self.stream = stream
        self.policy = policy
        self.on_drop = on_drop
        self.late_tuples = 0
        # Which behind tuples the window operator can no longer count exactly (None: all).
        self.late_rule: LateRule | None = None
        # It feeds a tuple window, which numbers rows as they arrive: until the end of the
        # stream no tuple is behind it, and a batch comes whole, in its order.
        self.numbers_rows = False
        self.on_failure: Callable[[ResourceExhausted], None] | None = None
        self.failed = False  # a limit failed the query: nothing passes any more

    @property
    def counts_behind(self) -> bool:
        """Whether tuples behind punctuation travel on for the window operator to judge: a
        window logic judges them (the rule is one, compiled by :mod:`lowtide.query.late_rules`)."""
        # Under update they travel on without a rule too: that is the policy's (windows revised
        # past punctuation), not a window's logic, so it stays a clause of its own.
        return self.late_rule is not None or self.policy is LatePolicy.UPDATE

    def describe(self) -> str:
        return f"Input {self.stream}"

    def placement(self) -> Placement:
        return self.placement_for()

    @staticmethod
    def placement_for() -> Placement:
        return Placement.by_row(passes_rows=True)

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        self._guarded(lambda: self.emit(batch))

    def process_late(self, batch: Batch) -> None:
        """Tuples behind the stream's punctuation (see the module)."""
        self.late_tuples += batch.n
        if self.counts_behind:
            self._guarded(lambda: self.emit(Batch(batch.columns, batch.n, late=True)))
        elif not self.failed:
            self.on_drop(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self._guarded(lambda: self.emit_punctuation(punctuation))

    def _guarded(self, send: Callable[[], None]) -> None:
        """Pass something downstream; a limit passed there goes to ``on_failure`` (see the module)."""
        if self.failed:
            return
        if self.on_failure is None:
            send()
            return
        try:
            send()
        except ResourceExhausted as exc:
            self.failed = True
            self.on_failure(exc)
