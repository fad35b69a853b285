"""Punctuation generators: how a source's progress is known when it does not punctuate itself.

Set per stream at creation with a spec string:

* ``explicit`` - clients punctuate; nothing is generated.
* ``ordered`` - the source sends in order: its progress is the largest value seen.
* ``bounded:<slack>`` - disorder is bounded: progress is the largest value seen minus ``slack``.
* ``heartbeat:<period>,<skew>`` - timer driven, as in Gigascope: every ``period`` of wall time
  the source's progress advances to wall clock minus ``skew``, so a lull still makes progress.

Every generated value is a promise the generator makes on the source's behalf; a tuple that
breaks it is late. Explicit punctuation is accepted on every kind of stream.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lowtide.errors import InvalidArgument
from lowtide.names import shown

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-z]+)?\s*$", re.IGNORECASE)
_MS = {"ms": 1.0, "s": 1000.0, "min": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0}
MAX_DURATION_MS = 2.0**52  # 142,000 years, exact as a float
MAX_UNITS = 2**62  # a duration in the attribute's units: window arithmetic stays within int64
# Spelled-out units as Spark's withWatermark takes them ("10 seconds", "1 minute").
_UNIT = {
    "ms": "ms", "millisecond": "ms", "milliseconds": "ms",
    "s": "s", "sec": "s", "second": "s", "seconds": "s",
    "m": "min", "min": "min", "minute": "min", "minutes": "min",
    "h": "h", "hour": "h", "hours": "h",
    "d": "d", "day": "d", "days": "d",
}  # fmt: skip


def parse_duration_ms(text: str) -> float:
    """``"500ms"``, ``"2s"``, ``"10 seconds"``, ``"1min"``, ``"1h"``, ``"1d"`` or a bare number of
    milliseconds."""
    match = _DURATION.match(text)
    unit = _UNIT.get((match.group(2) or "ms").lower()) if match else None
    if match is None or unit is None:
        raise InvalidArgument(f"cannot read duration {shown(text)}; write e.g. 500ms, 2s, 10 seconds, 1min")
    ms = float(match.group(1)) * _MS[unit]
    if not abs(ms) <= MAX_DURATION_MS:
        raise InvalidArgument(f"duration {shown(text)} is too long (at most 2^52 ms)")
    return ms


@dataclass(frozen=True)
class Generator:
    """A parsed generator spec; values are in the progressing attribute's units."""

    kind: str  # explicit | ordered | bounded | heartbeat
    slack: int = 0
    period_ms: float = 0.0
    skew: int = 0

    @staticmethod
    def parse(spec: str, unit_ms: float) -> Generator:
        """Parse ``spec``; durations convert to units of ``unit_ms`` milliseconds each."""
        kind, _, arg = spec.strip().partition(":")
        kind = kind.lower()
        if kind in ("explicit", "ordered") and not arg:
            return Generator(kind)
        if kind == "bounded" and arg:
            return Generator(kind, slack=duration_units(arg, unit_ms))
        if kind == "heartbeat" and arg.count(",") == 1:
            period, skew = arg.split(",")
            period_ms = parse_duration_ms(period)
            if period_ms <= 0:
                raise InvalidArgument("heartbeat period must be positive")
            return Generator(kind, period_ms=period_ms, skew=duration_units(skew, unit_ms))
        raise InvalidArgument(
            f"unknown punctuation generator {shown(spec)}; expected explicit, ordered, bounded:<slack> "
            "or heartbeat:<period>,<skew>"
        )

    def after_batch(self, max_seen: int) -> int | None:
        """The source's progress implied by the data seen so far (None: data implies nothing)."""
        if self.kind == "ordered":
            return max_seen
        if self.kind == "bounded":
            return max_seen - self.slack
        return None

    def on_timer(self, now_units: int) -> int | None:
        """The progress a heartbeat promises at wall-clock time ``now_units``."""
        return now_units - self.skew if self.kind == "heartbeat" else None


def duration_units(text: str, unit_ms: float) -> int:
    """A duration in units of ``unit_ms`` milliseconds; a bare integer is already in units."""
    text = text.strip()
    if re.fullmatch(r"-?\d{1,19}", text) and abs(int(text)) <= MAX_UNITS:
        return int(text)  # a bare integer is in the attribute's own units
    units = parse_duration_ms(text) / unit_ms if not re.fullmatch(r"-?\d+", text) else math.inf
    if not abs(units) <= MAX_UNITS:
        raise InvalidArgument(f"duration {shown(text)} is out of range (at most 2^62 units)")
    return round(units)
