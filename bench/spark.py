"""Spark -> lowtide against Spark's own windowed aggregation, on the same data and query, one run.

Every mode is a Structured Streaming query on ``local[2]`` over one of two sources:

* ``--source files``: the demo's disordered packet files (``lowtide.clients.demos.spark``: srcIP string
  over 1,000 addresses, len int32, ts timestamp; rows shuffled within a file, files overlapping
  3 s), ``--per-batch`` files a micro-batch, ``trigger(availableNow=True)``;
* ``--source rate``: Spark's ``rate-micro-batch`` source, ``--rows`` rows a micro-batch in 2
  partitions, 10 s of event time each, as srcIP = value % 1000 (long), len, and ts delayed by a
  pseudo-random 0-2 s per row (disordered).

Modes:

* ``source``: the rows into Spark's ``noop`` sink - what producing them alone costs (context);
* ``handoff``: ``foreachBatch`` that only calls ``toArrow()`` - the most any Python
  ``foreachBatch`` sink can forward on this machine (context: driver mode's ceiling);
* ``pywriter``: a Python streaming data source whose writer only reads its Arrow batches - the
  most any ``DataSourceStreamArrowWriter`` can take on this machine (context: the ceiling of
  ``format`` and of parallel mode's ``mapInArrow``);
* ``spark``: Spark's own ``withWatermark("ts", "5 seconds").groupBy(window(ts, "10 seconds",
  "5 seconds"), srcIP).agg(count, sum(len))``, append mode, into ``noop``;
* ``format``: ``writeStream.format("lowtide")`` (the executors stage their partitions, the driver
  commits each micro-batch) into a ``lowtide serve`` with ``--workers`` workers running the same
  sliding query (punctuation ``watermark:5 seconds``), then the source is closed;
* ``driver`` / ``parallel``: the same through ``foreachBatch(LowtideSink(...))``, then ``close()``.

For the lowtide modes the clock stops when the subscriber has the result punctuation that covers
the last window (lowtide's figure includes every result; Spark's need not).

Figures: rows/s (all rows / that time), median of ``--runs`` runs, modes interleaved per run, and
each lowtide mode's ratio to Spark's own aggregation measured in the same process. Then the
reader (``--reader``): a query with a result row for most input rows (``RANGE 10 ms`` by srcIP)
over the files, fed by a producer; ``spark.readStream.format("lowtide")`` from the earliest
offset into Parquet (``availableNow``), in result rows/s.

    python bench/spark.py [--source files|rate] [--files 8] [--rows 1000000] [--per-batch 1]
                          [--batches 8] [--runs 3] [--workers 2]
                          [--modes source,handoff,pywriter,spark,format,driver,parallel] [--no-reader]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from lowtide.clients import Client
from lowtide.clients.demos.server import local_server
from lowtide.clients.demos.spark import (
    SCHEMA,
    SPARK_SCHEMA,
    START_MS,
    local_session,
    window_sql,
    write_packet_files,
)
from lowtide.clients.spark import LowtideDataSource, LowtideSink
from lowtide.punctuation.model import END_OF_STREAM, Punctuation

RANGE_S, SLIDE_S = 10, 5
MODES = ("source", "handoff", "pywriter", "spark", "format", "driver", "parallel")
READER_SQL = (
    "SELECT srcIP, count(*) AS packets, sum(len) AS bytes [RANGE 10 ms, WA ts] FROM {s} GROUP BY srcIP"
)
RATE_SCHEMA = {"srcIP": "int64", "len": "int32", "ts": "timestamp[ms]"}
ADVANCE_MS = 10_000  # event time per rate micro-batch


@dataclass(frozen=True)
class Source:
    """Where the rows come from: the packet files, or Spark's ``rate-micro-batch`` source."""

    kind: str  # files | rate
    folder: Path
    per_batch: int  # files: files per micro-batch
    rows: int  # rate: rows per micro-batch
    batches: int  # rate: micro-batches to run

    @property
    def total(self) -> int:
        if self.kind == "files":
            return sum(pq.ParquetFile(p).metadata.num_rows for p in self.folder.glob("*.parquet"))
        return self.rows * self.batches

    @property
    def micro_batches(self) -> int:
        if self.kind == "files":
            return -(-len(list(self.folder.glob("*.parquet"))) // self.per_batch)
        return self.batches

    @property
    def schema(self) -> dict[str, str]:
        return SCHEMA if self.kind == "files" else RATE_SCHEMA

    def read(self, spark: Any) -> Any:
        if self.kind == "files":
            reader = spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", self.per_batch)
            return reader.parquet(str(self.folder))
        rate = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", self.rows)
            .option("numPartitions", 2)
            .option("advanceMillisPerBatch", ADVANCE_MS)
            .option("startTimestamp", START_MS)
            .load()
        )
        return rate.selectExpr(
            "value % 1000 AS srcIP",
            "CAST(value % 1460 + 40 AS INT) AS len",
            "timestamp_millis(unix_millis(timestamp) - (value * 7919) % 2000) AS ts",
        )

    def run(
        self, frame: Any, checkpoint: Path, sink: Any = None, into: str = "noop", **options: str
    ) -> float:
        """Run the query until ``micro_batches`` are done; returns the seconds it took. Into
        ``sink`` (foreachBatch), or the data source ``into`` with ``options``."""
        writer = frame.writeStream.option("checkpointLocation", str(checkpoint))
        writer = writer.foreachBatch(sink) if sink is not None else writer.format(into).options(**options)
        began = time.perf_counter()
        if self.kind == "files":
            writer.trigger(availableNow=True).start().awaitTermination()
            return time.perf_counter() - began
        query = writer.trigger(processingTime="0 seconds").start()
        while (query.lastProgress or {}).get("batchId", -1) < self.batches - 1:
            time.sleep(0.01)
        elapsed = time.perf_counter() - began
        query.stop()
        return elapsed


