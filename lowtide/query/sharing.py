"""Slices shared across the sliding-window queries of one stream (seed 001, §4).

Two Paned-WID queries can read the same :class:`~lowtide.operators.shared_slices.SharedSlices`
when their tuples reach it the same way - the same stream, the same WHERE, the same GROUP BY,
the same late policy (``drop``) - and the slice width divides both panes. The engine keeps a
:class:`Shares` registry; the planner looks a query up in it and either joins a share or starts
one (``explain`` shows which, and how many queries read the slices). A tuple behind punctuation
is late or not per query: the share's Input forwards it to the slices, whose readers each count it
in their windows not yet emitted and send it to their own query's late side stream if it missed
an emitted one (:mod:`lowtide.operators.shared_slices`).

A share is named across processes by :func:`share_key` (its slice width and a digest of what
feeds it), under which a checkpoint keeps its state. A query planned again after a restore reads
the slices it read before (``Context.restored_share``): it joins them, or, when the query that
fed them has been dropped since, starts them again with their width.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowtide.errors import CorruptState
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


def share_key(share: Share) -> str:
    """The name of a share's slices, the same in every process that plans the same queries."""
    return slices_key(share.key, share.slices.width)


def slices_key(key: Hashable, width: int) -> str:
    """``"<width>:<digest>"``: the slice width and a digest of ``key`` (stream, alias, WHERE, GROUP
    BY and group types: frozen dataclasses, tuples and strings, whose ``repr`` is stable)."""
    return f"{width}:{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}"


def saved_width(name: str, key: Hashable, pane: int) -> int:
    """The slice width in ``name``, the :func:`share_key` of slices a restored query read; raises
    ``CorruptState`` unless a query fed as ``key`` with panes of ``pane`` can read them."""
    width = int(name.partition(":")[0]) if re.match(r"[1-9][0-9]{0,18}:", name) else 0
    if not (width and pane % width == 0 and slices_key(key, width) == name):
        raise CorruptState(f"the query does not read the slices {name[:40]!r} its state was saved with")
    return width


class Shares:
    """The engine's shares, by what feeds them."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, list[Share]] = {}

    def __iter__(self) -> Iterator[Share]:
        """Every share, once (a worker checkpoints each under its :func:`share_key`)."""
        return (share for shares in self._by_key.values() for share in shares)

    def named(self, name: str) -> Share | None:
        """The share whose :func:`share_key` is ``name``, if it exists."""
        return next((share for share in self if share_key(share) == name), None)

    def find(self, key: Hashable, pane: int) -> Share | None:
        """A share for ``key`` whose slices tile panes of ``pane``."""
        return next((s for s in self._by_key.get(key, []) if pane % s.slices.width == 0), None)

    def enter(self, plan: Plan) -> bool:
        """Record a started plan's share; True when the plan joined slices fed already (then its
        own input feeds nothing)."""
        share = plan.share
        if share is None:
            return False
        if plan.joins_share:
            return True
        self.add(share)
        return False

    def leave(self, plan: Plan) -> None:
        """Stop a plan's reading of its share; the last reader takes the slices down."""
        share = plan.share
        if share is None:
            return
        assert plan.reader is not None
        plan.reader.detach()
        if not share.slices.readers:
            self.remove(share)

    def add(self, share: Share) -> None:
        self._by_key.setdefault(share.key, []).append(share)

    def remove(self, share: Share) -> None:
        self._by_key[share.key].remove(share)
        if not self._by_key[share.key]:
            del self._by_key[share.key]


__all__ = ["Share", "Shares", "saved_width", "share_key", "slices_key"]
