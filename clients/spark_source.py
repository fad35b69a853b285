"""The data source ``format("lowtide")``: Spark reads a query's results and writes streams
(docs/design.md, "Spark data source").

    from lowtide.clients.spark import LowtideDataSource
    spark.dataSource.register(LowtideDataSource)     # the short name "lowtide"

    df.writeStream.format("lowtide").option("server", "db1:50051").option("stream", "Packets")...
    spark.readStream.format("lowtide").option("server", "db1:50051").option("query", "q1").load()
    spark.read.format("lowtide").option("server", "db1:50051").option("query", "q1").load()

The writer (:mod:`.spark_writer`) stages each task's rows on the server and commits a
micro-batch whole, once per batch id; the readers (:mod:`.spark_reader`) take the query's output
offsets for Spark's. Both take :mod:`.spark_options`' options; a missing stream or query, or a
bad option, fails ``start()`` / ``load()`` on the driver with lowtide's one-line reason.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
)
from pyspark.sql.types import StructType

from lowtide.clients.spark_options import Connection
from lowtide.clients.spark_reader import LowtideBatchReader, LowtideStreamReader, QueryPosition
from lowtide.clients.spark_writer import LowtideStreamWriter, Target


class LowtideDataSource(DataSource):
    """``format("lowtide")``: register with ``spark.dataSource.register(LowtideDataSource)``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.connection = Connection.of(options)
        self._position: QueryPosition | None = None

    @classmethod
    def name(cls) -> str:
        return "lowtide"

    def position(self) -> QueryPosition:
        if self._position is None:
            self._position = QueryPosition.of(self.connection, self.options.get("query", ""))
        return self._position

    def schema(self) -> str:
        return self.position().ddl()

    def reader(self, schema: StructType) -> DataSourceReader:
        return LowtideBatchReader(self.connection, self.options["query"], self.position())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        starting = self.options.get("startingOffsets", "latest")
        reader = self.options.get("reader", "spark")
        return LowtideStreamReader(self.connection, self.options["query"], self.position(), starting, reader)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return LowtideStreamWriter(self.connection, Target.of(self.connection, self.options))


__all__ = ["LowtideDataSource"]
