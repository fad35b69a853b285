"""A query's operator graph, built from its description (:func:`~lowtide.query.build.build`).

Invariant: everything a plan is besides its live operators is its
:class:`~lowtide.query.description.PlanDescription`; the properties below read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.window_operator import WindowOperator
from lowtide.query.description import Fields, PlanDescription
from lowtide.query.early import Early
from lowtide.query.sharing import Share


@dataclass
class Plan:
    description: PlanDescription
    output: Operator
    inputs: list[tuple[str, Input]]  # each input stream and where it enters (the description's order)
    operators: list[Operator] = field(default_factory=list)  # in the description's node order
    share: Share | None = None  # the shareable slices this plan's Paned-WID reads
    reader: PanedWIDAggregate | None = None  # the Paned-WID reading slices, attached by start()

    @property
    def schema(self) -> Fields:
        return self.description.schema

    @property
    def progressing(self) -> tuple[str, ...]:
        return self.description.progressing

    @property
    def slides(self) -> dict[str, int]:
        """Stream -> SLIDE of a time window on it."""
        return dict(self.description.slides)

    @property
    def time_unit(self) -> str:
        """s|ms|us|ns: window bounds are epoch times in this unit; "": plain numbers."""
        return self.description.time_unit

    @property
    def early(self) -> Early | None:
        """EMIT EVERY: a final column, and partial rows when the engine's timer fires."""
        return self.description.early

    @property
    def joins_share(self) -> bool:
        """The share exists and is fed already."""
        return self.description.share is not None and self.description.share.joins

    def start(self) -> None:
        """Begin reading shared slices (planning leaves them untouched, for ``explain``)."""
        if self.reader is not None:
            self.reader.attach()

    def emit_partials(self) -> None:
        """EMIT EVERY fired: every window operator emits its open windows' current rows, final =
        false (see lowtide.query.early)."""
        for op in self.operators:
            if isinstance(op, WindowOperator):
                op.emit_partials()


__all__ = ["Plan"]
