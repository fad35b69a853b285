"""The operator contract shared by every node of a query graph.

An operator consumes batches and punctuation on numbered input ports and pushes batches and
punctuation to the operators connected downstream. It never sorts its input and never holds a
tuple back to restore order: whatever it holds is state that punctuation eventually releases.
Each subclass states in its docstring what its output punctuation promises.

Each subclass also names its state in ``STATE``, the public fields of its saved form under its
``VERSION`` (see :mod:`lowtide.snapshot`): restored into the same operator planned again, it
resumes exactly where the snapshot was taken. The counters and the last punctuation emitted are
every operator's state (a change to these fields bumps every operator's ``VERSION``). And each
says how its input may be split across workers, :meth:`Operator.placement` (see
:mod:`lowtide.operators.placement`): one worker unless it says otherwise; ``placement_for``, a
static method of the parameters it is built with, says the same before it is built (a query's
partitioning is known from its description).
Operators over windows declare more: :mod:`lowtide.operators.window_operator`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from lowtide.batch import Batch
from lowtide.operators.placement import ONE_WORKER, Placement
from lowtide.punctuation.model import Punctuation
from lowtide.snapshot import DATA, INT, Field, Stateful, declare


class Operator(Stateful, ABC):
    """A node of an operator graph; ``label`` names it in ``explain`` and in metrics."""

    label: str = "Operator"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(tuples_in=INT, tuples_out=INT, progress_out=DATA)

    def __init__(self) -> None:
        self._outputs: list[tuple[Operator, int]] = []
        self.tuples_in = 0
        self.tuples_out = 0
        self.progress_out: dict[str, int] = {}  # the last punctuation emitted, per attribute

    @property
    def outputs(self) -> list[tuple[Operator, int]]:
        return self._outputs

    def connect(self, downstream: Operator, port: int = 0) -> Operator:
        """Send this operator's output to ``downstream``'s input ``port``; returns ``downstream``."""
        self._outputs.append((downstream, port))
        return downstream

    def placement(self) -> Placement:
        """How this operator's input may be split across workers: on one worker, unless a
        subclass declares a split that leaves its output unchanged."""
        return ONE_WORKER

    @abstractmethod
    def process(self, batch: Batch, port: int = 0) -> None:
        """Consume a batch arriving on ``port`` (any order, any split)."""

    @abstractmethod
    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        """Consume punctuation arriving on ``port`` (never regressing on one port)."""

    def emit(self, batch: Batch) -> None:
        if batch.n == 0:
            return
        self.tuples_out += batch.n
        for operator, port in self._outputs:
            operator.process(batch, port)

    def emit_punctuation(self, punctuation: Punctuation) -> None:
        for operator, port in self._outputs:
            operator.punctuate(punctuation, port)

    def emit_progress(self, value: int, attribute: str = "window_end") -> None:
        """Emit ``Punctuation(value, attribute)`` when it moves that attribute on: output
        punctuation never goes back nor repeats."""
        last = self.progress_out.get(attribute)
        if last is None or value > last:
            self.progress_out[attribute] = value
            self.emit_punctuation(Punctuation(value, attribute))

    def describe(self) -> str:
        """One line for ``explain``: the operator and its parameters."""
        return self.label

    def state_bytes(self) -> int:
        """Bytes of state this operator holds (0 for stateless operators)."""
        return 0

    def open_windows(self) -> int:
        """Windows (or join buckets) currently open; 0 for operators without windows."""
        return 0
