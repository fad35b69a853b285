"""Nexmark end to end: lowtide beside PyFlink and Spark Structured Streaming on the same events,
every engine's rows checked equal to lowtide's before its figure is printed.

Events: nexmark's generator model (lowtide.clients.nexmark) at ``--rate`` events per second of
event time, out of order by up to ``--disorder-ms``, written once to Parquet. Per query:

* lowtide: a fresh ``lowtide serve --workers 2`` (warmed by the same query on a few events in a
  server before it, so numba's cache is filled); the streams made, the query registered, then the
  clock runs from the first batch sent (runs of 10,000 arrivals, a batch per stream, each followed
  by the punctuation honest after it; the Arrow tables made before the clock, as the other
  engines' files are) until the subscriber has received the end of the query's results.
  events/s = events / that time.
* latency: the same query in another fresh server, its batches (1,000 arrivals) paced so that
  event time keeps to the wall clock at ``--rate``, for ``--paced-seconds``; p50 and p99 of the
  server's own ``lowtide_punctuation_to_result_seconds`` (from a punctuation's arrival at the
  front to the results it completes leaving it: bucket bounds, so "<= x ms").
* Flink: bench/nexmark/flink_oracle.py in .venv-pyflink (``make pyflink``) at parallelism 2 over
  the same events (rewritten as JSON lines first, off the clock), the watermark at the disorder
  bound; its time is from submitting the query to the job's end, its start included: planning,
  the local MiniCluster, deploying the job.
* running: each engine's events/s without the time the same query takes over the first 1,000
  events (mostly its start: lowtide's workers loading numba's compiled kernels, Flink's planning
  and MiniCluster), and their ratio: how fast each runs once started.
* Spark: bench/nexmark/spark_runner.py (local[2], file stream source in arrival order, micro-
  batches, a watermark at the disorder bound), where Spark Structured Streaming can express the
  query (``spark_runner.CANNOT`` says why not for the others); its session's start is off the clock.
* Rows: as multisets, by bench/nexmark/nexmark_compare.py's rules (the test tier's): a figure is
  printed only beside "exact", else the first difference.

    python bench/nexmark.py [--events 2000000] [--queries 5,7,8] [--all] [--no-spark] [--quick]

``--quick``: q5, q7, q8 and q11 on 100,000 events, no latency, no Spark (a few minutes here).
``--all``: every query lowtide and Flink both run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from e2e import Server

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client, nexmark

sys.path.insert(0, str(Path(__file__).resolve().parent / "nexmark"))
import nexmark_compare as compare  # bench/nexmark/: the rules rows compare by

BASE_MS = 1_600_000_000_000
BATCH = 10_000
PACED_BATCH = 1_000
START_EVENTS = 1_000  # each engine's start: the same query over this many events
WINDOWED = (5, 7, 8, 11, 16, 17, 19)
Batches = list[tuple[str, Any, int]]
# Room for every string of the events: a stream's strings stay in the pool while it lives, and
# q0, q1, q7, q9, q10, q14, q18 and q19 read the bids' `extra` (unique, about 100 bytes each:
# docs/nexmark.md).
CONFIG = "max_strings = 100000000\nmax_string_bytes = 17179869184\n"


def _serve(client: Client, number: int) -> list[str]:
    """The streams made and query ``number`` registered as ``q``: its compared columns."""
    for name in nexmark.STREAMS:
        columns = {f.name: str(f.type) for f in nexmark.SCHEMAS[name]}
        client.create_stream(name, columns, progressing="dateTime")
    client.register_query((compare.QUERIES / f"q{number}.sql").read_text(), name="q")
    return compare.lowtide_columns(next(q["columns"] for q in client.list_queries() if q["name"] == "q"))


def _send(client: Client, batches: Batches, pace: float | None = None) -> None:
    """Every batch, each followed by its punctuation on all streams, then the sources closed;
    ``pace``: seconds between batches (None: as fast as the server takes them)."""
    producers = {name: client.producer(name) for name in nexmark.STREAMS}
    began = time.perf_counter()
    for i, (stream, table, punctuation) in enumerate(batches):
        if pace is not None and (wait := began + i * pace - time.perf_counter()) > 0:
            time.sleep(wait)
        producers[stream].send(table)
        for producer in producers.values():
            producer.punctuate(punctuation)
    for producer in producers.values():
        producer.close()


def _results(client: Client, tables: list[pa.Table]) -> None:
    """Every result table of ``q`` into ``tables``, until its end of stream."""
    with client.subscribe("q") as subscription:
        for item in subscription:
            if isinstance(item, Punctuation):
                if item.value >= END_OF_STREAM:
                    break
            else:
                tables.append(item)


def _run(
    batches: Batches, number: int, pace: float | None = None
) -> tuple[float, list[str], compare.Rows, list[float]]:
    """A fresh server runs query ``number`` over ``batches`` (see :func:`_send`), a subscriber
    reading its results as they come: the seconds from the first batch sent to the end of the
    results, the compared columns, the rows, and the p50 and p99 (ms, bucket bounds) of the
    server's punctuation-to-result latency."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as config:
        config.write(CONFIG)
        config.flush()
        server = Server.start(workers=2, serve=("--config", config.name))
    try:
        with Client(server.target, timeout=600) as client:
            columns = _serve(client, number)
            tables: list[pa.Table] = []  # made rows off the clock, as Flink's output file is read
            reader = threading.Thread(target=_results, args=(client, tables))
            began = time.perf_counter()
            reader.start()
            _send(client, batches, pace)
            reader.join()
            seconds = time.perf_counter() - began
        latency = server.latency_quantiles_ms(0.5, 0.99)
        rows = (row for table in tables for row in table.to_pylist())
        return seconds, columns, compare.lowtide_rows(number, columns, rows), latency
    finally:
        server.process.terminate()
        server.process.wait(60)


