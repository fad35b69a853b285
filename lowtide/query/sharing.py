"""Slices shared across the sliding-window queries of one stream (seed 001, §4).

Two Paned-WID queries can read the same :class:`~lowtide.operators.shared_slices.SharedSlices`
when their tuples reach it the same way - the same stream, the same WHERE, the same GROUP BY,
the same late policy (``drop``) - and the slice width divides both panes. The engine keeps a
:class:`Shares` registry; the planner looks a query up in it and either joins a share or starts
one (``explain`` shows which, and how many queries read the slices).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.operators.shared_slices import SharedSlices

if TYPE_CHECKING:
    from lowtide.query.planner import Plan


@dataclass
class Share:
    """One set of slices and the operators that feed it (Input, [Select], Bucket, slices)."""

    key: Hashable
    input: Input
    slices: SharedSlices
    operators: list[Operator]
    late_handlers: list[Callable[[Batch], None]] = field(default_factory=list)

    def on_drop(self, batch: Batch) -> None:
        """A late tuple is late for every query reading the slices: each gets it on its side stream."""
        for handler in self.late_handlers:
            handler(batch)


class Shares:
    """The engine's shares, by what feeds them."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, list[Share]] = {}

    def find(self, key: Hashable, pane: int) -> Share | None:
        """A share for ``key`` whose slices tile panes of ``pane``."""
        return next((s for s in self._by_key.get(key, []) if pane % s.slices.width == 0), None)

    def enter(self, plan: Plan) -> bool:
        """Record a started plan's share; True when the plan joined slices fed already (then its
        own input feeds nothing)."""
        share = plan.share
        if share is None:
            return False
        assert plan.late_handler is not None
        if plan.joins_share:
            share.late_handlers.append(plan.late_handler)
            return True
        self.add(share)
        return False

    def leave(self, plan: Plan) -> None:
        """Stop a plan's reading of its share; the last reader takes the slices down."""
        share = plan.share
        if share is None:
            return
        assert plan.reader is not None and plan.late_handler is not None
        plan.reader.detach()
        share.late_handlers.remove(plan.late_handler)
        if not share.slices.readers:
            self.remove(share)

    def add(self, share: Share) -> None:
        self._by_key.setdefault(share.key, []).append(share)

    def remove(self, share: Share) -> None:
        self._by_key[share.key].remove(share)
        if not self._by_key[share.key]:
            del self._by_key[share.key]


__all__ = ["Share", "Shares"]
