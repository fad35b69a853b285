"""Helpers for tests and for embedding: a manual clock that time-driven features can run on."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock time in seconds since the epoch."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to: heartbeats and idle timeouts become deterministic."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, seconds: float) -> None:
        self._now = seconds
