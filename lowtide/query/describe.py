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
from dataclasses import dataclass, replace

from lowtide.errors import UnsupportedQuery
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.join_windows import Band, JoinSide, JoinWindow, Tumbling, Until
from lowtide.operators.result_rows import RETRACTED
from lowtide.operators.windows import BOUNDS, Landmark, Rows, Session, Sliding, Whole, Window, pane_of
from lowtide.punctuation.model import END_OF_STREAM, MAX_EXTENT, NO_PROGRESS
from lowtide.punctuation.policies import LatePolicy
from lowtide.query.ast import (
    BinaryOp,
    Column,
    Duration,
    Expr,
    FromItem,
    FromQuery,
    FromStream,
    FuncCall,
    Interval,
    Literal,
    QueryTree,
    RankCall,
    SelectItem,
    Star,
    WindowBound,
    WindowSpec,
    walk,
)
from lowtide.query.computed import (
    AGGREGATES,
    AggregateInputs,
    aggregates_in,
    formatted_extremes,
    is_aggregate_call,
    post_expression,
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
    TopNNode,
    Where,
    WindowJudge,
)
from lowtide.query.early import FINAL, Early, early_results
from lowtide.query.expr import compile_conjuncts, compile_expr, expr_text, interval_units
from lowtide.query.graph import Graph
from lowtide.query.scope import Scope, ScopeField
from lowtide.query.sharing import ShareDescription, ShareIndex, ShareKey, saved_width
from lowtide.query.strategies import Feed, choose
from lowtide.query.topn import ranked_item, written
from lowtide.query.windowing import SlideByTuple, to_units, window_attribute, window_of
from lowtide.schema import INT64, ColumnType, Schema
from lowtide.strings import StringPool

Catalog = Callable[[str], Schema]  # a stream's schema by name; NotFound for an unknown one


@dataclass(frozen=True)
class _Stage:
    """The output of a part of the graph: its last node, visible columns and progress."""

    node: int
    scope: Scope
    attributes: tuple[str, ...]  # physical progressing attribute(s)
    window: WindowSpec | None = None  # the window spec written after this FROM item
    aligned: tuple[tuple[str, int], ...] = ()  # physical column = attributes[0] + constant


@dataclass
class _Describing:
    catalog: Catalog
    options: PlanOptions
    shared: ShareIndex | None  # what is shared already; None: every query has its own slices
    graph: Graph
    scratch: StringPool  # expressions compile here only to be checked


def describe(
    query: QueryTree, catalog: Catalog, options: PlanOptions, shared: ShareIndex | None = None
) -> PlanDescription:
    """Plan ``query`` over the streams of ``catalog`` (see the module); ``shared``: the slices
    queries share already (None, or ``options.share_slices`` False: no sharing)."""
    d = _Describing(catalog, options, shared if options.share_slices else None, Graph(), StringPool())
    if not 1 <= len(query.from_) <= 2:
        raise UnsupportedQuery("FROM takes one stream (or union) or two for a join")
    ranked = ranked_item(query)  # ROW_NUMBER() OVER (...): a Window Top-N
    if len(query.from_) == 2:
        stage = _join(query, d)
    else:
        stage = _from_item(query.from_[0], d)
        if query.where is not None:
            stage = _select(stage, query.where, d)
    if ranked is not None:
        return _window_top_n(query, ranked, stage, d)
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
        scope = Scope(tuple(ScopeField(name, name, kind, qualifiers) for name, kind in schema.columns))
        aligned = ((schema.progressing, 0), *schema.aligned)
        return _Stage(node, scope, (schema.progressing,), item.window, aligned)
    if isinstance(item, FromQuery):  # lowtide.query.derived plans it as a query of its own
        raise UnsupportedQuery("a derived table (SELECT ...) in FROM is planned by the door")
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
    scope = Scope(tuple(ScopeField(f.physical, f.physical, f.type, qualifiers) for f in first.scope.fields))
    return _Stage(meld, scope, first.attributes, item.window, ((first.attributes[0], 0),))


