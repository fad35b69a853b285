"""Nexmark end to end, lowtide beside PyFlink on the same events, their rows checked equal.

Events: nexmark's generator model (lowtide.clients.nexmark) at ``--rate`` events per second of
event time, out of order by up to ``--disorder-ms``, written once to Parquet. Per query:

* lowtide: a fresh ``lowtide serve --workers 2`` (warmed by the same query on a few events in a
  server before it, so numba's cache is filled); the streams made, the query registered, then the
  clock runs from the first batch sent (runs of 10,000 arrivals, a batch per stream, each followed
  by the punctuation honest after it) until the subscriber has received the end of the query's
  results. events/s = events / that time.
* Flink: bench/nexmark/flink_oracle.py in .venv-pyflink (``make pyflink``) at parallelism 2 over
  the same events (rewritten as JSON lines first, off the clock), the watermark at the disorder
  bound; its time is from submitting the query to the job's end: planning and the local
  MiniCluster's start included, its changelog written by a sink in the JVM.
* Both rows, as multisets (tests/nexmark/test_nexmark_flink.py compares them the same way): a
  figure is printed only beside "exact" or the first difference.

    python bench/nexmark.py [--events 1000000] [--queries 5,7,8] [--quick]

``--quick``: q5, q7, q8 and q11 on 100,000 events (a few minutes here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e import Server

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client, nexmark

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "tests" / "data" / "nexmark"
FLINK_PYTHON = ROOT / ".venv-pyflink" / "bin" / "python"
ORACLE = ROOT / "bench" / "nexmark" / "flink_oracle.py"
BASE_MS = 1_600_000_000_000
BATCH = 10_000
ADDED = ("window_start", "window_end")


def _value(value: Any) -> Any:
    if isinstance(value, datetime):
        return int(value.replace(tzinfo=value.tzinfo or UTC).timestamp() * 1000)
    return float(f"{value:.9g}") if isinstance(value, float) else value


Batches = list[tuple[str, Any, int]]


def _lowtide(batches: Batches, number: int) -> tuple[float, Counter[tuple[Any, ...]]]:
    server = Server.start(workers=2)
    try:
        with Client(server.target, timeout=300) as client:
            for name in nexmark.STREAMS:
                columns = {f.name: str(f.type) for f in nexmark.SCHEMAS[name]}
                client.create_stream(name, columns, progressing="dateTime")
            client.register_query((QUERIES / f"q{number}.sql").read_text(), name="q")
            columns = next(q["columns"] for q in client.list_queries() if q["name"] == "q")
            if columns[:2] == list(ADDED) and columns[-1] == "revision":
                columns = columns[2:-1]
            began = time.perf_counter()
            producers = {name: client.producer(name) for name in nexmark.STREAMS}
            for stream, table, punctuation in batches:
                producers[stream].send(table)
                for producer in producers.values():
                    producer.punctuate(punctuation)
            for producer in producers.values():
                producer.close()
            rows: Counter[tuple[Any, ...]] = Counter()
            with client.subscribe("q") as subscription:
                for item in subscription:
                    if isinstance(item, Punctuation):
                        if item.value >= END_OF_STREAM:
                            break
                    else:
                        rows.update(tuple(_value(r[c]) for c in columns) for r in item.to_pylist())
            return time.perf_counter() - began, rows
    finally:
        server.process.terminate()
        server.process.wait(60)


def _flink(folder: Path, number: int, disorder_ms: int) -> tuple[float, Counter[tuple[Any, ...]]]:
    out = folder / f"q{number}.flink.jsonl"
    done = subprocess.run(
        [
            *(
                str(FLINK_PYTHON),
                str(ORACLE),
                "--data",
                str(folder),
                "--query",
                str(QUERIES / f"q{number}.sql"),
            ),
            *("--out", str(out), "--parallelism", "2", "--watermark-ms", str(disorder_ms)),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"Flink failed on q{number}: {done.stderr.strip().splitlines()[-1:]}")
    seconds = float(next(w for w in done.stderr.split() if w.startswith("seconds=")).split("=")[1])
    rows = Counter(
        tuple(_value(v) for v in json.loads(line).values())
        for line in out.read_text(encoding="utf-8").splitlines()
        if line
    )
    return seconds, rows


def _difference(ours: Counter[tuple[Any, ...]], theirs: Counter[tuple[Any, ...]]) -> str:
    if ours == theirs:
        return "exact"
    extra, missing = ours - theirs, theirs - ours
    first = next(iter(extra or missing))
    only = f"{sum(extra.values())} rows only in lowtide, {sum(missing.values())} only in Flink"
    return f"DIFFERENT: {only}, e.g. {first}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--disorder-ms", type=int, default=2_000)
    parser.add_argument("--queries", default="5,7,8,11,16,17,19")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.events, args.queries = 100_000, "5,7,8,11"
    if not FLINK_PYTHON.exists():
        raise SystemExit(f"{FLINK_PYTHON} is missing: make pyflink")
    numbers = [int(q) for q in args.queries.split(",")]
    events = nexmark.generate(
        args.events, seed=1, rate=args.rate, disorder_ms=args.disorder_ms, base_ms=BASE_MS
    )
    warm = nexmark.generate(5_000, seed=2, rate=args.rate, disorder_ms=args.disorder_ms, base_ms=BASE_MS)
    print(f"{args.events:,} events, {args.rate:,}/s of event time, up to {args.disorder_ms} ms out of order")
    print(f"{'query':<6} {'lowtide ev/s':>13} {'Flink ev/s':>11} {'ratio':>6}  rows")
    with tempfile.TemporaryDirectory(prefix="nexmark-") as tmp:
        folder = Path(tmp)
        nexmark.write_parquet(events, folder)
        # Made before the clock, as Flink's input files are: the clock runs from the first send.
        batches, warm_batches = list(nexmark.batches(events, BATCH)), list(nexmark.batches(warm, BATCH))
        for number in numbers:
            _lowtide(warm_batches, number)  # numba's cache, off the clock
            ours_s, ours = _lowtide(batches, number)
            theirs_s, theirs = _flink(folder, number, args.disorder_ms)
            verdict = _difference(ours, theirs)
            figures = (
                f"{args.events / ours_s:>13,.0f} {args.events / theirs_s:>11,.0f} {theirs_s / ours_s:>6.1f}"
                if verdict == "exact"
                else f"{'-':>13} {'-':>11} {'-':>6}"
            )
            print(f"q{number:<5} {figures}  {sum(ours.values()):,} {verdict}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
