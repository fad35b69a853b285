"""Experiment (g): lowtide end to end against Spark Structured Streaming and PyFlink, same data.

Query, as in ``bench/e2e.py`` (Q6-3, sliding): ``SELECT k, count(*) [RANGE 10 seconds, SLIDE 1
second, WA ts] FROM S GROUP BY k`` over ``S(k int64, ts int64 ms)``, 1,000 keys, 20% of tuples
delayed uniformly up to 2 s, event time running at 100k tuples per second, progress (punctuation,
watermark) = max ts - 2 s, so no tuple is late. ``--queries`` adds the tumbling variant ``[RANGE 1
second]`` and the session query ``SELECT k, count(*) AS n [SESSION 1 second, WA ts] FROM S GROUP BY
k``: its rows are the same but for the keys, which take turns as in ``bench/sessions.py`` (a key is
active one arrival second in 4: ``session_share``), so that each key's activity has gaps and its
sessions end (e2e's uniform keys send every key a tuple every 10 ms: one endless session each). The
rows are ``bench/e2e.py``'s ``share()`` of ``--producers`` producers; Spark and Flink read the same
rows from files (their batches interleaved in arrival order), with ``ts`` moved by ``OFFSET_MS``
(1.7e12 ms, a multiple of every window) into real epoch time: Spark's watermark starts at epoch 0
and drops rows before it as late (the data starts at ts = -2 s). Results are compared after moving
them back.

Each system, and what its clock covers:

* **lowtide**: ``bench/e2e.py``'s ``run_once``: a fresh ``lowtide serve --workers 2`` (warmed
  up), ``--producers`` producer processes sending prebuilt Arrow IPC batches of 10k rows, each
  followed by punctuation ``last arrival - 2 s``, and a subscriber. Throughput = all tuples /
  (start signal -> the subscriber holds the output punctuation covering the last window): every
  result delivered. Latency: ``e2e``'s punctuation-to-result (the last source hands gRPC a
  punctuation crossing a window end -> the subscriber receives the output punctuation that
  releases that window, CLOCK_MONOTONIC across processes), at full speed (it includes queueing
  behind the batches already sent) and with the producers paced at ``--paced-rate`` (below
  saturation: the latency floor). The server's own histogram is in the notes. Not for sessions:
  their output punctuation runs up to a gap ahead of the input's (the end of the earliest open
  session, or input + gap), so it passes a value before the input covers it, and matching the
  two by value says nothing; the session query has no paced run, only the server's histogram.
* **Spark Structured Streaming** (pyspark 4, ``local[2]``, 2 shuffle partitions, default
  HDFS-backed state store): the rows as Parquet files of ``--spark-file-rows`` rows (``k long,
  ts timestamp``) read with ``maxFilesPerTrigger=1`` and ``trigger(availableNow=True)``, then
  ``withWatermark("ts", "2 seconds").groupBy(window(ts, "10 seconds", "1 second"), k).count()``,
  output mode append, ``noop`` sink. The file source is chosen over ``rate``/memory sources
  because it carries exactly these rows and lets Spark read columnar data at full speed. A last
  file holds one sentinel row (key -1, a day later) so that the watermark passes every window
  and append mode emits all of them, as lowtide's close does (its 10 windows stay open and are
  never emitted). Throughput = rows / (``start()`` -> ``awaitTermination()`` returns): query
  start, every micro-batch, the final no-data batch; the SparkSession's start-up and a warm-up
  query are excluded. Latency: Spark cannot emit a window before the micro-batch that passes
  its watermark has finished and the next one has run, so the micro-batch durations
  (``recentProgress[...]["durationMs"]["triggerExecution"]``, every batch of the run, p50/p99)
  are a lower bound of its punctuation-to-result latency. Sessions: ``groupBy(session_window(ts,
  "1 seconds"), k).count()``, otherwise the same. A second setting,
  ``--spark-small-rows`` rows a micro-batch (1 s of event time: one slide) over the first
  ``--spark-small-total`` rows, shows the latency end of Spark's trade-off.
* **PyFlink** (apache-flink from PyPI, in ``.venv-pyflink``, created here on first use:
  apache-beam pins grpcio, protobuf and numpy below lowtide's): ``bench/peers_flink.py`` run by
  that interpreter, Table API SQL, ``HOP(TABLE S, DESCRIPTOR(rt), INTERVAL '1' SECOND, INTERVAL
  '10' SECOND)`` with ``WATERMARK FOR rt AS rt - INTERVAL '2' SECOND`` over the same rows as CSV
  files (the filesystem connector: a JVM source, no Python per row; CSV because the wheel ships
  no Parquet format jar and nothing else can be fetched here), ``blackhole`` sink, parallelism
  1 and 2, local MiniCluster, default heap state backend. Throughput = rows / the job's net
  runtime (``JobExecutionResult.getNetRuntime()``: deployment, reading and parsing the CSV,
  windows, sink, to the job's end after the final watermark emitted every window); the client
  wall time (adding planning and the MiniCluster's start) is in the notes. Latency: not
  measured. Sessions: the group window ``GROUP BY SESSION(rt, INTERVAL '1' SECOND), k`` (bounds
  as ``MIN(ts)``, ``MAX(ts) + gap``). A warm-up job runs first in the same JVM. ``--flink-scan``
  adds a CSV -> blackhole job without the window (parallelism 1): what the source alone costs.

Before timing, the same query's windows are compared on a ``--verify-rows`` data set: lowtide's
(through a server, 2 workers), Spark's (the same streaming query into a ``memory`` sink) and
Flink's (into CSV files, parallelism 2) must be equal as multisets of (start, end, k, count).

Runs: lowtide's ``--runs`` rounds of every query first, before any JVM starts (an idle Spark
driver still takes CPU and adds latency on 2 cores); then per query the checks and Spark's
``--runs`` rounds, and Flink's runs in one subprocess after them; figures are medians. Writes
``bench/results/OUT.md`` and ``bench/results/OUT.png`` (``--out``, default ``peers``; the session
figures are in ``peers_session``).

    python bench/peers.py [--rows 20000000] [--runs 3] [--producers 1] [--quick]
                          [--queries sliding,tumbling,session] [--paced-rate 2000000]
                          [--spark-file-rows 1000000] [--spark-small-rows 100000]
                          [--flink-parallelism 1,2] [--no-flink] [--no-spark] [--out peers]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import e2e
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
FLINK_VENV = ROOT / ".venv-pyflink"
FLINK_JOB = Path(__file__).resolve().parent / "peers_flink.py"
KEYS = 1_000
OFFSET_MS = 1_700_000_000_000  # a multiple of every window length and slide here
SENTINEL_KEY = -1
QUERIES = {"sliding": (10, 1), "tumbling": (1, 1), "session": (0, 1)}  # name -> (RANGE s, SLIDE s)
# (0, gap s): session windows [SESSION gap, WA ts], over SESSION_ROWS (keys taking turns)
TURNS = 4  # session rows: a key is active one second in TURNS (bench/sessions.py's workload)
SESSION_ENV = "LOWTIDE_PEERS_SESSION_ROWS"
TARGET_TUPLES_S = 10_000_000
TARGET_SPARK_RATIO = 6.0
TARGET_P99_MS = 10.0
Window = tuple[int, int, int, int]  # window_start ms, window_end ms, k, count


def lowtide_sql(range_s: int, slide_s: int, stream: str = "{stream}") -> str:
    """``e2e.QUERY`` with this window (``{stream}`` left for ``e2e`` to fill in)."""
    if range_s == 0:
        gap = f"{slide_s} second{'s' if slide_s > 1 else ''}"
        return f"SELECT k, count(*) AS n [SESSION {gap}, WA ts] FROM {stream} GROUP BY k"
    slide = f", SLIDE {slide_s} second{'s' if slide_s > 1 else ''}" if slide_s != range_s else ""
    unit = "seconds" if range_s > 1 else "second"
    return f"SELECT k, count(*) [RANGE {range_s} {unit}{slide}, WA ts] FROM {stream} GROUP BY k"


@contextlib.contextmanager
def e2e_query(range_s: int, slide_s: int) -> Iterator[None]:
    """Point ``bench/e2e.py`` at this window: its query text and the end of its last window.

    A session (``range_s`` 0, gap ``slide_s``) ends at most ``gap`` after the last arrival: for
    ``e2e.final_window_end`` RANGE = gap, SLIDE = 1 ms (its latencies are not used). Its rows are
    :func:`session_share`'s.
    """
    saved = e2e.QUERY, e2e.RANGE_MS, e2e.SLIDE_MS
    e2e.QUERY = lowtide_sql(range_s, slide_s)
    e2e.RANGE_MS, e2e.SLIDE_MS = (slide_s * 1000, 1) if range_s == 0 else (range_s * 1000, slide_s * 1000)
    try:
        with session_rows(range_s == 0):
            yield
    finally:
        e2e.QUERY, e2e.RANGE_MS, e2e.SLIDE_MS = saved


_E2E_SHARE = e2e.share


def session_share(rows: int, keys: int, index: int, producers: int, seed: int = 11) -> e2e.Share:
    """``e2e.share`` with keys taking turns, as in ``bench/sessions.py``: a key is active one
    arrival second in ``TURNS`` (``(key + second) % TURNS == 0``), so with 1,000 keys 250 are
    active at a time, each sending a tuple every 2.5 ms; delays (20%, up to 2 s) are e2e's. Each key's
    activity then has a quiet second between its bursts: sessions with a 1 s gap (one a burst,
    sometimes more where delayed tuples thin out at its start)."""
    out = _E2E_SHARE(rows, keys, index, producers, seed)
    mine = rows // producers
    for number, start in enumerate(range(0, mine, e2e.BATCH)):
        n = len(out.keys[number])
        arrival = ((start + np.arange(n, dtype=np.int64)) * producers + index) // e2e.RATE_PER_MS
        turn = (arrival // 1000) % TURNS
        out.keys[number] = (out.keys[number] // TURNS) * TURNS + (TURNS - turn) % TURNS
    return out


@contextlib.contextmanager
def session_rows(on: bool) -> Iterator[None]:
    """``e2e.share`` is :func:`session_share`, here and in the producer processes ``e2e`` spawns
    (they run this module as ``__mp_main__``, which reads ``SESSION_ENV``: see the end)."""
    if not on:
        yield
        return
    saved, os.environ[SESSION_ENV] = os.environ.get(SESSION_ENV), "1"
    e2e.share = session_share
    try:
        yield
    finally:
        e2e.share = _E2E_SHARE
        if saved is None:
            os.environ.pop(SESSION_ENV, None)
        else:
            os.environ[SESSION_ENV] = saved


# -- data -----------------------------------------------------------------------------------------
@dataclass
class Data:
    """The rows of ``producers`` e2e producers, in arrival order, as files for Spark and Flink."""

    rows: int
    producers: int
    shares: list[e2e.Share]
    k: np.ndarray[Any, Any]
    ts: np.ndarray[Any, Any]

    @staticmethod
    def make(rows: int, producers: int) -> Data:
        shares = [e2e.share(rows, KEYS, i, producers) for i in range(producers)]
        order = [(b, s) for b in range(len(shares[0].ts)) for s in shares]  # batch b of every source
        k = np.concatenate([s.keys[b] for b, s in order])
        ts = np.concatenate([s.ts[b] for b, s in order])
        return Data(len(k), producers, shares, k, ts)

    def parquet(self, folder: Path, file_rows: int, limit: int | None = None) -> Path:
        """Parquet files of ``file_rows`` rows (epoch time), then the sentinel; read oldest first."""
        folder.mkdir(parents=True)
        total = min(limit or self.rows, self.rows)
        starts = list(range(0, total, file_rows))
        for n, start in enumerate(starts):
            end = min(start + file_rows, total)
            self._parquet(folder / f"part-{n:06d}.parquet", self.k[start:end], self.ts[start:end], n)
        sentinel_ts = np.array([int(self.ts[:total].max()) + 86_400_000], np.int64)
        self._parquet(folder / "sentinel.parquet", np.array([SENTINEL_KEY]), sentinel_ts, len(starts))
        return folder

    @staticmethod
    def _parquet(path: Path, k: np.ndarray[Any, Any], ts: np.ndarray[Any, Any], number: int) -> None:
        epoch = pa.array(ts + OFFSET_MS, pa.timestamp("ms", tz="UTC"))
        pq.write_table(pa.table({"k": pa.array(k, pa.int64()), "ts": epoch}), path)
        os.utime(path, (1_000_000 + number, 1_000_000 + number))  # the file source reads oldest first

    def csv(self, folder: Path, file_rows: int) -> Path:
        """CSV files ``k,ts`` (epoch ms, no header) of ``file_rows`` rows for Flink."""
        folder.mkdir(parents=True)
        options = pacsv.WriteOptions(include_header=False)
        for n, start in enumerate(range(0, self.rows, file_rows)):
            end = min(start + file_rows, self.rows)
            table = pa.table({"k": self.k[start:end], "ts": self.ts[start:end] + OFFSET_MS})
            pacsv.write_csv(table, folder / f"part-{n:06d}.csv", options)
        return folder


# -- lowtide --------------------------------------------------------------------------------------
def lowtide_windows(data: Data, range_s: int, slide_s: int) -> Counter[Window]:
    """The query's windows from a ``lowtide serve --workers 2``, every source sent then closed."""
    from lowtide import Punctuation
    from lowtide.clients import Client

    sources = [f"p{i}" for i in range(data.producers)]
    server = e2e.Server.start()
    found: Counter[Window] = Counter()
    try:
        with Client(server.target, timeout=120) as client:
            client.create_stream("S", e2e.SCHEMA, sources=sources)
            query = client.register_query(lowtide_sql(range_s, slide_s, "S"), name="q")
            for source, work in zip(sources, data.shares, strict=True):
                with client.producer("S", source=source, max_batch_rows=e2e.BATCH) as producer:
                    for table, p in zip(work.tables(), work.punctuation, strict=True):
                        producer.send(table)
                        producer.punctuate(p)
                    producer.close()
            with e2e_query(range_s, slide_s):
                final = e2e.final_window_end(data.rows)
            with client.subscribe(query, from_oldest=True) as subscription:
                for item in subscription:
                    if isinstance(item, Punctuation):
                        if item.value >= final:
                            break
                    elif item.num_rows:
                        columns = [item.column(i).to_pylist() for i in range(4)]
                        found.update(zip(*columns, strict=True))
    finally:
        server.stop()
    return found