def _select(stage: _Stage, predicate: Expr, d: _Describing) -> _Stage:
    conjuncts = tuple(_conjuncts(predicate))
    compile_conjuncts(conjuncts, stage.scope, d.scratch)
    node = d.graph.add(SelectNode(Where(conjuncts, stage.scope)), stage.node)
    return _Stage(node, stage.scope, stage.attributes, stage.window, stage.aligned)


def _conjuncts(expr: Expr | None) -> list[Expr]:
    if expr is None:
        return []
    if isinstance(expr, BinaryOp) and expr.op == "AND":
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [expr]


def _columns_of(expr: Expr) -> list[Column]:
    return [node for node in walk(expr) if isinstance(node, Column)]  # inside CASE and FILTER too


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
def _join(query: QueryTree, d: _Describing) -> _Stage:
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
    if all(item.window is None for item in items):  # as Flink writes it: bounded by its predicates
        window: JoinWindow = _interval_bound(_conjuncts(query.where), sides, prefixes)
    else:
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
        ScopeField(f.name, f"{prefix}.{f.physical}", f.type, frozenset({prefix}))
        for prefix, s in zip(prefixes, sides, strict=True)
        for f in s.scope.fields
    )
    stage = _Stage(
        join,
        Scope(fields),
        tuple(f"{p}.{s.attributes[0]}" for p, s in zip(prefixes, sides, strict=True)),
        aligned=tuple((f"{prefixes[0]}.{c}", offset) for c, offset in sides[0].aligned),
    )
    for predicate in residual:
        stage = _select(stage, predicate, d)
    return stage


def _interval_bound(conjuncts: list[Expr], sides: list[_Stage], prefixes: list[str]) -> Band | Until:
    """The window that a join's predicates bound its pairs in: a band for an interval join
    (``B.ts BETWEEN A.ts - INTERVAL '10' SECOND AND A.ts``) or a window join (equal
    ``window_end``, or columns that equal a side's progressing attribute plus a constant); an
    until window for an interval bounded by a column of one side (``B.ts BETWEEN A.ts AND
    A.expires``: a lower bound in time and ``B.ts <= A.expires``, plus or minus a constant). Each
    predicate stays a filter; the window only lets punctuation purge what can no longer pair, so
    the rows are exact."""
    low, high = NO_PROGRESS, END_OF_STREAM  # of right.ts - left.ts
    ends: list[tuple[int, str, int]] = []  # (side x, column, c): the other side's ts <= x.column + c
    for conjunct in conjuncts:
        if not (isinstance(conjunct, BinaryOp) and conjunct.op in ("=", "<", "<=", ">", ">=")):
            continue
        left_term, right_term = (_time_term(e, sides) for e in (conjunct.left, conjunct.right))
        if left_term is None or right_term is None or left_term[0] == right_term[0]:
            continue
        op = conjunct.op if left_term[0] == 0 else _MIRRORED[conjunct.op]
        # written as left term op right term: left.(ts|c0) + a0 op right.(ts|c1) + a1
        (_, a0, c0), (_, a1, c1) = (left_term, right_term) if left_term[0] == 0 else (right_term, left_term)
        if c0 is None and c1 is None:  # right.ts - left.ts op' a0 - a1
            if op in ("=", ">", ">="):  # left.ts + a0 >= right.ts + a1: right.ts - left.ts <= k
                high = min(high, a0 - a1)
            if op in ("=", "<", "<="):
                low = max(low, a0 - a1)
        elif c0 is None and c1 is not None and op in ("=", "<", "<="):  # left.ts <= right.c1 + (a1 - a0)
            ends.append((1, c1, a1 - a0))
        elif c1 is None and c0 is not None and op in ("=", ">", ">="):  # right.ts <= left.c0 + (a0 - a1)
            ends.append((0, c0, a0 - a1))
    if low > NO_PROGRESS and high < END_OF_STREAM:
        # Band: left.ts - r1 <= right.ts <= left.ts + r0; widened to hold 0 (a band that holds the
        # pairs is all the purge needs). Bounds that leave no pair still give one: the predicates
        # then filter every pair out, and the answer is empty, as Flink's is.
        return Band(_within_extent(max(high, 0)), _within_extent(max(-low, 0)))
    for x, column, c in ends:  # the other side's ts from x.ts + since on: right - left >= low, or <= high
        since = low if x == 0 else (NO_PROGRESS if high == END_OF_STREAM else -high)
        if since > NO_PROGRESS:
            return Until(x, column, -_within_extent(-since), _within_extent(c))
    # A column bound of the left side stands for the upper bound, one of the right for the lower.
    has_low = low > NO_PROGRESS or any(x == 1 for x, _, _ in ends)
    has_high = high < END_OF_STREAM or any(x == 0 for x, _, _ in ends)
    left, right = (f"{p}.{s.attributes[0]}" for p, s in zip(prefixes, sides, strict=True))
    missing = "a" if not (has_low or has_high) else "an upper" if has_low else "a lower"
    raise UnsupportedQuery(
        f"this join is not bounded in time, so its state would grow without end: add {missing} bound "
        f"to ON or WHERE, e.g. {right} BETWEEN {left} - INTERVAL '10' SECOND AND {left} (an interval "
        "join), or join two windowed queries on their window_end (a window join)"
    )


