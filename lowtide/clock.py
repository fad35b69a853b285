"""The clocks time-driven features (heartbeats, idle timeouts, EMIT EVERY) read.

Invariant: the engine reads the time only through a :class:`Clock`. :class:`WallClock` is the
system's; a :class:`ManualClock` moves only when told to, so the server's door can replay the
log at the times it records and a test can step heartbeats and timeouts deterministically.
"""

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