@dataclass
class LowtideRun:
    tuples_s: float
    p50_ms: float
    p99_ms: float
    server_ms: list[float]
    windows: int


def run_lowtide(data: Data, range_s: int, slide_s: int, rate: float = 0.0) -> LowtideRun:
    rows = data.rows if rate <= 0 else min(data.rows, int(rate * 5))  # paced: about 5 s of sending
    with e2e_query(range_s, slide_s):
        run = e2e.run_once(rows, KEYS, data.producers, "raw", rate)
    return LowtideRun(run.e2e_tuples_s, run.p(50), run.p(99), run.server_p50_p99_ms, len(run.latencies_ms))


# -- Spark ----------------------------------------------------------------------------------------
@dataclass
class SparkRun:
    seconds: float
    batch_ms: list[float]
    rows: int

    @property
    def tuples_s(self) -> float:
        return self.rows / self.seconds


def spark_query(spark: Any, folder: Path, range_s: int, slide_s: int) -> Any:
    from pyspark.sql import functions as F

    frame = (
        spark.readStream.schema("k long, ts timestamp").option("maxFilesPerTrigger", 1).parquet(str(folder))
    )
    if range_s == 0:
        window = F.session_window("ts", f"{slide_s} seconds")
    else:
        window = F.window("ts", f"{range_s} seconds", f"{slide_s} seconds")
    return frame.withWatermark("ts", "2 seconds").groupBy(window, "k").count()


