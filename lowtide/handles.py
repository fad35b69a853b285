"""What the engine and the network client both hand back to callers: query names and items.

Kept apart from the engine so that :mod:`lowtide.clients` (and every Spark executor and producer
that imports it) never loads the planner, lark or numba.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lowtide.lazy import loader

if TYPE_CHECKING:
    from lowtide.item import Item

# Item loads Arrow, on first use (PEP 562): a Query alone does not need it.
__getattr__ = loader(__name__, {"Item": "lowtide.item"}, globals())


class Query(str):
    """The name of a registered query (a ``str``), with its text: pass it to ``poll``."""

    sql: str

    def __new__(cls, name: str, sql: str) -> Query:
        self = super().__new__(cls, name)
        self.sql = sql
        return self

    @property
    def name(self) -> str:
        return str(self)

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        return (str(self), self.sql)  # so a Query pickles (e.g. into a spawned process)


__all__ = ["Item", "Query"]
