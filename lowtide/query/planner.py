"""The planner: a parsed query becomes a graph of order-insensitive operators.

Input -> [Meld] -> [Select] -> ( [OA-Join -> Select] ) -> [Bucket -> WID Aggregate | Slide-by-tuple
Aggregate | Session Aggregate | DupElim | Project]. Single-side predicates of a join are pushed
below it, equalities across sides become join keys, the rest filter its output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.errors import UnsupportedQuery
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.base import Operator
from lowtide.operators.bucket import Bucket
from lowtide.operators.dupelim import DupElim
from lowtide.operators.fused_wid import FusedWIDAggregate, fusable
from lowtide.operators.input import Input, LateRule
from lowtide.operators.meld import Meld
from lowtide.operators.oa_join import Band, JoinSide, OAJoin, Tumbling
from lowtide.operators.paned_wid import PanedWIDAggregate, pane_of
from lowtide.operators.project import Project
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.select import Predicate, Select
from lowtide.operators.session import RETRACTED, SessionAggregate
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.slide_by_tuple import SlideByTupleAggregate
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.operators.windows import Landmark, Rows, Session, Sliding, WindowLimits
from lowtide.punctuation.policies import LatePolicy
from lowtide.query.ast import (
    BinaryOp,
    Column,
    Expr,
    FromItem,
    FromStream,
    FuncCall,
    Literal,
    Query,
    Star,
)
from lowtide.query.early import FINAL, Early, early_results
from lowtide.query.expr import compile_expr
from lowtide.query.scope import Field, Scope
from lowtide.query.sharing import Share, Shares, saved_width
from lowtide.query.windowing import SlideByTuple, to_units, window_attribute, window_of
from lowtide.schema import INT64, ColumnType, Schema
from lowtide.strings import StringPool

AGGREGATES = {f.value for f in AggFunc if f is not AggFunc.COUNT_STAR}


@dataclass
class Stage:
    """The output of a part of the graph: its last operator, visible columns and progress."""

    op: Operator
    scope: Scope
    attributes: tuple[str, ...]  # physical progressing attribute(s)
    window: Any = None  # the window spec written after this FROM item


@dataclass
class Plan:
    output: Operator
    inputs: list[tuple[str, Input]]
    schema: tuple[tuple[str, ColumnType], ...]
    progressing: tuple[str, ...]
    operators: list[Operator] = field(default_factory=list)
    slides: dict[str, int] = field(default_factory=dict)  # stream -> SLIDE of a time window on it
    share: Share | None = None  # the shareable slices this plan's Paned-WID reads
    joins_share: bool = False  # the share exists and is fed already
    reader: PanedWIDAggregate | None = None  # the Paned-WID reading slices, attached by start()
    time_unit: str = ""  # s|ms|us|ns: window bounds are epoch times in this unit; "": plain numbers
    early: Early | None = None  # EMIT EVERY: a final column, and partial rows when the engine's timer fires

    def start(self) -> None:
        """Begin reading shared slices (planning leaves them untouched, for ``explain``)."""
        if self.reader is not None:
            self.reader.attach()

    def emit_partials(self) -> None:
        """EMIT EVERY fired: every operator emits its open windows' current rows, final = false
        (see lowtide.query.early)."""
        for op in self.operators:
            op.emit_partials()

    def explain(self) -> str:
        lines = [f"{i}. {op.describe()}" for i, op in enumerate(self.operators)]
        return "\n".join(lines)


@dataclass
class Context:
    catalog: Callable[[str], Schema]  # a stream's schema by name; NotFound for an unknown one
    pool: StringPool
    policy: LatePolicy
    allowed_lateness: str | int | None
    on_drop: Callable[[Batch, tuple[tuple[str, ColumnType], ...]], None]
    shares: Shares | None = None  # where slices to share are found; None: every query has its own
    flush: SlowFlush | None = None  # smooth emission of time windows; None: all at punctuation
    # Planning a query again to restore it: the share_key of the slices it read (plan_state.saved_share).
    restored_share: str | None = None
    windows: WindowLimits = field(
        default_factory=WindowLimits
    )  # windows per tuple and per step (the server's config)
    plan_ops: list[Operator] = field(default_factory=list)
    inputs: list[tuple[str, Input]] = field(default_factory=list)

    def add(self, op: Operator, upstream: Operator | None = None, port: int = 0) -> Operator:
        if upstream is not None:
            upstream.connect(op, port)
        self.plan_ops.append(op)
        return op


def plan_query(query: Query, ctx: Context) -> Plan:
    if not 1 <= len(query.from_) <= 2:
        raise UnsupportedQuery("FROM takes one stream (or union) or two for a join")
    if len(query.from_) == 2:
        stage = _join(query, ctx)
    else:
        stage = _from_item(query.from_[0], ctx)
        if query.where is not None:
            stage = _select(stage, query.where, ctx)
    slides: dict[str, int] = {}
    if _is_aggregate(query):
        return _aggregate(query, stage, ctx, slides)
    if query.window is not None:
        raise UnsupportedQuery("a window after the select list needs an aggregate")
    return _projection(query, stage, ctx)


# -- FROM -------------------------------------------------------------------------------------
def _from_item(item: FromItem, ctx: Context) -> Stage:
    if isinstance(item, FromStream):
        schema = ctx.catalog(item.name)
        stream_fields = schema.columns
        op = Input(item.name, ctx.policy, lambda batch: ctx.on_drop(batch, stream_fields))
        ctx.inputs.append((item.name, op))
        ctx.add(op)
        qualifiers = frozenset({item.name} | ({item.alias} if item.alias else set()))
        scope = Scope(tuple(Field(name, name, kind, qualifiers) for name, kind in schema.columns))
        return Stage(op, scope, (schema.progressing,), item.window)
    stages = [_from_item(part, ctx) for part in item.inputs]
    first = stages[0]
    layout = [(f.physical, f.type) for f in first.scope.fields]
    for other in stages[1:]:
        if [
            (f.physical, f.type) for f in other.scope.fields
        ] != layout or other.attributes != first.attributes:
            raise UnsupportedQuery(
                "UNION needs inputs with the same columns, types and progressing attribute"
            )
    meld = ctx.add(Meld(len(stages)))
    for port, stage in enumerate(stages):
        stage.op.connect(meld, port)
    qualifiers = frozenset({item.alias}) if item.alias else frozenset()
    scope = Scope(tuple(Field(f.physical, f.physical, f.type, qualifiers) for f in first.scope.fields))
    return Stage(meld, scope, first.attributes, item.window)


def _select(stage: Stage, predicate: Expr, ctx: Context) -> Stage:
    conjuncts = [(compile_expr(c, stage.scope, ctx.pool).fn, _text(c)) for c in _conjuncts(predicate)]
    op = ctx.add(Select(conjuncts), stage.op)
    return Stage(op, stage.scope, stage.attributes, stage.window)


def _conjuncts(expr: Expr | None) -> list[Expr]:
    if expr is None:
        return []
    if isinstance(expr, BinaryOp) and expr.op == "AND":
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [expr]


def _columns_of(expr: Expr) -> list[Column]:
    if isinstance(expr, Column):
        return [expr]
    if isinstance(expr, BinaryOp):
        return _columns_of(expr.left) + _columns_of(expr.right)
    if isinstance(expr, FuncCall):
        return [c for arg in expr.args for c in _columns_of(arg)]
    operand = getattr(expr, "operand", None)
    return _columns_of(operand) if operand is not None else []


def _side_of(column: Column, left: Scope, right: Scope) -> int:
    sides = []
    for i, scope in enumerate((left, right)):
        try:
            scope.resolve(column.name, column.qualifier)
            sides.append(i)
        except UnsupportedQuery:
            pass
    if len(sides) != 1:
        what = "ambiguous" if sides else "unknown"
        raise UnsupportedQuery(f"column {_text(column)!r} is {what} in this join")
    return sides[0]


# -- joins ------------------------------------------------------------------------------------
def _join(query: Query, ctx: Context) -> Stage:
    items = query.from_
    sides: list[Stage] = []
    side_inputs: list[list[tuple[str, Input]]] = []  # each side's streams and Inputs
    for item in items:
        first = len(ctx.inputs)
        sides.append(_from_item(item, ctx))
        side_inputs.append(ctx.inputs[first:])
    # What Input.on_drop sends for a stream of the side: its columns (a union's all alike).
    layouts = [tuple((f.physical, f.type) for f in s.scope.fields) for s in sides]
    prefixes = [_prefix(item) for item in items]
    if prefixes[0] == prefixes[1]:
        raise UnsupportedQuery("the two sides of a join need different names; add an alias")
    left_keys: list[str] = []
    right_keys: list[str] = []
    residual: list[Expr] = []
    pushed: list[list[Expr]] = [[], []]
    for conjunct in _conjuncts(query.where):
        used = {_side_of(c, sides[0].scope, sides[1].scope) for c in _columns_of(conjunct)}
        pair = _equi_pair(conjunct, sides)
        if pair is not None:
            left_keys.append(pair[0])
            right_keys.append(pair[1])
        elif len(used) == 1:
            pushed[used.pop()].append(conjunct)
        else:
            residual.append(conjunct)
    wheres: list[list[Select]] = [[], []]  # each side's pushed-down WHERE
    for i, predicates in enumerate(pushed):
        for predicate in predicates:
            sides[i] = _select(sides[i], predicate, ctx)
            where = sides[i].op
            assert isinstance(where, Select)
            wheres[i].append(where)
    window = _join_window(sides, items)
    join_sides = [
        JoinSide(prefix, tuple(f.physical for f in s.scope.fields), s.attributes[0], tuple(keys))
        for prefix, s, keys in zip(prefixes, sides, (left_keys, right_keys), strict=True)
    ]
    sinks = (lambda b: ctx.on_drop(b, layouts[0]), lambda b: ctx.on_drop(b, layouts[1]))
    join = OAJoin(join_sides[0], join_sides[1], window, sinks)
    op = ctx.add(join)
    sides[0].op.connect(op, 0)
    sides[1].op.connect(op, 1)
    streams = [[stream for stream, _ in inputs] for inputs in side_inputs]
    for side, inputs in enumerate(side_inputs):
        rule = _join_late_rule(join, side, streams, wheres[side])
        for _, input_op in inputs:
            input_op.late_rule = rule
    fields = tuple(
        Field(f.name, f"{prefix}.{f.physical}", f.type, frozenset({prefix}))
        for prefix, s in zip(prefixes, sides, strict=True)
        for f in s.scope.fields
    )
    stage = Stage(
        op, Scope(fields), tuple(f"{p}.{s.attributes[0]}" for p, s in zip(prefixes, sides, strict=True))
    )
    for predicate in residual:
        stage = _select(stage, predicate, ctx)
    return stage


def _join_late_rule(join: OAJoin, side: int, streams: list[list[str]], wheres: list[Select]) -> LateRule:
    """The late rule of the Inputs feeding ``side`` of ``join`` (DESIGN.md §2): the join counts
    their tuples behind punctuation and takes as late exactly :meth:`OAJoin.late_mask` at its input
    bounds, each side's the minimum over its streams' progress (what a Meld of a union passes on),
    among the tuples the side's pushed-down ``wheres`` keep."""
    ts = join.sides[side].ts

    def rule(batch: Batch, progress: Mapping[str, int]) -> npt.NDArray[np.bool_]:
        bounds = [min(progress[s] for s in names) for names in streams]
        late = join.late_mask(side, np.asarray(batch.columns[ts], np.int64), bounds)
        for where in wheres if late.any() else ():
            late &= where.passes(batch)
        return late

    return rule


