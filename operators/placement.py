"""Placement: how an operator's input may be split across workers without changing its output.

Every operator declares its placement (:meth:`~lowtide.operators.base.Operator.placement`) beside
its punctuation contract and its ``STATE``; the server combines the placements of a plan's
operators into the query's partitioning (``lowtide.server.partitioning``), so that no one else
restates which operator splits how.

* :attr:`Split.BY_ROW`: the operator relates no row to another (Select, Project, Meld...): any
  split of its input, by row position, gives the same output.
* :attr:`Split.BY_KEYS`: its state is per key: the rows arriving on input port ``p`` with equal
  values of the columns ``keys[p]`` must meet on one worker (group-by columns of a time-window
  aggregate, a partitioned tuple window's PA columns, a join's equality keys).
* :attr:`Split.ONE_WORKER`: its output depends on the whole input (arrival order, ranks, one
  aggregate over every row, DISTINCT): it runs on one worker. The default: an operator that
  declares nothing is never split.

``passes_rows``: the operator's output rows are its input rows, filtered or with columns added,
so an operator after it sees the input's key columns unchanged and a split by them still holds
there. Joins, aggregates and projections make new rows: keys needed after them cannot be
traced back to the stream, and such a query runs on one worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Split(Enum):
    BY_ROW = "row position"
    BY_KEYS = "keys"
    ONE_WORKER = "one worker"


@dataclass(frozen=True)
class Placement:
    """``keys[p]``: with ``BY_KEYS``, the key columns of input port ``p`` (never empty)."""

    split: Split
    keys: tuple[tuple[str, ...], ...] = ()
    passes_rows: bool = False

    def __post_init__(self) -> None:
        assert (self.split is Split.BY_KEYS) == bool(self.keys) and all(self.keys), self

    @staticmethod
    def by_row(passes_rows: bool) -> Placement:
        return Placement(Split.BY_ROW, passes_rows=passes_rows)

    @staticmethod
    def by_keys(*keys: tuple[str, ...], passes_rows: bool = False) -> Placement:
        """Split by ``keys[p]`` on port ``p``; one worker if a port has no key columns (then
        every row of it must meet every other)."""
        if not all(keys):
            return ONE_WORKER
        return Placement(Split.BY_KEYS, keys, passes_rows)


ONE_WORKER = Placement(Split.ONE_WORKER)

__all__ = ["ONE_WORKER", "Placement", "Split"]
