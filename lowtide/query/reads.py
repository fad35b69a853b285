"""Which columns a query reads: the door codes the string columns some query reads, and only
the rows behind punctuation of the others (:func:`lowtide.schema.code_kept`).

A column is read when the query names it anywhere - select list, WHERE, GROUP BY, HAVING, a
window's attributes, a join's keys - under any qualifier; ``SELECT *`` (or ``x.*``) reads all.
The answer is by name and may name more than the query uses (a name of another input, an
alias): coding a column no query needed costs memory; missing one would lose strings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lowtide.query.ast import Column, QueryTree, Star


def columns_read(query: QueryTree) -> frozenset[str] | None:
    """The names of the columns ``query`` reads; None: all of them (it selects ``*``)."""
    if any(isinstance(item.expr, Star) for item in query.select):
        return None
    names: set[str] = set()
    _walk(query, names)
    return frozenset(names)


def _walk(node: Any, names: set[str]) -> None:
    if isinstance(node, Column):
        names.add(node.name)
    elif isinstance(node, tuple):
        for item in node:
            _walk(item, names)
    elif dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            _walk(getattr(node, f.name), names)


__all__ = ["columns_read"]