def _prefix(item: FromItem) -> str:
    if item.alias:
        return item.alias
    if isinstance(item, FromStream):
        return item.name
    raise UnsupportedQuery("a UNION on one side of a join needs an alias: (A UNION B) AS name")


def _equi_pair(conjunct: Expr, sides: list[Stage]) -> tuple[str, str] | None:
    if not (isinstance(conjunct, BinaryOp) and conjunct.op == "="):
        return None
    a, b = conjunct.left, conjunct.right
    if not (isinstance(a, Column) and isinstance(b, Column)):
        return None
    sa, sb = (_side_of(c, sides[0].scope, sides[1].scope) for c in (a, b))
    if sa == sb:
        return None
    fa = sides[sa].scope.resolve(a.name, a.qualifier)
    fb = sides[sb].scope.resolve(b.name, b.qualifier)
    if fa.type.is_string != fb.type.is_string or fa.type.name == "float64" or fb.type.name == "float64":
        raise UnsupportedQuery(
            f"cannot join {_text(a)} ({fa.type.name}) with {_text(b)} ({fb.type.name}) on equality"
        )
    return (fa.physical, fb.physical) if sa == 0 else (fb.physical, fa.physical)


def _join_window(sides: list[Stage], items: tuple[FromItem, ...]) -> Band | Tumbling:
    specs = [item.window for item in items]
    if any(spec is not None and spec.emit_every is not None for spec in specs):
        raise UnsupportedQuery(
            "EMIT EVERY gives early results of a window aggregate; a join emits each pair once"
        )
    kinds = [s.scope.resolve(s.attributes[0]).type for s in sides]
    tumbling = [spec for spec in specs if spec is not None and spec.tumbling]
    if tumbling:
        sizes = {
            to_units(spec.range, kinds[0], "RANGE TUMBLING") for spec in tumbling if spec.range is not None
        }
        if len(sizes) != 1 or any(spec is not None and not spec.tumbling for spec in specs):
            raise UnsupportedQuery("both sides of a tumbling join share one RANGE TUMBLING")
        return Tumbling(sizes.pop())
    if any(spec is None or spec.range is None for spec in specs):
        raise UnsupportedQuery(
            "a join needs a window: [RANGE TUMBLING d, WA ts] after the last stream, "
            "or [RANGE r, WA ts] on each"
        )
    ranges = [spec.range for spec in specs if spec is not None and spec.range is not None]
    r0, r1 = (to_units(r, kind, "RANGE") for r, kind in zip(ranges, kinds, strict=True))
    return Band(r0, r1)


