"""Derived tables: a query with ``(SELECT ...) AS x`` in FROM runs as a chain of queries.

Each derived table is planned as a query of its own, a *part* of the query that names it
(``<query>~1``, ``<query>~2``, ...: innermost first, then left to right), and the outer query
reads the part's result under the table's alias, as any query reads another's result (its rows
are final, its punctuation on ``window_end``). So a derived table costs no new operator and no
new progress rule: a Flink query such as Nexmark's q5 is three window aggregates and a join.

Invariant: every part comes before the parts and the query that read it, and a part's name
cannot be a user's (``~`` is never in a stream or query name, `lowtide.names`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lowtide.query.ast import FromItem, FromQuery, FromStream, FromUnion, QueryTree
from lowtide.query.topn import with_limit

PART = "~"  # <query>~<n>


@dataclass(frozen=True)
class Part:
    """A derived table, planned as the query ``name``."""

    name: str
    query: QueryTree


def split(query: QueryTree, name: str) -> tuple[tuple[Part, ...], QueryTree]:
    """The parts of ``query`` (registered as ``name``), readers last, and ``query`` reading them."""
    parts: list[Part] = []

    def outer(q: QueryTree) -> QueryTree:
        items: list[FromItem] = []
        for item in q.from_:
            if isinstance(item, FromQuery):
                inner = outer(item.query)  # its own derived tables first, numbered before it
                inner = with_limit(inner, item, q.where)  # WHERE rownum <= N: a Top-N keeps N
                part = Part(f"{name}{PART}{len(parts) + 1}", inner)
                parts.append(part)
                items.append(FromStream(part.name, item.window, item.alias))
            else:
                if isinstance(item, FromUnion):
                    item.streams  # noqa: B018  (refuses a derived table under UNION)
                items.append(item)
        return replace(q, from_=tuple(items))

    top = outer(query)
    return tuple(parts), top


def streams_read(query: QueryTree) -> list[str]:
    """The streams (and registered queries) ``query`` reads, its derived tables' included."""
    names: list[str] = []
    for item in query.from_:
        if isinstance(item, FromQuery):
            names += streams_read(item.query)
        else:
            names += (item.name,) if isinstance(item, FromStream) else item.streams
    return names


def part_of(name: str) -> str | None:
    """The query whose derived table ``name`` plans, if it is a part."""
    return name.split(PART, 1)[0] if PART in name else None


__all__ = ["PART", "Part", "part_of", "split", "streams_read"]
