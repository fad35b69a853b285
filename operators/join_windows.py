"""What an OA-Join (:mod:`lowtide.operators.oa_join`) matches on, as data: its window (band,
tumbling or until) and each input's columns. The planner describes joins with these alone, so
it loads no operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class Band:
    """Sliding-window (band) join: ``S0.ts - r1 <= S1.ts <= S0.ts + r0``, in ts units."""

    r0: int
    r1: int


@dataclass(frozen=True)
class Tumbling:
    """Tumbling-window join: ``S0.ts // d == S1.ts // d``."""

    d: int


@dataclass(frozen=True)
class Until:
    """Interval join bounded by a column of input ``side`` (0 left, 1 right): a tuple ``x`` of it
    and a tuple ``y`` of the other match when ``x.ts + low <= y.ts <= x.column + high``."""

    side: int
    column: str
    low: int
    high: int = 0


JoinWindow: TypeAlias = Band | Tumbling | Until


@dataclass(frozen=True)
class JoinSide:
    """One input of the join: output prefix, carried columns, progressing attribute, keys."""

    prefix: str
    columns: tuple[str, ...]
    ts: str
    keys: tuple[str, ...]


__all__ = ["Band", "JoinSide", "JoinWindow", "Tumbling", "Until"]
