"""``lowtide demo --spark``: a Spark Structured Streaming job feeds a lowtide server, exactly.

Writes disordered packet files (each file's rows shuffled, consecutive files overlapping in event
time), starts ``lowtide serve``, and runs a Structured Streaming query that reads the files one
per micro-batch and writes them with ``writeStream.format("lowtide")`` (or, on request, through
:class:`~lowtide.clients.spark.LowtideSink`). lowtide's windows print as its punctuation closes
them; at the end they are checked against Spark's own batch ``groupBy(window(ts, ...))`` over the
same files, and Spark reads them back with ``spark.read.format("lowtide")``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from lowtide.clients import Client
from lowtide.clients.demos.in_process import show
from lowtide.clients.spark import LowtideDataSource, LowtideSink
from lowtide.punctuation.model import END_OF_STREAM, Punctuation

SCHEMA = {"srcIP": "string", "len": "int32", "ts": "timestamp[ms]"}
SPARK_SCHEMA = "srcIP string, len int, ts timestamp"
START_MS = 1_700_000_000_000
# (RANGE, SLIDE) in seconds: a tumbling and a sliding window, as in Q6-7 and Q6-3.
WINDOWS = {"tumbling": (10, 10), "sliding": (10, 5)}
Window = tuple[int, int, str, int, int]  # window_start, window_end (ms), srcIP, packets, bytes


def window_sql(stream: str, range_s: int, slide_s: int) -> str:
    return (
        f"SELECT srcIP, count(*) AS packets, sum(len) AS bytes "
        f"[RANGE {range_s} seconds, SLIDE {slide_s} seconds, WA ts] FROM {stream} GROUP BY srcIP"
    )


def local_session(app: str = "lowtide", cores: int = 2, task_attempts: int = 1) -> Any:
    """A local SparkSession bound to loopback (SPARK_LOCAL_IP too), quiet, with the Python
    workers on this interpreter. A failed task runs again until ``task_attempts`` failed (local
    mode takes it from the master URL only)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark picks the machine's interface address for itself unless told: keep it on loopback.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores},{task_attempts}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # A Python error (a data source's, a UDF's) as its one line, not its traceback.
        .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_packet_files(
    folder: Path, files: int, rows: int, seed: int = 1, span_ms: int = 10_000, overlap_ms: int = 3_000
) -> int:
    """``files`` Parquet files of ``rows`` packets each, in the order a file source reads them.

    File ``i`` covers event times ``[i*span - overlap, (i+1)*span)`` in random order: rows are
    disordered within a file and up to ``overlap_ms`` across files. Returns the rows written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ips = pa.array([f"10.0.{i // 256}.{i % 256}" for i in range(1_000)])
    for i in range(files):
        low = START_MS + i * span_ms - (overlap_ms if i else 0)
        ts = rng.integers(low, START_MS + (i + 1) * span_ms, rows)
        table = pa.table(
            {
                "srcIP": pa.DictionaryArray.from_arrays(
                    rng.integers(0, len(ips), rows).astype(np.int32), ips
                ),
                "len": pa.array(rng.integers(40, 1_500, rows).astype(np.int32)),
                "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
            }
        )
        path = folder / f"packets-{i:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # the file source reads oldest first
    return files * rows


def spark_windows(spark: Any, folder: Path, range_s: int, slide_s: int) -> Counter[Window]:
    """Spark's own batch answer over the files: ``groupBy(window(ts, RANGE, SLIDE), srcIP)``."""
    from pyspark.sql import functions as F

    frame = spark.read.schema(SPARK_SCHEMA).parquet(str(folder))
    grouped = frame.groupBy(F.window("ts", f"{range_s} seconds", f"{slide_s} seconds"), "srcIP").agg(
        F.count("*").alias("packets"), F.sum("len").alias("bytes")
    )
    flat = grouped.select(
        F.unix_millis(F.col("window.start")).alias("start"),
        F.unix_millis(F.col("window.end")).alias("end"),
        "srcIP",
        "packets",
        "bytes",
    )
    return Counter(_rows(flat.toArrow()))


def lowtide_windows(tables: list[pa.Table]) -> Counter[Window]:
    """Result rows of a lowtide query as the same tuples (each emission counted)."""
    found: Counter[Window] = Counter()
    for table in tables:
        found.update(_rows(table.select(["window_start", "window_end", "srcIP", "packets", "bytes"])))
    return found


def _rows(table: pa.Table) -> list[Window]:
    """(start ms, end ms, srcIP, packets, bytes) per row, times as integers whatever their type."""
    columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return list(zip(*(c.to_pylist() for c in columns), strict=True))