def run_spark(
    spark: Any, folder: Path, rows: int, range_s: int, slide_s: int, scratch: Path, memory: str = ""
) -> SparkRun:
    """One streaming run over ``folder`` (all its files); into ``noop``, or a memory table."""
    writer = spark_query(spark, folder, range_s, slide_s).writeStream.outputMode("append")
    writer = writer.option("checkpointLocation", str(scratch / f"ck-{time.monotonic_ns()}"))
    writer = writer.format("memory").queryName(memory) if memory else writer.format("noop")
    began = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - began
    batches = [float(p["durationMs"]["triggerExecution"]) for p in query.recentProgress]
    return SparkRun(seconds, batches, rows)


def spark_windows(spark: Any, folder: Path, range_s: int, slide_s: int, scratch: Path) -> Counter[Window]:
    run_spark(spark, folder, 0, range_s, slide_s, scratch, memory="peers_check")
    window = "session_window" if range_s == 0 else "window"
    table = spark.sql(
        f"SELECT unix_millis({window}.start) - {OFFSET_MS} AS s, "
        f"unix_millis({window}.end) - {OFFSET_MS} AS e, "
        f"k, count FROM peers_check WHERE k != {SENTINEL_KEY}"
    ).toArrow()
    spark.sql("DROP VIEW IF EXISTS peers_check")
    return Counter(zip(*(table.column(i).to_pylist() for i in range(4)), strict=True))