# -- aggregation ------------------------------------------------------------------------------
def _is_aggregate(query: Query) -> bool:
    return (
        bool(query.group_by) or query.window is not None or any(_has_aggregate(i.expr) for i in query.select)
    )


def _has_aggregate(expr: Expr) -> bool:
    if isinstance(expr, FuncCall):
        return expr.name in AGGREGATES or any(_has_aggregate(a) for a in expr.args)
    if isinstance(expr, BinaryOp):
        return _has_aggregate(expr.left) or _has_aggregate(expr.right)
    operand = getattr(expr, "operand", None)
    return operand is not None and _has_aggregate(operand)


def _call_of(expr: FuncCall, output: str, scope: Scope) -> AggregateCall:
    name = expr.name
    if name not in AGGREGATES:
        raise UnsupportedQuery(f"unknown aggregate {name}(); expected one of {', '.join(sorted(AGGREGATES))}")
    if name == "count" and len(expr.args) == 1 and isinstance(expr.args[0], Star):
        return AggregateCall(AggFunc.COUNT_STAR, None, None, None, output)
    params = {"quantile": 2, "heavy_hitters": 2}
    want = params.get(name, 1)
    if len(expr.args) != want or not isinstance(expr.args[0], Column):
        shape = "(column, number)" if want == 2 else "(column)"
        raise UnsupportedQuery(f"{name} takes {shape}")
    column = expr.args[0]
    f = scope.resolve(column.name, column.qualifier)
    param = None
    if want == 2:
        arg = expr.args[1]
        if not isinstance(arg, Literal) or not isinstance(arg.value, int | float) or not 0 <= arg.value <= 1:
            raise UnsupportedQuery(f"the second argument of {name} must be a number between 0 and 1")
        param = float(arg.value)
    func = AggFunc(name)
    needs_number = func not in (AggFunc.COUNT, AggFunc.COUNT_DISTINCT, AggFunc.HEAVY_HITTERS)
    if needs_number and not (f.type.is_numeric or f.type.name == "bool"):
        raise UnsupportedQuery(
            f"{name}({_text(column)}) needs a numeric column, {_text(column)} is {f.type.name}"
        )
    return AggregateCall(func, f.physical, f.type, param, output)


