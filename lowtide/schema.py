"""Stream schemas and the door: user batches in, typed numpy columns out.

Inside the engine every column is a numpy array: int64/int32/float64/bool keep their dtype,
``string`` becomes int64 codes of the engine's :class:`~lowtide.strings.StringPool` (at the door a
string column stays Arrow until its batch applies: :func:`to_code` says what is coded then), and
``timestamp[unit]`` becomes int64 counts of that unit. A batch that does not fit its schema is
rejected whole with a one-line reason, before anything is changed; so is a batch with a value of
the progressing attribute outside its domain ``[-2^62, 2^62)``, where every window bound of every
query computes without overflow (:mod:`lowtide.punctuation.model`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.batch import Batch
from lowtide.errors import InvalidArgument, SchemaMismatch
from lowtide.names import check_column, shown
from lowtide.punctuation.model import DOMAIN, TIME_END, TIME_MIN
from lowtide.strings import NULL_CODE, PoolLimits, StringPool, Uncoded

T = TypeVar("T")

_TIMESTAMP = re.compile(r"^timestamp\[(s|ms|us|ns)\]$")
_BASE_TYPES = {"int64", "int32", "float64", "bool", "string"}
_UNIT_MS = {"s": 1000.0, "ms": 1.0, "us": 1e-3, "ns": 1e-6}
MAX_COLUMNS = 1024  # columns of a stream's schema


@dataclass(frozen=True)
class ColumnType:
    """One of ``int64, int32, float64, bool, string, timestamp[s|ms|us|ns]``."""

    name: str

    @staticmethod
    def parse(name: str) -> ColumnType:
        name = str(name).strip().lower()
        if name in _BASE_TYPES or _TIMESTAMP.match(name):
            return ColumnType(name)
        raise InvalidArgument(
            f"unknown column type {shown(name)}; expected one of int64, int32, float64, bool, string, "
            "timestamp[s|ms|us|ns]"
        )

    @property
    def is_string(self) -> bool:
        return self.name == "string"

    @property
    def is_timestamp(self) -> bool:
        return self.name.startswith("timestamp")

    @property
    def is_integer(self) -> bool:
        return self.name in ("int64", "int32") or self.is_timestamp

    @property
    def is_numeric(self) -> bool:
        return self.is_integer or self.name == "float64"

    @property
    def unit(self) -> str | None:
        match = _TIMESTAMP.match(self.name)
        return match.group(1) if match else None

    @property
    def unit_ms(self) -> float:
        """Milliseconds per unit of this column (integers count as milliseconds)."""
        unit = self.unit
        return _UNIT_MS[unit] if unit else 1.0

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype of this column inside the engine."""
        if self.name in ("int32", "float64", "bool"):
            return np.dtype(self.name)
        return np.dtype(np.int64)

    @property
    def is_list(self) -> bool:
        """Result-only type ``list<element>`` (heavy hitters); never a stream column."""
        return self.name.startswith("list<")

    @property
    def element(self) -> ColumnType:
        return ColumnType(self.name[5:-1])

    @property
    def arrow(self) -> pa.DataType:
        """The Arrow type this column has in results."""
        if self.is_list:
            return pa.list_(self.element.arrow)
        unit = self.unit
        if unit:
            return pa.timestamp(unit)
        return {
            "int64": pa.int64(),
            "int32": pa.int32(),
            "float64": pa.float64(),
            "bool": pa.bool_(),
            "string": pa.string(),
        }[self.name]


INT64 = ColumnType("int64")
FLOAT64 = ColumnType("float64")
STRING = ColumnType("string")


