"""The scalar functions of lowtide's query language, as Flink writes them: ``HOUR(ts)``,
``MOD(a, b)``, ``DATE_FORMAT(ts, 'yyyy-MM-dd')`` and ``SPLIT_INDEX(s, '/', 3)``; and Nexmark's
user-defined ``COUNT_CHAR(s, 'c')``, built in.

Each compiles once, at planning, into a function of a batch's columns. All are vectorised: numpy
over the rows, and where a function makes strings (DATE_FORMAT, SPLIT_INDEX) it makes them once
per distinct value of the batch and codes them in the pool (:meth:`~lowtide.strings.StringPool.codes`:
pinned, like literals), never once per row in Python; where it reads a string's text
(SPLIT_INDEX, COUNT_CHAR) it reads it once per distinct code of the batch. Only a pool that gives
codes out can make them, and only the front's holds every text: a server computes them at its
front (see :mod:`lowtide.server.partitioning`).

Times are UTC. A ``timestamp[unit]`` column counts its unit since the epoch; a plain integer
column counts milliseconds, as windows read it (:attr:`~lowtide.schema.ColumnType.unit_ms`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.errors import UnsupportedQuery
from lowtide.query.ast import Expr, FuncCall, Literal, UnaryOp
from lowtide.schema import FLOAT64, INT64, STRING, ColumnType
from lowtide.strings import NULL_CODE, StringPool

Arr = npt.NDArray[Any]
I64 = npt.NDArray[np.int64]
Fn = Callable[[Mapping[str, Arr]], Any]
Typed = tuple[Fn, ColumnType | None]  # a compiled argument: its function and type (None: a literal)

SCALAR_FUNCTIONS = frozenset({"hour", "mod", "date_format", "split_index", "count_char"})
STRING_FUNCTIONS = frozenset({"date_format", "split_index"})  # those that make strings
TEXT_FUNCTIONS = frozenset({"split_index", "count_char"})  # those that read strings' text
_COUNT_CHAR = "COUNT_CHAR(s, 'c')"  # how to write it, for its refusals
MS_PER_DAY = 86_400_000

# ---- date patterns -------------------------------------------------------------------------------

# Pattern letters, most significant first, with the widths lowtide writes (Java's, zero-padded to
# the count of letters) and the length in ms of one step of the field where it is fixed.
_ORDER = "yMdHmsS"
_WIDTHS = {"y": (4,), "M": (1, 2), "d": (1, 2), "H": (1, 2), "m": (1, 2), "s": (1, 2), "S": (3,)}
_STEP_MS = {"d": MS_PER_DAY, "H": 3_600_000, "m": 60_000, "s": 1000, "S": 1}
_NAMES = {
    "y": "year",
    "M": "month",
    "d": "day",
    "H": "hour",
    "m": "minute",
    "s": "second",
    "S": "millisecond",
}
_FULL = {  # the pattern of one window a day, hour, ...
    "d": "yyyy-MM-dd",
    "H": "yyyy-MM-dd HH",
    "m": "yyyy-MM-dd HH:mm",
    "s": "yyyy-MM-dd HH:mm:ss",
    "S": "yyyy-MM-dd HH:mm:ss.SSS",
}
_LETTER_NAMES = "yyyy (year), MM (month), dd (day), HH (hour), mm (minute), ss (second), SSS (millisecond)"
_TOKEN = re.compile(r"'(?:[^']|'')*'|([A-Za-z])\1*|[^A-Za-z']+|'")


@dataclass(frozen=True)
class DatePattern:
    """A Java (Flink) date pattern: fields as ``(letter, width)`` and literal text, in order.

    Invariant: every letter is one of yMdHmsS at a width lowtide writes, each at most once.
    """

    text: str
    parts: tuple[tuple[str, int] | str, ...]

    @staticmethod
    def parse(text: str) -> DatePattern:
        """The pattern ``text`` (``'...'`` quotes literal text, ``''`` is a quote); an unknown
        letter, width or repeated field raises `UnsupportedQuery` naming the letters there are."""
        parts: list[tuple[str, int] | str] = []
        seen: set[str] = set()
        for match in _TOKEN.finditer(text):
            token = match.group(0)
            if match.group(1) is None:
                if token == "'":
                    raise UnsupportedQuery(f"DATE_FORMAT pattern {text!r} has an unclosed quote")
                quoted = token[1:-1].replace("''", "'") if token != "''" else "'"  # '' is a quote
                parts.append(quoted if token.startswith("'") else token)
                continue
            letter = token[0]
            if letter not in _WIDTHS or len(token) not in _WIDTHS[letter]:
                raise UnsupportedQuery(
                    f"DATE_FORMAT pattern {text!r}: {token!r} is not supported; patterns take {_LETTER_NAMES}"
                    ", and M, d, H, m, s unpadded"
                )
            if letter in seen:
                raise UnsupportedQuery(f"DATE_FORMAT pattern {text!r} has {letter!r} twice")
            seen.add(letter)
            parts.append((letter, len(token)))
        return DatePattern(text, tuple(parts))

    @property
    def fields(self) -> str:
        """The field letters, in pattern order."""
        return "".join(p[0] for p in self.parts if isinstance(p, tuple))

    @property
    def step_ms(self) -> int:
        """The value is constant over aligned steps of this many ms: its smallest field's (a
        pattern of years and months only has none: 0)."""
        smallest = max(self.fields, key=_ORDER.index, default="y")
        return _STEP_MS.get(smallest, 0)

    def interval(self) -> int | str:
        """The length in ms of the aligned UTC interval each value names, one value for one
        interval; or why the values are not such intervals."""
        fields = self.fields
        smallest = max(fields, key=_ORDER.index, default="y")
        missing = [f for f in _ORDER[: _ORDER.index(smallest) + 1] if f not in fields]
        if smallest in "yM":
            return "months and years have no fixed length, and lowtide's windows have one size"
        if missing:
            unit, lacking = _NAMES[smallest], ", ".join(_NAMES[m] for m in missing)
            return (
                f"{self.text!r} has no {lacking}, so a value stands for the same {unit} of every "
                f"{_NAMES[missing[-1]]}; write {_FULL[smallest]!r} for one window a {unit}"
            )
        for i, part in enumerate(self.parts):
            unpadded = isinstance(part, tuple) and part[1] < max(_WIDTHS[part[0]])
            if unpadded and i + 1 < len(self.parts) and not isinstance(self.parts[i + 1], str):
                return f"two of its values can read alike: pad the field {part[0]} to two digits"
        return _STEP_MS[smallest]

    def ordered_within_ms(self) -> float | None:
        """Within any aligned UTC interval of this many ms, the text order of values is their time
        order (inf: always, for years 0 to 9999); None if it never is: a field unpadded or out of
        order (most significant first), or a field between its first and last missing."""
        fields = self.fields
        if not fields:
            return None
        first, last = _ORDER.index(fields[0]), _ORDER.index(fields[-1])
        padded = all(p[1] == max(_WIDTHS[p[0]]) for p in self.parts if isinstance(p, tuple))
        if not padded or fields != _ORDER[first : last + 1]:
            return None
        if first == 0:
            return math.inf
        # The unit above the first field holds it constant; days nest in months and years.
        return float(_STEP_MS.get(_ORDER[first - 1], MS_PER_DAY))

    def format(self, days: I64, ms_of_day: I64) -> list[str]:
        """The text of each instant ``days`` since 1970-01-01 plus ``ms_of_day``, vectorised
        (numpy's string functions): one call per field, none per value."""
        date = days.astype("datetime64[D]")
        month_start = date.astype("datetime64[M]")
        values = {
            "y": date.astype("datetime64[Y]").astype(np.int64) + 1970,
            "M": month_start.astype(np.int64) % 12 + 1,
            "d": (date - month_start).astype(np.int64) + 1,
            "H": ms_of_day // 3_600_000,
            "m": ms_of_day // 60_000 % 60,
            "s": ms_of_day // 1000 % 60,
            "S": ms_of_day % 1000,
        }
        out: Arr = np.full(days.shape[0], "", dtype=np.dtypes.StringDType())
        for part in self.parts:
            if isinstance(part, str):
                out = np.strings.add(out, part)
            else:
                letter, width = part
                out = np.strings.add(
                    out, np.strings.zfill(values[letter].astype(np.dtypes.StringDType()), width)
                )
        return list(out.tolist())


# ---- compiling -----------------------------------------------------------------------------------


def scalar_call(call: FuncCall, args: Sequence[Typed], pool: StringPool) -> tuple[Fn, ColumnType]:
    """``call`` (one of `SCALAR_FUNCTIONS`) over its compiled arguments ``args``; its one-line
    `UnsupportedQuery` says how to call it where the arguments do not fit."""
    name = call.name
    if call.distinct or call.filter is not None:
        raise UnsupportedQuery(f"{name.upper()}() is not an aggregate: it takes no DISTINCT and no FILTER")
    wanted = {"hour": 1, "mod": 2, "date_format": 2, "split_index": 3, "count_char": 2}[name]
    if len(args) != wanted:
        usage = {
            "hour": "HOUR(ts)",
            "mod": "MOD(a, b)",
            "date_format": "DATE_FORMAT(ts, 'yyyy-MM-dd')",
            "split_index": "SPLIT_INDEX(s, '/', 0)",
            "count_char": _COUNT_CHAR,
        }[name]
        raise UnsupportedQuery(f"{name.upper()} takes {wanted} argument{'s' * (wanted > 1)}: {usage}")
    if name == "hour":
        return _hour(args[0]), INT64
    if name == "mod":
        return _mod(call, args)
    if name == "date_format":
        return _date_format(call, args[0], pool), STRING
    if name == "count_char":
        return _count_char(call, args[0], pool), INT64
    return _split_index(call, args[0], pool), STRING


def _time_unit_ms(name: str, arg: Typed) -> float:
    """Milliseconds per unit of a time argument (a timestamp or integer column)."""
    kind = arg[1]
    if kind is None or not kind.is_integer:
        what = "a literal" if kind is None else kind.name
        raise UnsupportedQuery(f"{name.upper()}() takes a timestamp or integer column, not {what}")
    return kind.unit_ms


def _units(ms: int, unit_ms: float) -> int:
    """``ms`` in a column's units, at least one (a second column's millisecond is its second)."""
    return max(1, round(ms / unit_ms))


def _hour(arg: Typed) -> Fn:
    per_hour = _units(3_600_000, _time_unit_ms("hour", arg))
    fn = arg[0]
    return lambda cols: np.floor_divide(np.asarray(fn(cols), np.int64), per_hour) % 24


def _mod(call: FuncCall, args: Sequence[Typed]) -> tuple[Fn, ColumnType]:
    """Java's remainder, as Flink's MOD: its sign is the dividend's (MOD(-7, 3) is -1). A zero
    divisor gives 0 for integers (there is no integer NULL) and NaN for floats."""
    kinds: list[ColumnType] = []
    for (_, kind), expr in zip(args, call.args, strict=True):
        number = _number(expr)
        if kind is None and number is not None:
            kind = INT64 if type(number) is int else FLOAT64
        if kind is None or not kind.is_numeric:
            raise UnsupportedQuery(f"MOD() takes numbers, not {_shown(expr, kind)}")
        kinds.append(kind)
    if _number(call.args[1]) == 0:
        raise UnsupportedQuery("MOD(a, 0) has no value: the divisor must not be 0")
    (left, _), (right, _) = args
    kind = FLOAT64 if any(k.name == "float64" for k in kinds) else INT64

    def mod(cols: Mapping[str, Arr]) -> Any:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.fmod(left(cols), right(cols), dtype=kind.dtype)

    return mod, kind


def _number(expr: Expr) -> int | float | None:
    """The value of a number literal, negated or not (``-3`` parses as a minus on 3)."""
    if isinstance(expr, UnaryOp) and expr.op == "-":
        inner = _number(expr.operand)
        return None if inner is None else -inner
    value = expr.value if isinstance(expr, Literal) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _shown(expr: Expr, kind: ColumnType | None) -> str:
    return kind.name if kind is not None else f"the literal {getattr(expr, 'value', expr)!r}"


def date_pattern(call: FuncCall) -> DatePattern:
    """The pattern of ``DATE_FORMAT(ts, '<pattern>')``, a string literal."""
    pattern = call.args[1] if len(call.args) == 2 else None
    if not (isinstance(pattern, Literal) and isinstance(pattern.value, str)):
        raise UnsupportedQuery("the pattern of DATE_FORMAT(ts, pattern) is a string such as 'yyyy-MM-dd'")
    return DatePattern.parse(pattern.value)


def _date_format(call: FuncCall, arg: Typed, pool: StringPool) -> Fn:
    pattern = date_pattern(call)
    unit_ms = _time_unit_ms("date_format", arg)
    per_day = _units(MS_PER_DAY, unit_ms)
    # Values equal within a step format alike: each distinct step of the batch is formatted once.
    step = _units(pattern.step_ms, unit_ms) if pattern.step_ms else per_day
    fn = arg[0]

    def date_format(cols: Mapping[str, Arr]) -> Any:
        values = np.asarray(fn(cols), np.int64)
        steps, rows = np.unique(np.floor_divide(values, step), return_inverse=True)
        starts = steps * step
        days = np.floor_divide(starts, per_day)
        in_day = starts - days * per_day  # in the column's units: to ms without overflow
        ms_of_day = in_day * round(unit_ms) if unit_ms >= 1 else in_day // round(1 / unit_ms)
        codes = pool.codes(pattern.format(days, ms_of_day))
        return codes[rows].reshape(values.shape)

    return date_format


def _split_index(call: FuncCall, arg: Typed, pool: StringPool) -> Fn:
    """Flink's SPLIT_INDEX: the index-th (from 0) piece of the string cut at each separator, all
    pieces kept (empty ones between adjacent separators too); NULL where the string is NULL or
    empty or has no such piece."""
    _, separator, index = call.args
    if arg[1] is None or not arg[1].is_string:
        raise UnsupportedQuery(f"SPLIT_INDEX() splits a string column, not {_shown(call.args[0], arg[1])}")
    if not (isinstance(separator, Literal) and isinstance(separator.value, str) and separator.value):
        raise UnsupportedQuery("the separator of SPLIT_INDEX(s, separator, index) is a non-empty string")
    if not (isinstance(index, Literal) and type(index.value) is int and index.value >= 0):
        raise UnsupportedQuery("the index of SPLIT_INDEX(s, separator, index) is a whole number from 0")
    sep, at, fn = separator.value, index.value, arg[0]

    def split_index(cols: Mapping[str, Arr]) -> Any:
        values = np.asarray(fn(cols), np.int64)
        distinct, rows = np.unique(values, return_inverse=True)
        strings = pool.decode(distinct)
        pieces = pc.split_pattern(strings, sep)
        lengths = np.asarray(pc.fill_null(pc.list_value_length(pieces), 0), np.int64)
        empty = np.asarray(pc.fill_null(pc.equal(strings, ""), True), np.bool_)
        present = (lengths > at) & ~empty
        codes = np.full(distinct.shape[0], NULL_CODE, np.int64)
        if present.any():
            starts = np.asarray(pieces.offsets, np.int64)[:-1][present] + at
            chosen = pieces.values.take(pa.array(starts))
            codes[present] = pool.codes(chosen.to_pylist())
        return codes[rows].reshape(values.shape)

    return split_index


def _count_char(call: FuncCall, arg: Typed, pool: StringPool) -> Fn:
    """Nexmark's UDF count_char (nexmark-flink's CountChar), built in: how many times the one
    character occurs in the string, 0 where it is NULL. (CountChar counts the UTF-8 bytes equal to
    the character's first byte: the same for an ASCII character, whose byte is in no other
    character's UTF-8; for another character this counts characters, not bytes.)"""
    fn, kind = arg
    if kind is None or not kind.is_string:
        raise UnsupportedQuery(
            f"COUNT_CHAR() counts a character in a string column, not {_shown(call.args[0], kind)}: "
            f"write {_COUNT_CHAR}"
        )
    char = call.args[1]
    if not (isinstance(char, Literal) and isinstance(char.value, str) and len(char.value) == 1):
        what = _shown(char, None) if isinstance(char, Literal) else "a column or expression"
        raise UnsupportedQuery(
            f"COUNT_CHAR() counts one character, written as a string literal, not {what}: write {_COUNT_CHAR}"
        )
    character = char.value

    def count_char(cols: Mapping[str, Arr]) -> Any:
        values = np.asarray(fn(cols), np.int64)
        distinct, rows = np.unique(values, return_inverse=True)
        found = pc.count_substring(pool.decode(distinct), character)  # literal, not a pattern
        counts = np.asarray(pc.fill_null(found, 0), np.int64)
        return counts[rows].reshape(values.shape)

    return count_char


__all__ = [
    "SCALAR_FUNCTIONS",
    "STRING_FUNCTIONS",
    "TEXT_FUNCTIONS",
    "DatePattern",
    "date_pattern",
    "scalar_call",
]