def _aggregate(query: Query, stage: Stage, ctx: Context, slides: dict[str, int]) -> Plan:
    spec = query.window
    if spec is None:
        raise UnsupportedQuery(
            "an aggregate needs a window after the select list, e.g. [RANGE 1 minute, WA ts]"
        )
    scope = stage.scope
    attr_ref = window_attribute(spec)
    if attr_ref is None:
        raise UnsupportedQuery("the window needs WA (or RATTR): the attribute it is defined on")
    partition = tuple(scope.resolve(c.name, c.qualifier).physical for c in spec.pa)
    attribute, kind = "row-num", INT64
    if isinstance(attr_ref, Column):
        f = scope.resolve(attr_ref.name, attr_ref.qualifier)
        if f.physical not in stage.attributes:
            raise UnsupportedQuery(
                f"the window is on {_text(attr_ref)}, which is not a progressing attribute here "
                f"({', '.join(stage.attributes)})"
            )
        attribute, kind = f.physical, f.type
    window = window_of(spec, attribute, kind, partition)
    if isinstance(window, Sliding | Rows):
        ctx.windows.check_window(window)
    early = early_results(spec, window)
    extra = (FINAL,) if early is not None else ()  # the column of early results, after revision
    if isinstance(window, Session) and ctx.policy is LatePolicy.UPDATE:
        extra = (RETRACTED, *extra)  # sessions merged away are withdrawn
    group_physicals: list[str] = []
    for g in query.group_by:
        if not isinstance(g, Column):
            raise UnsupportedQuery(f"GROUP BY takes columns, not {_text(g)}")
        group_physicals.append(scope.resolve(g.name, g.qualifier).physical)
    # A partition's windows are its own: PA columns are always part of the group key (the
    # aggregate maps every group to exactly one partition).
    group_physicals += [p for p in partition if p not in group_physicals]
    calls: list[AggregateCall] = []
    out_names: list[str] = []
    renames: dict[str, str] = {}
    names: dict[Expr, str] = {}
    for item in query.select:
        out = item.alias or item.text
        if out in out_names or out in ("window_start", "window_end", "revision", *extra):
            raise UnsupportedQuery(f"result column {out!r} appears twice; give it an alias")
        if isinstance(item.expr, FuncCall):
            calls.append(_call_of(item.expr, out, scope))
            names[item.expr] = out
        elif isinstance(item.expr, Column):
            physical = scope.resolve(item.expr.name, item.expr.qualifier).physical
            if physical not in group_physicals and physical not in partition:
                raise UnsupportedQuery(f"{item.text} must be in GROUP BY (or PA) or inside an aggregate")
            renames[physical] = out
        else:
            raise UnsupportedQuery(f"select item {item.text} must be a group column or an aggregate")
        out_names.append(out)
    group_types = tuple(scope.resolve(p).type for p in group_physicals)
    having = None
    if query.having is not None:
        for i, expr in enumerate(_aggregate_calls(query.having)):
            if expr not in names:
                hidden = f"__having_{i}"
                calls.append(_call_of(expr, hidden, scope))
                names[expr] = hidden
        result_fields = [
            Field("window_start", "window_start", INT64),
            Field("window_end", "window_end", INT64),
        ]
        result_fields += [Field(p, p, t) for p, t in zip(group_physicals, group_types, strict=True)]
        result_fields += [Field(c.output, c.output, c.result_type()) for c in calls]
        having = compile_expr(query.having, Scope(tuple(result_fields)), ctx.pool, names).fn
    internal = ("window_start", "window_end", *[_internal(n, renames) for n in out_names], "revision", *extra)
    decode = ctx.pool.decode
    lateness: int | None = None  # None: late tuples never reach the aggregate
    if ctx.policy is LatePolicy.UPDATE:
        # Without allowed lateness a late tuple still updates the windows not yet emitted.
        lateness = (
            to_units(_lateness(ctx.allowed_lateness), kind, "allowed lateness") if ctx.allowed_lateness else 0
        )
        if isinstance(window, Landmark | SlideByTuple) or attribute == "row-num":
            raise UnsupportedQuery(
                "late='update' works with time-based sliding, tumbling and session windows only"
            )
    groups, aggs = tuple(group_physicals), tuple(calls)
    agg: Operator
    shared: dict[str, Any] = {}  # the Plan's sharing fields
    late_fields = tuple((f.physical, f.type) for f in scope.fields)  # the layout of <query>.late

    def late_sink(batch: Batch) -> None:
        ctx.on_drop(batch, late_fields)

    if isinstance(window, SlideByTuple):
        agg = SlideByTupleAggregate(
            window.range,
            attribute,
            window.slide_rows,
            window.by_rank,
            groups,
            group_types,
            aggs,
            internal,
            having,
            decode,
        )
        ctx.add(agg, stage.op)
    elif isinstance(window, Session):
        agg = SessionAggregate(
            window,
            groups,
            group_types,
            aggs,
            internal,
            having,
            allowed_lateness=lateness,
            late_sink=late_sink,
            decode=decode,
        )
        ctx.add(agg, stage.op)
        # Under drop the Inputs forward tuples behind punctuation and the aggregate judges them;
        # under error its rule calls each late (whether one is depends on its state).
        _judges_behind(stage, ctx, agg.late_mask)
    else:
        key = _share_key(query, groups, group_types, ctx.policy)
        share = _share_of(key, ctx, window)
        if _paned(window, calls, lateness, share is not None or _restoring(key, ctx, window)):
            assert isinstance(window, Sliding)
            agg, shared = _paned_aggregate(
                stage, ctx, window, key, share, groups, group_types, aggs, internal, having, late_sink
            )
        elif _adaptive(window, calls, lateness):
            bucket = ctx.add(Bucket(window), stage.op)
            agg = AdaptWIDAggregate(
                window,
                groups,
                group_types,
                aggs,
                internal,
                having,
                decode,
                late_sink=late_sink,
            )
            ctx.add(agg, bucket)
            _judges_behind(stage, ctx, agg.late_mask)
        elif (
            isinstance(stage.op, Select)  # the gain is the filtered copy it saves
            and isinstance(window, Sliding)
            and lateness is None
            and fusable(aggs, group_types)
        ):
            upstream, predicates = _unselect(stage.op, ctx)
            agg = FusedWIDAggregate(
                window,
                predicates,
                groups,
                group_types,
                aggs,
                internal,
                having,
                decode,
                ctx.flush,
                late_sink=late_sink,
            )
            ctx.add(agg, upstream)
            _judges_behind(stage, ctx, agg.late_mask)
        else:
            bucket = ctx.add(Bucket(window, lateness), stage.op)
            agg = WIDAggregate(
                window,
                groups,
                group_types,
                aggs,
                internal,
                having,
                allowed_lateness=lateness is not None,
                late_sink=late_sink,
                decode=decode,
                # Revisions must follow their window's first emission: no slow flush under lateness.
                flush=ctx.flush if lateness is None and isinstance(window, Sliding) else None,
                limits=ctx.windows,
            )
            ctx.add(agg, bucket)
            _judges_behind(stage, ctx, agg.late_mask, numbers_rows=isinstance(window, Rows))
        if isinstance(window, Sliding) and isinstance(stage.op, Input | Meld | Select):
            for stream, _ in ctx.inputs:
                slides[stream] = min(slides.get(stream, window.slide), window.slide)
    types = {c.output: c.result_type() for c in calls}
    types.update({renames.get(p, p): t for p, t in zip(group_physicals, group_types, strict=True)})
    schema = (
        ("window_start", INT64),
        ("window_end", INT64),
        *[(n, types[n]) for n in out_names],
        ("revision", INT64),
        *[(name, ColumnType("bool")) for name in extra],
    )
    last: Operator = agg
    if any(renames.get(p, p) != p for p in renames):
        outputs = {
            name: _getter(internal_name)
            for name, internal_name in zip(
                ("window_start", "window_end", *out_names, "revision", *extra), internal, strict=True
            )
        }
        last = ctx.add(Project(outputs, {}), agg)
    unit = kind.name[len("timestamp[") : -1] if kind.name.startswith("timestamp[") else ""
    return Plan(
        last, ctx.inputs, schema, ("window_end",), ctx.plan_ops, slides, time_unit=unit, early=early, **shared
    )


