"""Experiment (h): punctuation-to-result latency as the groups per window grow (in-process engine).

A tumbling 1 s count per key, ``SELECT k, count(*) [RANGE 1 second, WA ts] FROM S GROUP BY k``,
and the Q6-3 sliding count (10 s / 1 s), over 1M tuples per second of event time with uniform
keys, 100k-row batches each followed by punctuation. Per batch, the wall time of its push,
punctuate and poll is the step: a window boundary that emits many groups at once stalls it.
Latency is, per window end, the wall time from the call whose punctuation covers it to the poll
that returns the output punctuation past it (all its rows are out then). With many groups it is
measured again with smooth emission (§8.3.3, ``SlowFlush``): results leave a few rows per input
tuple over the next batches, which bounds the step at the price of bounded latency. Writes
``bench/results/latency.md`` and ``bench/results/latency.png``.

    python bench/latency.py [--seconds 20] [--groups 1000,10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lowtide import Engine, Punctuation, SlowFlush

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 100_000
RATE_PER_MS = 1_000
SLOW = SlowFlush(every=1, max_windows=2)
SLOW_FROM = 100_000  # groups per window from which slow flush is measured too
QUERIES = {
    "tumbling 1 s": "SELECT k, count(*) AS n [RANGE 1 second, WA ts] FROM S GROUP BY k",
    "sliding 10 s / 1 s": (
        "SELECT k, count(*) AS n [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k"
    ),
}


@dataclass
class Measured:
    steps: list[float]  # wall time of each batch's push + punctuate + poll (the ingestion stall)
    latency: list[float]  # per window end: punctuation that completes it -> its output punctuation


def measure(sql: str, groups: int, seconds: int, flush: SlowFlush | None) -> Measured:
    rng = np.random.default_rng(3)
    engine = Engine(flush=flush)
    engine.create_stream("S", {"k": "int64", "ts": "int64"}, progressing="ts")
    engine.register_query(sql, name="q")
    found = Measured([], [])
    closing: dict[int, float] = {}  # window end -> when punctuation first covered it
    covered = 0  # window ends up to here are in closing already (or out)
    for start in range(0, seconds * 1000 * RATE_PER_MS, BATCH):
        ts = (start + np.arange(BATCH)) // RATE_PER_MS
        keys = rng.integers(0, groups, BATCH)
        began = time.perf_counter()
        engine.push("S", {"k": keys, "ts": ts})
        p = int(ts[-1]) + 1
        engine.punctuate("S", p)
        items = engine.poll("q")
        done = time.perf_counter()
        found.steps.append(done - began)
        for end in range(covered + 1000, p + 1, 1000):
            closing[end] = began
        covered = max(covered, p // 1000 * 1000)
        for item in items:
            if isinstance(item, Punctuation):
                for end in [e for e in closing if e <= item.value]:
                    found.latency.append(done - closing.pop(end))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--groups", default="1000,10000,100000,1000000")
    args = parser.parse_args(argv)
    counts = [int(g) for g in args.groups.split(",")]
    measure(QUERIES["tumbling 1 s"], 1000, 2, None)  # numba compiles off the clock
    found: dict[str, dict[int, Measured]] = {}
    lines = [
        "## Punctuation-to-result latency and ingestion stalls, in one process (ms)",
        "",
        "Step: one batch's push + punctuate + poll (100k tuples). Latency: from the punctuation that",
        f"completes a window to its output punctuation. Slow flush: {SLOW.every} input tuple per result",
        f"row, at most {SLOW.max_windows} windows behind.",
        "",
        "| query | groups | emission | step p50 | step p99 | step max | latency p50 | latency p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, sql in QUERIES.items():
        for groups in counts:
            for emission, flush in (("at punctuation", None), ("slow flush", SLOW)):
                if flush is not None and groups < SLOW_FROM:
                    continue
                m = measure(sql, groups, args.seconds, flush)
                found[f"{label}, {emission}"] = found.get(f"{label}, {emission}", {}) | {groups: m}
                steps, lat = np.array(m.steps) * 1e3, np.array(m.latency) * 1e3
                s50, s99 = np.percentile(steps, [50, 99])
                l50, l99 = np.percentile(lat, [50, 99])
                lines.append(
                    f"| {label} | {groups:,} | {emission} | {s50:.1f} | {s99:.1f} | {steps.max():.1f} "
                    f"| {l50:.1f} | {l99:.1f} |"
                )
                print(lines[-1], file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latency.md").write_text("\n".join(lines) + "\n")
    plot(found)
    print("\n".join(lines))
    return 0


def plot(found: dict[str, dict[int, Measured]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, by_groups in found.items():
        groups = sorted(by_groups)
        left.plot(groups, [np.percentile(by_groups[g].steps, 99) * 1e3 for g in groups], "o-", label=label)
        right.plot(groups, [np.percentile(by_groups[g].latency, 99) * 1e3 for g in groups], "o-", label=label)
    for axis, title in ((left, "p99 ingestion step (ms)"), (right, "p99 punctuation to result (ms)")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("groups per window")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "latency.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