class Received(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class ReadOnly(DataSourceStreamArrowWriter):
    """A writer that only reads what Spark hands it (``pywriter``)."""

    def write(self, iterator: Iterator[Any]) -> Received:
        return Received(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class ReadOnlySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pywriter"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return ReadOnly()


class Bounded:
    """A sink that forwards the first ``batches`` micro-batches and ignores the rest (rate runs on)."""

    def __init__(self, sink: LowtideSink, batches: int) -> None:
        self.sink, self.batches = sink, batches
        self.done = threading.Event()

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if batch_id < self.batches:
            self.sink(batch_df, batch_id)
            if batch_id == self.batches - 1:
                self.done.set()


def run_spark(spark: Any, source: Source, scratch: Path, aggregate: bool) -> float:
    from pyspark.sql import functions as F

    frame = source.read(spark)
    if aggregate:
        frame = (
            frame.withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", f"{RANGE_S} seconds", f"{SLIDE_S} seconds"), "srcIP")
            .agg(F.count("*").alias("packets"), F.sum("len").alias("bytes"))
        )
    return source.run(frame, scratch / f"ck-{time.monotonic_ns()}")


def run_handoff(spark: Any, source: Source, scratch: Path) -> float:
    def to_arrow(batch_df: Any, batch_id: int) -> None:
        batch_df.toArrow()

    return source.run(source.read(spark), scratch / f"ck-{time.monotonic_ns()}", to_arrow)


def run_lowtide(spark: Any, target: str, source: Source, scratch: Path, mode: str) -> float:
    """``format``, ``driver`` or ``parallel`` into a fresh stream and query; the seconds until
    the query's last window is out."""
    stream = f"Packets{time.monotonic_ns()}"
    with Client(target, timeout=30) as client:
        client.create_stream(stream, source.schema, progressing="ts")
        query = client.register_query(window_sql(stream, RANGE_S, SLIDE_S), name=f"{stream}_q")
        results = client.subscribe(query)
        began = time.perf_counter()
        if mode == "format":
            options = {"server": target, "stream": stream, "punctuation": "watermark:5 seconds"}
            source.run(source.read(spark), scratch / f"ck-{stream}", into="lowtide", **options)
            with client.producer(stream, "spark") as producer:
                producer.close()
        else:
            sink = LowtideSink(target, stream, punctuation="watermark:5 seconds", parallel=mode == "parallel")
            bounded = Bounded(sink, source.micro_batches)
            source.run(source.read(spark), scratch / f"ck-{stream}", bounded)
            bounded.done.wait()
            sink.close()
        for item in results:
            if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                break
        elapsed = time.perf_counter() - began
        results.cancel()
        applied = next(s for s in client.list_streams() if s["name"] == stream)["tuples_ingested"]
        client.drop_query(query)
        client.drop_stream(stream)
    # The rate source runs on while the query stops: format mode may commit a batch more.
    if applied < source.total or (source.kind == "files" and applied != source.total):
        raise RuntimeError(f"{mode} mode applied {applied} of {source.total} rows")
    return elapsed


def run_reader(spark: Any, target: str, folder: Path, scratch: Path) -> tuple[int, float]:
    """The files through a producer into a query with a row for most inputs, then Spark reads
    its results from the earliest offset into Parquet: (result rows, seconds)."""
    stream = f"Read{time.monotonic_ns()}"
    with Client(target, timeout=60) as client:
        client.create_stream(stream, SCHEMA, progressing="ts")
        query = client.register_query(READER_SQL.format(s=stream), name=f"{stream}_q")
        with client.producer(stream, "files") as producer:
            for path in sorted(folder.glob("*.parquet")):
                producer.send(pq.read_table(path))
            producer.close()
        for item in client.subscribe(query, from_oldest=True):
            if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                break
        began = time.perf_counter()
        (
            spark.readStream.format("lowtide")
            .options(server=target, query=query, startingOffsets="earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(scratch / f"{stream}-out"))
            .option("checkpointLocation", str(scratch / f"ck-{stream}"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
        elapsed = time.perf_counter() - began
        client.drop_query(query)
        client.drop_stream(stream)
    rows = pq.read_table(scratch / f"{stream}-out").num_rows
    return rows, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=("files", "rate"), default="files")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per file or per rate micro-batch")
    parser.add_argument("--per-batch", type=int, default=1, help="files per micro-batch")
    parser.add_argument("--batches", type=int, default=8, help="rate micro-batches")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-reader", dest="reader", action="store_false", help="skip the reader figure")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    with (
        tempfile.TemporaryDirectory(prefix="lowtide-bench-spark-") as tmp,
        local_server(args.workers) as (target, _),
    ):
        scratch = Path(tmp)
        if args.source == "files":
            write_packet_files(scratch / "packets", args.files, args.rows)
            write_packet_files(scratch / "warm", 2, 100_000, seed=9)
        source = Source(args.source, scratch / "packets", args.per_batch, args.rows, args.batches)
        warm = Source(args.source, scratch / "warm", 1, 100_000, 2)
        spark = local_session("lowtide-bench", cores=2)
        spark.dataSource.register(LowtideDataSource)
        spark.dataSource.register(ReadOnlySource)

        def once(mode: str, of: Source) -> float:
            if mode in ("source", "spark"):
                return run_spark(spark, of, scratch, aggregate=mode == "spark")
            if mode == "handoff":
                return run_handoff(spark, of, scratch)
            if mode == "pywriter":
                return of.run(of.read(spark), scratch / f"ck-{time.monotonic_ns()}", into="pywriter")
            return run_lowtide(spark, target, of, scratch, mode)

        for mode in modes:  # JIT, numba and Spark's first-query costs, off the clock
            once(mode, warm)
        total, micro_batches = source.total, source.micro_batches
        for run in range(args.runs):
            for mode in modes:
                seconds[mode].append(once(mode, source))
                print(
                    f"run {run + 1} {mode:>8}: {total / seconds[mode][-1] / 1e6:6.2f}M rows/s",
                    file=sys.stderr,
                )
        reads = [
            run_reader(spark, target, source.folder, scratch) for _ in range(args.runs if args.reader else 0)
        ]
        spark.stop()
    rates = {m: total / statistics.median(s) for m, s in seconds.items()}
    print(
        f"\n{args.source}: {total:,} rows in {micro_batches} micro-batches of "
        f"{total // micro_batches:,} rows; sliding {RANGE_S} s / {SLIDE_S} s by srcIP; "
        f"median of {args.runs}\n"
    )
    print("| mode | rows/s (median) | vs Spark's own aggregation |")
    print("|---|---|---|")
    spark_rate = rates.get("spark")
    for mode, rate in rates.items():
        ratio = f"{rate / spark_rate:.2f}x" if spark_rate else "-"
        print(f"| {mode} | {rate / 1e6:.2f}M | {ratio} |")
    if "format" in rates and ("driver" in rates or "parallel" in rates):
        best = max(rates.get("driver", 0.0), rates.get("parallel", 0.0))
        print(f"\nformat / best LowtideSink mode: {rates['format'] / best:.2f}x")
    if reads:
        rows = reads[0][0]
        median = statistics.median(seconds for _, seconds in reads)
        print(
            f'\nreader: spark.readStream.format("lowtide") into Parquet, {rows:,} result rows: '
            f"{rows / median / 1e6:.2f}M rows/s (median of {len(reads)}; runs "
            f"{', '.join(f'{r / s / 1e6:.2f}' for r, s in reads)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
