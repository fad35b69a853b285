"""The columns an aggregation computes around its operator, which reads columns only.

Before it (`AggregateInputs`): an aggregate's argument that is an expression (``sum(0.908 *
price)``), and for ``agg(x) FILTER (WHERE cond)`` the condition as a bool column and the argument
once more under a name of its own. (Aggregate state is named by the column it reads, shared by
the calls that read it: calls with different filters must read different columns.) A Project
that keeps its input adds them, so the rows reaching the aggregate are the input's.

After it (`post_expression`): a select item over aggregates, group columns and the window's
bounds (``DATE_FORMAT(window_start, 'yyyy-MM-dd')``, ``sum(x) / count(*)``), computed over the
result rows by a Project over the aggregate's result columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from lowtide.errors import UnsupportedQuery
from lowtide.operators.aggregates import AggFunc
from lowtide.operators.windows import Sliding
from lowtide.query.ast import Column, Expr, FuncCall, Literal, Star, rewrite, walk
from lowtide.query.description import ProjectNode
from lowtide.query.expr import BOOL, compile_expr, expr_text
from lowtide.query.functions import STRING_FUNCTIONS, TEXT_FUNCTIONS, date_pattern
from lowtide.query.graph import Graph
from lowtide.query.scope import Scope, ScopeField
from lowtide.schema import ColumnType
from lowtide.strings import StringPool

AGGREGATES = {f.value for f in AggFunc if f is not AggFunc.COUNT_STAR}
_INPUT = "__in"  # hidden columns before the aggregate: __in0, __in1, ...


def is_aggregate_call(expr: Expr) -> bool:
    """Whether ``expr`` is an aggregate call (``count(DISTINCT x)`` is count_distinct)."""
    return isinstance(expr, FuncCall) and (expr.name in AGGREGATES or expr.distinct)


@dataclass
class AggregateInputs:
    """The hidden columns computed before an aggregate over the input ``scope``, one per distinct
    (expression, filter) and one per filter condition. ``pool`` compiles them, to check them."""

    scope: Scope
    pool: StringPool
    columns: dict[tuple[Expr, Expr | None], ScopeField] = field(default_factory=dict)
    conditions: dict[Expr, str] = field(default_factory=dict)
    computed: list[tuple[str, Expr, ColumnType]] = field(default_factory=list)

    def value(self, expr: Expr, condition: Expr | None) -> ScopeField:
        """The column an aggregate of ``expr`` filtered by ``condition`` (None: unfiltered) reads:
        a plain column itself when unfiltered, else a hidden one."""
        if isinstance(expr, Column) and condition is None:
            return self.scope.resolve(expr.name, expr.qualifier)
        key = (expr, condition)
        if key not in self.columns:
            kind = self._type(expr)
            name = self._add(expr if not isinstance(expr, Star) else Literal(True), kind)
            self.columns[key] = ScopeField(name, name, kind)
        return self.columns[key]

    def condition(self, expr: Expr) -> str:
        """The bool column holding a FILTER's condition."""
        if expr not in self.conditions:
            if self._type(expr) != BOOL:
                raise UnsupportedQuery(f"FILTER (WHERE {expr_text(expr)}) takes a condition")
            self.conditions[expr] = self._add(expr, BOOL)
        return self.conditions[expr]

    def _type(self, expr: Expr) -> ColumnType:
        if isinstance(expr, Star):  # count(*) FILTER (...): counts a column that is never null
            return BOOL
        kind = compile_expr(expr, self.scope, self.pool).type
        if kind is None:
            raise UnsupportedQuery(
                f"{expr_text(expr)} is a constant: an aggregate takes a column or an expression of columns"
            )
        return kind

    def _add(self, expr: Expr, kind: ColumnType) -> str:
        """A new hidden column: the first name ``__in<i>`` neither an input column nor another has."""
        taken = {f.physical for f in self.scope.fields} | {name for name, _, _ in self.computed}
        name = next(n for i in itertools.count() if (n := f"{_INPUT}{i}") not in taken)
        self.computed.append((name, expr, kind))
        return name

    def node(self, source: int, graph: Graph) -> int:
        """The node feeding the aggregate: a Project after ``source`` adding the hidden columns
        to every input column, or ``source`` itself when there are none."""
        if not self.computed:
            return source
        columns = tuple((name, expr) for name, expr, _ in self.computed)
        return graph.add(ProjectNode(columns, self.scope, (), keeps_input=True), source)


