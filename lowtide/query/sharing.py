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
query joining slices fed already finds their operators in the live registry,
:class:`~lowtide.query.live_shares.Shares`, by that name, and ``explain`` shows which, and how
many queries read the slices. The registry's :meth:`~lowtide.query.live_shares.Shares.index` is
the same index, read off the live slices. This module is the data alone, the planner's: it loads
no operator (the live slices are in :mod:`lowtide.query.live_shares`).

A share is named across processes by :func:`slices_key` (its slice width and a digest of what
feeds it), under which a checkpoint keeps its state. A query described again after a restore
reads the slices it read before (``PlanOptions.restored_share``): it joins them, or, when the
query that fed them has been dropped since, starts them again with their width.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from lowtide.errors import CorruptState
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


__all__ = [
    "ShareDescription",
    "ShareIndex",
    "ShareKey",
    "saved_width",
    "slices_key",
]
