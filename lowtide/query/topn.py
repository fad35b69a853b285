"""Window Top-N: ``ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY x DESC)``.

A query whose select list holds a rank (``ROW_NUMBER()``, ``RANK()``, ``DENSE_RANK()`` with
``OVER``) ranks the rows of each partition once the partition is complete, and emits every row
with its rank (:class:`~lowtide.operators.window_top_n.WindowTopN`). A partition is complete when
punctuation passes it, so its PARTITION BY must hold a column aligned to the input's progressing
attribute: a window's ``window_start`` or ``window_end`` (or a copy), over a windowed query's
result or over ``TABLE(TUMBLE(...))``, whose rows the operator gives their window. A rank
partitioned by no window (Flink's plain Top-N, Nexmark q18 and q19; over a join, q9) ranks the
whole stream: its partitions complete at the end of the stream.

This module checks where a rank may stand (:func:`ranked_item`) and pushes the bound of the
query that reads one (:func:`with_limit`); :func:`lowtide.query.describe.describe` plans it.

Invariant of :func:`with_limit`: it sets a rank's ``limit`` to ``N`` only when the reading
query's WHERE has a conjunct that keeps no row of a rank above ``N``; the operator then keeps
only such rows, and the conjunct, which stays, filters exactly what it filtered before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

from lowtide.errors import UnsupportedQuery
from lowtide.query.ast import BinaryOp, Column, Expr, FromQuery, Literal, QueryTree, RankCall, SelectItem

RANK_FUNCTIONS = ("row_number", "rank", "dense_rank")
# A conjunct `rank <op> n` keeps ranks up to: (op, n) -> bound.
_BOUNDS = {"<=": lambda n: n, "<": lambda n: n - 1, "=": lambda n: n}
_MIRRORED = {">=": "<=", ">": "<", "=": "="}


def written(rank: RankCall) -> str:
    """How a message names ``rank``: ``ROW_NUMBER() OVER (...)``."""
    return f"{rank.function.upper()}() OVER (...)"


def ranked_item(query: QueryTree) -> SelectItem | None:
    """The select item of ``query`` that is a rank, if one is; refuses a rank anywhere else
    (inside an expression, WHERE, GROUP BY, HAVING), two ranks, a rank beside GROUP BY, and one
    without ORDER BY."""
    ranks = [item for item in query.select if isinstance(item.expr, RankCall)]
    inside = [
        (e.partition_by, e.order_by) if isinstance(e, RankCall) else e for e in (i.expr for i in query.select)
    ]
    if any(_holds_rank(e) for e in (*inside, query.where, *query.group_by, query.having)):
        raise UnsupportedQuery(
            "ROW_NUMBER() OVER (...) is a select item of its own, AS a name: filter on that name "
            "in an outer query, SELECT * FROM (SELECT *, ROW_NUMBER() OVER (...) AS r FROM ...) WHERE r <= 3"
        )
    if not ranks:
        return None
    rank = ranks[0].expr
    assert isinstance(rank, RankCall)
    if len(ranks) > 1:
        raise UnsupportedQuery(f"a query ranks its rows once; got {len(ranks)} OVER (...) items")
    if query.group_by or query.having is not None:
        raise UnsupportedQuery(
            f"{written(rank)} ranks rows, not groups: aggregate in a derived table and rank its rows "
            "in the query that reads it, SELECT *, ROW_NUMBER() OVER (...) FROM (SELECT ... GROUP BY ...)"
        )
    if not rank.order_by:
        raise UnsupportedQuery(f"{written(rank)} needs ORDER BY: the rows are ranked in that order")
    return ranks[0]


def _holds_rank(node: Any) -> bool:
    """Whether an expression (or None) holds a rank anywhere in it."""
    if isinstance(node, RankCall):
        return True
    if isinstance(node, tuple):
        return any(_holds_rank(item) for item in node)
    if dataclasses.is_dataclass(node):
        return any(_holds_rank(getattr(node, f.name)) for f in dataclasses.fields(node))
    return False


def with_limit(inner: QueryTree, item: FromQuery, where: Expr | None) -> QueryTree:
    """``inner``, the derived table ``item`` of a query whose WHERE is ``where``, with the bound
    of its rank set when a conjunct of ``where`` bounds it (the module's invariant): ``r <= 3``,
    ``r < 4``, ``r = 3``, ``3 >= r`` (BETWEEN's upper half) all keep ranks up to 3."""
    ranked = next((i for i in inner.select if isinstance(i.expr, RankCall)), None)
    if ranked is None or not isinstance(ranked.expr, RankCall):
        return inner
    bounds = [_bound(c, ranked.name, item.alias) for c in _conjuncts(where)]
    found = [b for b in bounds if b is not None]
    if not found:
        return inner
    limit = max(min(found), 0)
    if ranked.expr.limit is not None:
        limit = min(limit, ranked.expr.limit)
    select = tuple(
        replace(i, expr=replace(ranked.expr, limit=limit)) if i is ranked else i for i in inner.select
    )
    return replace(inner, select=select)


def _conjuncts(expr: Expr | None) -> list[Expr]:
    if isinstance(expr, BinaryOp) and expr.op == "AND":
        return _conjuncts(expr.left) + _conjuncts(expr.right)
    return [] if expr is None else [expr]


def _bound(conjunct: Expr, name: str, alias: str | None) -> int | None:
    """The rank up to which ``conjunct`` keeps rows, if it compares column ``name`` (of the
    table named ``alias``) with a whole number. An unqualified name is the rank's: were it
    another input's column too, planning refuses it as ambiguous."""
    if not isinstance(conjunct, BinaryOp):
        return None
    op, column, value = conjunct.op, conjunct.left, conjunct.right
    if isinstance(value, Column) and op in _MIRRORED:  # 3 >= r
        op, column, value = _MIRRORED[op], value, column
    if not (
        op in _BOUNDS
        and isinstance(column, Column)
        and column.name == name
        and column.qualifier in (None, alias)
        and isinstance(value, Literal)
        and type(value.value) is int
    ):
        return None
    bound: int = _BOUNDS[op](value.value)
    return bound


__all__ = ["RANK_FUNCTIONS", "ranked_item", "with_limit", "written"]
