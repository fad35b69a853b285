"""What a producer checks before anything leaves it (docs/design.md, "Producers"). No I/O here.

A producer fetches its stream when it opens (``ListStreams``) and keeps a :class:`Contract`: the
schema, the progressing attribute, the sources declared on the stream and the punctuation the
server holds for the producer's source. Then

* a table (a dict of columns, a DataFrame, an Arrow table) is checked by the server's own door
  rules (:func:`lowtide.schema.check`): missing or unknown columns, the progressing attribute,
  types that do not convert exactly, nulls where the stream allows none;
* a row sent on its own (a dict of scalars) is checked value by value as it is sent
  (:class:`RowCheck`), and the pending rows become columns of the stream's own Arrow types, so
  what the door would refuse is refused at the ``send`` that carries it;
* a punctuation below this source's last one - the producer's own, or what the server held at
  open - is refused at the ``punctuate`` call.

Whatever fails raises there, with nothing sent.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lowtide.errors import RegressingPunctuation, SchemaMismatch
from lowtide.names import unknown
from lowtide.punctuation.model import DOMAIN, END_OF_STREAM, NO_PROGRESS, TIME_END, TIME_MIN
from lowtide.schema import ColumnType, Schema, check, check_names

Convert = Callable[[Any], Any]
_INT64 = (-(2**63), 2**63)
_INT32 = (-(2**31), 2**31)
_SUB_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}  # microseconds per unit (ns: any)
_KNOWN_SHAPES = 64  # row shapes (column orders) whose checks a RowCheck keeps


@dataclass(frozen=True)
class Contract:
    """What a producer knows of its stream and source from ``ListStreams`` at open."""

    stream: str
    source: str
    schema: Schema
    declared: tuple[str, ...]  # the sources named when the stream was created
    punctuation: int  # the source's punctuation on the server at open (NO_PROGRESS: none yet)

    @staticmethod
    def of(streams: list[dict[str, Any]], stream: str, source: str) -> Contract:
        """From ``Client.list_streams()``; an unknown stream raises NotFound."""
        info = next((s for s in streams if s["name"] == stream), None)
        if info is None:
            raise unknown("stream", stream, (s["name"] for s in streams))
        return Contract(
            stream,
            source,
            Schema.of(info["schema"], info["progressing"]),
            tuple(info.get("declared", ())),
            int(info.get("source_punctuation", {}).get(source, NO_PROGRESS)),
        )

    @property
    def closed(self) -> bool:
        """The source was closed (by this or an earlier producer) before this one opened."""
        return self.punctuation >= END_OF_STREAM

    def check_table(self, table: pa.Table) -> None:
        """Raises SchemaMismatch for what the server's door would refuse."""
        check(table, self.schema)

    def check_punctuation(self, value: int, last: int) -> None:
        """``value`` against the larger of ``last`` (this producer's) and the server's at open."""
        if self.closed:
            raise RegressingPunctuation(
                f"source {self.source!r} of stream {self.stream!r} is closed; it takes no punctuation"
            )
        floor = max(last, self.punctuation)
        if value < floor:
            whose = "this producer's last" if last >= self.punctuation else "the source's on the server"
            raise RegressingPunctuation(
                f"punctuation {value} of source {self.source!r} on stream {self.stream!r} goes back "
                f"from {floor} ({whose}); a source's punctuation never goes back"
            )


class RowCheck:
    """Checks one row (a dict of scalars) against the schema and returns its values, each as it
    goes into a column of the stream's Arrow type (an integral float for an integer column
    becomes an int): a row that passes makes a batch the door admits as it is."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._shapes: dict[tuple[str, ...], tuple[Convert, ...]] = {}

    def __call__(self, row: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        names = tuple(row)
        converts = self._shapes.get(names)
        if converts is None:
            converts = self._shape(names)
        # One value per name: the names are the row's own keys.
        return names, tuple([convert(value) for convert, value in zip(converts, row.values())])  # noqa: B905

    def _shape(self, names: tuple[str, ...]) -> tuple[Convert, ...]:
        check_names(names, self.schema)
        progressing = self.schema.progressing
        converts = tuple(converter(name, self.schema.type_of(name), name == progressing) for name in names)
        if len(self._shapes) >= _KNOWN_SHAPES:
            self._shapes.clear()
        self._shapes[names] = converts
        return converts

    def arrow_types(self, names: tuple[str, ...]) -> list[pa.DataType]:
        return [self.schema.type_of(name).arrow for name in names]


def converter(name: str, kind: ColumnType, progressing: bool = False) -> Convert:
    """The check of one column's values in rows sent one by one (the door's rules, value by value;
    the progressing attribute's values lie in its domain, ``[-2^62, 2^62)``)."""

    def wrong(value: Any) -> SchemaMismatch:
        if value is None:
            return SchemaMismatch(
                f"column {name!r} ({kind.name}) has nulls; only float64 and string columns may"
            )
        return SchemaMismatch(f"column {name!r} is {kind.name}, got {type(value).__name__} {value!r}")

    if kind.is_string:

        def text(value: Any) -> Any:
            if type(value) is str or value is None or isinstance(value, str):
                return value
            raise wrong(value)

        return text
    if kind.name == "bool":

        def truth(value: Any) -> Any:
            if type(value) is bool or isinstance(value, np.bool_):
                return bool(value)
            raise wrong(value)

        return truth
    if kind.name == "float64":

        def real(value: Any) -> Any:
            if type(value) is float or value is None:
                return value
            if isinstance(value, int | float | np.integer | np.floating) and not isinstance(
                value, bool | np.bool_
            ):
                return float(value)
            raise wrong(value)

        return real
    low, high = _INT32 if kind.name == "int32" else (TIME_MIN, TIME_END) if progressing else _INT64
    unit = kind.unit

    def outside(number: int) -> SchemaMismatch:
        if progressing:
            return SchemaMismatch(
                f"column {name!r} has {number}, outside the domain of a progressing attribute, {DOMAIN}"
            )
        return SchemaMismatch(f"column {name!r} is {kind.name}, got {number}, out of its range")

    def integer(value: Any) -> Any:
        if type(value) is int and low <= value < high:
            return value
        if type(value) is int:
            number = value
        elif isinstance(value, bool | np.bool_) or value is None:
            raise wrong(value)
        elif isinstance(value, int | np.integer):
            number = int(value)
        elif isinstance(value, float | np.floating):
            if not math.isfinite(value) or value != math.floor(value):
                raise SchemaMismatch(f"column {name!r} is {kind.name}, got non-integral number {value!r}")
            number = int(value)
        elif unit is not None and isinstance(value, datetime.datetime):
            micros = value.microsecond % _SUB_UNIT[unit] if unit in ("s", "ms") else 0
            if micros or (unit != "ns" and getattr(value, "nanosecond", 0)):
                raise SchemaMismatch(f"column {name!r} is {kind.name}, got {value!r}, finer than its unit")
            if progressing:
                try:
                    number = pa.scalar(value, kind.arrow).value
                except (pa.ArrowException, OverflowError, ValueError) as exc:  # past int64 in its unit
                    raise SchemaMismatch(f"column {name!r} is {kind.name}, got {value!r}: {exc}") from exc
                if not low <= number < high:
                    raise outside(number)
            return value
        else:
            raise wrong(value)
        if not low <= number < high:
            raise outside(number)
        return number

    return integer


__all__ = ["Contract", "RowCheck", "converter"]
