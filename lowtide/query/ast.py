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

from dataclasses import dataclass
from typing import TypeAlias

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
    """The ``*`` of ``count(*)``; found nowhere else."""


@dataclass(frozen=True, slots=True)
class FuncCall:
    """A function or aggregate call; `name` is lower case and not checked at parse time."""

    name: str
    args: tuple[Expr, ...]


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


Expr: TypeAlias = Column | Literal | Star | FuncCall | BinaryOp | UnaryOp | Interval | TableArg

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
class Rows:
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
    `emit_every`.
    """

    range: Duration | Rows | None = None
    range_all: bool = False
    tumbling: bool = False
    slide: Duration | Rows | None = None
    wa: Column | RowNum | None = None
    pa: tuple[Column, ...] = ()
    rattr: Column | None = None
    sattr: RowNum | Rank | None = None
    session: Duration | None = None
    emit_every: Duration | None = None
    text: str = ""


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
            names.extend((item.name,) if isinstance(item, FromStream) else item.streams)
        return tuple(names)


FromItem: TypeAlias = FromStream | FromUnion


@dataclass(frozen=True, slots=True)
class Query:
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
