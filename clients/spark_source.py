"""The data source ``format("lowtide")``: a query's results read by Spark (DESIGN.md §12).

    spark.dataSource.register(LowtideDataSource)
    spark.readStream.format("lowtide").option("server", "db1:50051").option("query", "q1")
        .option("startingOffsets", "earliest").load()       # streaming: results as they come
    spark.read.format("lowtide").option("server", ...).option("query", "q1").load()  # retained rows

Invariant: Spark's offset *is* the query's output offset (``{"offset": n}``, the n-th item the
query emitted: a result table or a punctuation), so a micro-batch ``[start, end)`` is a fixed set
of rows however often Spark reads it again (after a restart, from its checkpoint), and every row
carries the offset of its table in ``_offset``. Exactly once into any sink that is itself
idempotent per batch. Rows are read on the executors, by subscribing from ``start`` and stopping
after ``end - 1``; the driver only asks the server where the query stands (``ListQueries``).

Options: ``server`` (required), ``query`` (required), ``startingOffsets`` (``latest``, the
default as for Spark's Kafka source; ``earliest``: the oldest retained; or an offset), ``token``,
``root_certificates`` (PEM text, or a path read on the driver), ``timeout`` (seconds, control
calls). An unknown query, an offset no longer retained or a bad option fails on the driver with
lowtide's one-line reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from lowtide.clients._security import pem_bytes
from lowtide.clients.client import Client
from lowtide.errors import InvalidArgument, NotFound, OutOfRange

OFFSET = "_offset"  # the column each row's table offset travels in
# lowtide's column types (lowtide/schema.py, plus heavy_hitters' list<...>) as Spark SQL types
_SPARK_TYPES = {"int64": "bigint", "int32": "int", "float64": "double", "bool": "boolean", "string": "string"}


@dataclass(frozen=True)
class Connection:
    """How an executor reaches the server: picklable, the certificates read on the driver."""

    server: str
    timeout: float
    root_certificates: bytes | None
    token: str | None

    @staticmethod
    def of(options: Mapping[str, str]) -> Connection:
        server = options.get("server")
        if not server:
            raise InvalidArgument('format("lowtide") needs the option "server" (host:port)')
        try:
            timeout = float(options.get("timeout", "30"))
        except ValueError:
            raise InvalidArgument(
                f'the option "timeout" must be seconds, got {options["timeout"]!r}'
            ) from None
        return Connection(server, timeout, pem_bytes(options.get("root_certificates")), options.get("token"))

    def client(self) -> Client:
        return Client(self.server, self.timeout, self.root_certificates, self.token)


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
        with connection.client() as client:
            for info in client.list_queries():
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
    """The rows of the result tables at offsets ``[start, end)``, each with its ``_offset``."""
    if part.end <= part.start:
        return
    with connection.client() as client, client.subscribe(query, from_offset=part.start) as items:
        for item in items:
            offset = items.offset
            assert offset is not None
            if isinstance(item, pa.Table) and item.num_rows:
                for name in timestamps:  # Spark's timestamps: microseconds, UTC
                    column = item.column(name).cast(pa.timestamp("us", tz="UTC"))
                    item = item.set_column(item.schema.get_field_index(name), name, column)
                item = item.append_column(OFFSET, pa.array([offset] * item.num_rows, pa.int64()))
                yield from item.to_batches()
            if offset >= part.end - 1:
                return


class LowtideStreamReader(DataSourceStreamReader):
    """Micro-batches of a query's output offsets (see the module)."""

    def __init__(self, connection: Connection, query: str, position: QueryPosition, starting: str) -> None:
        self.connection = connection
        self.query = query
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


class LowtideDataSource(DataSource):
    """``format("lowtide")``: register with ``spark.dataSource.register(LowtideDataSource)``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.connection = Connection.of(options)
        self.query = options.get("query", "")
        self._position: QueryPosition | None = None

    @classmethod
    def name(cls) -> str:
        return "lowtide"

    def position(self) -> QueryPosition:
        if self._position is None:
            self._position = QueryPosition.of(self.connection, self.query)
        return self._position

    def schema(self) -> str:
        return self.position().ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        return LowtideBatchReader(self.connection, self.query, self.position())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        starting = self.options.get("startingOffsets", "latest")
        return LowtideStreamReader(self.connection, self.query, self.position(), starting)


__all__ = ["LowtideDataSource"]