@dataclass(frozen=True)
class Schema:
    """Ordered column types and the progressing attribute of a stream."""

    columns: tuple[tuple[str, ColumnType], ...]
    progressing: str
    # Columns known to equal the progressing attribute plus a constant (a query's result: its
    # window_start, window_end and their copies): a join that equates them is bounded in time.
    aligned: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(columns: Mapping[str, str | ColumnType], progressing: str) -> Schema:
        if not columns:
            raise InvalidArgument("a schema needs at least one column")
        if len(columns) > MAX_COLUMNS:
            raise InvalidArgument(f"a schema has at most {MAX_COLUMNS} columns, got {len(columns)}")
        typed = tuple(
            (check_column(name), kind if isinstance(kind, ColumnType) else ColumnType.parse(kind))
            for name, kind in columns.items()
        )
        schema = Schema(typed, progressing)
        if progressing not in schema.names:
            raise InvalidArgument(f"progressing attribute {shown(progressing)} is not a column of the schema")
        if not schema.type_of(progressing).is_integer:
            raise InvalidArgument(
                f"progressing attribute {progressing!r} must be an integer or timestamp column, "
                f"not {schema.type_of(progressing).name}"
            )
        return schema

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def type_of(self, name: str) -> ColumnType:
        for column, kind in self.columns:
            if column == name:
                return kind
        raise KeyError(name)

    def as_dict(self) -> dict[str, str]:
        return {name: kind.name for name, kind in self.columns}


