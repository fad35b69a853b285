"""Spark's Arrow batches typed per a lowtide stream's schema (pure Arrow, no Spark, no I/O).

Spark hands timestamps over as ``timestamp[us, tz=UTC]`` and integers as ``int64``. A stream's
progressing attribute is an integer in its own unit, so both map onto that unit: a Spark timestamp
becomes ``timestamp[<unit>]`` (floored to the unit) or, for an integer column, milliseconds since
the epoch; a Spark long is taken as already counted in the column's unit. Strings travel
dictionary-encoded, which takes their hashing off the server's door. Everything else is left for
the server's door to check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.errors import InvalidArgument, SchemaMismatch
from lowtide.punctuation.generators import duration_units
from lowtide.punctuation.model import NO_PROGRESS
from lowtide.schema import ColumnType

_UNITS_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


@dataclass(frozen=True)
class Layout:
    """What the sink needs to know of its stream: column types and the progressing attribute."""

    stream: str
    columns: dict[str, ColumnType]
    progressing: str

    @staticmethod
    def of(info: dict[str, Any]) -> Layout:
        """From a ``Client.list_streams()`` entry."""
        columns = {name: ColumnType.parse(kind) for name, kind in info["schema"].items()}
        return Layout(info["name"], columns, info["progressing"])

    @property
    def unit_ms(self) -> float:
        """Milliseconds per unit of the progressing attribute (durations convert with it)."""
        return self.columns[self.progressing].unit_ms


@dataclass(frozen=True)
class PunctuationMode:
    """How a Spark job's batches punctuate their stream: ``watermark:<delay>`` (the largest
    event time seen minus ``delay``, as Spark's own ``withWatermark``), ``column:<name>`` (each
    batch carries its low-watermark in that column, not sent as data) or ``none``."""

    kind: str
    delay: str = "0"
    column: str | None = None

    @staticmethod
    def parse(spec: str) -> PunctuationMode:
        kind, _, arg = spec.strip().partition(":")
        kind, arg = kind.strip().lower(), arg.strip()
        if kind == "watermark":
            delay = arg or "0"
            if duration_units(delay, 1.0) < 0:
                raise InvalidArgument(f"the watermark delay must not be negative, got {delay!r}")
            return PunctuationMode(kind, delay=delay)
        if kind == "column" and arg:
            return PunctuationMode(kind, column=arg)
        if kind == "none" and not arg:
            return PunctuationMode(kind)
        raise InvalidArgument(
            f"unknown punctuation {spec!r} for Spark; expected watermark:<delay>, column:<name> or none"
        )


@dataclass(frozen=True)
class Conformed:
    table: pa.Table
    max_event: int  # the largest progressing value in the batch (NO_PROGRESS when empty)
    watermark: int  # the largest value of the punctuation column, if any (else NO_PROGRESS)


def conform(table: pa.Table, layout: Layout, watermark_column: str | None = None) -> Conformed:
    """``table`` with exactly the stream's columns, times in the stream's units."""
    known = set(layout.columns)
    extra = [n for n in table.column_names if n not in known and n != watermark_column]
    if extra:
        raise SchemaMismatch(
            f"the Spark batch has column(s) {', '.join(map(repr, extra))} that stream "
            f"{layout.stream!r} has not; select the stream's columns before the sink"
        )
    missing = [n for n in layout.columns if n not in table.column_names]
    if missing:
        raise SchemaMismatch(
            f"the Spark batch lacks column(s) {', '.join(map(repr, missing))} of stream {layout.stream!r}"
        )
    arrays = [_typed(name, table.column(name), kind) for name, kind in layout.columns.items()]
    typed = pa.Table.from_arrays(arrays, names=list(layout.columns))
    max_event = _max(typed.column(layout.progressing))
    watermark = NO_PROGRESS
    if watermark_column is not None:
        if watermark_column not in table.column_names:
            raise SchemaMismatch(f"the Spark batch lacks its punctuation column {watermark_column!r}")
        kind = layout.columns[layout.progressing]
        watermark = _max(_typed(watermark_column, table.column(watermark_column), kind))
    return Conformed(typed, max_event, watermark)


def _typed(name: str, values: pa.ChunkedArray, kind: ColumnType) -> pa.ChunkedArray | pa.Array:
    if kind.is_string and (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        # The server turns strings into codes; a dictionary leaves it one lookup per distinct value.
        return pc.dictionary_encode(values)
    if not pa.types.is_timestamp(values.type):
        return values
    if not kind.is_integer:
        raise SchemaMismatch(f"column {name!r} is {kind.name}, the Spark batch has a timestamp")
    unit = kind.unit or "ms"  # an integer column counts milliseconds
    source = _UNITS_PER_S[values.type.unit]
    target = _UNITS_PER_S[unit]
    ticks = pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    if source > target:
        ticks = np.floor_divide(ticks, source // target)
    elif target > source:
        ticks = ticks * (target // source)
    mask = pc.is_null(values).to_numpy(zero_copy_only=False) if values.null_count else None
    return pa.array(ticks, type=kind.arrow if kind.unit else pa.int64(), mask=mask)


def _max(values: pa.ChunkedArray | pa.Array) -> int:
    if len(values) == 0 or values.null_count == len(values):
        return NO_PROGRESS
    top = pc.max(values.cast(pa.int64())).as_py()
    return NO_PROGRESS if top is None else int(top)


__all__ = ["Conformed", "Layout", "PunctuationMode", "conform"]
