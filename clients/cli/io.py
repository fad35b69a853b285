"""Files in and results out for the ``lowtide`` command: readers, the progress bar, writers.

``read_batches`` streams a CSV, JSONL or Parquet file (chosen by extension, optionally compressed
``.gz``/``.bz2``/``.zst``) as Arrow tables of exactly ``batch_rows`` rows (the last fewer), so a
batch's rows depend on the file and ``batch_rows`` alone and a batch's index can name it (see
:mod:`lowtide.clients.cli.batch_ids`). Columns are read with the stream's types so a string
column of digits stays a string; a CSV file has a header row naming the stream's columns (or,
with ``header=False``, has them in the stream's order); timestamps written as text are read by
:mod:`lowtide.clients.cli.timestamps`, which names the first row that does not parse. Progress
is counted in bytes of the file (CSV, JSONL) or rows (Parquet); the readers parse one 4 MiB
block at a time so the bytes read track the bytes sent. ``writer_for`` prints result tables as a
table, JSON lines or CSV; ``Collated`` and ``Times`` shape them for reading: one table per
punctuation (early results as they come), times as numbers or ISO 8601.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from lowtide.clients.cli.text_table import format_table
from lowtide.clients.cli.timestamps import TimestampText, timestamp_unit
from lowtide.errors import InvalidArgument
from lowtide.punctuation.model import END_OF_STREAM, Punctuation

_COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}
_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
# Stream column types the readers can force; timestamps are read as text (CSV) or as Arrow infers
# them (JSON numbers, strings), and text is converted by TimestampText.
_FORCED = {
    "string": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}
# Arrow's reasons for a bad row: its CSV reader counts rows from 1 with the header, columns from 0;
# its JSON reader counts rows from 0 within each block (a batch) of the file.
_CSV_VALUE = re.compile(
    r"In CSV column #(\d+): (?:Row #(\d+): )?CSV conversion error to [^:]+: invalid value '(.*)'"
)
_CSV_ROW = re.compile(r"Row #(\d+)")
_JSON_TYPE = re.compile(r"JSON parse error: Column\((/.*)\) changed from (\w+) to (\w+) in row (\d+)")
_JSON_ROW = re.compile(r"(.*) in row (\d+)")


class Batches:
    """The batches of one input file; ``done`` of ``total`` ``unit`` read so far."""

    def __init__(
        self, path: Path, schema: dict[str, str], batch_rows: int, fmt: str | None, header: bool = True
    ) -> None:
        self.path = path
        self.schema = schema
        self.batch_rows = batch_rows
        self.header = header
        self.rows = 0  # rows read so far; rows are numbered from 1, a CSV header not counted
        suffixes = [s.lower() for s in path.suffixes]
        self.codec = _COMPRESSION.get(suffixes[-1]) if suffixes else None
        plain = suffixes[-2] if self.codec and len(suffixes) > 1 else (suffixes[-1] if suffixes else "")
        self.format = fmt or _FORMATS.get(plain, "")
        if not self.format:
            raise InvalidArgument(
                f"cannot tell the format of {path}: name it *.csv, *.jsonl or *.parquet, or pass --format"
            )
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise InvalidArgument(f"cannot read {path}: {exc.strerror or exc}") from exc
        self.unit = "bytes"
        self.total = size
        self._bytes_read = 0  # of the file, by the reader (CSV and JSONL progress)
        self._parquet_rows = 0
        if self.format == "parquet":
            self.unit = "rows"
            self.total = self._parquet().metadata.num_rows

    @property
    def done(self) -> int:
        if self.format == "parquet":
            return self._parquet_rows
        return self._bytes_read

    @property
    def shape(self) -> str:
        """What decides which rows of the file make each batch (its batch ids depend on it)."""
        return f"{self.format} header={self.header} rows={self.batch_rows}"

    def __iter__(self) -> Iterator[pa.Table]:
        try:
            yield from _exactly(self._converted(), self.batch_rows)
        except InvalidArgument as exc:
            raise InvalidArgument(f"cannot read {self.path}: {exc}") from exc
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise InvalidArgument(f"cannot read {self.path}: {self._readable(reason)}") from exc

    def _readable(self, reason: str) -> str:
        """Arrow's reason for a bad row, its rows counted as the help says (from 1, the header not
        counted) and its column named: ``row 1, column 'len': 'sixty' is not an int32``."""
        if self.format == "csv":
            if match := _CSV_VALUE.fullmatch(reason):
                columns = self._csv_columns()
                index = int(match[1])
                name = columns[index] if index < len(columns) else f"#{index + 1}"
                kind = self.schema.get(name)
                where = f"row {self._csv_row(int(match[2]))}, " if match[2] else ""
                return f"{where}column {name!r}: {match[3]!r} is not {_a(kind) if kind else 'of its type'}"
            return _CSV_ROW.sub(lambda m: f"row {self._csv_row(int(m[1]))}", reason)
        if self.format == "jsonl":
            # self.rows: the rows of the blocks before the one that failed.
            if match := _JSON_TYPE.fullmatch(reason):
                name = match[1][1:].replace("~1", "/").replace("~0", "~")  # a JSON pointer
                row, was, got = self.rows + int(match[4]) + 1, match[2], match[3]
                kind = self.schema.get(name, "")
                if kind in _FORCED:
                    return f"row {row}, column {name!r}: a JSON {got} is not {_a(kind)}"
                return f"row {row}, column {name!r}: a JSON {got}, where the rows before hold {_a(was)}"
            if match := _JSON_ROW.fullmatch(reason):
                return f"row {self.rows + int(match[2]) + 1}: {match[1]}"
        return reason

    def _csv_row(self, arrow_row: int) -> int:
        """A row of Arrow's CSV reader (from 1, the header counted) counted from 1 after the header."""
        return arrow_row - 1 if self.header else arrow_row

    def _csv_columns(self) -> list[str]:
        """The CSV file's columns in its order: its header's (from its first MiB), else the stream's."""
        if not self.header:
            return list(self.schema)
        with pa.input_stream(str(self.path), compression=self.codec) as stream:
            head = stream.read(1 << 20).decode("utf-8", "replace")
        return next(csv.reader(io.StringIO(head)), [])

    def _converted(self) -> Iterator[pa.RecordBatch]:
        """The file's record batches, timestamp columns written as text made timestamps."""
        texts = {
            name: TimestampText(name, unit)
            for name, kind in self.schema.items()
            if (unit := timestamp_unit(kind)) is not None
        }
        self.rows = self._parquet_rows = 0  # each pass reads the file from its start
        for batch in self._read():
            first = self.rows + 1
            self.rows += batch.num_rows
            for name, text in texts.items():
                index = batch.schema.get_field_index(name)
                if index >= 0 and pa.types.is_string(batch.schema.field(index).type):
                    batch = batch.set_column(index, name, text.convert(batch.column(index), first))
            yield batch

    def _read(self) -> Iterator[pa.RecordBatch]:
        if self.format == "parquet":
            for batch in self._parquet().iter_batches(batch_size=self.batch_rows):
                self._parquet_rows += batch.num_rows
                yield batch
            return
        forced = {name: _FORCED[kind] for name, kind in self.schema.items() if kind in _FORCED}
        if self.format == "jsonl":  # an explicit JSON schema adds its fields: keep those present
            present = self._first_json_keys()
            forced = {name: kind for name, kind in forced.items() if name in present}
        # A native file, not a Python one: Arrow's reader reads ahead on its own threads, which
        # must never call back into Python (one still waiting for the interpreter as it exits
        # aborts the process).
        with pa.OSFile(str(self.path), "rb") as raw:
            self._bytes_read = 0
            source: Any = pa.CompressedInputStream(raw, self.codec) if self.codec else raw
            try:
                reader = (
                    self._open_csv(source, forced)
                    if self.format == "csv"
                    else self._open_json(source, forced)
                )
            except pa.ArrowInvalid as exc:
                # Arrow's readers refuse a file with no byte ("Empty CSV file", "Empty JSON stream").
                if str(exc).startswith("Empty"):
                    raise InvalidArgument(f"it is empty{self._needs()}") from exc
                raise
            for batch in reader:
                self._bytes_read = raw.tell()  # read ahead of the batch: progress, not an offset
                yield batch
            self._bytes_read = self.total

    def _open_csv(self, source: Any, forced: dict[str, pa.DataType]) -> Any:
        # Timestamps are read as text: their form is checked row by row (TimestampText).
        as_text = {name: pa.string() for name, kind in self.schema.items() if timestamp_unit(kind)}
        reader = pa_csv.open_csv(
            source,
            read_options=pa_csv.ReadOptions(
                block_size=1 << 22, use_threads=False, column_names=None if self.header else list(self.schema)
            ),
            convert_options=pa_csv.ConvertOptions(column_types=forced | as_text),
        )
        if self.header:
            self._check_header(reader.schema.names)
        return reader

    def _open_json(self, source: Any, forced: dict[str, pa.DataType]) -> Any:
        return pa_json.open_json(
            source,
            read_options=pa_json.ReadOptions(block_size=1 << 22, use_threads=False),
            parse_options=pa_json.ParseOptions(
                explicit_schema=pa.schema(list(forced.items())), unexpected_field_behavior="infer"
            ),
        )

    def _needs(self) -> str:
        """What a CSV file must start with, for an error (nothing for another format)."""
        if self.format != "csv":
            return ""
        if not self.header:
            return f": with --no-header each line holds {', '.join(self.schema)}, in that order"
        return (
            f": a CSV file needs a header row naming the stream's columns ({', '.join(self.schema)}), "
            "or --no-header if its fields come in that order"
        )

    def _check_header(self, names: list[str]) -> None:
        """The header row names each of the stream's columns, and nothing else."""
        unknown = [name for name in names if name not in self.schema]
        missing = [name for name in self.schema if name not in names]
        if len(unknown) == len(names):  # most likely a first row of data, no header
            raise InvalidArgument(
                f"its first line names no column of the stream ({', '.join(names)}){self._needs()}"
            )
        columns = ", ".join(self.schema)
        if unknown:
            listed = ", ".join(map(repr, unknown))
            raise InvalidArgument(
                f"unknown column(s) {listed} in its header: the stream's columns are {columns}"
            )
        if missing:
            listed = ", ".join(map(repr, missing))
            raise InvalidArgument(f"its header lacks column(s) {listed}: the stream's columns are {columns}")

    def _first_json_keys(self) -> set[str]:
        """The keys of the first object (from its first MiB): the columns the file has."""
        with pa.input_stream(str(self.path), compression=self.codec) as stream:
            head = stream.read(1 << 20)
        for line in head.splitlines():
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return set()
                return set(first) if isinstance(first, dict) else set()
        return set()

    def _parquet(self) -> Any:
        try:
            return pq.ParquetFile(self.path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InvalidArgument(f"cannot read {self.path}: {' '.join(str(exc).split())}") from exc


def _a(kind: str) -> str:
    """``kind`` with its article: "an int32", "a string"."""
    return f"an {kind}" if kind[:1] in ("a", "e", "i", "o", "u") else f"a {kind}"


def read_batches(
    path: str, schema: dict[str, str], batch_rows: int, fmt: str | None = None, header: bool = True
) -> Batches:
    return Batches(Path(path), schema, batch_rows, fmt, header)


def _exactly(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """The rows of ``batches`` as tables of ``rows`` rows each, the last fewer (none empty)."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(held)
            yield table.slice(0, rows)
            rest = table.slice(rows)
            held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held)


class LazyProgress:
    """A progress bar on stderr that shows only for long work: on a terminal, after ``delay_s``."""

    def __init__(self, description: str, total: int, unit: str, delay_s: float = 1.0) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.began = time.monotonic()
        self.delay_s = delay_s
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> LazyProgress:
        return self

    def update(self, done: int) -> None:
        if self._progress is None:
            if time.monotonic() - self.began < self.delay_s:
                return
            self._start(done)
            if self._progress is None:
                return
        self._progress.update(self._task, completed=done)

    def _start(self, done: int) -> None:
        from rich import progress as rp
        from rich.console import Console

        console = Console(stderr=True)
        if not console.is_terminal:
            self.delay_s = float("inf")
            return
        amount = rp.DownloadColumn() if self.unit == "bytes" else rp.MofNCompleteColumn()
        self._progress = rp.Progress(
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            amount,
            rp.TransferSpeedColumn() if self.unit == "bytes" else rp.TaskProgressColumn(),
            rp.TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=self.total, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


# -- results out -----------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A result value as JSON/CSV shows it: timestamps in ISO 8601, lists as JSON arrays."""
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def _as_integers(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A progressing attribute as the integers punctuation is stated in: a timestamp column
    (``SELECT ts ...`` of a query without a window) counts units of its own type."""
    return column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column


class Collated:
    """Result rows held until a punctuation covers their window, released as one sorted table.

    Several workers emit a window's rows (each holds some of its groups), and the output
    punctuation (the minimum over the workers) may pass before a slower worker's rows of a later
    window: a punctuation on ``window_end`` of value ``v`` completes exactly the windows ending
    below ``v``. Releasing those, whole, shows every window once. Early results (``final``
    false, ``EMIT EVERY``) are not held: no punctuation completes them, and they are marked, so
    they print as they come, as Flink's SQL client shows a changelog's rows.
    """

    def __init__(self) -> None:
        self._tables: list[pa.Table] = []

    def add(self, table: pa.Table) -> pa.Table | None:
        """Hold the rows a punctuation is yet to complete; the early results, to print now."""
        if "final" in table.column_names and pa.types.is_boolean(table.schema.field("final").type):
            early = pc.invert(pc.fill_null(table["final"], True))
            shown, table = table.filter(early), table.filter(pc.invert(early))
        else:
            shown = None
        if table.num_rows:
            self._tables.append(table)
        return _in_window_order(shown) if shown is not None and shown.num_rows else None

    def release(self, punctuation: Punctuation | None = None) -> pa.Table | None:
        """The rows ``punctuation`` completes (``None``: every row held), window then group order."""
        if not self._tables:
            return None
        table = pa.concat_tables(self._tables, promote_options="default")
        self._tables = []
        if punctuation is not None and punctuation.attribute in table.column_names:
            covered = pc.less(_as_integers(table[punctuation.attribute]), punctuation.value)
            rest = table.filter(pc.invert(covered))
            if rest.num_rows:
                self._tables.append(rest)
            table = table.filter(covered)
            if not table.num_rows:
                return None
        return _in_window_order(table)


def _in_window_order(table: pa.Table) -> pa.Table:
    """window_start, window_end, the groups, then the aggregates: windows in order, groups within."""
    keys = [(f.name, "ascending") for f in table.schema if not pa.types.is_nested(f.type)]
    return table.sort_by(keys) if keys else table


class Times:
    """How window bounds and punctuation are shown: numbers (``raw``) or ISO 8601 (``iso``).

    ``unit`` is the query's ``time_unit`` (``ms`` for a timestamp[ms] window attribute); without
    one (row windows, integer attributes) times stay numbers either way.
    """

    def __init__(self, iso: bool, unit: str) -> None:
        self.unit = unit if iso else ""

    def table(self, table: pa.Table) -> pa.Table:
        if not self.unit:
            return table
        for name in ("window_start", "window_end"):
            index = table.schema.get_field_index(name)
            if index >= 0 and pa.types.is_integer(table.schema.field(index).type):
                table = table.set_column(index, name, table.column(index).cast(pa.timestamp(self.unit)))
        return table

    def punctuation(self, item: Punctuation) -> str | int:
        """``end`` for the end-of-stream punctuation, else its value as the window bounds show."""
        if item.value >= END_OF_STREAM:
            return "end"
        if self.unit and item.attribute == "window_end":
            return str(_plain(pa.scalar(item.value, pa.timestamp(self.unit)).as_py()))
        return item.value


class Writer:
    """Prints result tables and (when asked) punctuation markers; flushes after each item."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def table(self, table: pa.Table) -> None:
        raise NotImplementedError

    def punctuation(self, attribute: str, shown: str | int, offset: int | None) -> None:
        """A punctuation marker and its output offset (resume with ``tail --from-offset offset+1``)."""
        raise NotImplementedError


class JsonLinesWriter(Writer):
    def table(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            self.out.write(json.dumps(row, default=_plain) + "\n")
        self.out.flush()

    def punctuation(self, attribute: str, shown: str | int, offset: int | None) -> None:
        self.out.write(json.dumps({"punctuation": shown, "attribute": attribute, "offset": offset}) + "\n")
        self.out.flush()


class CsvWriter(Writer):
    def __init__(self, out: IO[str]) -> None:
        super().__init__(out)
        self.csv = csv.writer(out, lineterminator="\n")
        self.header = False

    def table(self, table: pa.Table) -> None:
        if not self.header:
            self.csv.writerow(table.column_names)
            self.header = True
        for row in table.to_pylist():
            self.csv.writerow(
                json.dumps(v, default=_plain) if isinstance(v, list | dict) else _plain(v)
                for v in row.values()
            )
        self.out.flush()

    def punctuation(self, attribute: str, shown: str | int, offset: int | None) -> None:
        self.out.write(f"# punctuation {attribute}={shown} offset={offset}\n")
        self.out.flush()


class TableWriter(Writer):
    def table(self, table: pa.Table) -> None:
        rows = [["" if v is None else str(_plain(v)) for v in row.values()] for row in table.to_pylist()]
        self.out.write(format_table(table.column_names, rows) + "\n\n")
        self.out.flush()

    def punctuation(self, attribute: str, shown: str | int, offset: int | None) -> None:
        self.out.write(f"-- punctuation {attribute} = {shown} (offset {offset}) --\n\n")
        self.out.flush()


def writer_for(fmt: str, out: IO[str]) -> Writer:
    return {"jsonl": JsonLinesWriter, "csv": CsvWriter, "table": TableWriter}[fmt](out)
