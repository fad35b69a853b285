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
from lowtide.query.ast import BinaryOp, Column, Expr, FuncCall, Literal, Star, UnaryOp
from lowtide.query.scope import Scope
from lowtide.schema import ColumnType
from lowtide.strings import StringPool

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
    if isinstance(expr, FuncCall | Star):
        raise UnsupportedQuery(f"function {getattr(expr, 'name', '*')}() is not allowed here")
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
        return f"{expr.name}({', '.join(expr_text(a) for a in expr.args)})"
    if isinstance(expr, Star):
        return "*"
    return f"{getattr(expr, 'op', '')} {expr_text(getattr(expr, 'operand'))}"  # noqa: B009


def _binary(expr: BinaryOp, scope: Scope, pool: StringPool, names: Mapping[Expr, str] | None) -> Compiled:
    left = compile_expr(expr.left, scope, pool, names)
    right = compile_expr(expr.right, scope, pool, names)
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
    floaty = op == "/" or any(k.name == "float64" for k in kinds)
    kind = ColumnType("float64") if floaty else ColumnType("int64")
    return Compiled(lambda cols: arith(left.fn(cols), right.fn(cols)), kind)


def _as_codes(compiled: Compiled, expr: Expr, pool: StringPool) -> Compiled:
    if isinstance(expr, Literal) and isinstance(expr.value, str):
        code = pool.code(expr.value)
        return Compiled(lambda cols: code, ColumnType("string"))
    return compiled
