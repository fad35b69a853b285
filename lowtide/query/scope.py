"""Name resolution: which physical column a query's column reference means, and its type."""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.errors import UnsupportedQuery
from lowtide.schema import ColumnType


@dataclass(frozen=True)
class ScopeField:
    """A column visible to a query stage: ``qualifiers`` may prefix ``name`` in the query text."""

    name: str
    physical: str
    type: ColumnType
    qualifiers: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Scope:
    fields: tuple[ScopeField, ...]

    def resolve(self, name: str, qualifier: str | None = None) -> ScopeField:
        text = f"{qualifier}.{name}" if qualifier else name
        if qualifier is None:
            found = [f for f in self.fields if f.name == name or f.physical == name]
        else:
            found = [f for f in self.fields if f.name == name and qualifier in f.qualifiers]
            found = found or [f for f in self.fields if f.physical == text]
        if not found:
            known = ", ".join(sorted({f.physical for f in self.fields}))
            raise UnsupportedQuery(f"unknown column {text!r}; columns here: {known}")
        if len({f.physical for f in found}) > 1:
            raise UnsupportedQuery(f"column {text!r} is ambiguous; qualify it with a stream name or alias")
        return found[0]

    def qualified(self, qualifier: str) -> Scope:
        return Scope(
            tuple(ScopeField(f.name, f.physical, f.type, f.qualifiers | {qualifier}) for f in self.fields)
        )
