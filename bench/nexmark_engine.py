"""Nexmark's windowed queries (and those over the whole stream, q4, q9, q18, q19) as Flink SQL
users write them, in the in-process engine: tuples/s, state bytes, and q8 against the same query
written by hand in the bracket form (two queries and a tumbling join on their window_end) in the
same run, as a ratio.

Events: nexmark's generator model (lowtide.clients.nexmark: of every 50 events 1 person, 3
auctions, 46 bids; hot auctions, bidders and sellers) at ``--rate`` events per second of event
time, each arriving up to 2 s late, in runs of 50,000 arrivals (a batch per stream), each followed
by the punctuation honest after it on all three streams. Every figure is the median of
``--runs`` runs. The queries are tests/data/nexmark's, unchanged.

    python bench/nexmark_engine.py [--seconds 200] [--rate 25000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pyarrow as pa

from lowtide import Engine
from lowtide.clients import nexmark

QUERIES = Path(__file__).resolve().parent.parent / "tests" / "data" / "nexmark"
BATCH = 50_000
DELAY_MS = 2_000
BASE = 1_600_000_000_000  # ms: a multiple of every window of the queries
# The columns of nexmark-flink's ddl_views.sql, as the tests type them.
SCHEMAS: dict[str, dict[str, str]] = json.loads((QUERIES / "schemas.json").read_text(encoding="utf-8"))
BRACKET_Q8 = {  # q8 as a lowtide user writes it without Flink SQL
    "p": "SELECT id, name [RANGE 10 seconds, WA dateTime] FROM person GROUP BY id, name",
    "a": "SELECT seller [RANGE 10 seconds, WA dateTime] FROM auction GROUP BY seller",
    "q8": (
        "SELECT p.id, p.name, p.window_start FROM p, a [RANGE TUMBLING 1, WA window_end] "
        "WHERE p.id = a.seller"
    ),
}


def _events(seconds: int, rate: int, seed: int = 7) -> list[tuple[str, pa.Table, int]]:
    """Nexmark's events (lowtide.clients.nexmark: its generator's model), ``DELAY_MS`` out of
    order, in runs of ``BATCH`` arrivals, each with the punctuation honest after it."""
    events = nexmark.generate(seconds * rate, seed=seed, rate=rate, disorder_ms=DELAY_MS, base_ms=BASE)
    return list(nexmark.batches(events, BATCH))


def _run(
    queries: dict[str, str], events: list[tuple[str, pa.Table, int]], polled: str
) -> tuple[float, int, int]:
    """Seconds to run ``events`` through ``queries``, the rows ``polled`` gave, the peak state bytes."""
    engine = Engine()
    for stream, schema in SCHEMAS.items():
        engine.create_stream(stream, schema, progressing="dateTime")
    for name, sql in queries.items():
        engine.register_query(sql, name=name)
    rows = peak = 0
    spent = 0.0  # the calls' time alone: reading the state is not the query's work
    for stream, table, punctuation in events:
        began = time.perf_counter()
        engine.push(stream, table)
        for name in SCHEMAS:
            engine.punctuate(name, punctuation)
        rows += sum(t.num_rows for t in engine.poll(polled) if isinstance(t, pa.Table))
        spent += time.perf_counter() - began
        peak = max(peak, sum(q["state_bytes"] for q in engine.stats()["queries"].values()))  # parts too
    began = time.perf_counter()
    for name in SCHEMAS:
        engine.close_source(name)
    rows += sum(t.num_rows for t in engine.poll(polled) if isinstance(t, pa.Table))
    return spent + time.perf_counter() - began, rows, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=400)
    parser.add_argument("--rate", type=int, default=25_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    events = _events(args.seconds, args.rate)
    total = sum(t.num_rows for _, t, _ in events)
    print(f"{total:,} events ({args.seconds} s of event time), medians of {args.runs} runs")
    print(f"{'query':<14} {'tuples/s':>12} {'rows':>10} {'state MiB':>10}")
    seconds: dict[str, float] = {}
    cases = {f"q{n}": {f"q{n}": (QUERIES / f"q{n}.sql").read_text()} for n in (4, 5, 7, 8, 9, 11, 18, 19)}
    cases["q8 bracket"] = BRACKET_Q8
    for label, queries in cases.items():
        runs = [_run(queries, events, label.split()[0]) for _ in range(args.runs)]
        seconds[label] = statistics.median(r[0] for r in runs)
        rows, peak = runs[0][1], max(r[2] for r in runs)
        print(f"{label:<14} {total / seconds[label]:>12,.0f} {rows:>10,} {peak / 2**20:>10.1f}")
    print(
        f"q8 as Flink writes it / as the bracket form: {seconds['q8 bracket'] / seconds['q8']:.2f}x the speed"
    )


if __name__ == "__main__":
    main()
