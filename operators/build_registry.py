"""The build registry: for each aggregation strategy the planner chooses
(:data:`lowtide.query.strategies.STRATEGIES`), by its name, how its operator is built from its
:class:`~lowtide.query.description.AggregateNode` and how that operator is placed across workers.

The planner names the strategy in the node (describe time) and loads no operator;
:func:`lowtide.query.build.build` and :func:`~lowtide.query.build.placement_of` look the name up
here (build time), where the operators run. Invariant: :data:`BUILDERS` has exactly the names of
the planner's strategies (``tests/unit/test_strategies.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from lowtide.batch import Batch
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggregateCall
from lowtide.operators.base import Operator
from lowtide.operators.fused_wid import FusedWIDAggregate
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.placement import Placement
from lowtide.operators.result_rows import Having
from lowtide.operators.session import SessionAggregate
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.slide_by_tuple import SlideByTupleAggregate
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.operators.windows import Session, Sliding, Window
from lowtide.query.description import AggregateDescription, AggregateNode
from lowtide.query.expr import compile_conjuncts, compile_expr
from lowtide.query.windowing import SlideByTuple
from lowtide.schema import ColumnType
from lowtide.strings import StringPool

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


@dataclass(frozen=True)
class Builder:
    """One strategy's operator: built as its node says, placed before it is built."""

    build: Callable[[AggregateNode, Env], Operator]
    placement: Callable[[AggregateNode], Placement]


def _slide_by_tuple(node: AggregateNode, env: Env) -> Operator:
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


def _session(node: AggregateNode, env: Env) -> Operator:
    a, window = node.aggregate, node.aggregate.window
    assert isinstance(window, Session)
    return SessionAggregate(
        window,
        *env.grouped(a),
        allowed_lateness=a.lateness,
        late_sink=env.late_sink,
        decode=env.pool.decode,
    )


def _paned(node: AggregateNode, env: Env) -> Operator:
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


def _adaptive(node: AggregateNode, env: Env) -> Operator:
    a = node.aggregate
    assert isinstance(a.window, Sliding)
    return AdaptWIDAggregate(
        a.window,
        *env.grouped(a),
        env.pool.decode,
        late_sink=env.late_sink,
    )


def _fused(node: AggregateNode, env: Env) -> Operator:
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


def _wid(node: AggregateNode, env: Env) -> Operator:
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


def _wid_placement(node: AggregateNode) -> Placement:
    window = node.aggregate.window
    assert isinstance(window, Window)
    return WIDAggregate.placement_for(window, node.aggregate.groups)


# Strategy name (lowtide.query.strategies) -> its builder.
BUILDERS: Mapping[str, Builder] = {
    "slide-by-tuple": Builder(_slide_by_tuple, lambda node: SlideByTupleAggregate.placement_for()),
    "session": Builder(_session, lambda node: SessionAggregate.placement_for(node.aggregate.groups)),
    "paned": Builder(_paned, lambda node: PanedWIDAggregate.placement_for(node.aggregate.groups)),
    "adaptive": Builder(_adaptive, lambda node: AdaptWIDAggregate.placement_for(node.aggregate.groups)),
    "fused": Builder(_fused, lambda node: FusedWIDAggregate.placement_for(node.aggregate.groups)),
    "wid": Builder(_wid, _wid_placement),
}


def build(node: AggregateNode, env: Env) -> Operator:
    """The operator of ``node``'s strategy, as ``node`` says."""
    return BUILDERS[node.strategy].build(node, env)


def placement(node: AggregateNode) -> Placement:
    """The placement of ``node``'s operator, before it is built."""
    return BUILDERS[node.strategy].placement(node)


__all__ = ["BUILDERS", "Builder", "Env", "build", "placement"]
