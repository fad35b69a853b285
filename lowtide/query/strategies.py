"""How an aggregation runs: a table of strategies, in order of preference (the planner's half).

Each strategy says when it applies to an :class:`~lowtide.query.description.AggregateDescription`
and what feeds it (:class:`Feed`), and which nodes it adds to the graph when chosen (describe
time); the :class:`~lowtide.query.description.AggregateNode` it adds names it. The first that
applies is chosen (``explain`` shows which). Invariant: the choice reads the description and the
feed only, so the door and every runner make the same one.

This half loads no operator (the rule is ``tests/unit/test_layers.py``'s): of ``operators/`` it
reads data alone - window definitions, aggregate calls and :func:`~lowtide.operators.aggregates.fusable`,
:class:`~lowtide.operators.result_queue.SlowFlush`. How each strategy's operator is built from its
node and placed across workers is the build registry's, beside the operators
(:mod:`lowtide.operators.build_registry`), under the strategy's name.

Adding an operator: its module, one entry of :data:`STRATEGIES`, its builder in the registry, its
case in the contract suites.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from lowtide.operators.aggregates import fusable
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.windows import Session, Sliding, Window, pane_of
from lowtide.query.description import (
    AggregateDescription,
    AggregateNode,
    BucketNode,
    SelectNode,
    SlicesNode,
)
from lowtide.query.graph import Graph
from lowtide.query.sharing import ShareDescription, ShareKey
from lowtide.query.windowing import SlideByTuple


@dataclass(frozen=True)
class Feed:
    """What feeds an aggregation, as the strategies read it: the ``node`` before it, whether that
    is a WHERE (``filtered``), the key its slices would be shared under (None: not shareable),
    the slices it is to read (fed already, or read before a restore), the slow flush, and the
    overlap from which Paned-WID runs (the query's
    :attr:`~lowtide.query.description.PlanOptions.paned_min_overlap`)."""

    node: int
    filtered: bool
    share_key: ShareKey | None
    reads: ShareDescription | None
    flush: SlowFlush | None
    paned_min_overlap: int


class Strategy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        """Whether it runs this aggregation (the first in the table that does is chosen)."""

    def describe(self, aggregate: AggregateDescription, feed: Feed, graph: Graph) -> None:
        """Add its nodes to ``graph``, fed by ``feed.node``: its operator alone by default."""
        graph.add(AggregateNode(self.name, aggregate), feed.node)


class SlideByTupleStrategy(Strategy):
    """``[RANGE r, RATTR ra, SLIDE n ROWS, SATTR ...]``: windows slide by rows, ranges are on ra."""

    name = "slide-by-tuple"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        return isinstance(aggregate.window, SlideByTuple)


class SessionStrategy(Strategy):
    """Session windows: under drop the Inputs forward tuples behind punctuation and the aggregate
    judges them; under error its rule calls each late (whether one is depends on its state)."""

    name = "session"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        return isinstance(aggregate.window, Session)


class PanedStrategy(Strategy):
    """Paned-WID: its window-level query over slices, those it reads (an earlier query's, fed the
    same way, or those it read before a restore) or its own, shareable under the feed's key.
    Tuples behind punctuation travel to the slices, where each reader counts them in its windows
    not yet emitted and sends those that missed an emitted one to its own late side stream."""

    name = "paned"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        """Holistic aggregates take it only to read slices another query keeps already: alone,
        AdaptWID holds less state at the same speed (bench/adapt.py, the holistic table)."""
        window = aggregate.window
        return (
            isinstance(window, Sliding)
            and window.range >= feed.paned_min_overlap * window.slide
            and aggregate.lateness is None  # revisions of late tuples need per-window cells
            and (feed.reads is not None or not any(call.func.holistic for call in aggregate.calls))
        )

    def describe(self, aggregate: AggregateDescription, feed: Feed, graph: Graph) -> None:
        window = aggregate.window
        assert isinstance(window, Sliding)
        share = feed.reads
        if share is None and feed.share_key is not None:
            share = ShareDescription(feed.share_key, pane_of(window).range, joins=False)
        width = share.width if share is not None else pane_of(window).range
        bucket = graph.add(BucketNode(Sliding(width, width, window.attribute)), feed.node)
        slices = graph.add(SlicesNode(width, aggregate.groups, aggregate.group_types), bucket)
        graph.add(AggregateNode(self.name, aggregate, slices=slices, flush=feed.flush))  # reads, not fed
        graph.share = share


class AdaptStrategy(Strategy):
    """AdaptWID for overlapping windows of holistic aggregates: they have no partials to share,
    and plain WID would keep each value once per window it falls in, where AdaptWID's lazy groups
    keep it once."""

    name = "adaptive"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        window = aggregate.window
        return (
            isinstance(window, Sliding)
            and window.range > window.slide
            and aggregate.lateness is None
            and any(call.func.holistic for call in aggregate.calls)
        )

    def describe(self, aggregate: AggregateDescription, feed: Feed, graph: Graph) -> None:
        window = aggregate.window
        assert isinstance(window, Sliding)
        bucket = graph.add(BucketNode(window), feed.node)
        graph.add(AggregateNode(self.name, aggregate), bucket)


class FusedStrategy(Strategy):
    """Fused WID runs the WHERE before it itself: the gain is the filtered copy it saves."""

    name = "fused"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        return (
            feed.filtered
            and isinstance(aggregate.window, Sliding)
            and aggregate.lateness is None
            and fusable(aggregate.calls, aggregate.group_types)
        )

    def describe(self, aggregate: AggregateDescription, feed: Feed, graph: Graph) -> None:
        assert feed.node == len(graph.nodes) - 1
        where = graph.pop()  # the WHERE it runs, out of the graph
        assert isinstance(where.kind, SelectNode)
        graph.add(
            AggregateNode(self.name, aggregate, where=where.kind.where, flush=feed.flush), *where.sources
        )


class WIDStrategy(Strategy):
    """WID: any window of ids (sliding, tumbling, landmark, tuple windows), late updates too."""

    name = "wid"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        return isinstance(aggregate.window, Window)

    def describe(self, aggregate: AggregateDescription, feed: Feed, graph: Graph) -> None:
        window = aggregate.window
        assert isinstance(window, Window)
        bucket = graph.add(BucketNode(window, aggregate.lateness), feed.node)
        # Revisions must follow their window's first emission: no slow flush under lateness.
        timed = aggregate.lateness is None and isinstance(window, Sliding)
        graph.add(AggregateNode(self.name, aggregate, flush=feed.flush if timed else None), bucket)


# In order of preference: the first that applies runs the aggregation.
STRATEGIES: tuple[Strategy, ...] = (
    SlideByTupleStrategy(),
    SessionStrategy(),
    PanedStrategy(),
    AdaptStrategy(),
    FusedStrategy(),
    WIDStrategy(),
)


def choose(aggregate: AggregateDescription, feed: Feed) -> Strategy:
    """The first strategy that applies."""
    return next(s for s in STRATEGIES if s.applies(aggregate, feed))


__all__ = ["STRATEGIES", "Feed", "Strategy", "choose"]
