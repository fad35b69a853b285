"""Vectorised evaluation of scalar expressions (WHERE, HAVING, select items) over a batch.

An expression compiles once, at planning, into a function of the batch's columns that returns a
numpy array: no per-tuple Python. String literals compared with string columns become pool codes,
so string equality is integer equality.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.errors import UnsupportedQuery
from lowtide.operators.aggregates import AggFunc
from lowtide.query.ast import (
    UNIT_MS,
    BinaryOp,
    Case,
    Column,
    Expr,
    FuncCall,
    Interval,
    Literal,
    Star,
    UnaryOp,
    WindowBound,
)
from lowtide.query.functions import SCALAR_FUNCTIONS, scalar_call
from lowtide.query.scope import Scope
from lowtide.schema import ColumnType
from lowtide.strings import NULL_CODE, StringPool

Arr = npt.NDArray[Any]
Columns = Mapping[str, Arr]
BOOL = ColumnType("bool")

_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": np.true_divide,
    "%": np.mod,
}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True)
class Compiled:
    fn: Callable[[Columns], Any]
    type: ColumnType | None  # None: a literal whose type follows its context


def compile_expr(
    expr: Expr, scope: Scope, pool: StringPool, names: Mapping[Expr, str] | None = None
) -> Compiled:
    """Compile ``expr``; ``names`` maps whole sub-expressions (aggregates) to result columns."""
    if names and expr in names:
        column = names[expr]
        return Compiled(lambda cols: cols[column], scope.resolve(column).type)
    if isinstance(expr, Column):
        field = scope.resolve(expr.name, expr.qualifier)
        physical = field.physical
        return Compiled(lambda cols: cols[physical], field.type)
    if isinstance(expr, Literal):
        value = expr.value
        return Compiled(lambda cols: value, None)
    if isinstance(expr, UnaryOp):
        inner = compile_expr(expr.operand, scope, pool, names)
        if expr.op == "NOT":
            return Compiled(lambda cols: np.logical_not(inner.fn(cols)), BOOL)
        return Compiled(lambda cols: -inner.fn(cols), inner.type)
    if isinstance(expr, BinaryOp):
        return _binary(expr, scope, pool, names)
    if isinstance(expr, Case):
        return _case(expr, scope, pool, names)
    if isinstance(expr, FuncCall) and expr.name in SCALAR_FUNCTIONS:
        args = [compile_expr(a, scope, pool, names) for a in expr.args]
        return Compiled(*scalar_call(expr, [(a.fn, a.type) for a in args], pool))
    if isinstance(expr, FuncCall) and expr.name not in _AGGREGATES:
        known = ", ".join(sorted(name.upper() for name in SCALAR_FUNCTIONS))
        raise UnsupportedQuery(
            f"unknown function {expr.name}(): lowtide has no user-defined functions; its scalar functions "
            f"are {known}"
        )
    if isinstance(expr, FuncCall | Star):
        raise UnsupportedQuery(f"function {getattr(expr, 'name', '*')}() is not allowed here")
    if isinstance(expr, Interval):
        raise UnsupportedQuery(_INTERVAL_USE)
    raise UnsupportedQuery(f"unsupported expression {expr!r}")


def compile_conjuncts(
    conjuncts: Sequence[Expr], scope: Scope, pool: StringPool
) -> list[tuple[Callable[[Columns], Any], str]]:
    """Each conjunct of a WHERE compiled, with its text (for ``explain``)."""
    return [(compile_expr(c, scope, pool).fn, expr_text(c)) for c in conjuncts]


def expr_text(expr: Expr) -> str:
    """``expr`` written out again (conjuncts in ``explain``, columns in error messages)."""
    if isinstance(expr, Column):
        return expr.text
    if isinstance(expr, Literal):
        return repr(expr.value)
    if isinstance(expr, BinaryOp):
        return f"{expr_text(expr.left)} {expr.op} {expr_text(expr.right)}"
    if isinstance(expr, FuncCall):
        distinct = "DISTINCT " if expr.distinct else ""
        where = "" if expr.filter is None else f" FILTER (WHERE {expr_text(expr.filter)})"
        return f"{expr.name}({distinct}{', '.join(expr_text(a) for a in expr.args)}){where}"
    if isinstance(expr, Case):
        whens = " ".join(f"WHEN {expr_text(c)} THEN {expr_text(v)}" for c, v in expr.whens)
        otherwise = "" if expr.else_ is None else f" ELSE {expr_text(expr.else_)}"
        return f"CASE {whens}{otherwise} END"
    if isinstance(expr, Star):
        return "*"
    if isinstance(expr, Interval):
        amount = expr.duration.amount
        number = int(amount) if float(amount).is_integer() else amount
        return f"INTERVAL '{number}' {expr.duration.unit or 'ms'}"
    if isinstance(expr, WindowBound):
        return expr.which
    return f"{getattr(expr, 'op', '')} {expr_text(getattr(expr, 'operand'))}"  # noqa: B009


def _binary(expr: BinaryOp, scope: Scope, pool: StringPool, names: Mapping[Expr, str] | None) -> Compiled:
    left = _interval_or(expr.left, expr.right, scope, pool, names)
    right = _interval_or(expr.right, expr.left, scope, pool, names)
    op = expr.op
    if op in ("AND", "OR"):
        fn = np.logical_and if op == "AND" else np.logical_or
        return Compiled(lambda cols: fn(left.fn(cols), right.fn(cols)), BOOL)
    strings = [c for c in (left, right) if c.type is not None and c.type.is_string]
    if strings:
        if op not in ("=", "!="):
            raise UnsupportedQuery(f"strings can only be compared with = or !=, not {op}")
        left, right = _as_codes(left, expr.left, pool), _as_codes(right, expr.right, pool)
        if not (left.type and left.type.is_string and right.type and right.type.is_string):
            raise UnsupportedQuery("a string can only be compared with a string")
    if op in _COMPARE:
        cmp = _COMPARE[op]
        return Compiled(lambda cols: np.asarray(cmp(left.fn(cols), right.fn(cols))), BOOL)
    arith = _ARITHMETIC[op]
    kinds = [c.type for c in (left, right) if c.type is not None]
    if any(not k.is_numeric for k in kinds):
        raise UnsupportedQuery(f"operator {op} needs numbers")
    # A float literal makes the result float too (0.908 * price): typed int64, it was truncated.
    float_literal = any(type(_literal_value(e)) is float for e in (expr.left, expr.right))
    floaty = op == "/" or float_literal or any(k.name == "float64" for k in kinds)
    kind = ColumnType("float64") if floaty else ColumnType("int64")
    return Compiled(lambda cols: arith(left.fn(cols), right.fn(cols)), kind)


def _interval_or(
    expr: Expr, other: Expr, scope: Scope, pool: StringPool, names: Mapping[Expr, str] | None
) -> Compiled:
    """``expr`` compiled; an ``INTERVAL`` as a number in the units of the column it meets
    (``ts - INTERVAL '10' SECOND`` on a timestamp[ms] column subtracts 10000)."""
    if not isinstance(expr, Interval):
        return compile_expr(expr, scope, pool, names)
    kind = compile_expr(other, scope, pool, names).type
    if kind is None or not kind.is_integer:
        raise UnsupportedQuery(_INTERVAL_USE)
    units = interval_units(expr, kind)
    return Compiled(lambda cols: units, None)


_AGGREGATES = frozenset(f.value for f in AggFunc)  # allowed where rows are grouped, not in a row's expression
_INTERVAL_USE = (
    "an INTERVAL is added to or compared with a timestamp or integer column, e.g. ts - INTERVAL '10' SECOND"
)


def interval_units(interval: Interval, kind: ColumnType) -> int:
    """``interval`` in the units of a ``kind`` column (integers count milliseconds); a length
    that is not a whole number of them is refused."""
    duration = interval.duration
    units = duration.amount * UNIT_MS[duration.unit or "ms"] / kind.unit_ms
    if units != int(units):
        raise UnsupportedQuery(f"an interval of {units} {kind.unit or 'ms'} is not a whole number of them")
    return int(units)


def _literal_value(expr: Expr) -> object:
    """The value of a literal, a negated one too (-0.5); None for anything else."""
    while isinstance(expr, UnaryOp) and expr.op == "-":
        expr = expr.operand
    return expr.value if isinstance(expr, Literal) else None


def _as_codes(compiled: Compiled, expr: Expr, pool: StringPool) -> Compiled:
    if isinstance(expr, Literal) and isinstance(expr.value, str):
        code = pool.code(expr.value)
        return Compiled(lambda cols: code, ColumnType("string"))
    return compiled


def _case(expr: Case, scope: Scope, pool: StringPool, names: Mapping[Expr, str] | None) -> Compiled:
    """``CASE WHEN c THEN v ... ELSE e END`` as one ``np.select`` over the batch: the first WHEN
    that holds picks its value. Values are all strings (literals as pool codes), all numbers
    (int64, or float64 if any is a float) or all booleans; NULL, and no ELSE, is a null string or a
    NaN float, which an integer or boolean result cannot hold."""
    tests = []
    for when, _ in expr.whens:
        condition = compile_expr(when, scope, pool, names)
        if condition.type != BOOL and not isinstance(_literal_value(when), bool):
            raise UnsupportedQuery(f"CASE WHEN {expr_text(when)} THEN ...: WHEN takes a condition")
        tests.append(condition.fn)
    written = [v for _, v in expr.whens] + [Literal(None) if expr.else_ is None else expr.else_]
    values = [compile_expr(v, scope, pool, names) for v in written]
    kind = _case_type(expr, written, values)
    if kind.is_string:
        values = [_as_codes(c, v, pool) for c, v in zip(values, written, strict=True)]
    null = NULL_CODE if kind.is_string else np.nan
    fns = [(lambda cols: null) if _is_null(v) else c.fn for c, v in zip(values, written, strict=True)]
    *chosen, otherwise = fns
    dtype = kind.dtype

    def case(cols: Columns) -> Any:
        conditions = [np.asarray(test(cols), np.bool_) for test in tests]
        picked = np.select(conditions, [value(cols) for value in chosen], otherwise(cols))
        return picked.astype(dtype, copy=False)

    return Compiled(case, kind)


def _is_null(expr: Expr) -> bool:
    return isinstance(expr, Literal) and expr.value is None


def _case_type(expr: Case, written: list[Expr], values: list[Compiled]) -> ColumnType:
    """The one type of a CASE's values (see `_case`): an integer type they all have is kept."""
    kinds: set[str] = set()
    for v, c in zip(written, values, strict=True):
        value = _literal_value(v)
        if c.type is not None:
            kinds.add("string" if c.type.is_string else c.type.name)
        elif value is not None:
            kinds.add({str: "string", bool: "bool", int: "int64", float: "float64"}[type(value)])
    if not kinds:
        raise UnsupportedQuery(f"{expr_text(expr)}: every value is NULL; give one a type")
    integers = {k for k in kinds if k not in ("string", "bool", "float64")}
    if (integers and kinds - integers - {"float64"}) or len(kinds - integers) > 1:
        raise UnsupportedQuery(f"{expr_text(expr)} mixes {' and '.join(sorted(kinds))} values: give them one")
    if "float64" in kinds or len(integers) > 1:
        kind = ColumnType("float64" if "float64" in kinds else "int64")
    else:
        kind = ColumnType(kinds.pop())
    if any(_is_null(v) for v in written) and not (kind.is_string or kind.name == "float64"):
        raise UnsupportedQuery(
            f"{expr_text(expr)} is NULL where no WHEN holds (or where it says NULL), which a {kind.name} "
            "result cannot hold: add an ELSE with a value"
        )
    return kind
