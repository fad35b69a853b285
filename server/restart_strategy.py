"""When to try placing a lost worker again: Flink's exponential-delay restart strategy.

A worker whose Ray actor died is placed again by attempts (create the actor, wait for it to
answer within ``attempt_timeout_s``). The first attempt after a death goes at once: every second
waited is a second of the worker's queries standing still. After a failed attempt the next one
waits ``initial_backoff_s``, then each wait is ``backoff_multiplier`` times the one before, up to
``max_backoff_s`` (``fixed-delay``: always ``initial_backoff_s``). A worker that has run for
``reset_backoff_threshold_s`` without dying starts over from the first wait, and its attempts
are counted from there: ``max_attempts`` of them failed in a row (0: no limit) and the server
gives up. Flink's ``restart-strategy.exponential-delay.*`` options, by the same names.

Invariant: the waits of one worker never shrink between two resets, never pass ``max_backoff_s``,
and a worker is never given up on while ``max_attempts`` is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("exponential-delay", "fixed-delay")


@dataclass(frozen=True)
class RestartStrategy:
    kind: str = "exponential-delay"
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    backoff_multiplier: float = 2.0
    reset_backoff_threshold_s: float = 300.0
    attempt_timeout_s: float = 60.0  # an actor not answering by then is killed and made again
    max_attempts: int = 0  # failed attempts in a row before the server gives up; 0: never

    def problem(self) -> str | None:
        """What is wrong with these settings, in one line; None if nothing."""
        if self.kind not in STRATEGIES:
            return f"restart_strategy must be one of {', '.join(STRATEGIES)}, got {self.kind!r}"
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            return "restart_initial_backoff_s must be more than 0 and at most restart_max_backoff_s"
        if self.backoff_multiplier < 1:
            return "restart_backoff_multiplier must be at least 1"
        if not self.attempt_timeout_s > 0 or self.reset_backoff_threshold_s < 0:
            return (
                "restart_attempt_timeout_s must be more than 0, "
                "restart_reset_backoff_threshold_s not negative"
            )
        if self.max_attempts < 0:
            return "restart_max_attempts must not be negative (0: no limit)"
        return None


class Backoff:
    """One worker's attempts and waits, under a :class:`RestartStrategy`."""

    def __init__(self, strategy: RestartStrategy) -> None:
        self.strategy = strategy
        self.failed = 0  # attempts failed since the last reset
        self.wait = 0.0  # the last wait, 0 before the first since the last reset
        self.placed_at: float | None = None  # when the worker last came up

    def died(self, now: float) -> None:
        """The worker was lost: after a quiet run long enough, its waits start over."""
        if self.placed_at is not None and now - self.placed_at >= self.strategy.reset_backoff_threshold_s:
            self.failed, self.wait = 0, 0.0
        self.placed_at = None

    def placed(self, now: float) -> None:
        self.placed_at = now

    def attempt_failed(self) -> float | None:
        """Count a failed attempt; the wait before the next one, or None: give up."""
        self.failed += 1
        strategy = self.strategy
        if strategy.max_attempts and self.failed >= strategy.max_attempts:
            return None
        if not self.wait or strategy.kind == "fixed-delay":
            self.wait = strategy.initial_backoff_s
        else:
            self.wait = min(self.wait * strategy.backoff_multiplier, strategy.max_backoff_s)
        return self.wait


__all__ = ["STRATEGIES", "Backoff", "RestartStrategy"]