def _spark(folder: Path, number: int, disorder_ms: int) -> tuple[float, compare.Rows] | None:
    import spark_runner  # bench/nexmark/: pyspark is imported only when Spark runs

    return spark_runner.run(folder, number, disorder_ms)


@dataclass
class Workload:
    """The events of one run: as files for Flink and Spark, as batches for lowtide."""

    folder: Path  # every event, as Parquet
    start_folder: Path  # the first START_EVENTS
    batches: Batches
    first: Batches  # the first START_EVENTS
    warm: Batches  # other events: numba's cache, off the clock
    paced: Batches  # --paced-seconds of events in PACED_BATCH batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--disorder-ms", type=int, default=2_000)
    parser.add_argument("--queries", default=",".join(map(str, WINDOWED)))
    parser.add_argument("--all", action="store_true", help="every query both run")
    parser.add_argument("--paced-seconds", type=float, default=20.0, help="0: no latency run")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.events, args.queries, args.paced_seconds, args.no_spark = 100_000, "5,7,8,11", 0, True
    if not compare.FLINK_PYTHON.exists():
        raise SystemExit(f"{compare.FLINK_PYTHON} is missing: make pyflink")
    numbers = list(compare.BOTH) if args.all else [int(q) for q in args.queries.split(",")]
    shape = {"rate": args.rate, "disorder_ms": args.disorder_ms, "base_ms": BASE_MS}
    events = nexmark.generate(args.events, seed=1, **shape)
    first = nexmark.generate(START_EVENTS, seed=1, **shape)
    print(f"{args.events:,} events, {args.rate:,}/s of event time, up to {args.disorder_ms} ms out of order")
    print(
        f"{'query':<6} {'p50/p99 ms':>11} {'lowtide ev/s':>13} {'Flink ev/s':>11} {'ratio':>6} "
        f"{'running: lt':>11} {'Flink':>11} {'ratio':>6} {'Spark ev/s':>11} {'ratio':>6}  rows"
    )
    with tempfile.TemporaryDirectory(prefix="nexmark-") as tmp:
        work = Workload(
            Path(tmp) / "events",
            Path(tmp) / "first",
            list(nexmark.batches(events, BATCH)),
            list(nexmark.batches(first, BATCH)),
            list(nexmark.batches(nexmark.generate(5_000, seed=2, **shape), BATCH)),
            list(
                nexmark.batches(
                    nexmark.generate(int(args.rate * args.paced_seconds), seed=3, **shape), PACED_BATCH
                )
            ),
        )
        nexmark.write_parquet(events, work.folder)
        nexmark.write_parquet(first, work.start_folder)
        for number in numbers:
            print(_line(number, work, args), flush=True)
    if not args.no_spark:
        import spark_runner

        spark_runner.stop()


def _line(number: int, work: Workload, args: argparse.Namespace) -> str:
    """Query ``number``'s figures: each engine's events/s once its rows equal lowtide's."""
    _run(work.warm, number)
    ours_s, columns, ours, _ = _run(work.batches, number)
    ours_start_s = _run(work.first, number)[0]
    out = work.folder.parent / f"q{number}.flink.jsonl"
    theirs_s, theirs = compare.flink_rows(work.folder, number, args.disorder_ms, out, columns)
    theirs_start_s = compare.flink_rows(work.start_folder, number, args.disorder_ms, out, columns)[0]
    verdict = compare.difference(ours, theirs)
    latency = "-"
    if args.paced_seconds > 0:
        p50, p99 = _run(work.paced, number, PACED_BATCH / args.rate)[3]
        latency = f"{p50:.0f}/{p99:.0f}"
    spark = "" if args.no_spark else _spark_figures(work.folder, number, args, columns, ours, ours_s)
    figures = f"{'-':>13} {'-':>11} {'-':>6} {'-':>11} {'-':>11} {'-':>6}"
    if verdict == "exact":
        running = [
            _per_second(args.events, ours_s, ours_start_s),
            _per_second(args.events, theirs_s, theirs_start_s),
        ]
        ratio = f"{running[0] / running[1]:.1f}" if all(running) else "-"
        figures = " ".join(
            [
                f"{args.events / ours_s:>13,.0f} {args.events / theirs_s:>11,.0f} {theirs_s / ours_s:>6.1f}",
                *(f"{r:>11,.0f}" if r else f"{'-':>11}" for r in running),
                f"{ratio:>6}",
            ]
        )
    return f"q{number:<5} {latency:>11} {figures} {spark:>18}  {sum(ours.values()):,} {verdict}"


def _per_second(events: int, seconds: float, start: float) -> float:
    """Events per second of running: without the time the same query takes on START_EVENTS (its
    start, mostly); 0 where that is not a tenth of the time less (too few events to tell)."""
    running = seconds - start
    return (events - START_EVENTS) / running if running > 0.1 * seconds else 0.0


def _spark_figures(
    folder: Path, number: int, args: argparse.Namespace, columns: list[str], ours: compare.Rows, ours_s: float
) -> str:
    """Spark's events/s and ratio, "cannot" (spark_runner.CANNOT) or "DIFFERENT" (its rows)."""
    ran = _spark(folder, number, args.disorder_ms)
    if ran is None:
        return f"{'cannot':>11} {'-':>6}"
    seconds, rows = ran
    if compare.difference(ours, compare.in_order(number, columns, rows.elements()), "Spark") != "exact":
        return f"{'DIFFERENT':>11} {'-':>6}"
    return f"{args.events / seconds:>11,.0f} {seconds / ours_s:>6.1f}"


if __name__ == "__main__":
    main()