def _judges_behind(
    stage: Stage,
    ctx: Context,
    late_at: Callable[[Batch, int], npt.NDArray[np.bool_]],
    numbers_rows: bool = False,
) -> None:
    """Let the window operator fed by ``stage`` count tuples behind punctuation (DESIGN.md §2):
    the query's Inputs forward them, and ``late_at(batch, p)`` tells which of them the operator
    can no longer count once its input punctuation is ``p`` - the minimum over the query's
    streams (a Meld) - for ``error``. Only where the Inputs' columns reach it unchanged (Meld,
    Select): after a join the join judges its Inputs (:func:`_join_late_rule`) and the pairs it
    emits are in time for the aggregate. A tuple the WHERE drops is late for no window.
    ``numbers_rows``: a tuple window, fed each batch whole and in order (see
    Input)."""
    if not isinstance(stage.op, Input | Select | Meld) or any(isinstance(op, OAJoin) for op in ctx.plan_ops):
        return
    streams = tuple(stream for stream, _ in ctx.inputs)
    where = stage.op if isinstance(stage.op, Select) else None

    def rule(batch: Batch, progress: Mapping[str, int]) -> npt.NDArray[np.bool_]:
        late = late_at(batch, min(progress[s] for s in streams))
        return late & where.passes(batch) if where is not None and late.any() else late

    for _, op in ctx.inputs:
        op.late_rule = rule
        op.numbers_rows = numbers_rows