# -- Flink ----------------------------------------------------------------------------------------
def ensure_pyflink() -> str | None:
    """The interpreter of ``.venv-pyflink``, created on first use; None and a reason if it fails."""
    python = FLINK_VENV / "bin" / "python"
    check = [str(python), "-c", "import pyflink.table"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return None
    print(f"creating {FLINK_VENV.name} (pip install apache-flink; a few minutes) ...", file=sys.stderr)
    steps = [
        [sys.executable, "-m", "venv", str(FLINK_VENV)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", "apache-flink"],
        check,
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{' '.join(step[1:4])}: {error}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]
            return f"{' '.join(step[1:4])} failed: {last[:200]}"
    return None


def run_flink(args: list[str], log: Path) -> tuple[list[dict[str, Any]], str | None]:
    """``peers_flink.py`` in the Flink venv: its JSON lines, or a one-line reason it failed."""
    command = [str(FLINK_VENV / "bin" / "python"), str(FLINK_JOB), *args]
    with log.open("a") as errors:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=errors, text=True, timeout=7200)
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        lines = [line.strip() for line in log.read_text().splitlines() if line.strip()]
        causes = [line for line in lines if "Exception" in line or "Error" in line] or lines or ["no output"]
        return found, f"peers_flink.py exited {done.returncode}: {causes[-1][:200]}"
    return found, None


def flink_windows(
    folder: Path, range_s: int, slide_s: int, scratch: Path
) -> tuple[Counter[Window], str | None]:
    out = scratch / f"flink-out-{time.monotonic_ns()}"
    args = ["--data", str(folder), "--parallelism", "2", "--collect", str(out)]
    _, error = run_flink([*args, "--range-s", str(range_s), "--slide-s", str(slide_s)], scratch / "flink.log")
    found: Counter[Window] = Counter()
    if error is None:
        names = ["s", "e", "k", "n"]
        for path in sorted(out.glob("part-*")):
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=names))
            columns = [[v - OFFSET_MS for v in table.column(i).to_pylist()] for i in range(2)]
            found.update(zip(*columns, *(table.column(i).to_pylist() for i in (2, 3)), strict=True))
    return found, error


