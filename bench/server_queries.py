"""Concurrent sliding queries on one stream through ``lowtide serve`` (experiment (b) end to end).

Query i is ``SELECT k, count(*) [RANGE 10*i seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k``,
for 1, 2, 5 and 10 queries registered before the data: the first starts the slices in the
workers, the others read them, and the front sends each tuple once (README, "shared slices").
One producer sends ``bench/e2e.py``'s workload (1,000 keys, 20% delayed up to 2 s, 10k-row
batches each followed by punctuation) through the raw gRPC stub, then closes its source.

Figure: tuples / (start signal -> every query's subscriber has its end-of-stream punctuation),
so it includes emitting every window of every query; the median of ``--runs``, a fresh server
each run. Writes ``bench/results/server_queries.md`` and ``bench/results/server_queries.png``.

    python bench/server_queries.py [--rows 10000000] [--runs 3] [--queries 1,2,5,10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

import e2e

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client

RESULTS = Path(__file__).resolve().parent / "results"


def sql(i: int) -> str:
    return f"SELECT k, count(*) AS n [RANGE {10 * (i + 1)} seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k"


def run_once(rows: int, queries: int) -> tuple[float, str]:
    """Tuples/s until every query ended, and the last query's plan beside the others."""
    ctx = mp.get_context("spawn")
    server = e2e.Server.start()
    try:
        e2e.warm_up(server.target, 1_000)
        with Client(server.target, timeout=60) as client:
            client.create_stream("S", e2e.SCHEMA, sources=["p0"])
            names = [str(client.register_query(sql(i), name=f"q{i}")) for i in range(queries - 1)]
            plan = client.explain(sql(queries - 1))  # how the last one runs beside the others
            names.append(str(client.register_query(sql(queries - 1), name=f"q{queries - 1}")))
        out, start = ctx.Queue(), ctx.Event()
        args = (server.target, "S", 0, 1, rows, 1_000, "raw", 0.0, start, out)
        producer = ctx.Process(target=e2e.producer_main, args=args)
        producer.start()
        assert out.get(timeout=600)[0] == "ready"
        ended: list[float] = []

        def until_end(query: str) -> None:
            with Client(server.target) as client, client.subscribe(query, from_oldest=True) as items:
                for item in items:
                    if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                        break
            ended.append(time.monotonic())

        listeners = [threading.Thread(target=until_end, args=(name,)) for name in names]
        began = time.monotonic()
        start.set()
        for listener in listeners:
            listener.start()
        for listener in listeners:
            listener.join()
        out.get(timeout=600)
        producer.join(60)
    finally:
        server.stop()
    return rows / (max(ended) - began), plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--queries", default="1,2,5,10")
    args = parser.parse_args(argv)
    lines = [
        f"## Sliding queries on one stream through lowtide serve (2 workers, {args.rows:,} tuples)",
        "",
        "| queries | tuples/s (every query to its end) | of one query | runs | slices |",
        "|---|---|---|---|---|",
    ]
    first = 0.0
    rates: dict[int, float] = {}
    for count in (int(q) for q in args.queries.split(",")):
        found = [run_once(args.rows, count) for _ in range(args.runs)]
        rate = rates[count] = statistics.median(f[0] for f in found)
        first = first or rate
        shared = "shared" if "shared with" in found[0][1] else "its own"
        runs = ", ".join(f"{f[0] / 1e6:.2f}" for f in found)
        lines.append(f"| {count} | {rate / 1e6:.2f} M | {rate / first:.2f}x | {runs} M | {shared} |")
        print(lines[-1], file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "server_queries.md").write_text("\n".join(lines) + "\n")
    plot(rates)
    print("\n".join(lines))
    return 0


def plot(rates: dict[int, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4))
    counts = list(rates)
    axis.bar([str(c) for c in counts], [rates[c] / 1e6 for c in counts], color="tab:blue")
    axis.set_xlabel("sliding queries on one stream (shared slices)")
    axis.set_ylabel("M tuples/s, every query to its end")
    axis.set_title("lowtide serve, 2 workers")
    axis.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "server_queries.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
