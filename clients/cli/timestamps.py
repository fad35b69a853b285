"""Timestamp columns written as text (CSV fields, JSON strings), as ``lowtide send`` reads them.

A ``timestamp[unit]`` column is written one of three ways, and its first row says which: integers
(counts of the unit since 1970-01-01 UTC, ``1700000000000``), ISO 8601 times without a zone offset
(taken as UTC, ``2023-11-14T22:13:20.5``, ``2023-11-14 22:13:20``, ``2023-11-14``) or ISO 8601
times with one (``2023-11-14T22:13:20Z``, ``...+01:00``). Every row must be written the way the
first is, to the column's unit at most (``20.1234`` seconds does not fit ``ms``); the first row that
is not is named, with its value. A column is converted whole by Arrow's casts; only a batch that
fails is searched for its first bad row, by halving (a few casts of the failing batch).
:func:`time_value` converts one such text the same way (``send --punctuation 2023-11-14T22:14:30``);
:func:`time_text` writes a value back as ``tail`` shows times (``source list``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa

from lowtide.errors import InvalidArgument

_INTEGER = re.compile(r"[+-]?\d+")
# A zone offset follows a time of day (hh:mm...): "2023-11-14" ends in "-14" and has none.
_ZONED = re.compile(r".*\d\d:\d\d(:\d\d(\.\d*)?)?(Z|[+-]\d\d(:?\d\d)?)")
_UNIT = re.compile(r"timestamp\[(s|ms|us|ns)\]")
_DATED = re.compile(r"[+-]?\d{4,}-\d\d-\d\d(?:[T ]|$)")
_UNIT_NAMES = {"s": "seconds", "ms": "ms", "us": "µs", "ns": "ns"}

Cast = Callable[[pa.Array], pa.Array]


def timestamp_unit(kind: str) -> str | None:
    """The unit of a stream column type ``timestamp[ms]`` ..., None for other types."""
    match = _UNIT.fullmatch(kind)
    return match[1] if match else None


class TimestampText:
    """One timestamp column of a file read as strings: its values as ``timestamp[unit]``."""

    def __init__(self, name: str, unit: str) -> None:
        self.name = name
        self.unit = unit
        self.form = ""  # "integer", "naive" or "zoned": set by the file's first row
        self.first_row = 0

    def describe(self) -> str:
        unit = _UNIT_NAMES[self.unit]
        return {
            "integer": f"integers ({unit} since 1970-01-01 UTC)",
            "naive": f"ISO 8601 times without a zone offset, to the {unit} at most",
            "zoned": f"ISO 8601 times with a zone offset, to the {unit} at most",
        }[self.form]

    def convert(self, values: pa.Array, first_row: int) -> pa.Array:
        """``values`` (strings; ``first_row`` is the 1-based row number of the first) as timestamps.

        Raises InvalidArgument naming the first row not written like the file's first row."""
        if not self.form and len(values):
            self.form = _form_of(values[0].as_py() or "")
            self.first_row = first_row
        cast = self._cast()
        try:
            return cast(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            bad = _first_failure(values, cast)
        row, value = first_row + bad, values[bad].as_py()
        kind, unit = f"timestamp[{self.unit}]", _UNIT_NAMES[self.unit]
        if row == self.first_row:
            raise InvalidArgument(
                f"row {row}: column {self.name!r} is {kind}: write it as integers ({unit} since "
                f"1970-01-01 UTC) or ISO 8601 times to the {unit} at most, got {value!r}"
            )
        raise InvalidArgument(
            f"row {row}: column {self.name!r} is {kind} written as {self.describe()}, "
            f"as row {self.first_row} is; got {value!r}"
        )

    def _cast(self) -> Cast:
        unit = self.unit
        exact = pa.timestamp(unit)
        if self.form == "integer":
            return lambda values: values.cast(pa.int64()).cast(exact)
        # Parsed to the µs (ns for an ns column), then cast safely: a finer value raises, never truncates.
        parse_unit = "ns" if unit == "ns" else "us"
        zone = "UTC" if self.form == "zoned" else None
        parsed, fitted = pa.timestamp(parse_unit, zone), pa.timestamp(unit, zone)
        return lambda values: values.cast(parsed).cast(fitted).cast(pa.int64()).cast(exact)


def looks_like_time(text: str) -> bool:
    """Whether ``text`` is written as an ISO 8601 time (a date first), whether or not it is one."""
    return _DATED.match(text) is not None


def time_value(text: str, unit: str) -> int:
    """``text`` (an integer or an ISO 8601 time) as the count of ``unit`` since 1970-01-01 UTC that
    a ``timestamp[unit]`` column of a file holding it gets (:class:`TimestampText`).

    Raises InvalidArgument saying what a value of that unit may be."""
    column = TimestampText("", unit)
    column.form = _form_of(text)
    try:
        converted = column._cast()(pa.array([text], pa.string()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        name = _UNIT_NAMES[unit]
        raise InvalidArgument(
            f"expected an integer ({name} since 1970-01-01 UTC) or an ISO 8601 time to the {name} at "
            f"most, got {text!r}"
        ) from None
    return int(converted.cast(pa.int64())[0].as_py())


def time_text(value: int, unit: str) -> str:
    """``value`` (a count of ``unit`` since 1970-01-01 UTC) as ISO 8601 in UTC, as ``tail`` shows a
    time; the integer itself outside the years a calendar date holds (1-9999)."""
    try:
        return str(pa.scalar(value, pa.timestamp(unit)).as_py().isoformat())
    except (OverflowError, ValueError):
        return str(value)


def _form_of(text: str) -> str:
    if _INTEGER.fullmatch(text):
        return "integer"
    return "zoned" if _ZONED.fullmatch(text) else "naive"


def _first_failure(values: pa.Array, cast: Cast) -> int:
    """The index of the first value ``cast`` refuses (the whole of ``values`` fails)."""
    good, bad = 0, len(values)  # values[:good] convert, values[:bad] do not
    while bad - good > 1:
        middle = (good + bad) // 2
        try:
            cast(values.slice(good, middle - good))
            good = middle
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            bad = middle
    return good
