"""The string literals of a planned query, pinned in the pool that decides every string's code.

A string literal compared with a string column compiles to that string's pool code. The door's
pool gives codes out; a worker's pool mirrors it and must never give one out itself (its code
would name another string at the door). So the door pins every string literal of a description
before a runner builds it anywhere: a mirror that receives the door's new entries first then
compiles each literal to the code the door holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from operator import attrgetter
from typing import Any

from lowtide.query.ast import Literal
from lowtide.query.description import PlanDescription
from lowtide.strings import StringPool


def pin_literals(description: PlanDescription, pool: StringPool) -> None:
    """Pin in ``pool`` every string literal ``description`` holds, wherever it appears."""
    for value in sorted(_strings(description)):
        pool.code(value)


# The types most of a description's values are, holding nothing: passed over first.
_LEAVES = (str, int, float, bool, type(None))


def _strings(node: Any) -> set[str]:
    """The values of the string :class:`Literal` s within ``node`` (dataclasses and tuples),
    walked without recursion, a dataclass's fields read in one call: every query registered
    walks its whole description."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        cls: type = type(item)
        if cls in _LEAVES:
            continue
        if isinstance(item, Literal):
            if isinstance(item.value, str):
                found.add(item.value)
        elif isinstance(item, tuple | list):
            stack.extend(item)
        else:
            fields = _fields(cls)
            if fields is not None:
                stack.extend(fields(item))
    return found


@cache
def _fields(cls: type) -> Callable[[Any], tuple[Any, ...]] | None:
    """What reads the fields of a dataclass ``cls`` as a tuple; None for a type without fields
    (its instances are leaves)."""
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    if len(names) < 2:  # attrgetter of one name gives the value itself, not a tuple of it
        return (lambda item: (getattr(item, names[0]),)) if names else None
    return attrgetter(*names)


__all__ = ["pin_literals"]