def _within_extent(bound: int) -> int:
    """A join's bound in time, refused past ``MAX_EXTENT`` units either way, as a window's RANGE
    is (the time arithmetic on it must not overflow)."""
    if abs(bound) > MAX_EXTENT:
        raise UnsupportedQuery(
            f"a join's bound in time reaches {abs(bound)} units from the other side's time, over the "
            f"limit of 2^{MAX_EXTENT.bit_length() - 1} units: bound it closer"
        )
    return bound


_MIRRORED = {"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _time_term(expr: Expr, sides: list[_Stage]) -> tuple[int, int, str | None] | None:
    """``(side, c, None)`` if ``expr`` is that side's progressing attribute plus the constant c:
    an aligned column (`_Stage.aligned`), plus or minus a number or an INTERVAL; ``(side, c,
    column)`` if it is another integer or timestamp column of that side plus c (an INTERVAL in
    that column's units), which may bound the other side's time (an until join)."""
    if isinstance(expr, Column):
        side = _side_of(expr, sides[0].scope, sides[1].scope)
        found = sides[side].scope.resolve(expr.name, expr.qualifier)
        offset = dict(sides[side].aligned).get(found.physical)
        if offset is not None:
            return side, offset, None
        return (side, 0, found.physical) if found.type.is_integer else None
    if isinstance(expr, BinaryOp) and expr.op in ("+", "-"):
        term = _time_term(expr.left, sides)
        if term is None:
            return None
        side, offset, column = term
        kind = sides[side].scope.resolve(column or sides[side].attributes[0]).type
        if isinstance(expr.right, Interval):
            amount = interval_units(expr.right, kind)
        elif isinstance(expr.right, Literal) and type(expr.right.value) is int:
            amount = expr.right.value
        else:
            return None
        return side, offset + amount if expr.op == "+" else offset - amount, column
    return None


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
def _is_aggregate(query: QueryTree) -> bool:
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


def _call_of(expr: FuncCall, output: str, inputs: AggregateInputs) -> AggregateCall:
    """The aggregate call ``expr`` (``count(DISTINCT x)`` is count_distinct), reading a column of
    the input or one ``inputs`` computes: of an expression, or of a call with FILTER."""
    name = "count_distinct" if expr.distinct else expr.name
    if name not in AGGREGATES:
        raise UnsupportedQuery(f"unknown aggregate {name}(); expected one of {', '.join(sorted(AGGREGATES))}")
    valid = None if expr.filter is None else inputs.condition(expr.filter)
    if name == "count" and len(expr.args) == 1 and isinstance(expr.args[0], Star):
        if valid is None:
            return AggregateCall(AggFunc.COUNT_STAR, None, None, None, output)
        counted = inputs.value(expr.args[0], expr.filter)  # count(*) FILTER: a column never null
        return AggregateCall(AggFunc.COUNT, counted.physical, counted.type, None, output, valid)
    params = {"quantile": 2, "heavy_hitters": 2}
    want = params.get(name, 1)
    if len(expr.args) != want or isinstance(expr.args[0], Star):
        shape = "(x, number)" if want == 2 else "(x)"
        raise UnsupportedQuery(f"{name} takes {shape}, x a column or an expression of columns")
    argument = expr.args[0]
    f = inputs.value(argument, expr.filter)
    param = None
    if want == 2:
        arg = expr.args[1]
        if not isinstance(arg, Literal) or not isinstance(arg.value, int | float) or not 0 <= arg.value <= 1:
            raise UnsupportedQuery(f"the second argument of {name} must be a number between 0 and 1")
        param = float(arg.value)
    func = AggFunc(name)
    needs_number = func not in (AggFunc.COUNT, AggFunc.COUNT_DISTINCT, AggFunc.HEAVY_HITTERS)
    if func in (AggFunc.MIN, AggFunc.MAX) and f.type.is_string:
        raise UnsupportedQuery(
            f"{name}() of a string ({expr_text(argument)}) is not supported: lowtide codes strings in order "
            f"of arrival, not of text; {name}(DATE_FORMAT(ts, p)) is, where p's text orders as time does in "
            "every window ('HH:mm' in windows of a day)"
        )
    if needs_number and not (f.type.is_numeric or f.type.name == "bool"):
        raise UnsupportedQuery(
            f"{name}({expr_text(argument)}) needs a numeric column, {expr_text(argument)} is {f.type.name}"
        )
    if valid is not None and func in (AggFunc.MIN, AggFunc.MAX) and f.type.name != "float64":
        raise UnsupportedQuery(
            f"{name}({expr_text(argument)}) FILTER (...) has no value where no row passes, and a "
            f"{f.type.name} column has no NULL: write {name}(1.0 * {expr_text(argument)}) FILTER (...)"
        )
    return AggregateCall(func, f.physical, f.type, param, output, valid)


def _aggregate(query: QueryTree, stage: _Stage, d: _Describing) -> PlanDescription:
    spec = query.window if query.window is not None else _grouped_in_time(query, stage)
    scope = stage.scope
    window: Window | Session | SlideByTuple
    partition: tuple[str, ...] = ()
    if spec is None:
        # Flink's unbounded GROUP BY: one window, the whole stream, answered when it ends.
        attribute, early = stage.attributes[0], None
        kind = scope.resolve(attribute).type
        window = Whole(attribute)
    else:
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
    copies: dict[str, str] = {}  # a window bound under another name: name -> bound
    names: dict[Expr, str] = {}
    inputs = AggregateInputs(scope, d.scratch)  # columns computed before the aggregate
    post: dict[str, Expr] = {}  # select items computed over its result rows
    for item in query.select:
        out = item.alias or item.text
        if out in out_names or out in ("window_start", "window_end", "revision", *extra):
            raise UnsupportedQuery(f"result column {out!r} appears twice; give it an alias")
        expr = formatted_extremes(item.expr, window, attribute, scope)
        if isinstance(expr, WindowBound):
            copies[out] = expr.which
        elif is_aggregate_call(expr):
            assert isinstance(expr, FuncCall)
            calls.append(_call_of(expr, out, inputs))
            names[expr] = out
        elif not isinstance(expr, Column):
            post[out] = expr  # its aggregates are calls below, once the select list's are known
        else:
            physical = scope.resolve(expr.name, expr.qualifier).physical
            if physical not in group_physicals and physical not in partition:
                raise UnsupportedQuery(f"{item.text} must be in GROUP BY (or PA) or inside an aggregate")
            renames[physical] = out
        out_names.append(out)
    for expr in post.values():
        for call in aggregates_in(expr):
            if call not in names:
                names[call] = f"__agg_{len(calls)}"
                calls.append(_call_of(call, names[call], inputs))
    group_types = tuple(scope.resolve(p).type for p in group_physicals)
    grouped = {*group_physicals, *partition}
    result = _result_scope(scope, kind, group_physicals, calls)
    post = {out: post_expression(expr, names, grouped, scope) for out, expr in post.items()}
    having = None
    if query.having is not None:
        condition = formatted_extremes(query.having, window, attribute, scope)
        for i, expr in enumerate(aggregates_in(condition)):
            if expr not in names:
                hidden = f"__having_{i}"
                calls.append(_call_of(expr, hidden, inputs))
                names[expr] = hidden
        result_fields = [
            ScopeField("window_start", "window_start", INT64),
            ScopeField("window_end", "window_end", INT64),
        ]
        result_fields += [ScopeField(p, p, t) for p, t in zip(group_physicals, group_types, strict=True)]
        result_fields += [ScopeField(c.output, c.output, c.result_type()) for c in calls]
        having = HavingClause(condition, Scope(tuple(result_fields)), tuple(names.items()))
        compile_expr(having.expr, having.scope, d.scratch, names)
    internal = (
        "window_start",
        "window_end",
        *[copies.get(n) or _internal(n, renames) for n in out_names],
        "revision",
        *extra,
    )
    lateness: int | None = None  # None: late tuples never reach the aggregate
    if policy is LatePolicy.UPDATE:
        # Without allowed lateness a late tuple still updates the windows not yet emitted.
        allowed = d.options.allowed_lateness
        lateness = to_units(_lateness(allowed), kind, "allowed lateness") if allowed else 0
        if isinstance(window, Landmark | SlideByTuple) or attribute == "row-num":
            raise UnsupportedQuery(
                "late='update' works with time-based sliding, tumbling and session windows only"
            )
    # With select items computed after it, the aggregate emits every column they may read.
    emitted = internal if not post else tuple(dict.fromkeys(f.physical for f in result.fields))
    if post:
        emitted = (*emitted, "revision", *extra)
    aggregate = AggregateDescription(
        window,
        tuple(group_physicals),
        group_types,
        tuple(calls),
        emitted,
        having,
        lateness,
        tuple((f.physical, f.type) for f in scope.fields),  # the layout of <query>.late
        d.options.windows,
    )
    graph = d.graph
    feeding = graph.nodes[stage.node].kind
    fed = inputs.node(stage.node, graph)  # a Project adding the computed columns, if any
    computes = fed != stage.node  # then no WHERE fuses into the aggregate, no slices are shared
    shares = d.shared is not None and not computes
    key = _share_key(query, aggregate.groups, group_types, policy) if shares else None
    filtered = isinstance(feeding, SelectNode) and not computes
    feed = Feed(fed, filtered, key, _reads(key, window, d), d.options.flush, d.options.paned_min_overlap)
    chosen = choose(aggregate, feed)
    chosen.describe(aggregate, feed, graph)
    # The window operator counts the Inputs' tuples behind punctuation
    # (docs/design.md, "Punctuation and lateness") where their columns reach it unchanged (Meld,
    # Select): after a join the join judges its Inputs, and the pairs it emits are in time for the
    # aggregate. Every window but slide-by-tuple has a logic that judges them, the operator's and
    # the door's (lowtide.operators.window_logic); slide-by-tuple windows are defined by arrival
    # ranks: behind tuples are late at the Input.
    direct = isinstance(feeding, InputNode | SelectNode | MeldNode) and not any(
        isinstance(node.kind, JoinNode) for node in graph.nodes
    )
    if direct and not isinstance(window, SlideByTuple):
        where = feeding.where if isinstance(feeding, SelectNode) else None
        streams = _streams_of(graph)
        graph.judge(list(graph.inputs), WindowJudge(window, streams, where), isinstance(window, Rows))
    slides: dict[str, int] = {}
    if isinstance(window, Sliding) and isinstance(feeding, InputNode | MeldNode | SelectNode):
        for stream in _streams_of(graph):
            slides[stream] = min(slides.get(stream, window.slide), window.slide)
    types = {c.output: c.result_type() for c in calls}
    types.update({renames.get(p, p): t for p, t in zip(group_physicals, group_types, strict=True)})
    types.update(dict.fromkeys(copies, INT64))
    types.update({out: _post_type(expr, result, d.scratch) for out, expr in post.items()})
    schema = (
        ("window_start", INT64),
        ("window_end", INT64),
        *[(n, types[n]) for n in out_names],
        ("revision", INT64),
        *[(name, ColumnType("bool")) for name in extra],
    )
    if copies or post or any(renames.get(p, p) != p for p in renames):
        named = ("window_start", "window_end", *out_names, "revision", *extra)
        outputs = tuple((name, post.get(name, column)) for name, column in zip(named, internal, strict=True))
        graph.add(ProjectNode(outputs, result if post else scope, ()), len(graph.nodes) - 1)
    # The whole stream's bounds are the domain's ends, no instants a timestamp can show.
    timed = kind.name.startswith("timestamp[") and not isinstance(window, Whole)
    unit = kind.name[len("timestamp[") : -1] if timed else ""
    selected = {out: p for p, out in renames.items() if p in group_physicals}  # by their result names
    aligned = _aligned_result(window, stage, copies, selected)
    return _described(d, schema, ("window_end",), tuple(slides.items()), unit, early, aligned)


def _result_scope(scope: Scope, kind: ColumnType, groups: list[str], calls: list[AggregateCall]) -> Scope:
    """An aggregate's result columns as select items computed after it read them: the window's
    bounds (of the attribute's type: ``DATE_FORMAT(window_start, p)`` reads its unit), the group
    columns by their input names and the calls' outputs."""
    bounds = (ScopeField("window_start", "window_start", kind), ScopeField("window_end", "window_end", kind))
    grouped = (scope.resolve(p) for p in dict.fromkeys(groups))
    group_fields = tuple(ScopeField(f.name, f.physical, f.type, f.qualifiers) for f in grouped)
    outputs = tuple(ScopeField(c.output, c.output, c.result_type()) for c in calls)
    return Scope((*bounds, *group_fields, *outputs))


def _post_type(expr: Expr, result: Scope, pool: StringPool) -> ColumnType:
    """The type of a select item computed over the result rows (checked as it compiles)."""
    return compile_expr(expr, result, pool).type or _literal_type(expr)


def _grouped_in_time(query: QueryTree, stage: _Stage) -> WindowSpec | None:
    """GROUP BY a column that is the progressing attribute plus a constant (an outer query over
    window results, grouped by their window: Flink's ``GROUP BY starttime, endtime``) is a
    window of one value of the attribute: the group closes once punctuation passes it."""
    aligned = dict(stage.aligned)
    for g in query.group_by:
        if isinstance(g, Column) and stage.scope.resolve(g.name, g.qualifier).physical in aligned:
            attribute = stage.attributes[0]
            text = f"[RANGE 1, WA {attribute}]"
            return WindowSpec(range=Duration(1, None), wa=Column(attribute), text=text)
    return None


def _aligned_result(
    window: object, stage: _Stage, copies: dict[str, str], groups: dict[str, str]
) -> tuple[tuple[str, int], ...]:
    """The result columns that equal its window_end plus a constant: window_end, window_start of
    a window of one size, their copies, and a group column aligned in the input of a window of
    one value (whose window_end is that value + 1)."""
    offsets = {"window_end": 0}
    if isinstance(window, Sliding):
        offsets["window_start"] = -window.range
        if window.range == window.slide == 1 and window.attribute == stage.attributes[0]:
            inputs = dict(stage.aligned)  # offsets from attributes[0], the window's own attribute
            offsets.update({out: inputs[p] - 1 for out, p in groups.items() if p in inputs})
    offsets.update({out: offsets[which] for out, which in copies.items() if which in offsets})
    return tuple(offsets.items())


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
    query: QueryTree, groups: tuple[str, ...], types: tuple[ColumnType, ...], policy: LatePolicy
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


# -- projection ---------------------------------------------------------------------------------
def _projection(query: QueryTree, stage: _Stage, d: _Describing) -> PlanDescription:
    if stage.window is not None and stage.window.emit_every is not None:
        raise UnsupportedQuery("EMIT EVERY gives early results of a window aggregate, after the select list")
    outputs: dict[str, Expr | str] = {}
    types: list[tuple[str, ColumnType]] = []
    renames: dict[str, str] = {}
    for item in query.select:
        if isinstance(item.expr, Star):
            for f in _starred(item.expr, stage.scope):
                out = f.name if item.expr.qualifier is not None else f.physical
                if out in outputs:
                    raise UnsupportedQuery(f"result column {out!r} appears twice; select the columns by name")
                outputs[out] = f.physical
                types.append((out, f.type))
                renames.setdefault(f.physical, out)
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
    aligned: tuple[tuple[str, int], ...] = ()
    if stage.attributes[0] in renames:  # progressing[0] is the first attribute's new name
        aligned = tuple((renames[c], offset) for c, offset in stage.aligned if c in renames)
    project = ProjectNode(tuple(outputs.items()), stage.scope, tuple(renames.items()))
    if query.distinct:
        if not progressing:
            raise UnsupportedQuery("SELECT DISTINCT needs the progressing attribute among its columns")
        last = d.graph.add(project, stage.node)
        d.graph.add(DupElimNode(tuple(outputs), progressing[0]), last)
    else:
        d.graph.add(project, stage.node)
    return _described(d, tuple(types), progressing, aligned=aligned)


# -- Window Top-N ---------------------------------------------------------------------------------
def _window_top_n(query: QueryTree, item: SelectItem, stage: _Stage, d: _Describing) -> PlanDescription:
    """``... -> Window Top-N -> Project`` (`lowtide.query.topn`): the Window Top-N gives each row
    its rank, over TUMBLE its window's bounds too, as columns the select list reads like any."""
    rank = item.expr
    assert isinstance(rank, RankCall)
    if any(_has_aggregate(i.expr) for i in query.select):
        raise UnsupportedQuery(
            f"{written(rank)} ranks rows, not groups: aggregate in a derived table and rank its rows "
            "in the query that reads it"
        )
    if d.options.policy is LatePolicy.UPDATE:
        raise UnsupportedQuery(
            f"late='update' revises a window's rows; {written(rank)} ranks each window once: "
            "register the query with late='drop' or 'error'"
        )
    tumble: int | None = None
    attribute = stage.attributes[0]  # its punctuation completes windows
    if query.window is not None:
        stage, tumble = _tumbled(query.window, stage, d)
    partition = tuple(_rank_column(e, stage.scope, rank).physical for e in rank.partition_by)
    # Partitioned by no window: Flink's Top-N over the stream, its partitions complete at its end.
    whole = not set(partition) & dict(stage.aligned).keys()
    if whole:
        _judge_whole(stage, d)
    order = []
    for key in rank.order_by:
        f = _rank_column(key.expr, stage.scope, rank)
        if f.type.is_string:
            raise UnsupportedQuery(
                f"{written(rank)} orders by numbers, times and booleans; {expr_text(key.expr)} is a string"
            )
        order.append((f.physical, key.descending))
    physicals = {f.physical for f in stage.scope.fields}
    output = item.name
    while output in physicals:  # a column of its own, whatever the input's are named
        output += "~"
    kind = TopNNode(rank.function, partition, tuple(order), output, attribute, rank.limit, tumble, whole)
    node = d.graph.add(kind, stage.node)
    scope = Scope((*stage.scope.fields, ScopeField(output, output, INT64)))
    select: list[SelectItem] = []
    for i in query.select:  # the rank as its column; * as the columns before it, named as _projection does
        if i is item:
            select.append(SelectItem(Column(output), i.alias, i.text))
        elif isinstance(i.expr, Star):
            qualifier = i.expr.qualifier
            for f in _starred(i.expr, stage.scope):
                name = f.name if qualifier else f.physical
                select.append(SelectItem(Column(name, qualifier), None, name))
        else:
            select.append(i)
    ranked = _Stage(node, scope, stage.attributes, None, stage.aligned)
    described = _projection(replace(query, select=tuple(select), window=None), ranked, d)
    if tumble is None:
        return described
    time = stage.scope.resolve(attribute).type  # the window's bounds are times in its unit
    return replace(described, time_unit=time.unit or "")


def _judge_whole(stage: _Stage, d: _Describing) -> None:
    """Rows of a stream ranked as a whole are late at its end only: no tuple behind punctuation
    is late before then (after a join, the join judges its Inputs)."""
    graph = d.graph
    if any(isinstance(node.kind, JoinNode) for node in graph.nodes):
        return
    feeding = graph.nodes[stage.node].kind
    where = feeding.where if isinstance(feeding, SelectNode) else None
    graph.judge(list(graph.inputs), WindowJudge(Whole(stage.attributes[0]), _streams_of(graph), where))


def _tumbled(spec: WindowSpec, stage: _Stage, d: _Describing) -> tuple[_Stage, int]:
    """TUMBLE's rows, ranked per window: they gain the columns window_start and window_end,
    which the Window Top-N computes from the progressing attribute and whose punctuation it
    gives; returns that stage and the window's size."""
    attribute = window_attribute(spec)
    if not isinstance(attribute, Column):
        raise UnsupportedQuery(f"a Window Top-N ranks the rows of a time window, not of {spec.text}")
    f = stage.scope.resolve(attribute.name, attribute.qualifier)
    if f.physical != stage.attributes[0]:
        raise UnsupportedQuery(
            f"the window is on {expr_text(attribute)}, which is not the progressing attribute here "
            f"({stage.attributes[0]})"
        )
    window = window_of(spec, f.physical, f.type, ())
    if not isinstance(window, Sliding) or window.slide != window.range or spec.pa or spec.emit_every:
        raise UnsupportedQuery(
            f"a Window Top-N ranks the rows of a tumbling window, TABLE(TUMBLE(...)) or [RANGE d, WA ts], "
            f"not {spec.text}"
        )
    d.options.windows.check_window(window)
    taken = [g.physical for g in stage.scope.fields if g.physical in BOUNDS]
    if taken:
        raise UnsupportedQuery(
            f"TUMBLE gives its rows the columns window_start and window_end; the input has {taken[0]} "
            "already: rename it in a derived table"
        )
    added = tuple(ScopeField(b, b, INT64, f.qualifiers) for b in BOUNDS)
    aligned = (("window_end", 0), ("window_start", -window.range))
    scope = Scope((*stage.scope.fields, *added))
    return _Stage(stage.node, scope, ("window_end",), None, aligned), window.range


def _rank_column(expr: Expr, scope: Scope, rank: RankCall) -> ScopeField:
    if not isinstance(expr, Column):
        raise UnsupportedQuery(
            f"{written(rank)} takes columns in PARTITION BY and ORDER BY, not {expr_text(expr)}: "
            "compute it in a derived table"
        )
    return scope.resolve(expr.name, expr.qualifier)


def _starred(star: Star, scope: Scope) -> list[ScopeField]:
    """The columns ``*`` (all) or ``x.*`` (those of x) selects."""
    if star.qualifier is None:
        return list(scope.fields)
    fields = [f for f in scope.fields if star.qualifier in f.qualifiers]
    if not fields:
        raise UnsupportedQuery(f"{star.qualifier}.* names no input of this query")
    return fields


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
    aligned: tuple[tuple[str, int], ...] = (),
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
        aligned,
    )


__all__ = ["Catalog", "describe"]
