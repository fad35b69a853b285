"""How an aggregation runs: a table of strategies, in order of preference.

Each strategy says when it applies to an :class:`~lowtide.query.description.AggregateDescription`
and what feeds it (:class:`Feed`), which nodes it adds to the graph when chosen (describe time),
how it builds its operator from its node (build time) and how that operator is placed across
workers. The first that applies is chosen (``explain`` shows which). Invariant: the choice reads
the description and the feed only, so the door and every runner make the same one.

Adding an operator: its module, one entry of :data:`STRATEGIES`, its case in the contract suites.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from lowtide.batch import Batch
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggregateCall
from lowtide.operators.base import Operator
from lowtide.operators.fused_wid import FusedWIDAggregate, fusable
from lowtide.operators.paned_wid import PanedWIDAggregate, pane_of
from lowtide.operators.placement import Placement
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.result_rows import Having
from lowtide.operators.session import SessionAggregate
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.slide_by_tuple import SlideByTupleAggregate
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.operators.windows import Session, Sliding, Window
from lowtide.query.description import (
    AggregateDescription,
    AggregateNode,
    BucketNode,
    SelectNode,
    SlicesNode,
)
from lowtide.query.expr import compile_conjuncts, compile_expr
from lowtide.query.graph import Graph
from lowtide.query.sharing import ShareDescription, ShareKey
from lowtide.query.windowing import SlideByTuple
from lowtide.schema import ColumnType
from lowtide.strings import StringPool


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


Grouped: TypeAlias = tuple[
    tuple[str, ...], tuple[ColumnType, ...], tuple[AggregateCall, ...], tuple[str, ...], Having | None
]


@dataclass
class Env:
    """What building an aggregate takes: the pool (HAVING, WHERE literals; decoding group
    strings), the query's late side stream, and the operators built before it."""

    pool: StringPool
    late_sink: Callable[[Batch], None]
    built: Sequence[Operator]

    def having(self, aggregate: AggregateDescription) -> Having | None:
        clause = aggregate.having
        if clause is None:
            return None
        return compile_expr(clause.expr, clause.scope, self.pool, dict(clause.names)).fn

    def grouped(self, a: AggregateDescription) -> Grouped:
        """What every grouping aggregate operator takes, in its order: group columns and types,
        aggregate calls, output columns, HAVING."""
        return a.groups, a.group_types, a.calls, a.columns, self.having(a)


class Strategy(ABC):
    name: ClassVar[str]
    judges_behind: ClassVar[bool] = True  # its operator counts tuples behind punctuation (Input rule)

    @abstractmethod
    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        """Whether it runs this aggregation (the first in the table that does is chosen)."""

    def describe(self, aggregate: AggregateDescription, feed: Feed, graph: Graph) -> None:
        """Add its nodes to ``graph``, fed by ``feed.node``: its operator alone by default."""
        graph.add(AggregateNode(self.name, aggregate), feed.node)

    @abstractmethod
    def build(self, node: AggregateNode, env: Env) -> Operator:
        """Its operator, as ``node`` says."""

    @abstractmethod
    def placement(self, node: AggregateNode) -> Placement:
        """Its operator's placement, before it is built."""


class SlideByTupleStrategy(Strategy):
    """``[RANGE r, RATTR ra, SLIDE n ROWS, SATTR ...]``: windows slide by rows, ranges are on ra."""

    name = "slide-by-tuple"
    judges_behind = False  # tuples behind punctuation are late at the Input

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        return isinstance(aggregate.window, SlideByTuple)

    def build(self, node: AggregateNode, env: Env) -> Operator:
        a, window = node.aggregate, node.aggregate.window
        assert isinstance(window, SlideByTuple)
        return SlideByTupleAggregate(
            window.range,
            window.rattr,
            window.slide_rows,
            window.by_rank,
            *env.grouped(a),
            env.pool.decode,
        )

    def placement(self, node: AggregateNode) -> Placement:
        return SlideByTupleAggregate.placement_for()


class SessionStrategy(Strategy):
    """Session windows: under drop the Inputs forward tuples behind punctuation and the aggregate
    judges them; under error its rule calls each late (whether one is depends on its state)."""

    name = "session"

    def applies(self, aggregate: AggregateDescription, feed: Feed) -> bool:
        return isinstance(aggregate.window, Session)

    def build(self, node: AggregateNode, env: Env) -> Operator:
        a, window = node.aggregate, node.aggregate.window
        assert isinstance(window, Session)
        return SessionAggregate(
            window,
            *env.grouped(a),
            allowed_lateness=a.lateness,
            late_sink=env.late_sink,
            decode=env.pool.decode,
        )

    def placement(self, node: AggregateNode) -> Placement:
        return SessionAggregate.placement_for(node.aggregate.groups)


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

    def build(self, node: AggregateNode, env: Env) -> Operator:
        a, window = node.aggregate, node.aggregate.window
        assert isinstance(window, Sliding) and node.slices is not None
        slices = env.built[node.slices]
        assert isinstance(slices, SharedSlices)
        return PanedWIDAggregate(
            window,
            slices,
            a.calls,
            a.columns,
            env.having(a),
            env.pool.decode,
            node.flush,
            late_sink=env.late_sink,
        )

    def placement(self, node: AggregateNode) -> Placement:
        return PanedWIDAggregate.placement_for(node.aggregate.groups)


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

    def build(self, node: AggregateNode, env: Env) -> Operator:
        a = node.aggregate
        assert isinstance(a.window, Sliding)
        return AdaptWIDAggregate(
            a.window,
            *env.grouped(a),
            env.pool.decode,
            late_sink=env.late_sink,
        )

    def placement(self, node: AggregateNode) -> Placement:
        return AdaptWIDAggregate.placement_for(node.aggregate.groups)


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

    def build(self, node: AggregateNode, env: Env) -> Operator:
        a = node.aggregate
        assert isinstance(a.window, Sliding) and node.where is not None
        return FusedWIDAggregate(
            a.window,
            compile_conjuncts(node.where.conjuncts, node.where.scope, env.pool),
            *env.grouped(a),
            env.pool.decode,
            node.flush,
            late_sink=env.late_sink,
        )

    def placement(self, node: AggregateNode) -> Placement:
        return FusedWIDAggregate.placement_for(node.aggregate.groups)


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

    def build(self, node: AggregateNode, env: Env) -> Operator:
        a = node.aggregate
        assert isinstance(a.window, Window)
        return WIDAggregate(
            a.window,
            *env.grouped(a),
            allowed_lateness=a.lateness is not None,
            late_sink=env.late_sink,
            decode=env.pool.decode,
            flush=node.flush,
            limits=a.limits,
        )

    def placement(self, node: AggregateNode) -> Placement:
        window = node.aggregate.window
        assert isinstance(window, Window)
        return WIDAggregate.placement_for(window, node.aggregate.groups)


# In order of preference: the first that applies runs the aggregation.
STRATEGIES: tuple[Strategy, ...] = (
    SlideByTupleStrategy(),
    SessionStrategy(),
    PanedStrategy(),
    AdaptStrategy(),
    FusedStrategy(),
    WIDStrategy(),
)
_BY_NAME = {s.name: s for s in STRATEGIES}


def choose(aggregate: AggregateDescription, feed: Feed) -> Strategy:
    """The first strategy that applies."""
    return next(s for s in STRATEGIES if s.applies(aggregate, feed))


def strategy(name: str) -> Strategy:
    """The strategy of an :class:`AggregateNode`."""
    return _BY_NAME[name]


__all__ = ["STRATEGIES", "Env", "Feed", "Strategy", "choose", "strategy"]