def _paned_aggregate(
    stage: Stage,
    ctx: Context,
    window: Sliding,
    key: tuple[Any, ...] | None,
    share: Share | None,
    groups: tuple[str, ...],
    types: tuple[ColumnType, ...],
    calls: tuple[AggregateCall, ...],
    internal: tuple[str, ...],
    having: Any,
    late_sink: Callable[[Batch], None],
) -> tuple[PanedWIDAggregate, dict[str, Any]]:
    """Paned-WID: its window-level query over slices, those of ``share`` (an earlier query's,
    fed the same way) or its own, shareable under ``key``; returns it and the Plan's sharing
    fields. Tuples behind punctuation travel to the slices, where each reader counts them in
    its windows not yet emitted and sends those that missed an emitted one to its own late
    side stream; a shared Input's late rule is any reader's (only ``drop`` shares)."""
    if share is None:
        width = pane_of(window).range
        if _restoring(key, ctx, window):  # the slices it read, fed by a query dropped since
            assert ctx.restored_share is not None
            width = saved_width(ctx.restored_share, key, width)
        bucket = ctx.add(Bucket(Sliding(width, width, window.attribute)), stage.op)
        slices = SharedSlices(width, groups, types)
        ctx.add(slices, bucket)
    else:
        ctx.plan_ops[:] = share.operators
        ctx.inputs[:] = [(share.input.stream, share.input)]
        slices = share.slices
    reader = PanedWIDAggregate(
        window,
        slices,
        calls,
        internal,
        having,
        ctx.pool.decode,
        ctx.flush,
        late_sink=late_sink,
    )
    ctx.add(reader)
    if key is None or ctx.shares is None:
        _judges_behind(stage, ctx, reader.late_mask)
        return reader, {"reader": reader}
    if share is None:
        _judges_behind(stage, ctx, slices.late_mask)
        share = Share(key, ctx.inputs[0][1], slices, ctx.plan_ops[:-1])
        return reader, {"share": share, "reader": reader}
    return reader, {"share": share, "joins_share": True, "reader": reader}


