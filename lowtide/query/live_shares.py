"""The live slices shared across queries: :class:`Shares`, the registry of an engine or a worker,
and each :class:`Share`'s operators. What is shared, as the planner reads it, is data
(:class:`~lowtide.query.sharing.ShareIndex`); :meth:`Shares.index` reads that index off the live
slices. Built with the operators (:func:`~lowtide.query.build.build`), never by the planner.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.shared_slices import SharedSlices
from lowtide.query.sharing import ShareDescription, ShareIndex, ShareKey, slices_key


@dataclass
class Share:
    """One set of live slices and the operators that feed it (Input, [Select], Bucket, slices)."""

    key: ShareKey
    input: Input
    slices: SharedSlices
    operators: list[Operator]


def share_key(share: Share) -> str:
    """The name of a share's slices, the same in every process that plans the same queries."""
    return slices_key(share.key, share.slices.width)


class ReadsSlices(Protocol):
    """A started plan, as the registry sees it (:class:`~lowtide.query.plan.Plan`)."""

    @property
    def share(self) -> Share | None: ...

    @property
    def joins_share(self) -> bool: ...

    @property
    def reader(self) -> PanedWIDAggregate | None: ...


class Shares:
    """The live slices of an engine or a worker, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Share] = {}

    def __iter__(self) -> Iterator[Share]:
        """Every share, once (a worker checkpoints each under its :func:`share_key`)."""
        return iter(list(self._by_name.values()))

    def named(self, name: str) -> Share | None:
        """The share whose :func:`share_key` is ``name``, if it exists."""
        return self._by_name.get(name)

    def index(self) -> ShareIndex:
        """What these slices are, as data: the index queries are described with."""
        return ShareIndex(
            (ShareDescription(s.key, s.slices.width, True), len(s.slices.readers)) for s in self
        )

    def enter(self, plan: ReadsSlices) -> bool:
        """Record a started plan's share; True when the plan joined slices fed already (then its
        own input feeds nothing)."""
        share = plan.share
        if share is None:
            return False
        if plan.joins_share:
            return True
        self.add(share)
        return False

    def leave(self, plan: ReadsSlices) -> None:
        """Stop a plan's reading of its share; the last reader takes the slices down."""
        share = plan.share
        if share is None:
            return
        assert plan.reader is not None
        plan.reader.detach()
        if not share.slices.readers:
            self.remove(share)

    def add(self, share: Share) -> None:
        name = share_key(share)
        assert name not in self._by_name, f"slices {name} are live already"
        self._by_name[name] = share

    def remove(self, share: Share) -> None:
        del self._by_name[share_key(share)]


__all__ = ["ReadsSlices", "Share", "Shares", "share_key"]