class Results(threading.Thread):
    """A query's subscription read until end of stream, printing windows as they close."""

    def __init__(self, target: str, query: str, console: Console | None) -> None:
        super().__init__(daemon=True)
        self.tables: list[pa.Table] = []
        self.windows = 0
        self._subscription = Client(target).subscribe(query)
        self._query, self._console = query, console

    def run(self) -> None:
        for item in self._subscription:
            if isinstance(item, Punctuation):
                if item.value >= END_OF_STREAM:
                    return
            elif item.num_rows:
                self.tables.append(item)
                self.windows += show(self._console, self._query, item) if self._console else 0


def run(
    files: int = 12,
    rows: int = 250_000,
    workers: int = 2,
    sink: str = "lowtide",
    console: Console | None = None,
    spark: Any | None = None,
) -> dict[str, float]:
    """The demo; ``sink``: ``lowtide`` (``writeStream.format("lowtide")``, the executors send),
    ``foreachBatch`` (:class:`LowtideSink` on the driver) or ``parallel`` (its parallel mode).
    ``spark``: a SparkSession to run on, left running (a notebook's, the tests' shared one); by
    default a local one of its own (:func:`local_session`), stopped at the end."""
    from lowtide.clients.demos.server import local_server

    console = console or Console()
    with (
        tempfile.TemporaryDirectory(prefix="lowtide-spark-") as scratch,
        local_server(workers) as (target, _),
    ):
        folder, checkpoint = Path(scratch, "packets"), Path(scratch, "checkpoint")
        total = write_packet_files(folder, files, rows)
        console.print(f"[bold]{files} disordered packet files[/], {total:,} rows; server on {target}")
        with Client(target) as client:
            client.create_stream("Packets", SCHEMA, progressing="ts")
            for name, (range_s, slide_s) in WINDOWS.items():
                client.register_query(window_sql("Packets", range_s, slide_s), name=name)
                console.print(f"[dim]{name}: {window_sql('Packets', range_s, slide_s)}[/]")
        readers = {name: Results(target, name, console if name == "sliding" else None) for name in WINDOWS}
        for reader in readers.values():
            reader.start()
        own_session = spark is None
        if spark is None:
            spark = local_session("lowtide-demo")
        spark.dataSource.register(LowtideDataSource)
        files_read = (
            spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))
        )
        began = time.perf_counter()
        if sink == "lowtide":
            query = (
                files_read.writeStream.format("lowtide")
                .option("server", target)
                .option("stream", "Packets")
                .option("punctuation", "watermark:5 seconds")
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            with Client(target) as client, client.producer("Packets", "spark") as producer:
                producer.close()  # every file is read: the last windows can close
        else:
            forward = LowtideSink(
                target, "Packets", punctuation="watermark:5 seconds", parallel=sink == "parallel"
            )
            query = (
                files_read.writeStream.foreachBatch(forward)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            forward.close()
        for reader in readers.values():
            reader.join()
        elapsed = time.perf_counter() - began
        micro_batches = sum(1 for progress in query.recentProgress if progress.numInputRows)
        with Client(target) as client:
            sent = next(s for s in client.list_streams() if s["name"] == "Packets")["tuples_ingested"]
        exact = all(
            lowtide_windows(readers[name].tables) == spark_windows(spark, folder, *WINDOWS[name])
            for name in WINDOWS
        )
        # Both ways: Spark reads lowtide's windows back, as a batch of every retained result.
        read_back = spark.read.format("lowtide").option("server", target).option("query", "sliding").load()
        read_rows = read_back.drop("_offset").toArrow()
        read_exact = lowtide_windows([read_rows]) == lowtide_windows(readers["sliding"].tables)
        if own_session:
            spark.stop()
    summary = {
        "rows": float(sent),
        "seconds": elapsed,
        "rows_per_s": sent / elapsed,
        "micro_batches": float(micro_batches),
        "windows": float(readers["sliding"].windows),
        "exact": float(exact and read_exact),
    }
    how = {
        "lowtide": 'writeStream.format("lowtide")',
        "foreachBatch": "LowtideSink",
        "parallel": "LowtideSink(parallel=True)",
    }
    verdict = "[bold green]equal[/]" if exact else "[bold red]NOT equal[/]"
    console.print(
        f"\n[bold green]done[/]: Spark wrote {sent:,} rows in {micro_batches} micro-batches through "
        f"{how[sink]} in {elapsed:.1f} s = {sent / elapsed / 1e6:.2f}M rows/s end to end; lowtide's "
        f"windows are {verdict} to Spark's own batch groupBy(window(ts, ...)) over the same files"
    )
    back = "[bold green]the same rows[/]" if read_exact else "[bold red]other rows[/]"
    console.print(
        f'spark.read.format("lowtide") read the sliding windows back: {read_rows.num_rows:,} rows, {back}'
    )
    return summary