def _share_of(key: tuple[Any, ...] | None, ctx: Context, window: Any) -> Share | None:
    """The slices of an earlier query, shareable under ``key``, that a sliding ``window`` over
    them could read."""
    if not isinstance(window, Sliding) or ctx.shares is None or key is None:
        return None
    if ctx.restored_share is not None:
        saved_width(ctx.restored_share, key, pane_of(window).range)
        return ctx.shares.named(ctx.restored_share)
    return ctx.shares.find(key, pane_of(window).range)


def _restoring(key: tuple[Any, ...] | None, ctx: Context, window: Any) -> bool:
    """Whether the query is planned again to read the slices it read before a restore."""
    return (
        ctx.restored_share is not None
        and ctx.shares is not None
        and key is not None
        and isinstance(window, Sliding)
    )


def _share_key(
    query: Query, groups: tuple[str, ...], types: tuple[ColumnType, ...], policy: LatePolicy
) -> tuple[Any, ...] | None:
    """What makes two queries' slices the same: tuples reach them the same way and are
    grouped alike. Joins and unions are not shared; late policies other than drop either
    reject batches per query or revise windows, so they keep their own."""
    item = query.from_[0]
    if len(query.from_) != 1 or not isinstance(item, FromStream) or policy is not LatePolicy.DROP:
        return None
    return (item.name, item.alias, query.where, groups, types)


# Plain WID updates RANGE / SLIDE cells per tuple; Paned-WID one, plus combining RANGE / pane
# panes per group when a window closes. Panes pay off once windows overlap this much.
PANED_MIN_OVERLAP = 4


def _paned(window: Any, calls: list[AggregateCall], lateness: int | None, shared: bool) -> bool:
    """Whether a sliding window runs as Paned-WID (explain shows the choice). Holistic
    aggregates take it only to read slices another query keeps already: alone, AdaptWID holds
    less state at the same speed (bench/adapt.py, the holistic table)."""
    return (
        isinstance(window, Sliding)
        and window.range >= PANED_MIN_OVERLAP * window.slide
        and lateness is None  # revisions of late tuples need per-window cells
        and (shared or not any(call.func.holistic for call in calls))
    )


