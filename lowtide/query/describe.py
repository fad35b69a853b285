"""The planner's decisions: a parsed query becomes a :class:`~lowtide.query.description.PlanDescription`.

Input -> [Meld] -> [Select] -> ( [OA-Join -> Select] ) -> [Bucket -> WID Aggregate | Slide-by-tuple
Aggregate | Session Aggregate | DupElim | Project]. Single-side predicates of a join are pushed
below it, equalities across sides become join keys, the rest filter its output. An aggregation
runs as the first of :data:`~lowtide.query.strategies.STRATEGIES` that applies.

Invariant: :func:`describe` makes every decision and every check of planning - it raises
``UnsupportedQuery`` (and the rest) exactly where planning does - and builds nothing: expressions
are compiled only to check them, against a scratch pool. :func:`~lowtide.query.build.build` then
only instantiates and connects what the description says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lowtide.errors import UnsupportedQuery
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.oa_join import Band, JoinSide, Tumbling
from lowtide.operators.paned_wid import pane_of
from lowtide.operators.session import RETRACTED
from lowtide.operators.windows import Landmark, Rows, Session, Sliding
from lowtide.punctuation.policies import LatePolicy
from lowtide.query.ast import (
    BinaryOp,
    Column,
    Duration,
    Expr,
    FromItem,
    FromStream,
    FuncCall,
    Literal,
    Query,
    Star,
    WindowSpec,
)
from lowtide.query.description import (
    AggregateDescription,
    DupElimNode,
    Fields,
    HavingClause,
    InputNode,
    JoinJudge,
    JoinNode,
    MeldNode,
    PlanDescription,
    PlanOptions,
    ProjectNode,
    SelectNode,
    Where,
    WindowJudge,
)
from lowtide.query.early import FINAL, Early, early_results
from lowtide.query.expr import compile_conjuncts, compile_expr, expr_text
from lowtide.query.graph import Graph
from lowtide.query.scope import Field, Scope
from lowtide.query.sharing import ShareDescription, ShareIndex, ShareKey, saved_width
from lowtide.query.strategies import Feed, choose
from lowtide.query.windowing import SlideByTuple, to_units, window_attribute, window_of
from lowtide.schema import INT64, ColumnType, Schema
from lowtide.strings import StringPool

AGGREGATES = {f.value for f in AggFunc if f is not AggFunc.COUNT_STAR}
Catalog = Callable[[str], Schema]  # a stream's schema by name; NotFound for an unknown one


@dataclass(frozen=True)
class _Stage:
    """The output of a part of the graph: its last node, visible columns and progress."""

    node: int
    scope: Scope
    attributes: tuple[str, ...]  # physical progressing attribute(s)
    window: WindowSpec | None = None  # the window spec written after this FROM item


@dataclass
class _Describing:
    catalog: Catalog
    options: PlanOptions
    shared: ShareIndex | None  # what is shared already; None: every query has its own slices
    graph: Graph
    scratch: StringPool  # expressions compile here only to be checked


def describe(
    query: Query, catalog: Catalog, options: PlanOptions, shared: ShareIndex | None = None
) -> PlanDescription:
    """Plan ``query`` over the streams of ``catalog`` (see the module); ``shared``: the slices
    queries share already (None: no sharing)."""
    d = _Describing(catalog, options, shared, Graph(), StringPool())
    if not 1 <= len(query.from_) <= 2:
        raise UnsupportedQuery("FROM takes one stream (or union) or two for a join")
    if len(query.from_) == 2:
        stage = _join(query, d)
    else:
        stage = _from_item(query.from_[0], d)
        if query.where is not None:
            stage = _select(stage, query.where, d)
    if _is_aggregate(query):
        return _aggregate(query, stage, d)
    if query.window is not None:
        raise UnsupportedQuery("a window after the select list needs an aggregate")
    return _projection(query, stage, d)


# -- FROM -------------------------------------------------------------------------------------
def _from_item(item: FromItem, d: _Describing) -> _Stage:
    if isinstance(item, FromStream):
        schema = d.catalog(item.name)
        node = d.graph.add(InputNode(item.name, schema.columns))
        d.graph.add_input(item.name, node)
        qualifiers = frozenset({item.name} | ({item.alias} if item.alias else set()))
        scope = Scope(tuple(Field(name, name, kind, qualifiers) for name, kind in schema.columns))
        return _Stage(node, scope, (schema.progressing,), item.window)
    stages = [_from_item(part, d) for part in item.inputs]
    first = stages[0]
    layout = [(f.physical, f.type) for f in first.scope.fields]
    for other in stages[1:]:
        if [
            (f.physical, f.type) for f in other.scope.fields
        ] != layout or other.attributes != first.attributes:
            raise UnsupportedQuery(
                "UNION needs inputs with the same columns, types and progressing attribute"
            )
    meld = d.graph.add(MeldNode(len(stages)), *(stage.node for stage in stages))
    qualifiers = frozenset({item.alias}) if item.alias else frozenset()
    scope = Scope(tuple(Field(f.physical, f.physical, f.type, qualifiers) for f in first.scope.fields))
    return _Stage(meld, scope, first.attributes, item.window)


def _select(stage: _Stage, predicate: Expr, d: _Describing) -> _Stage:
    conjuncts = tuple(_conjuncts(predicate))
    compile_conjuncts(conjuncts, stage.scope, d.scratch)
    node = d.graph.add(SelectNode(Where(conjuncts, stage.scope)), stage.node)
    return _Stage(node, stage.scope, stage.attributes, stage.window)


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
        raise UnsupportedQuery(f"column {expr_text(column)!r} is {what} in this join")
    return sides[0]


# -- joins ------------------------------------------------------------------------------------
def _join(query: Query, d: _Describing) -> _Stage:
    items = query.from_
    sides: list[_Stage] = []
    side_inputs: list[list[str]] = []  # each side's streams
    for item in items:
        first = len(d.graph.inputs)
        sides.append(_from_item(item, d))
        side_inputs.append([i.stream for i in d.graph.inputs[first:]])
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
    wheres: list[Where | None] = []  # each side's pushed-down WHERE, one Select per conjunct
    for i, predicates in enumerate(pushed):
        for predicate in predicates:
            sides[i] = _select(sides[i], predicate, d)
        wheres.append(Where(tuple(predicates), sides[i].scope) if predicates else None)
    for item, joined in zip(items, sides, strict=True):
        _check_join_attribute(item, joined)
    window = _join_window(sides, items)
    left, right = (
        JoinSide(prefix, tuple(f.physical for f in s.scope.fields), s.attributes[0], tuple(keys))
        for prefix, s, keys in zip(prefixes, sides, (left_keys, right_keys), strict=True)
    )
    join = d.graph.add(JoinNode(left, right, window, (layouts[0], layouts[1])), sides[0].node, sides[1].node)
    streams = (tuple(side_inputs[0]), tuple(side_inputs[1]))
    for side, join_side in enumerate((left, right)):
        inputs = [i for i in d.graph.inputs if i.stream in side_inputs[side]]
        d.graph.judge(inputs, JoinJudge(window, side, join_side.ts, streams, wheres[side]))
    fields = tuple(
        Field(f.name, f"{prefix}.{f.physical}", f.type, frozenset({prefix}))
        for prefix, s in zip(prefixes, sides, strict=True)
        for f in s.scope.fields
    )
    stage = _Stage(
        join, Scope(fields), tuple(f"{p}.{s.attributes[0]}" for p, s in zip(prefixes, sides, strict=True))
    )
    for predicate in residual:
        stage = _select(stage, predicate, d)
    return stage


def _check_join_attribute(item: FromItem, side: _Stage) -> None:
    """A join's window is on each side's progressing attribute, which punctuation bounds: a WA
    naming another column is refused (before, it was taken for the progressing one, silently)."""
    spec = item.window
    attr_ref = window_attribute(spec) if spec is not None else None
    if not isinstance(attr_ref, Column):
        return
    f = side.scope.resolve(attr_ref.name, attr_ref.qualifier)
    if f.physical != side.attributes[0]:
        name = _prefix(item)
        raise UnsupportedQuery(
            f"the join's window on {name} is on {expr_text(attr_ref)}, but {name}'s rows progress on "
            f"{side.attributes[0]} (its punctuation): write WA {side.attributes[0]}, with a RANGE that "
            f"holds the pairs, and compare {expr_text(attr_ref)} in WHERE"
        )


def _prefix(item: FromItem) -> str:
    if item.alias:
        return item.alias
    if isinstance(item, FromStream):
        return item.name
    raise UnsupportedQuery("a UNION on one side of a join needs an alias: (A UNION B) AS name")


def _equi_pair(conjunct: Expr, sides: list[_Stage]) -> tuple[str, str] | None:
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
            f"cannot join {expr_text(a)} ({fa.type.name}) with {expr_text(b)} ({fb.type.name}) on equality"
        )
    return (fa.physical, fb.physical) if sa == 0 else (fb.physical, fa.physical)


def _join_window(sides: list[_Stage], items: tuple[FromItem, ...]) -> Band | Tumbling:
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
            f"{name}({expr_text(column)}) needs a numeric column, {expr_text(column)} is {f.type.name}"
        )
    return AggregateCall(func, f.physical, f.type, param, output)


def _aggregate(query: Query, stage: _Stage, d: _Describing) -> PlanDescription:
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
                f"the window is on {expr_text(attr_ref)}, which is not a progressing attribute here "
                f"({', '.join(stage.attributes)})"
            )
        attribute, kind = f.physical, f.type
    window = window_of(spec, attribute, kind, partition)
    if isinstance(window, Sliding | Rows):
        d.options.windows.check_window(window)
    early = early_results(spec, window)
    extra: tuple[str, ...] = (FINAL,) if early is not None else ()  # early results' column, after revision
    policy = d.options.policy
    if isinstance(window, Session) and policy is LatePolicy.UPDATE:
        extra = (RETRACTED, *extra)  # sessions merged away are withdrawn
    group_physicals: list[str] = []
    for g in query.group_by:
        if not isinstance(g, Column):
            raise UnsupportedQuery(f"GROUP BY takes columns, not {expr_text(g)}")
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
        having = HavingClause(query.having, Scope(tuple(result_fields)), tuple(names.items()))
        compile_expr(having.expr, having.scope, d.scratch, names)
    internal = ("window_start", "window_end", *[_internal(n, renames) for n in out_names], "revision", *extra)
    lateness: int | None = None  # None: late tuples never reach the aggregate
    if policy is LatePolicy.UPDATE:
        # Without allowed lateness a late tuple still updates the windows not yet emitted.
        allowed = d.options.allowed_lateness
        lateness = to_units(_lateness(allowed), kind, "allowed lateness") if allowed else 0
        if isinstance(window, Landmark | SlideByTuple) or attribute == "row-num":
            raise UnsupportedQuery(
                "late='update' works with time-based sliding, tumbling and session windows only"
            )
    aggregate = AggregateDescription(
        window,
        tuple(group_physicals),
        group_types,
        tuple(calls),
        internal,
        having,
        lateness,
        tuple((f.physical, f.type) for f in scope.fields),  # the layout of <query>.late
        d.options.windows,
    )
    graph = d.graph
    feeding = graph.nodes[stage.node].kind
    key = _share_key(query, aggregate.groups, group_types, policy) if d.shared is not None else None
    feed = Feed(stage.node, isinstance(feeding, SelectNode), key, _reads(key, window, d), d.options.flush)
    chosen = choose(aggregate, feed)
    chosen.describe(aggregate, feed, graph)
    # The window operator counts the Inputs' tuples behind punctuation (DESIGN.md §2) where their
    # columns reach it unchanged (Meld, Select): after a join the join judges its Inputs, and the
    # pairs it emits are in time for the aggregate.
    direct = isinstance(feeding, InputNode | SelectNode | MeldNode) and not any(
        isinstance(node.kind, JoinNode) for node in graph.nodes
    )
    if chosen.judges_behind and direct:
        assert not isinstance(window, SlideByTuple)
        where = feeding.where if isinstance(feeding, SelectNode) else None
        streams = _streams_of(graph)
        graph.judge(list(graph.inputs), WindowJudge(window, streams, where), isinstance(window, Rows))
    slides: dict[str, int] = {}
    if isinstance(window, Sliding) and isinstance(feeding, InputNode | MeldNode | SelectNode):
        for stream in _streams_of(graph):
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
    if any(renames.get(p, p) != p for p in renames):
        outputs = tuple(
            zip(("window_start", "window_end", *out_names, "revision", *extra), internal, strict=True)
        )
        graph.add(ProjectNode(outputs, scope, ()), len(graph.nodes) - 1)
    unit = kind.name[len("timestamp[") : -1] if kind.name.startswith("timestamp[") else ""
    return _described(d, schema, ("window_end",), tuple(slides.items()), unit, early)


def _streams_of(graph: Graph) -> tuple[str, ...]:
    return tuple(i.stream for i in graph.inputs)


def _reads(key: ShareKey | None, window: object, d: _Describing) -> ShareDescription | None:
    """The slices a sliding ``window`` fed as ``key`` reads: an earlier query's it can, or, described
    again to restore, those it read before (started again with their width if their feeder is gone)."""
    if not isinstance(window, Sliding) or d.shared is None or key is None:
        return None
    pane = pane_of(window).range
    restored = d.options.restored_share
    if restored is not None:
        width = saved_width(restored, key, pane)
        return d.shared.named(restored) or ShareDescription(key, width, joins=False)
    return d.shared.find(key, pane)


def _share_key(
    query: Query, groups: tuple[str, ...], types: tuple[ColumnType, ...], policy: LatePolicy
) -> ShareKey | None:
    """What makes two queries' slices the same: tuples reach them the same way and are
    grouped alike. Joins and unions are not shared; late policies other than drop either
    reject batches per query or revise windows, so they keep their own."""
    item = query.from_[0]
    if len(query.from_) != 1 or not isinstance(item, FromStream) or policy is not LatePolicy.DROP:
        return None
    return (item.name, item.alias, query.where, groups, types)


def _internal(name: str, renames: dict[str, str]) -> str:
    for physical, out in renames.items():
        if out == name:
            return physical
    return name


def _lateness(value: str | int) -> Duration:
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
def _projection(query: Query, stage: _Stage, d: _Describing) -> PlanDescription:
    if stage.window is not None and stage.window.emit_every is not None:
        raise UnsupportedQuery("EMIT EVERY gives early results of a window aggregate, after the select list")
    outputs: dict[str, Expr | str] = {}
    types: list[tuple[str, ColumnType]] = []
    renames: dict[str, str] = {}
    for item in query.select:
        if isinstance(item.expr, Star):
            for f in stage.scope.fields:
                outputs[f.physical] = f.physical
                types.append((f.physical, f.type))
            continue
        out = item.alias or item.text
        if out in outputs:
            raise UnsupportedQuery(f"result column {out!r} appears twice; give it an alias")
        compiled = compile_expr(item.expr, stage.scope, d.scratch)
        outputs[out] = item.expr
        types.append((out, compiled.type or _literal_type(item.expr)))
        if isinstance(item.expr, Column):
            renames[stage.scope.resolve(item.expr.name, item.expr.qualifier).physical] = out
    progressing = tuple(renames[a] for a in stage.attributes if a in renames)
    project = ProjectNode(tuple(outputs.items()), stage.scope, tuple(renames.items()))
    if query.distinct:
        if not progressing:
            raise UnsupportedQuery("SELECT DISTINCT needs the progressing attribute among its columns")
        last = d.graph.add(project, stage.node)
        d.graph.add(DupElimNode(tuple(outputs), progressing[0]), last)
    else:
        d.graph.add(project, stage.node)
    return _described(d, tuple(types), progressing)


def _literal_type(expr: Expr) -> ColumnType:
    value = expr.value if isinstance(expr, Literal) else None
    if isinstance(value, bool):
        return ColumnType("bool")
    if isinstance(value, int):
        return INT64
    if isinstance(value, str):
        return ColumnType("string")
    return ColumnType("float64")


def _described(
    d: _Describing,
    schema: Fields,
    progressing: tuple[str, ...],
    slides: tuple[tuple[str, int], ...] = (),
    time_unit: str = "",
    early: Early | None = None,
) -> PlanDescription:
    return PlanDescription(
        tuple(d.graph.nodes),
        tuple(d.graph.inputs),
        schema,
        progressing,
        d.options.policy,
        slides,
        time_unit,
        early,
        d.graph.share,
    )


__all__ = ["Catalog", "describe"]