def to_arrow_table(data: Any) -> pa.Table:
    """Accept a dict of columns, a pandas DataFrame, or a pyarrow Table/RecordBatch."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "to_dict") and hasattr(data, "columns") and hasattr(data, "dtypes"):
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Mapping):
        arrays = {}
        for name, values in data.items():
            try:
                arrays[str(name)] = (
                    values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
                raise SchemaMismatch(f"column {name!r}: {exc}") from exc
        try:
            return pa.table(arrays)
        except pa.ArrowInvalid as exc:
            raise SchemaMismatch(str(exc).splitlines()[0]) from exc
    raise SchemaMismatch(
        f"cannot read a batch from {type(data).__name__}; send a dict of columns, numpy arrays, "
        "a pandas DataFrame or a pyarrow Table"
    )


def _integers(name: str, values: pa.ChunkedArray, kind: ColumnType) -> npt.NDArray[Any]:
    vtype = values.type
    if pa.types.is_timestamp(vtype):
        if not kind.is_timestamp:
            raise SchemaMismatch(f"column {name!r} is {kind.name}, got a timestamp")
        try:  # another unit: only values it holds exactly (ns -> ms must not truncate or overflow)
            values = values.cast(pa.timestamp(kind.unit or "ms")).cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaMismatch(
                f"column {name!r} is {kind.name}, got {vtype} values it cannot hold exactly: "
                f"{' '.join(str(exc).split())}"
            ) from exc
    elif pa.types.is_floating(vtype):
        as_float = values.to_numpy()
        if not np.all(np.isfinite(as_float)) or np.any(as_float != np.floor(as_float)):
            raise SchemaMismatch(f"column {name!r} is {kind.name}, got non-integral numbers")
        if len(as_float) and (as_float.min() < -(2.0**63) or as_float.max() >= 2.0**63):
            raise SchemaMismatch(f"column {name!r} is {kind.name}, got numbers out of its range")
        return _fit(name, as_float.astype(np.int64), kind)
    elif not pa.types.is_integer(vtype):
        raise SchemaMismatch(f"column {name!r} is {kind.name}, got {vtype}")
    out = values.to_numpy()
    if vtype == pa.uint64() and len(out) and out.max() >= 2**63:
        raise SchemaMismatch(f"column {name!r} is {kind.name}, got values out of its range")
    return _fit(name, out, kind)


def _fit(name: str, out: npt.NDArray[Any], kind: ColumnType) -> npt.NDArray[Any]:
    if kind.name == "int32" and len(out) and (out.min() < -(2**31) or out.max() >= 2**31):
        raise SchemaMismatch(f"column {name!r} is int32, got values out of its range")
    return np.asarray(out, dtype=kind.dtype)


def _column(name: str, values: pa.ChunkedArray, kind: ColumnType) -> npt.NDArray[Any]:
    """The engine column of ``values``, checked; strings other than all nulls are left to
    :func:`admit` (an empty placeholder here)."""
    vtype = values.type
    if pa.types.is_null(vtype) and len(values) == 0:
        return np.empty(0, dtype=kind.dtype)  # an empty list has no type of its own: it fits any column
    if kind.is_string:
        if pa.types.is_dictionary(vtype):
            vtype = vtype.value_type
        if not (pa.types.is_string(vtype) or pa.types.is_large_string(vtype) or pa.types.is_null(vtype)):
            raise SchemaMismatch(f"column {name!r} is string, got {vtype}")
        if values.null_count == len(values):  # all null: no dictionary for the pool to map
            return np.full(len(values), NULL_CODE, dtype=np.int64)
        return np.empty(0, dtype=np.int64)
    if values.null_count:
        if kind.name != "float64":
            raise SchemaMismatch(
                f"column {name!r} ({kind.name}) has nulls; only float64 and string columns may"
            )
        if not (pa.types.is_floating(vtype) or pa.types.is_integer(vtype) or pa.types.is_null(vtype)):
            raise SchemaMismatch(f"column {name!r} is float64, got {vtype}")
        values = pc.fill_null(values.cast(pa.float64()), float("nan"))
    if kind.is_integer:
        return _integers(name, values, kind)
    if kind.name == "float64":
        if not (pa.types.is_floating(vtype) or pa.types.is_integer(vtype) or pa.types.is_null(vtype)):
            raise SchemaMismatch(f"column {name!r} is float64, got {vtype}")
        return np.asarray(values.to_numpy(), dtype=np.float64)
    if not pa.types.is_boolean(vtype):
        raise SchemaMismatch(f"column {name!r} is bool, got {vtype}")
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.bool_)


def admit(
    data: Any,
    schema: Schema,
    pool: StringPool | None = None,
    holder: str | None = None,
    reads: Collection[str] | None = None,
    limits: PoolLimits | None = None,
) -> Batch:
    """Check a user batch against ``schema`` and turn it into engine columns.

    With a ``pool``, string columns in ``reads`` (None: all) become its codes now, held by
    ``holder`` (the stream), within ``limits``. Every other string column stays an Arrow array:
    the door's batches code their strings as they apply (:func:`to_code`)."""
    table = to_arrow_table(data)
    check_names(table.column_names, schema)
    columns: dict[str, Any] = {}
    strings: dict[str, pa.ChunkedArray] = {}
    for name, kind in schema.columns:
        values = table.column(name)
        try:
            columns[name] = _column(name, values, kind)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            reason = " ".join(str(exc).split())
            raise SchemaMismatch(f"column {name!r} is {kind.name}, got {values.type}: {reason}") from exc
        if kind.is_string and values.null_count < len(values):
            if pool is not None and (reads is None or name in reads):
                strings[name] = values
            else:
                columns[name] = values  # coded as its batch applies (lowtide.door), where needed
    check_domain(schema.progressing, columns[schema.progressing])  # before the pool takes strings
    if pool is not None:
        columns.update(_coding(strings, lambda: pool.encode(strings, holder, limits)))
    return Batch(columns, table.num_rows)


def to_code(
    batch: Batch,
    schema: Schema,
    reads: Collection[str] | None,
    behind: npt.NDArray[np.bool_],
    known: Mapping[str, Uncoded],
) -> dict[str, Uncoded]:
    """The string columns :func:`admit` kept as Arrow, as they are coded when the batch applies:
    all rows of a column a query reads now, else the rows ``behind`` punctuation only (a query's
    late side stream shows them, nothing else shows a column no query reads; the other rows get
    ``NULL_CODE``: :func:`with_codes`). ``known``: what an earlier look at the same batch made
    (a whole column is taken from it, not made again)."""
    kept = {
        name: values
        for name, values in batch.columns.items()
        if isinstance(values, pa.Array | pa.ChunkedArray) and schema.type_of(name).is_string
    }

    def made() -> dict[str, Uncoded]:
        out: dict[str, Uncoded] = {}
        for name, values in kept.items():
            before = known.get(name)
            if reads is None or name in reads:
                out[name] = before if before is not None and before.where is None else Uncoded.of(values)
            elif behind.any():
                out[name] = Uncoded.of(values, behind)
        return out

    return _coding(kept, made)


