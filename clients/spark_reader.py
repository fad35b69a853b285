"""``format("lowtide")`` read by Spark: a query's results, its output offsets Spark's
(docs/design.md, "Spark data source").

    spark.readStream.format("lowtide").option("server", "db1:50051").option("query", "q1")
        .option("startingOffsets", "earliest").load()       # streaming: results as they come
    spark.read.format("lowtide").option("server", ...).option("query", "q1").load()  # retained rows

Invariant: Spark's offset *is* the query's output offset (``{"offset": n}``, the n-th item the
query emitted: a result table or a punctuation), so a micro-batch ``[start, end)`` is a fixed set
of rows however often Spark reads it again (after a restart, from its checkpoint), and every row
carries the offset of its table in ``_offset``. Exactly once into any sink that is itself
idempotent per batch. Rows are read on the executors, by subscribing from ``start`` and stopping
after ``end - 1``; the driver only asks the server where the query stands (``ListQueries``).

Options (besides :mod:`.spark_options`'): ``query`` (required), ``startingOffsets`` (``latest``,
the default as for Spark's Kafka source; ``earliest``: the oldest retained; or an offset),
``reader`` (the name a stream reader's commits go under, ``spark`` by default: the server shows
each reader's lag). An unknown query or an offset no longer retained fails on the driver with
lowtide's one-line reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from lowtide.clients.client import Client
from lowtide.clients.spark_options import Connection
from lowtide.errors import InvalidArgument, NotFound, OutOfRange, ServerUnavailable

OFFSET = "_offset"  # the column each row's table offset travels in
_TABLES_AT_ONCE = 64  # result tables one subscription reads before handing them to Spark
# lowtide's column types (lowtide/schema.py, plus heavy_hitters' list<...>) as Spark SQL types
_SPARK_TYPES = {"int64": "bigint", "int32": "int", "float64": "double", "bool": "boolean", "string": "string"}


def spark_type(lowtide_type: str) -> str:
    """A Spark SQL type for a lowtide column type (timestamps arrive as Spark timestamps)."""
    if lowtide_type.startswith("timestamp["):
        return "timestamp"
    if lowtide_type.startswith("list<") and lowtide_type.endswith(">"):
        return f"array<{spark_type(lowtide_type[len('list<') : -1])}>"
    return _SPARK_TYPES[lowtide_type]


@dataclass(frozen=True)
class QueryPosition:
    """Where a query stands: its result columns and the output offsets a reader can start at."""

    columns: tuple[tuple[str, str], ...]  # (name, lowtide type)
    oldest_offset: int
    next_offset: int

    @staticmethod
    def of(connection: Connection, query: str) -> QueryPosition:
        if not query:
            raise InvalidArgument('format("lowtide") reads a query: it needs the option "query"')
        for info in connection.call(lambda client: client.list_queries()):
            if info["name"] == query:
                columns = tuple((name, kind) for name, kind in info["schema"].items())
                return QueryPosition(columns, info["oldest_offset"], info["next_offset"])
        raise NotFound(f"no query named {query!r} on {connection.server}")

    def ddl(self) -> str:
        fields = [f"`{name.replace('`', '``')}` {spark_type(kind)}" for name, kind in self.columns]
        return ", ".join([*fields, f"{OFFSET} bigint"])

    def start_at(self, option: str, query: str) -> int:
        """The offset ``startingOffsets`` names: ``earliest``, ``latest`` or an offset retained."""
        if option == "earliest":
            return self.oldest_offset
        if option == "latest":
            return self.next_offset
        try:
            offset = int(option)
        except ValueError:
            raise InvalidArgument(
                f"startingOffsets must be earliest, latest or an output offset, got {option!r}"
            ) from None
        if offset < self.oldest_offset:
            raise OutOfRange(
                f"offset {offset} of query {query!r} is no longer retained: the oldest is "
                f"{self.oldest_offset} (retained_items, retained_bytes)"
            )
        return offset


class OffsetRange(InputPartition):
    """The output offsets ``[start, end)`` of one query: one micro-batch, read by one task."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end


def read_range(
    connection: Connection, query: str, timestamps: Sequence[str], part: OffsetRange
) -> Iterator[pa.RecordBatch]:
    """The rows of the result tables at offsets ``[start, end)``, each with its ``_offset``. A
    server that cannot be reached (or drains) is waited for (``reconnect_timeout``), and the read
    goes on after the last table it gave: a server restarted on its state has the same offsets."""
    start = part.start
    while start < part.end:
        tables, last = connection.call(partial(_tables, query=query, start=start, end=part.end))
        for offset, table in tables:
            yield from _spark_rows(table, offset, timestamps).to_batches()
        start = last + 1


def _tables(client: Client, *, query: str, start: int, end: int) -> tuple[list[tuple[int, pa.Table]], int]:
    """Up to ``_TABLES_AT_ONCE`` result tables from offset ``start`` on, below ``end``, and the
    offset of the last item read."""
    found: list[tuple[int, pa.Table]] = []
    with client.subscribe(query, from_offset=start) as items:
        for item in items:
            offset = items.offset
            assert offset is not None
            if isinstance(item, pa.Table) and item.num_rows:
                found.append((offset, item))
            if offset >= end - 1 or len(found) >= _TABLES_AT_ONCE:
                return found, offset
    raise ServerUnavailable(f"the subscription to {query!r} ended before offset {end - 1}")


def _spark_rows(table: pa.Table, offset: int, timestamps: Sequence[str]) -> pa.Table:
    for name in timestamps:  # Spark's timestamps: microseconds, UTC
        column = table.column(name).cast(pa.timestamp("us", tz="UTC"))
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table.append_column(OFFSET, pa.array([offset] * table.num_rows, pa.int64()))


class LowtideStreamReader(DataSourceStreamReader):
    """Micro-batches of a query's output offsets (see the module)."""

    def __init__(
        self, connection: Connection, query: str, position: QueryPosition, starting: str, reader: str
    ) -> None:
        self.connection = connection
        self.query = query
        self.reader = reader
        self.start = position.start_at(starting, query)
        self.timestamps = tuple(name for name, kind in position.columns if kind.startswith("timestamp["))

    def initialOffset(self) -> dict[str, int]:
        return {"offset": self.start}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        position = QueryPosition.of(self.connection, self.query)
        return {"offset": max(position.next_offset, start["offset"])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [OffsetRange(start["offset"], end["offset"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.connection, self.query, self.timestamps, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Spark is done with every offset below ``end``: the server shows how far behind
        this reader is (``readers`` in ListQueries, ``lowtide_reader_lag_items``)."""
        self.connection.call(lambda client: client.commit_offset(self.query, self.reader, end["offset"]))


class LowtideBatchReader(DataSourceReader):
    """Every row the server retains of a query, as of the read."""

    def __init__(self, connection: Connection, query: str, position: QueryPosition) -> None:
        self.connection = connection
        self.query = query
        self.range = OffsetRange(position.oldest_offset, position.next_offset)
        self.timestamps = tuple(name for name, kind in position.columns if kind.startswith("timestamp["))

    def partitions(self) -> Sequence[InputPartition]:
        return [self.range]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.connection, self.query, self.timestamps, partition)


__all__ = ["LowtideBatchReader", "LowtideStreamReader", "QueryPosition"]
