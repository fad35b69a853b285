"""From a :class:`~lowtide.query.description.PlanDescription` to the live operators of a
:class:`~lowtide.query.plan.Plan`.

Invariant: :func:`build` decides nothing. It instantiates each node as the description says
(compiling the expressions it carries with the process's string pool), connects each to the
nodes feeding it, takes the live slices of a share the description joins from the registry by
name, and sets each Input's late rule from the description (:func:`~lowtide.query.late_rules.late_rules`).
An aggregate is built and placed as the build registry
(:mod:`lowtide.operators.build_registry`) says for the strategy its node names.
:func:`placement_of` gives a node's placement before it is built, as its operator would;
:func:`explain` the operator lines of a description without running anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from lowtide.batch import Batch
from lowtide.operators import build_registry
from lowtide.operators.base import Operator
from lowtide.operators.bucket import Bucket
from lowtide.operators.dupelim import DupElim
from lowtide.operators.input import Input
from lowtide.operators.meld import Meld
from lowtide.operators.oa_join import OAJoin
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.placement import Placement
from lowtide.operators.project import Project
from lowtide.operators.select import Select
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.window_top_n import WindowTopN
from lowtide.punctuation.policies import LatePolicy
from lowtide.query.description import (
    AggregateNode,
    BucketNode,
    DupElimNode,
    Fields,
    InputNode,
    JoinNode,
    MeldNode,
    NodeKind,
    PlanDescription,
    ProjectNode,
    SelectNode,
    SlicesNode,
    TopNNode,
)
from lowtide.query.expr import Columns, compile_conjuncts, compile_expr
from lowtide.query.late_rules import late_rules
from lowtide.query.live_shares import Share, Shares
from lowtide.query.plan import Plan
from lowtide.strings import StringPool

LateSink = Callable[[Batch, Fields], None]  # late tuples of the query, with their columns


@dataclass
class BuildContext:
    """What building takes from the process: its string pool, where the query's late tuples go,
    and its live slices (None: the description reads none)."""

    pool: StringPool
    on_drop: LateSink
    shares: Shares | None = None


def build(description: PlanDescription, ctx: BuildContext) -> Plan:
    share = description.share
    live: Share | None = None  # the slices it joins: their operators are its first nodes
    if share is not None and share.joins:
        live = ctx.shares.named(share.name) if ctx.shares is not None else None
        if live is None:
            raise LookupError(f"the query reads the slices {share.name}, which are not live here")
    joined = live.operators if live is not None else []
    ops: list[Operator] = []
    for node in description.nodes:
        if len(ops) < len(joined):
            ops.append(joined[len(ops)])
            continue
        op = _operator(node.kind, description.policy, ops, ctx)
        for port, source in enumerate(node.sources):
            ops[source].connect(op, port)
        ops.append(op)
    inputs = [(i.stream, _input(ops[i.node])) for i in description.inputs]
    if not joined:  # a joined share's Input keeps the rule of the query that started it
        for (_, op), about, rule in zip(
            inputs, description.inputs, late_rules(description, ctx.pool), strict=True
        ):
            op.late_rule = rule
            op.numbers_rows = about.numbers_rows
    reader = next((op for op in ops if isinstance(op, PanedWIDAggregate)), None)
    if share is not None and live is None:  # it starts the slices: a share others may join
        assert reader is not None
        live = Share(share.key, inputs[0][1], reader.slices, ops[: ops.index(reader)])
    return Plan(description, ops[-1], inputs, ops, live, reader)


def explain(description: PlanDescription, readers: int = 0) -> str:
    """The operators ``description`` runs, one a line from input to output, as ``explain`` shows
    them: built alone (its own slices, a scratch string pool) and never run; ``readers``: how many
    queries read the slices it shares."""
    if description.share is not None:
        description = replace(description, share=replace(description.share, joins=False))
    plan = build(description, BuildContext(StringPool(), lambda batch, fields: None))
    lines = (
        op.describe_shared(readers) if isinstance(op, SharedSlices) else op.describe()
        for op in plan.operators
    )
    return "\n".join(f"{i}. {line}" for i, line in enumerate(lines))


def _input(op: Operator) -> Input:
    assert isinstance(op, Input)
    return op


def _operator(kind: NodeKind, policy: LatePolicy, built: Sequence[Operator], ctx: BuildContext) -> Operator:
    pool = ctx.pool
    match kind:
        case InputNode():
            return Input(kind.stream, policy, partial(_dropped, ctx.on_drop, kind.layout))
        case MeldNode():
            return Meld(kind.inputs)
        case SelectNode():
            return Select(compile_conjuncts(kind.where.conjuncts, kind.where.scope, pool))
        case JoinNode():
            left, right = kind.layouts
            sinks = (partial(_dropped, ctx.on_drop, left), partial(_dropped, ctx.on_drop, right))
            return OAJoin(kind.left, kind.right, kind.window, sinks)
        case BucketNode():
            return Bucket(kind.window, kind.allowed_lateness)
        case SlicesNode():
            return SharedSlices(kind.width, kind.groups, kind.types)
        case AggregateNode():
            sink = partial(_dropped, ctx.on_drop, kind.aggregate.late_layout)
            return build_registry.build(kind, build_registry.Env(pool, sink, built))
        case ProjectNode():
            return project(kind, pool)
        case DupElimNode():
            return DupElim(kind.columns, kind.attribute)
        case TopNNode():
            top = kind
            return WindowTopN(
                top.function,
                top.partition,
                top.order,
                top.output,
                top.attribute,
                top.limit,
                top.tumble,
                whole=top.whole,
            )


def project(kind: ProjectNode, pool: StringPool) -> Project:
    """The Project of ``kind``, its expressions compiled with ``pool`` (a server's front builds
    one apart from its graph: see :mod:`lowtide.server.partitioning`)."""
    outputs = {
        name: _column(expr) if isinstance(expr, str) else compile_expr(expr, kind.scope, pool).fn
        for name, expr in kind.columns
    }
    return Project(outputs, dict(kind.renames), kind.keeps_input)


def placement_of(kind: NodeKind) -> Placement:
    """How the operator of ``kind`` may be split across workers, before it is built."""
    match kind:
        case InputNode():
            return Input.placement_for()
        case MeldNode():
            return Meld.placement_for()
        case SelectNode():
            return Select.placement_for()
        case JoinNode():
            return OAJoin.placement_for(kind.left, kind.right)
        case BucketNode():
            return Bucket.placement_for(kind.window)
        case SlicesNode():
            return SharedSlices.placement_for(kind.groups)
        case AggregateNode():
            return build_registry.placement(kind)
        case ProjectNode():
            return Project.placement_for(kind.keeps_input)
        case DupElimNode():
            return DupElim.placement_for()
        case TopNNode():
            return WindowTopN.placement_for(kind.partition, kind.tumble)


def _dropped(on_drop: LateSink, layout: Fields, batch: Batch) -> None:
    on_drop(batch, layout)


def _column(name: str) -> Callable[[Columns], object]:
    return lambda cols: cols[name]


__all__ = ["BuildContext", "build", "placement_of", "project"]
