"""Slices shared across the sliding-window queries of one stream: stream slicing, as in
Traub et al., "Efficient Window Aggregation with General Stream Slicing" (EDBT 2019), section 4.

Two Paned-WID queries can read the same :class:`~lowtide.operators.shared_slices.SharedSlices`
when their tuples reach it the same way - the same stream, the same WHERE, the same GROUP BY,
the same late policy (``drop``) - and the slice width divides both panes. A tuple behind
punctuation is late or not per query: the share's Input forwards it to the slices, whose readers
each count it in their windows not yet emitted and send it to their own query's late side stream
if it missed an emitted one (:mod:`lowtide.operators.shared_slices`).

Which slices a query reads is decided once, when it is described (:mod:`lowtide.query.describe`),
from a :class:`ShareIndex`: what is shared, as data (each share's key, width and readers), kept
by whoever describes queries. The description names the share (:class:`ShareDescription`); a
query joining slices fed already finds their operators in the live registry, :class:`Shares`, by
that name, and ``explain`` shows which, and how many queries read the slices. The registry's
:meth:`Shares.index` is the same index, read off the live slices.

A share is named across processes by :func:`slices_key` (its slice width and a digest of what
feeds it), under which a checkpoint keeps its state. A query described again after a restore
reads the slices it read before (``PlanOptions.restored_share``): it joins them, or, when the
query that fed them has been dropped since, starts them again with their width.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from lowtide.errors import CorruptState
from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.shared_slices import SharedSlices
from lowtide.query.ast import Expr
from lowtide.schema import ColumnType

# What makes two queries' slices the same: stream, alias, WHERE, GROUP BY columns and their types.
# Frozen dataclasses, tuples and strings: its ``repr`` is stable across processes.
ShareKey: TypeAlias = tuple[str, str | None, Expr | None, tuple[str, ...], tuple[ColumnType, ...]]


def slices_key(key: ShareKey, width: int) -> str:
    """``"<width>:<digest>"``: the slice width and a digest of ``key``."""
    return f"{width}:{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}"


def saved_width(name: str, key: ShareKey, pane: int) -> int:
    """The slice width in ``name``, the :func:`slices_key` of slices a restored query read; raises
    ``CorruptState`` unless a query fed as ``key`` with panes of ``pane`` can read them."""
    width = int(name.partition(":")[0]) if re.match(r"[1-9][0-9]{0,18}:", name) else 0
    if not (width and pane % width == 0 and slices_key(key, width) == name):
        raise CorruptState(f"the query does not read the slices {name[:40]!r} its state was saved with")
    return width


@dataclass(frozen=True)
class ShareDescription:
    """The slices a query reads: fed as ``key``, ``width`` wide; ``joins``: fed already by an
    earlier query (the query's own Input feeds nothing), else the query starts them."""

    key: ShareKey
    width: int
    joins: bool

    @property
    def name(self) -> str:
        return slices_key(self.key, self.width)


class ShareIndex:
    """What is shared, as data: each share's key and width, and how many queries read it, in the
    order the shares started (the first that fits is joined)."""

    def __init__(self, shares: Iterable[tuple[ShareDescription, int]] = ()) -> None:
        self._shares: dict[str, tuple[ShareDescription, int]] = {}
        for share, readers in shares:
            self._shares[share.name] = (ShareDescription(share.key, share.width, True), readers)

    def find(self, key: ShareKey, pane: int) -> ShareDescription | None:
        """A share fed as ``key`` whose slices tile panes of ``pane``, to join."""
        return next(
            (s for s, _ in self._shares.values() if s.key == key and pane % s.width == 0),
            None,
        )

    def named(self, name: str) -> ShareDescription | None:
        """The share of that :func:`slices_key`, to join, if it exists."""
        found = self._shares.get(name)
        return found[0] if found is not None else None

    def enter(self, share: ShareDescription | None) -> None:
        """A query reading ``share`` (its description's) started."""
        if share is None:
            return
        readers = self._shares[share.name][1] if share.joins else 0
        self._shares[share.name] = (ShareDescription(share.key, share.width, True), readers + 1)

    def leave(self, share: ShareDescription | None) -> None:
        """A query reading ``share`` was dropped; the last reader takes the share down."""
        if share is None:
            return
        found, readers = self._shares[share.name]
        if readers > 1:
            self._shares[share.name] = (found, readers - 1)
        else:
            del self._shares[share.name]

    def readers(self) -> dict[str, int]:
        """How many queries read each share, by name."""
        return {name: readers for name, (_, readers) in self._shares.items()}


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


__all__ = [
    "ReadsSlices",
    "Share",
    "ShareDescription",
    "ShareIndex",
    "ShareKey",
    "Shares",
    "saved_width",
    "share_key",
    "slices_key",
]
