"""Nexmark's windowed queries (and those over the whole stream, q4, q9, q18, q19) as Flink SQL
users write them, in the in-process engine: tuples/s,
state bytes, and q8 against the same query written by hand in the bracket form (two queries and
a tumbling join on their window_end) in the same run, as a ratio.

Events: bids at ``--rate`` per second of event time (auctions a tenth of that, persons a
hundredth), each arriving up to 2 s late, in 50,000-row batches per stream, each followed by
punctuation on all three streams. Every figure is the median of ``--runs`` runs. The queries are
tests/data/nexmark's, unchanged.

    python bench/nexmark_engine.py [--seconds 400] [--rate 25000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from lowtide import Engine

QUERIES = Path(__file__).resolve().parent.parent / "tests" / "data" / "nexmark"
BATCH = 50_000
DELAY_MS = 2_000
BASE = 1_600_000_000_000
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


def _columns(stream: str, n: int, seconds: int, rate: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The columns of ``n`` events of ``stream`` but their time."""
    people, auctions, i = max(seconds * rate // 100, 1), max(seconds * rate // 10, 1), np.arange(n)
    if stream == "person":
        return {
            "id": i,
            "name": np.array(["ann", "bob", "cy"])[i % 3],
            "emailAddress": np.array(["a@x.org", "b@x.org"])[i % 2],
            "creditCard": np.array(["1111", "2222"])[i % 2],
            "city": np.array(["Bend", "Boise"])[i % 2],
            "state": np.array(["OR", "CA"])[i % 2],
            "extra": np.array(["", "x"])[i % 2],
        }
    if stream == "auction":
        return {
            "id": i,
            "itemName": np.array(["lamp", "desk", "pen"])[i % 3],
            "description": np.array(["old", "new"])[i % 2],
            "initialBid": rng.integers(1, 100, n),
            "reserve": rng.integers(100, 200, n),
            "seller": rng.integers(0, people, n),
            "category": rng.integers(10, 15, n),
            "extra": np.array(["", "x"])[i % 2],
        }
    return {
        "auction": rng.integers(0, auctions, n),
        "bidder": rng.integers(0, people, n),
        "price": rng.integers(1, 1_000, n),
        "channel": np.array(["apple", "google", "baidu"])[i % 3],
        "url": np.array(["https://x.org/a", "https://x.org/b"])[i % 2],
        "extra": np.array(["", "x"])[i % 2],
    }


def _events(seconds: int, rate: int, seed: int = 7) -> list[tuple[str, pa.Table, int]]:
    """Each stream's rows in arrival order, cut into batches, merged by their last arrival."""
    rng = np.random.default_rng(seed)
    types = {"int64": pa.int64(), "string": pa.string(), "timestamp[ms]": pa.timestamp("ms")}
    out = []
    for stream, share in (("person", 100), ("auction", 10), ("bid", 1)):
        n = seconds * rate // share
        ts = BASE + rng.integers(0, seconds * 1000, n)
        arrival = ts + rng.integers(0, DELAY_MS, n)
        order = np.argsort(arrival, kind="stable")
        columns = {c: v[order] for c, v in _columns(stream, n, seconds, rate, rng).items()}
        columns["dateTime"], arrival = ts[order], arrival[order]
        if stream == "auction":  # open 1 to 20 s: Nexmark's auctions close, and q4, q9 wait for it
            columns["expires"] = columns["dateTime"] + rng.integers(1_000, 20_000, n)
        schema = pa.schema([(c, types[t]) for c, t in SCHEMAS[stream].items()])
        for at in range(0, n, BATCH):
            part = {c: v[at : at + BATCH] for c, v in columns.items()}
            out.append((stream, pa.table(part, schema=schema), int(arrival[min(at + BATCH, n) - 1])))
    return sorted(out, key=lambda x: x[2])


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
    for stream, table, arrived in events:
        began = time.perf_counter()
        engine.push(stream, table)
        for name in SCHEMAS:
            engine.punctuate(name, arrived - DELAY_MS)
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