def with_codes(batch: Batch, schema: Schema, codes: Mapping[str, npt.NDArray[np.int64]]) -> Batch:
    """``batch`` with its Arrow string columns replaced: by ``codes`` where given, else by
    ``NULL_CODE`` (a column no query reads, of rows not behind punctuation)."""
    coded = {
        name: codes[name] if name in codes else np.full(batch.n, NULL_CODE, dtype=np.int64)
        for name, values in batch.columns.items()
        if isinstance(values, pa.Array | pa.ChunkedArray) and schema.type_of(name).is_string
    }
    return batch.with_columns(coded) if coded else batch


def _coding(columns: Mapping[str, Any], work: Callable[[], T]) -> T:
    """``work`` over string ``columns``, an Arrow failure as the batch's SchemaMismatch."""
    try:
        return work()
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        reason = " ".join(str(exc).split())
        raise SchemaMismatch(f"string column(s) {', '.join(map(repr, columns))}: {reason}") from exc


def check_domain(name: str, values: npt.NDArray[Any]) -> None:
    """The values of progressing attribute ``name`` lie in ``[TIME_MIN, TIME_END)``."""
    if values.shape[0] == 0 or (values.min() >= TIME_MIN and values.max() < TIME_END):
        return  # two passes, nothing allocated: the common case
    outside = (values < TIME_MIN) | (values >= TIME_END)
    if outside.any():
        row = int(np.argmax(outside))
        raise SchemaMismatch(
            f"column {name!r} has {int(values[row])} at row {row}, outside the domain of a "
            f"progressing attribute, {DOMAIN}"
        )


def check_names(names: Sequence[str], schema: Schema) -> None:
    """The columns of a batch against ``schema``: the progressing attribute, missing, unknown."""
    present = set(names)
    if len(present) < len(names):
        twice = sorted(n for n, times in Counter(names).items() if times > 1)
        raise SchemaMismatch(f"column(s) {', '.join(map(repr, twice))} appear more than once in the batch")
    if schema.progressing not in present:
        raise SchemaMismatch(f"batch lacks the progressing attribute {schema.progressing!r}")
    missing = [n for n in schema.names if n not in present]
    if missing:
        raise SchemaMismatch(f"batch lacks column(s) {', '.join(map(repr, missing))}")
    known = set(schema.names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SchemaMismatch(f"unknown column(s) {', '.join(map(repr, unknown))}")


def check(table: pa.Table, schema: Schema) -> None:
    """Whether :func:`admit` takes ``table``, without making engine columns (a producer checks
    its sends with this before they leave): raises what the door would raise."""
    check_names(table.column_names, schema)
    for name, kind in schema.columns:
        values = table.column(name)
        progressing = name == schema.progressing
        if _exact(values, kind) and not progressing:
            continue
        try:
            column = _column(name, values, kind)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            reason = " ".join(str(exc).split())
            raise SchemaMismatch(f"column {name!r} is {kind.name}, got {values.type}: {reason}") from exc
        if progressing:
            check_domain(name, column)


def _exact(values: pa.ChunkedArray, kind: ColumnType) -> bool:
    """Values of the column's own Arrow type that the door takes as they are (no copy to check)."""
    vtype = values.type
    if kind.is_string:
        if pa.types.is_dictionary(vtype):
            vtype = vtype.value_type
        return bool(pa.types.is_string(vtype) or pa.types.is_large_string(vtype))
    return bool(vtype == kind.arrow) and (values.null_count == 0 or kind.name == "float64")
