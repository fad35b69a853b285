"""The syntax tree of a lowtide query, as written: what `parse_query` returns.

Every node is a frozen dataclass, so a tree is immutable, hashable and comparable by value.
The tree records the query's text and nothing more: names are not resolved, function names are
not checked and window parameters are not combined into a window kind. That is the planner's
work. Keywords are normalised (``<>`` becomes ``!=``, AND/OR are upper case, function names lower
case, duration units one of ``ms``, ``s``, ``min``, ``h``, ``day``); identifiers keep their case.
A window written as a Spark or Flink window function arrives as the bracket window it spells
(`lowtide.query.spellings`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeAlias

from lowtide.errors import UnsupportedQuery

# ---- expressions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    """A column reference: ``ts`` is ``Column("ts")``, ``S0.ts`` is ``Column("ts", "S0")``."""

    name: str
    qualifier: str | None = None

    @property
    def text(self) -> str:
        return self.name if self.qualifier is None else f"{self.qualifier}.{self.name}"


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant: an int, a float, a string, a boolean, or None for NULL."""

    value: int | float | str | bool | None


@dataclass(frozen=True, slots=True)
class Star:
    """The ``*`` of ``count(*)``, or a select item ``*`` (every column) or ``x.*`` (every column of x)."""

    qualifier: str | None = None


@dataclass(frozen=True, slots=True)
class FuncCall:
    """A function or aggregate call; `name` is lower case and not checked at parse time.

    ``count(DISTINCT x)`` sets `distinct`; ``agg(...) FILTER (WHERE cond)`` sets `filter` to cond.
    """

    name: str
    args: tuple[Expr, ...]
    distinct: bool = False
    filter: Expr | None = None


@dataclass(frozen=True, slots=True)
class Case:
    """``CASE WHEN c THEN v ... [ELSE e] END``: `whens` are the (c, v) pairs in order, `else_` is
    None without ELSE. The simple form ``CASE x WHEN a THEN v`` arrives as ``WHEN x = a THEN v``."""

    whens: tuple[tuple[Expr, Expr], ...]
    else_: Expr | None