def _unselect(select: Select, ctx: Context) -> tuple[Operator, list[tuple[Predicate, str]]]:
    """Take ``select`` out of the graph, for a fused operator to run its conjuncts; returns what
    fed it and its conjuncts."""
    upstream = next(op for op in ctx.plan_ops if any(out is select for out, _ in op.outputs))
    upstream.outputs[:] = [(op, port) for op, port in upstream.outputs if op is not select]
    ctx.plan_ops.remove(select)
    return upstream, [(c.predicate, c.text) for c in select.conjuncts]


def _adaptive(window: Any, calls: list[AggregateCall], lateness: int | None) -> bool:
    """Whether overlapping windows run as AdaptWID: holistic aggregates have no partials to
    share, and plain WID would keep each value once per window it falls in, where AdaptWID's
    lazy groups keep it once (explain shows the choice)."""
    return (
        isinstance(window, Sliding)
        and window.range > window.slide
        and lateness is None
        and any(call.func.holistic for call in calls)
    )


def _internal(name: str, renames: dict[str, str]) -> str:
    for physical, out in renames.items():
        if out == name:
            return physical
    return name


def _getter(name: str) -> Callable[[Any], Any]:
    return lambda cols: cols[name]


def _lateness(value: str | int) -> Any:
    from lowtide.query.ast import Duration

    if isinstance(value, int):
        return Duration(value, None)
    from lowtide.punctuation.generators import parse_duration_ms

    return Duration(parse_duration_ms(value), "ms")


def _aggregate_calls(expr: Expr) -> list[FuncCall]:
    if isinstance(expr, FuncCall) and expr.name in AGGREGATES:
        return [expr]
    if isinstance(expr, BinaryOp):
        return _aggregate_calls(expr.left) + _aggregate_calls(expr.right)
    operand = getattr(expr, "operand", None)
    return _aggregate_calls(operand) if operand is not None else []


# -- projection ---------------------------------------------------------------------------------
def _projection(query: Query, stage: Stage, ctx: Context) -> Plan:
    if stage.window is not None and stage.window.emit_every is not None:
        raise UnsupportedQuery("EMIT EVERY gives early results of a window aggregate, after the select list")
    outputs: dict[str, Callable[[Any], Any]] = {}
    types: list[tuple[str, ColumnType]] = []
    renames: dict[str, str] = {}
    for item in query.select:
        if isinstance(item.expr, Star):
            for f in stage.scope.fields:
                outputs[f.physical] = _getter(f.physical)
                types.append((f.physical, f.type))
            continue
        out = item.alias or item.text
        if out in outputs:
            raise UnsupportedQuery(f"result column {out!r} appears twice; give it an alias")
        compiled = compile_expr(item.expr, stage.scope, ctx.pool)
        outputs[out] = compiled.fn
        types.append((out, compiled.type or _literal_type(item.expr)))
        if isinstance(item.expr, Column):
            renames[stage.scope.resolve(item.expr.name, item.expr.qualifier).physical] = out
    progressing = tuple(renames[a] for a in stage.attributes if a in renames)
    last = stage.op
    if query.distinct:
        if not progressing:
            raise UnsupportedQuery("SELECT DISTINCT needs the progressing attribute among its columns")
        last = ctx.add(Project(outputs, renames), last)
        last = ctx.add(DupElim(tuple(outputs), progressing[0]), last)
    else:
        last = ctx.add(Project(outputs, renames), last)
    return Plan(last, ctx.inputs, tuple(types), progressing, ctx.plan_ops)


def _literal_type(expr: Expr) -> ColumnType:
    value = expr.value if isinstance(expr, Literal) else None
    if isinstance(value, bool):
        return ColumnType("bool")
    if isinstance(value, int):
        return INT64
    if isinstance(value, str):
        return ColumnType("string")
    return ColumnType("float64")


def _text(expr: Expr) -> str:
    if isinstance(expr, Column):
        return expr.text
    if isinstance(expr, Literal):
        return repr(expr.value)
    if isinstance(expr, BinaryOp):
        return f"{_text(expr.left)} {expr.op} {_text(expr.right)}"
    if isinstance(expr, FuncCall):
        return f"{expr.name}({', '.join(_text(a) for a in expr.args)})"
    if isinstance(expr, Star):
        return "*"
    return f"{getattr(expr, 'op', '')} {_text(getattr(expr, 'operand'))}"  # noqa: B009
