"""Experiment (h): punctuation-to-result latency as the groups per window grow (in-process engine).

A tumbling 1 s count per key, ``SELECT k, count(*) [RANGE 1 second, WA ts] FROM S GROUP BY k``,
and the Q6-3 sliding count (10 s / 1 s), over 1M tuples per second of event time with uniform
keys, 100k-row batches each followed by punctuation. Latency is the wall time from handing the
engine a punctuation to having the results it releases as Arrow tables (``punctuate`` + ``poll``),
over every punctuation that releases a window; p50, p99 and max per group count. This is the
stall a window boundary puts on ingestion in one process. Writes ``bench/results/latency.md``
and ``bench/results/latency.png``.

    python bench/latency.py [--seconds 20] [--groups 1000,10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from lowtide import Engine

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 100_000
RATE_PER_MS = 1_000
QUERIES = {
    "tumbling 1 s": "SELECT k, count(*) AS n [RANGE 1 second, WA ts] FROM S GROUP BY k",
    "sliding 10 s / 1 s": (
        "SELECT k, count(*) AS n [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k"
    ),
}


def latencies(sql: str, groups: int, seconds: int) -> list[float]:
    rng = np.random.default_rng(3)
    engine = Engine()
    engine.create_stream("S", {"k": "int64", "ts": "int64"}, progressing="ts")
    engine.register_query(sql, name="q")
    found = []
    for start in range(0, seconds * 1000 * RATE_PER_MS, BATCH):
        ts = (start + np.arange(BATCH)) // RATE_PER_MS
        engine.push("S", {"k": rng.integers(0, groups, BATCH), "ts": ts})
        began = time.perf_counter()
        engine.punctuate("S", int(ts[-1]) + 1)
        released = [item for item in engine.poll("q") if isinstance(item, pa.Table) and item.num_rows]
        if released:
            found.append(time.perf_counter() - began)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--groups", default="1000,10000,100000,1000000")
    args = parser.parse_args(argv)
    counts = [int(g) for g in args.groups.split(",")]
    latencies(QUERIES["tumbling 1 s"], 1000, 2)  # numba compiles off the clock
    found: dict[str, dict[int, list[float]]] = {label: {} for label in QUERIES}
    lines = [
        "## Punctuation-to-result latency per window, in one process (ms)",
        "",
        "| query | groups | p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for label, sql in QUERIES.items():
        for groups in counts:
            values = np.array(latencies(sql, groups, args.seconds)) * 1e3
            found[label][groups] = values.tolist()
            p50, p99 = np.percentile(values, [50, 99])
            lines.append(f"| {label} | {groups:,} | {p50:.1f} | {p99:.1f} | {values.max():.1f} |")
            print(lines[-1], file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latency.md").write_text("\n".join(lines) + "\n")
    plot(found)
    print("\n".join(lines))
    return 0


def plot(found: dict[str, dict[int, list[float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.5, 3.6))
    for label, by_groups in found.items():
        groups = sorted(by_groups)
        for q, style in ((50, "-"), (99, "--")):
            values = [np.percentile(by_groups[g], q) for g in groups]
            axis.plot(groups, values, style, marker="o", label=f"{label} p{q}")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("groups per window")
    axis.set_ylabel("punctuation to result (ms)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "latency.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