@dataclass(frozen=True, slots=True)
class BinaryOp:
    """``left op right``; `op` is one of ``+ - * / % = != < <= > >= AND OR``."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class UnaryOp:
    """``NOT operand`` or ``-operand``."""

    op: str
    operand: Expr


@dataclass(frozen=True, slots=True)
class Interval:
    """``INTERVAL '1' MINUTE`` (Flink), ``INTERVAL 10 SECONDS`` or ``INTERVAL '10 seconds'`` (Spark).

    Only an argument of the Spark and Flink window functions, which `parse_query` replaces by a
    `WindowSpec` (see `lowtide.query.spellings`): a tree it returns never holds one.
    """

    duration: Duration


@dataclass(frozen=True, slots=True)
class TableArg:
    """``TABLE S``: the input of a Flink window table function, ``TABLE(TUMBLE(TABLE S, ...))``.

    Like `Interval`, replaced by `parse_query`: a tree it returns never holds one.
    """

    name: str


@dataclass(frozen=True, slots=True)
class WindowBound:
    """A window's ``window_start`` or ``window_end`` selected under another name (Flink's
    ``window_start AS starttime``, ``SESSION_END(...) AS endtime``): a result column that copies
    the bound. Only a select item of a windowed aggregate holds one."""

    which: str  # "window_start" or "window_end"


@dataclass(frozen=True, slots=True)
class SortKey:
    """One key of an ORDER BY: ``price DESC`` is ``SortKey(Column("price"), True)``."""

    expr: Expr
    descending: bool = False


@dataclass(frozen=True, slots=True)
class RankCall:
    """``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)``, or ``RANK()`` or ``DENSE_RANK()``
    (`function` lower case): the rank of a row among the rows of its partition. Only a select
    item of its own holds one (a Window Top-N, `lowtide.query.topn`). `limit` is not written:
    `lowtide.query.derived` sets it when the query reading this one keeps only ranks up to it."""

    function: str
    partition_by: tuple[Expr, ...]
    order_by: tuple[SortKey, ...]
    limit: int | None = None


Expr: TypeAlias = (
    Column
    | Literal
    | Star
    | FuncCall
    | Case
    | BinaryOp
    | UnaryOp
    | Interval
    | TableArg
    | WindowBound
    | RankCall
)

# ---- window specification ----------------------------------------------------------------------


# The words a duration's unit may be written as, and the unit each means.
DURATION_UNITS = {
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), "ms"),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), "min"),
    **dict.fromkeys(("h", "hour", "hours"), "h"),
    **dict.fromkeys(("day", "days"), "day"),
}
UNIT_MS = {"ms": 1.0, "s": 1000.0, "min": 60_000.0, "h": 3_600_000.0, "day": 86_400_000.0}


@dataclass(frozen=True, slots=True)
class Duration:
    """``10 minutes`` is ``Duration(10.0, "min")``; a bare number has unit None (the attribute's unit)."""

    amount: float
    unit: str | None


@dataclass(frozen=True, slots=True)
class RowCount:
    """``1000 rows`` (or ``1 row``): a tuple-count extent or slide."""

    count: int


@dataclass(frozen=True, slots=True)
class RowNum:
    """The ``row-num`` pseudo attribute: arrival order at the server."""


@dataclass(frozen=True, slots=True)
class Rank:
    """``SATTR rank(ts)``: slide by tuples taken in `attribute` order."""

    attribute: Column


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """A bracketed window specification, one field per parameter; absent parameters are empty.

    ``RANGE ALL`` sets `range_all` and leaves `range` None; ``RANGE TUMBLING d`` sets `tumbling`
    and `range` to ``d``. ``WA`` and ``WATTR`` are synonyms and both land in `wa`. ``SESSION gap``
    sets `session`; ``EMIT EVERY d`` (the last parameter, or right after the bracket) sets
    `emit_every`. `touching`: no bracket parameter; Flink's ``SESSION`` and Spark's
    ``session_window`` set it (`lowtide.query.spellings`): their sessions merge when they touch.
    """

    range: Duration | RowCount | None = None
    range_all: bool = False
    tumbling: bool = False
    slide: Duration | RowCount | None = None
    wa: Column | RowNum | None = None
    pa: tuple[Column, ...] = ()
    rattr: Column | None = None
    sattr: RowNum | Rank | None = None
    session: Duration | None = None
    emit_every: Duration | None = None
    text: str = ""
    touching: bool = False


# ---- query -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SelectItem:
    """One item of the select list; `text` is the expression as written (without its alias)."""

    expr: Expr
    alias: str | None
    text: str

    @property
    def name(self) -> str:
        """The item's output name: its alias, else its text."""
        return self.alias if self.alias is not None else self.text


@dataclass(frozen=True, slots=True)
class FromStream:
    """A stream (or a registered query's result) read by name."""

    name: str
    window: WindowSpec | None = None
    alias: str | None = None


@dataclass(frozen=True, slots=True)
class FromUnion:
    """``A UNION B ...`` (Meld), nested as written: ``(A UNION (B UNION C))`` keeps its inner union."""

    inputs: tuple[FromItem, ...]
    window: WindowSpec | None = None
    alias: str | None = None

    @property
    def streams(self) -> tuple[str, ...]:
        """The names of every stream under this union, left to right, nesting flattened."""
        names: list[str] = []
        for item in self.inputs:
            if isinstance(item, FromQuery):
                raise UnsupportedQuery("a derived table (SELECT ...) cannot be an input of UNION")
            names.extend((item.name,) if isinstance(item, FromStream) else item.streams)
        return tuple(names)


@dataclass(frozen=True, slots=True)
class FromQuery:
    """A derived table, ``(SELECT ...) [AS] x``: planned as a query of its own whose result the
    outer query reads (`lowtide.query.derived`)."""

    query: QueryTree
    window: WindowSpec | None = None
    alias: str | None = None


FromItem: TypeAlias = FromStream | FromUnion | FromQuery


@dataclass(frozen=True, slots=True)
class QueryTree:
    """``SELECT [DISTINCT] select [window] FROM from_ [WHERE where] [GROUP BY group_by] [HAVING having]``.

    `window` is the aggregation window written after the select list; join windows live on the
    items of `from_` (one item, or two for a join). `text` is the query's source text.
    """

    select: tuple[SelectItem, ...]
    distinct: bool
    window: WindowSpec | None
    from_: tuple[FromItem, ...]
    where: Expr | None
    group_by: tuple[Expr, ...]
    having: Expr | None
    text: str

    @property
    def is_join(self) -> bool:
        return len(self.from_) > 1


# ---- walks over expressions -------------------------------------------------------------------


def children(expr: Expr) -> tuple[Expr, ...]:
    """The expressions directly under ``expr`` (an aggregate's FILTER condition included)."""
    if isinstance(expr, FuncCall):
        return expr.args if expr.filter is None else (*expr.args, expr.filter)
    if isinstance(expr, Case):
        return (*(e for pair in expr.whens for e in pair), *(() if expr.else_ is None else (expr.else_,)))
    if isinstance(expr, BinaryOp):
        return expr.left, expr.right
    if isinstance(expr, UnaryOp):
        return (expr.operand,)
    return ()


def walk(expr: Expr | None, stop: Callable[[Expr], bool] = lambda _: False) -> Iterator[Expr]:
    """``expr`` and what is under it, outermost first, not under a node ``stop`` holds for
    (without recursion: trees nest deep)."""
    stack = [] if expr is None else [expr]
    while stack:
        node = stack.pop()
        yield node
        if not stop(node):
            stack.extend(reversed(children(node)))


def rewrite(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """``expr`` with each sub-expression for which ``fn`` gives a replacement replaced."""
    replaced = fn(expr)
    if replaced is not None:
        return replaced
    if isinstance(expr, FuncCall):
        where = None if expr.filter is None else rewrite(expr.filter, fn)
        return replace(expr, args=tuple(rewrite(a, fn) for a in expr.args), filter=where)
    if isinstance(expr, Case):
        whens = tuple((rewrite(c, fn), rewrite(v, fn)) for c, v in expr.whens)
        return Case(whens, None if expr.else_ is None else rewrite(expr.else_, fn))
    if isinstance(expr, BinaryOp):
        return replace(expr, left=rewrite(expr.left, fn), right=rewrite(expr.right, fn))
    if isinstance(expr, UnaryOp):
        return replace(expr, operand=rewrite(expr.operand, fn))
    return expr
