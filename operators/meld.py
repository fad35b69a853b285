"""Meld (Figure 8-2): the order-insensitive UNION of several inputs.

Tuples pass through at once, never buffered. Output punctuation on an attribute is the minimum
of the latest punctuation of every input on that attribute; it is emitted only when that minimum
rises, so it is never repeated and never regresses. Its state: the latest punctuation of each
input on each attribute. Placement: any split by row position (each worker melds the punctuation
of all inputs); its rows pass on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.punctuation.model import NO_PROGRESS, Punctuation
from lowtide.snapshot import DATA, Field, declare


class Meld(Operator):
    label = "Meld"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(Operator.STATE, bounds=DATA.at("_bounds"))

    def __init__(self, inputs: int) -> None:
        super().__init__()
        self.inputs = inputs
        self._bounds: dict[str, list[int]] = {}

    def describe(self) -> str:
        return f"Meld of {self.inputs} inputs"

    def placement(self) -> Placement:
        return self.placement_for()

    @staticmethod
    def placement_for() -> Placement:
        return Placement.by_row(passes_rows=True)

    @property
    def low_watermark(self) -> int:
        """The lowest output punctuation over its attributes (NO_PROGRESS before any)."""
        return min(self.progress_out.values(), default=NO_PROGRESS)

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        self.emit(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        bounds = self._bounds.setdefault(punctuation.attribute, [NO_PROGRESS] * self.inputs)
        bounds[port] = max(bounds[port], punctuation.value)
        low = min(bounds)
        if low > NO_PROGRESS:
            self.emit_progress(low, punctuation.attribute)