def post_expression(expr: Expr, names: dict[Expr, str], grouped: set[str], scope: Scope) -> Expr:
    """``expr`` (a select item of an aggregate query that is no aggregate call and no column)
    with each aggregate call it reads as the result column ``names`` gives it. A column outside
    an aggregate must be one of the ``grouped`` physical columns or a window bound."""
    for column in _columns_outside_aggregates(expr):
        if column.qualifier is None and column.name in ("window_start", "window_end"):
            continue
        if scope.resolve(column.name, column.qualifier).physical not in grouped:
            raise UnsupportedQuery(
                f"{expr_text(column)} in {expr_text(expr)} must be in GROUP BY (or PA) or inside an aggregate"
            )
    return rewrite(expr, lambda sub: Column(names[sub]) if sub in names else None)


def formatted_extremes(expr: Expr, window: object, attribute: str, scope: Scope) -> Expr:
    """``expr`` with ``max(DATE_FORMAT(ts, p))`` (and min) as ``DATE_FORMAT(max(ts), p)`` where the
    two agree: where p's text orders as time does over every window (``'HH:mm'`` within windows
    of a day, aligned; ``'yyyy-MM-dd HH:mm'`` always). lowtide's strings are codes in order of
    arrival, so it has no max of strings itself."""

    def swapped(sub: Expr) -> Expr | None:
        if not (isinstance(sub, FuncCall) and sub.name in ("min", "max") and len(sub.args) == 1):
            return None
        inner = sub.args[0]
        if not (isinstance(inner, FuncCall) and inner.name == "date_format" and not inner.distinct):
            return None
        time = inner.args[0] if len(inner.args) == 2 else None
        if not isinstance(time, Column) or sub.distinct or inner.filter is not None:
            return None
        span = date_pattern(inner).ordered_within_ms()
        f = scope.resolve(time.name, time.qualifier)
        if span is None or not (span == float("inf") or _within(window, f, attribute, span)):
            return None
        return FuncCall("date_format", (replace(sub, args=(time,)), inner.args[1]))

    return rewrite(expr, swapped)


def _within(window: object, time: ScopeField, attribute: str, span_ms: float) -> bool:
    """Whether every window of ``window`` lies in one aligned interval of ``span_ms`` of the column
    ``time``: it is the window's attribute, and the window tumbles with a size dividing the span."""
    if time.physical != attribute or not isinstance(window, Sliding) or window.range != window.slide:
        return False
    span = span_ms / time.type.unit_ms
    return span == int(span) and int(span) % window.range == 0


def aggregates_in(expr: Expr | None) -> list[FuncCall]:
    """The aggregate calls in ``expr``, outermost first (their arguments are not searched)."""
    found: list[FuncCall] = []
    for sub in walk(expr, stop=is_aggregate_call):
        if is_aggregate_call(sub):
            assert isinstance(sub, FuncCall)
            found.append(sub)
    return found


def string_call(expr: Expr) -> FuncCall | None:
    """The first call in ``expr`` that makes strings (DATE_FORMAT, SPLIT_INDEX) or reads their
    text (COUNT_CHAR too), outermost first; None if it has none."""
    for sub in walk(expr):
        if isinstance(sub, FuncCall) and sub.name in STRING_FUNCTIONS | TEXT_FUNCTIONS:
            return sub
    return None


def columns_in(expr: Expr) -> Iterator[Column]:
    """Every column ``expr`` reads, outermost first."""
    for sub in walk(expr):
        if isinstance(sub, Column):
            yield sub


def _columns_outside_aggregates(expr: Expr) -> Iterator[Column]:
    for sub in walk(expr, stop=is_aggregate_call):
        if isinstance(sub, Column):
            yield sub


__all__ = [
    "AGGREGATES",
    "AggregateInputs",
    "aggregates_in",
    "columns_in",
    "formatted_extremes",
    "is_aggregate_call",
    "post_expression",
    "rewrite",
    "string_call",
]
