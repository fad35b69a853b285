"""A query's operator graph, built from its description (:func:`~lowtide.query.build.build`).

Invariant: everything a plan is besides its live operators is its
:class:`~lowtide.query.description.PlanDescription` (schema, slides, early results, the share
it reads: whoever needs them reads the description).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.window_operator import WindowOperator
from lowtide.query.description import PlanDescription
from lowtide.query.live_shares import Share


@dataclass
class Plan:
    description: PlanDescription
    output: Operator
    inputs: list[tuple[str, Input]]  # each input stream and where it enters (the description's order)
    operators: list[Operator] = field(default_factory=list)  # in the description's node order
    share: Share | None = None  # the shareable slices this plan's Paned-WID reads
    reader: PanedWIDAggregate | None = None  # the Paned-WID reading slices, attached by start()

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