def flink_window(range_s: int, slide_s: int) -> str:
    return "SESSION" if range_s == 0 else "HOP" if range_s != slide_s else "TUMBLE"


def difference(theirs: Counter[Window], reference: Counter[Window]) -> str:
    """How two window multisets differ, in one line."""
    extra, missing = theirs - reference, reference - theirs
    return (
        f"{len(theirs):,} windows against lowtide's {len(reference):,}; {len(extra):,} not in lowtide's "
        f"(e.g. {sorted(extra)[:2]}), {len(missing):,} missing (e.g. {sorted(missing)[:2]})"
    )


# -- report ---------------------------------------------------------------------------------------
@dataclass
class Row:
    system: str
    tuples_s: float | None
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    runs: list[float] = field(default_factory=list)
    short: str = ""  # the plot's label


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or value != value else f"{value:,.{digits}f}"


def table_lines(query: str, rows: list[Row], reference: float, reference_p99: float | None) -> list[str]:
    lines = [
        f"### {query}",
        "",
        "| system | tuples/s | p50 / p99 latency (ms) | lowtide / system, tuples/s | "
        "system / lowtide full speed, p99 | notes |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = f"{reference / row.tuples_s:.1f}x" if row.tuples_s else "-"
        latency_ratio = (
            f"{row.p99_ms / reference_p99:.0f}x"
            if row.p99_ms and reference_p99 and row.system[0] != "l"
            else "-"
        )
        rate = f"{row.tuples_s / 1e6:.2f} M" if row.tuples_s else "not measured"
        lines.append(
            f"| {row.system} | {rate} | {_f(row.p50_ms)} / {_f(row.p99_ms)} | {ratio} | {latency_ratio} "
            f"| {row.note} |"
        )
    return lines


def plot(found: dict[str, list[Row]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(dict.fromkeys(row.short or row.system for rows in found.values() for row in rows))
    width = 0.8 / len(found)
    for n, (query, rows) in enumerate(found.items()):
        by = {row.short or row.system: row for row in rows}
        x = np.arange(len(names)) + (n - (len(found) - 1) / 2) * width
        rates = [(by[s].tuples_s or 0) / 1e6 if s in by else 0 for s in names]
        p99 = [(by[s].p99_ms or 0) if s in by else 0 for s in names]
        axes[0].bar(x, rates, width, label=query)
        axes[1].bar(x, p99, width, label=query)
    for axis, label in zip(axes, ("throughput (M tuples/s)", "p99 latency (ms)"), strict=True):
        axis.set_xticks(np.arange(len(names)))
        axis.set_xticklabels(names, fontsize=7)
        axis.set_ylabel(label)
        axis.set_yscale("log")
        axis.grid(True, axis="y", which="both", alpha=0.3)
        axis.legend(fontsize=8)
    axes[0].axhline(TARGET_TUPLES_S / 1e6, color="grey", linestyle="--", linewidth=1)
    axes[1].axhline(TARGET_P99_MS, color="grey", linestyle="--", linewidth=1)
    axes[0].set_title("end to end (dashed: the 10 M target)", fontsize=8)
    axes[1].set_title("lowtide: punctuation to result; Spark: micro-batch duration (lower bound)", fontsize=8)
    fig.suptitle("count per key, 1,000 keys, 20% delayed up to 2 s: same rows, this machine (2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--producers", type=int, default=1, help="lowtide producer processes (sources)")
    parser.add_argument(
        "--queries",
        default="sliding,tumbling",
        help="sliding (10 s / 1 s), tumbling (1 s), session (gap 1 s)",
    )
    parser.add_argument(
        "--paced-rate", type=float, default=2_000_000, help="lowtide paced run, tuples/s (0: off)"
    )
    parser.add_argument("--spark-file-rows", type=int, default=1_000_000, help="rows per Spark micro-batch")
    parser.add_argument("--spark-small-rows", type=int, default=100_000, help="small micro-batches (0: off)")
    parser.add_argument(
        "--spark-small-total", type=int, default=2_000_000, help="rows of the small-batch run"
    )
    parser.add_argument("--flink-parallelism", default="1,2")
    parser.add_argument("--flink-scan", action="store_true", help="also time Flink's CSV source alone")
    parser.add_argument("--verify-rows", type=int, default=2_000_000)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--no-flink", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2M rows, 1 run")
    parser.add_argument("--out", default="peers", help="results/OUT.md and results/OUT.png")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.runs = 2_000_000, 1
    queries = [q for q in args.queries.split(",") if q]
    print(
        f"rows={args.rows:,} keys={KEYS:,} producers={args.producers} runs={args.runs} "
        f"({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at start)",
        file=sys.stderr,
    )
    flink_reason = None if args.no_flink else ensure_pyflink()
    if args.no_flink:
        flink_reason = "--no-flink"
    elif flink_reason:
        print(f"Flink not measured: {flink_reason}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="lowtide-peers-") as tmp:
        scratch = Path(tmp)
        report = measure(args, queries, scratch, flink_reason)
    lines, found = report
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    plot(found, RESULTS / f"{args.out}.png")
    print("\n".join(lines))
    return 0


def measure(
    args: argparse.Namespace, queries: list[str], scratch: Path, flink_reason: str | None
) -> tuple[list[str], dict[str, list[Row]]]:
    # rows, check rows, warm-up rows: e2e's for the windows, session_share's for sessions
    kinds = {name: "session" if QUERIES[name][0] == 0 else "window" for name in queries}
    sets: dict[str, tuple[Data, Data, Data]] = {}
    for kind in sorted(set(kinds.values())):
        with session_rows(kind == "session"):
            sets[kind] = (
                Data.make(args.rows, args.producers),
                Data.make(min(args.verify_rows, args.rows), args.producers),
                Data.make(200_000, args.producers),
            )
    data = next(iter(sets.values()))[0]
    # lowtide's timed rounds come first, before any JVM is up: an idle Spark driver still takes
    # CPU (and latency) from a 2-core machine. Per query: full-speed runs, paced runs, the load.
    timed: dict[str, tuple[list[LowtideRun], list[LowtideRun], list[float]]] = {}
    for name in queries:
        range_s, slide_s = QUERIES[name]
        full: list[LowtideRun] = []
        paced: list[LowtideRun] = []
        loads: list[float] = []
        for number in range(args.runs):
            loads.append(os.getloadavg()[0])
            full.append(run_lowtide(sets[kinds[name]][0], range_s, slide_s))
            if args.paced_rate > 0 and range_s != 0:  # paced runs measure latency only (see below)
                paced.append(run_lowtide(sets[kinds[name]][0], range_s, slide_s, args.paced_rate))
            print(
                f"   {name} run {number + 1}: lowtide {full[-1].tuples_s / 1e6:.2f} M/s "
                f"p99 {full[-1].p99_ms:.1f} ms" + (f", paced p99 {paced[-1].p99_ms:.1f} ms" if paced else ""),
                file=sys.stderr,
            )
        timed[name] = (full, paced, loads)
    spark = None
    if not args.no_spark:
        from lowtide.clients.demos.spark import local_session

        spark = local_session("lowtide-peers", cores=2)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        spark_files = {
            kind: (
                rows.parquet(scratch / f"parquet-{kind}", args.spark_file_rows),
                rows.parquet(scratch / f"parquet-small-{kind}", args.spark_small_rows, args.spark_small_total)
                if args.spark_small_rows > 0
                else None,
                warm.parquet(scratch / f"parquet-warm-{kind}", 100_000),
            )
            for kind, (rows, _, warm) in sets.items()
        }
    flink_levels = [int(p) for p in args.flink_parallelism.split(",")]
    if flink_reason is None:
        flink_files = {
            kind: (
                rows.csv(scratch / f"csv-{kind}", args.spark_file_rows),
                warm.csv(scratch / f"csv-warm-{kind}", 100_000),
            )
            for kind, (rows, _, warm) in sets.items()
        }
    notes: list[str] = []
    found: dict[str, list[Row]] = {}
    lines = [
        "## Experiment (g): lowtide end to end against Spark Structured Streaming and PyFlink",
        "",
        f"Same rows for every system: {data.rows:,} tuples (k int64, ts ms), {KEYS:,} keys, 20% delayed "
        f"uniformly up to 2 s, event time 100k tuples/s, progress = max ts - 2 s; {args.producers} lowtide "
        f"producer(s). Median of {args.runs} run(s) on this machine ({os.cpu_count()} cores, shared: "
        "other processes may have been running). `bench/peers.py` says exactly what each clock covers."
        + (
            f" Session rows: the same, but a key is active one arrival second in {TURNS} (keys take "
            "turns, as in `bench/sessions.py`), so each key's activity has gaps."
            if "session" in sets
            else ""
        ),
        "",
    ]
    for name in queries:
        range_s, slide_s = QUERIES[name]
        data, check, warm = sets[kinds[name]]
        if range_s == 0:
            label = f"{name}: count per key, SESSION gap {slide_s} s"
        else:
            label = f"{name}: count per key, RANGE {range_s} s, SLIDE {slide_s} s"
        if spark is not None:
            big, small, warm_files = spark_files[kinds[name]]
        if flink_reason is None:
            flink_csv, flink_warm = flink_files[kinds[name]]
        print(f"== {label}", file=sys.stderr)
        # -- verification: the same windows from all three
        verdict = []
        reference = lowtide_windows(check, range_s, slide_s)
        what = "sessions" if range_s == 0 else "windows"
        verdict.append(f"lowtide {len(reference):,} {what} ({sum(w[3] for w in reference):,} counted)")
        if spark is not None:
            folder = check.parquet(scratch / f"check-{name}", args.spark_file_rows)
            theirs = spark_windows(spark, folder, range_s, slide_s, scratch)
            same = theirs == reference
            verdict.append(f"Spark {'equal' if same else 'NOT EQUAL'}")
            if not same:
                raise SystemExit(
                    f"{name}: Spark's windows differ from lowtide's: {difference(theirs, reference)}"
                )
        if flink_reason is None:
            folder = scratch / f"check-csv-{name}"
            flink, error = flink_windows(check.csv(folder, args.spark_file_rows), range_s, slide_s, scratch)
            if error:
                flink_reason = error
            else:
                verdict.append(f"Flink {'equal' if flink == reference else 'NOT EQUAL'}")
                if flink != reference:
                    raise SystemExit(
                        f"{name}: Flink's windows differ from lowtide's: {difference(flink, reference)}"
                    )
        print(f"   check on {check.rows:,} rows: {', '.join(verdict)}", file=sys.stderr)
        # -- warm-up, off the clock
        if spark is not None:
            run_spark(spark, warm_files, warm.rows, range_s, slide_s, scratch)
        # -- timed rounds (lowtide's ran above)
        full, paced, loads = timed[name]
        spark_big: list[SparkRun] = []
        spark_small: list[SparkRun] = []
        for number in range(args.runs if spark is not None else 0):
            spark_big.append(run_spark(spark, big, data.rows, range_s, slide_s, scratch))
            if args.spark_small_rows > 0:
                small_rows = min(args.spark_small_total, data.rows)
                assert small is not None
                spark_small.append(run_spark(spark, small, small_rows, range_s, slide_s, scratch))
            print(f"   run {number + 1}: Spark {spark_big[-1].tuples_s / 1e6:.2f} M/s", file=sys.stderr)
        flink_runs: list[dict[str, Any]] = []
        scan_notes: list[str] = []
        if flink_reason is None:
            flink_args = ["--data", str(flink_csv), "--warm", str(flink_warm)]
            flink_args += ["--parallelism", args.flink_parallelism, "--runs", str(args.runs)]
            flink_args += ["--range-s", str(range_s), "--slide-s", str(slide_s)]
            flink_runs, error = run_flink(
                [*flink_args, *(["--scan"] if args.flink_scan else [])], scratch / "flink.log"
            )
            if error:
                flink_reason = error
                print(f"   Flink not measured: {error}", file=sys.stderr)
        # -- rows of the table
        med = statistics.median
        rows = [
            Row(
                f"lowtide serve, 2 workers, {args.producers} producer(s), full speed",
                med(r.tuples_s for r in full),
                med(r.p50_ms for r in full) if range_s else None,
                med(r.p99_ms for r in full) if range_s else None,
                (
                    "e2e's latency does not apply (a session query's output punctuation runs up to a gap "
                    "ahead of its input, so it passes a value before input punctuation covers it); "
                    if range_s == 0
                    else "punctuation to result incl. queueing; "
                )
                + "server histogram p50/p99 <= "
                f"{med(r.server_ms[0] for r in full):g}/{med(r.server_ms[1] for r in full):g} ms",
                [r.tuples_s for r in full],
                "lowtide\nfull speed",
            )
        ]
        if paced:
            rows.append(
                Row(
                    f"lowtide serve, paced at {args.paced_rate / 1e6:g} M tuples/s",
                    None,
                    med(r.p50_ms for r in paced),
                    med(r.p99_ms for r in paced),
                    f"latency below saturation, {min(data.rows, int(args.paced_rate * 5)):,} rows",
                    short=f"lowtide paced\n{args.paced_rate / 1e6:g} M/s",
                )
            )
        for label_runs, batch_rows, total in (
            (spark_big, args.spark_file_rows, data.rows),
            (spark_small, args.spark_small_rows, min(args.spark_small_total, data.rows)),
        ):
            if label_runs:
                durations = [d for r in label_runs for d in r.batch_ms]
                rows.append(
                    Row(
                        f"Spark Structured Streaming, local[2], {batch_rows:,}-row micro-batches",
                        med(r.tuples_s for r in label_runs),
                        float(np.percentile(durations, 50)),
                        float(np.percentile(durations, 99)),
                        f"{total:,} rows, {len(label_runs[0].batch_ms)} micro-batches a run; "
                        "latency = micro-batch duration, a lower bound",
                        [r.tuples_s for r in label_runs],
                        f"Spark, {batch_rows / 1e3:g}k\nrows a batch",
                    )
                )
        if flink_reason is None:
            for level in flink_levels:
                mine = [r for r in flink_runs if r["parallelism"] == level and not r.get("scan")]
                if mine:
                    net = med(data.rows / r["net_s"] for r in mine)
                    wall = med(data.rows / r["wall_s"] for r in mine)
                    rows.append(
                        Row(
                            f"PyFlink SQL {flink_window(range_s, slide_s)}, parallelism {level}",
                            net,
                            note=f"CSV source; job net runtime; {wall / 1e6:.2f} M/s by client wall time",
                            runs=[data.rows / r["net_s"] for r in mine],
                            short=f"Flink\nparallelism {level}",
                        )
                    )
            scans = [r for r in flink_runs if r.get("scan")]
            if scans:
                scan_notes.append(
                    f"Flink's CSV source alone (scan -> blackhole, parallelism 1): "
                    f"{med(data.rows / r['net_s'] for r in scans) / 1e6:.2f} M rows/s (net runtime)"
                )
        elif not args.no_flink:
            rows.append(
                Row("PyFlink SQL", None, note=f"not measured ({flink_reason})", short="Flink\nnot measured")
            )
        found[name] = rows
        lines += table_lines(label, rows, rows[0].tuples_s or 0.0, rows[0].p99_ms)
        lines += [
            "",
            f"Same query checked on {check.rows:,} rows: {', '.join(verdict)}. Load average (1 min) at "
            "the start of each lowtide round (run before any JVM started): "
            f"{', '.join(f'{load:.1f}' for load in loads)}.",
            "",
        ]
        for row in rows:
            if row.runs:
                lines.append(
                    f"* {row.system}: runs " + ", ".join(f"{r / 1e6:.2f}" for r in row.runs) + " M/s"
                )
        lines += [*(f"* {note}" for note in scan_notes), ""]
        if name == "sliding":
            lowtide, p99 = rows[0].tuples_s or 0.0, rows[1].p99_ms if paced else rows[0].p99_ms
            spark_rate = next((r.tuples_s for r in rows if r.system.startswith("Spark")), None)
            targets = [
                f"lowtide end to end >= {TARGET_TUPLES_S / 1e6:.0f} M tuples/s: {lowtide / 1e6:.2f} M "
                f"({'met' if lowtide >= TARGET_TUPLES_S else 'NOT met'})",
                f"p99 punctuation-to-result <= {TARGET_P99_MS:.0f} ms: {_f(p99)} ms "
                f"({'met' if p99 is not None and p99 <= TARGET_P99_MS else 'NOT met'}"
                f"{', paced' if paced else ', full speed'}); at full speed {_f(rows[0].p99_ms)} ms",
            ]
            if spark_rate:
                ratio = lowtide / spark_rate
                targets.insert(
                    1,
                    f"lowtide >= {TARGET_SPARK_RATIO:.0f}x Spark Structured Streaming: {ratio:.1f}x "
                    f"({'met' if ratio >= TARGET_SPARK_RATIO else 'NOT met'})",
                )
            notes += ["Targets (sliding):", *(f"* {t}" for t in targets)]
    if spark is not None:
        spark.stop()
    lines += [*notes, ""]
    return lines, found


if os.environ.get(SESSION_ENV) and __name__ == "__mp_main__":  # a producer e2e spawned: session rows
    e2e.share = session_share

if __name__ == "__main__":
    sys.exit(main())
