"""Experiment (c): throughput under disorder - in order, 20% and 50% delayed, block-sorted.

One process, the in-process engine, 1,000 integer keys, 1M tuples per second of event time,
100k-row batches each followed by punctuation ``arrival - 2 s`` (so no tuple is late in any
order). The orders:

* ``in order``: every tuple carries its arrival time;
* ``20% delayed`` / ``50% delayed``: that share of tuples carries a timestamp up to 2 s earlier;
* ``block-sorted``: each 100k-row batch is sorted, but its times are spread over the last 2 s
  (whole blocks arrive late, as from a buffering upstream);
* ``20% behind``: 20% delayed, but each batch is followed by punctuation at its last arrival time,
  so the delayed tuples of the next batches are behind punctuation
  (docs/design.md, "Punctuation and lateness"): they count in their windows still open and go to
  ``q.late`` for the emitted ones.

OOP operators never sort and never buffer for order, so the order should not matter: the target
is 50% delayed within 10% of in order. Medians of ``--runs``. Writes ``bench/results/disorder.md``
and ``bench/results/disorder.png``; the orders run interleaved.

    python bench/disorder.py [--rows 5000000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import engine as workloads
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
ORDERS = ("in order", "20% delayed", "50% delayed", "block-sorted", "20% behind")
QUERIES = {
    "Q6-7 tumbling 1 s sum": "SELECT k, sum(len) AS bytes [RANGE 1 second, WA ts] FROM S GROUP BY k",
    "Q6-3 sliding 10 s / 1 s count": (
        "SELECT k, count(*) AS n [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k"
    ),
}


def ordered(rows: int, order: str, seed: int = 11) -> workloads.Workload:
    """``bench/engine.py``'s workload with the timestamps of ``order``."""
    load = workloads.workload(rows, 1_000, strings=False, seed=seed)
    rng = np.random.default_rng(seed)
    start = 0
    for i, batch in enumerate(load.batches):
        n = len(batch["ts"])
        arrival = (start + np.arange(n)) // workloads.RATE_PER_MS
        start += n
        delay = workloads.MAX_DELAY_MS
        if order == "in order":
            ts = arrival
        elif order == "block-sorted":
            ts = np.sort(arrival - rng.integers(0, delay, n))
        else:
            share = 0.2 if order.startswith("20") else 0.5
            ts = arrival - np.where(rng.random(n) < share, rng.integers(0, delay, n), 0)
            if order == "20% behind":
                load.punctuation[i] = int(arrival[-1])  # no slack: the next delayed tuples are behind
        batch["ts"] = ts.astype(np.int64)
    return load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    loads = {order: ordered(args.rows, order) for order in ORDERS}
    rates: dict[str, dict[str, float]] = {}
    for label, sql in QUERIES.items():
        workloads.run_query(sql, loads["in order"], False)  # numba compiles off the clock
        seconds: dict[str, list[float]] = {order: [] for order in ORDERS}
        for _ in range(args.runs):  # orders interleaved: the machine's drift hits them alike
            for order in ORDERS:
                seconds[order].append(workloads.run_query(sql, loads[order], False)[0])
        rates[label] = {order: args.rows / statistics.median(s) for order, s in seconds.items()}
        print(label, {o: f"{r / 1e6:.1f}M" for o, r in rates[label].items()}, file=sys.stderr)
    lines = ["## Throughput under disorder (1,000 keys, medians, M tuples/s; ratio to in order)", ""]
    lines += ["| query | " + " | ".join(ORDERS) + " |", "|---|" + "---|" * len(ORDERS)]
    for label, by_order in rates.items():
        base = by_order["in order"]
        cells = [f"{r / 1e6:.1f} ({r / base:.2f}x)" for r in by_order.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "disorder.md").write_text("\n".join(lines) + "\n")
    plot(rates)
    print("\n".join(lines))
    return 0


def plot(rates: dict[str, dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(rates)
    for i, (label, by_order) in enumerate(rates.items()):
        xs = np.arange(len(ORDERS)) + i * width
        axis.bar(xs, [by_order[o] / 1e6 for o in ORDERS], width, label=label)
    axis.set_xticks(np.arange(len(ORDERS)) + width * (len(rates) - 1) / 2, ORDERS)
    axis.set_ylabel("M tuples/s")
    axis.set_title("Throughput does not depend on arrival order")
    axis.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(RESULTS / "disorder.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
