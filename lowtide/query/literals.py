"""The string literals of a planned query, pinned in the pool that decides every string's code.

A string literal compared with a string column compiles to that string's pool code. The door's
pool gives codes out; a worker's pool mirrors it and must never give one out itself (its code
would name another string at the door). So the door pins every string literal of a description
before a runner builds it anywhere: a mirror that receives the door's new entries first then
compiles each literal to the code the door holds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lowtide.query.ast import Literal
from lowtide.query.description import PlanDescription
from lowtide.strings import StringPool


def pin_literals(description: PlanDescription, pool: StringPool) -> None:
    """Pin in ``pool`` every string literal ``description`` holds, wherever it appears."""
    for value in sorted(_strings(description)):
        pool.code(value)


def _strings(node: Any) -> set[str]:
    """The values of the string :class:`Literal` s within ``node`` (dataclasses and tuples)."""
    if isinstance(node, Literal):
        return {node.value} if isinstance(node.value, str) else set()
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return set().union(*(_strings(getattr(node, f.name)) for f in dataclasses.fields(node)))
    if isinstance(node, tuple | list):
        return set().union(*(_strings(item) for item in node))
    return set()


__all__ = ["pin_literals"]
