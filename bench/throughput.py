"""Experiment (a): engine throughput per window type and per aggregate, one process.

The in-process engine (``lowtide.Engine``), ``bench/engine.py``'s disordered workload: 1,000
integer keys, 10k tuples per second of event time (``--rate``, tuples per ms; 5M tuples span
500 s), 20% of tuples delayed up to 2 s, 100k-row batches each followed by punctuation, then the
source closes (the last windows flush on the clock).

* Table 1, per window type, ``count(*), sum(len)`` by ``k``: tumbling 1 s, sliding 10 s / 1 s
  (Paned-WID, and plain WID forced for comparison), the same with ``median(len)`` added (holistic:
  plain WID), landmark (RANGE ALL, SLIDE 1 s), tuple windows (``WA row-num``) tumbling and
  sliding, partitioned tuple windows (``PA k``), slide-by-tuple (``RATTR ts, SATTR row-num`` and
  ``rank(ts)``), and windows with no GROUP BY. Tuple-window sizes match the time windows at the
  default rate: 10,000 rows ~ 1 s of the stream, 10 rows of one key ~ 1 s of that key.
* Table 2, one aggregate at a time by ``k`` (every function of ``AggFunc``) over tumbling 1 s and
  sliding 10 s / 1 s; holistic aggregates make the sliding window plain WID.

Each cell is the median of ``--runs`` runs of push + punctuate + poll for every batch
(``engine.run_query``) after a warm-up run off the clock (numba compiles), in tuples/s = rows /
seconds, and its ratio to the same-process baseline of ``bench/engine.py`` (a dense numba
tumbling count over the same columns: no window state management, no punctuation), timed just
before each run and the ratio's median taken, so that load from other processes cancels. The
operator column is the aggregating operator ``engine.explain`` shows. Slow cells run on a prefix
of the workload (the rows column). Writes ``bench/results/throughput.md`` and ``throughput.png``.

    python bench/throughput.py [--rows 5000000] [--runs 3] [--rate 10] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import engine as workloads
from engine import Workload, baseline, run_query, workload

from lowtide import Engine
from lowtide.operators import select
from lowtide.operators.aggregates import fusable
from lowtide.query import strategies

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = 1_000
TUMBLING = "[RANGE 1 second, WA ts]"
SLIDING = "[RANGE 10 seconds, SLIDE 1 second, WA ts]"
RERANK_DEFAULT = select.RERANK


@dataclass(frozen=True)
class Case:
    label: str
    sql: str
    share: int = 1  # runs on rows // share (slow cases)
    plain: bool = False  # force plain WID (no Paned-WID)
    written_order: bool = False  # run a WHERE's conjuncts as written (no measured order)
    fused: bool = True  # let the planner fuse Select + Bucket + WID Aggregate where it can


@dataclass
class Cell:
    case: Case
    operator: str
    rows: int
    tuples_per_s: float
    ratio: float  # to the baseline measured next to each run
    peak_bytes: int
    results: int


def by_k(items: str, window: str) -> str:
    return f"SELECT k, {items} {window} FROM S GROUP BY k"


# A WHERE whose selective conjunct (k = 7 keeps 0.1%) is written last.
FILTERED = "SELECT k, count(*) AS n, sum(len) AS bytes [RANGE 1 second, WA ts] FROM S "
FILTER = "WHERE len > 100 AND k = 7 GROUP BY k"
FILTER_CASES = [
    Case(
        "Select, Bucket, WID Aggregate; conjuncts as written",
        FILTERED + FILTER,
        written_order=True,
        fused=False,
    ),
    Case("Select, Bucket, WID Aggregate; conjuncts in measured order", FILTERED + FILTER, fused=False),
    Case("fused in one kernel (the planner's choice)", FILTERED + FILTER),
]


WINDOW_CASES = [
    Case("tumbling 1 s", by_k("count(*), sum(len)", TUMBLING)),
    Case("sliding 10 s / 1 s", by_k("count(*), sum(len)", SLIDING)),
    Case("sliding 10 s / 1 s, plain WID forced", by_k("count(*), sum(len)", SLIDING), plain=True),
    Case("sliding 10 s / 1 s + median (holistic)", by_k("count(*), sum(len), median(len)", SLIDING), share=5),
    Case("tumbling 1 s + median (holistic)", by_k("count(*), sum(len), median(len)", TUMBLING)),
    Case("landmark (RANGE ALL, SLIDE 1 s)", by_k("count(*), sum(len)", "[RANGE ALL, SLIDE 1 second, WA ts]")),
    Case("tuple tumbling 10,000 rows", by_k("count(*), sum(len)", "[RANGE 10000 ROWS, WA row-num]")),
    Case(
        "tuple sliding 100,000 / 10,000 rows",
        by_k("count(*), sum(len)", "[RANGE 100000 ROWS, SLIDE 10000 ROWS, WA row-num]"),
    ),
    Case(
        "partitioned tuple tumbling 10 rows (PA k)",
        "SELECT k, count(*), sum(len) [RANGE 10 ROWS, WA row-num, PA k] FROM S",
    ),
    Case(
        "partitioned tuple sliding 100 / 10 rows (PA k)",
        "SELECT k, count(*), sum(len) [RANGE 100 ROWS, SLIDE 10 ROWS, WA row-num, PA k] FROM S",
    ),
    Case(
        "slide-by-tuple 10 s, SLIDE 10,000 rows (row-num)",
        by_k("count(*), sum(len)", "[RANGE 10 seconds, RATTR ts, SLIDE 10000 ROWS, SATTR row-num]"),
    ),
    Case(
        "slide-by-tuple 10 s, SLIDE 10,000 rows (rank(ts))",
        by_k("count(*), sum(len)", "[RANGE 10 seconds, RATTR ts, SLIDE 10000 ROWS, SATTR rank(ts)]"),
    ),
    Case("global tumbling 1 s (no GROUP BY)", f"SELECT count(*), sum(len) {TUMBLING} FROM S"),
    Case("global sliding 10 s / 1 s (no GROUP BY)", f"SELECT count(*), sum(len) {SLIDING} FROM S"),
]

# (label, select item, share on the tumbling window, share on the sliding window): holistic
# aggregates keep every value of each open cell, RANGE / SLIDE cells per tuple on the sliding one
AGGREGATES = [
    ("count(*)", "count(*)", 1, 1),
    ("count(x)", "count(len)", 1, 1),
    ("sum", "sum(len)", 1, 1),
    ("avg", "avg(len)", 1, 1),
    ("min", "min(len)", 1, 1),
    ("max", "max(len)", 1, 1),
    ("var", "var(len)", 1, 1),
    ("stddev", "stddev(len)", 1, 1),
    ("median", "median(len)", 1, 5),
    ("quantile 0.9", "quantile(len, 0.9)", 1, 5),
    ("count_distinct", "count_distinct(len)", 1, 5),
    ("heavy_hitters 1%", "heavy_hitters(len, 0.01)", 1, 5),
]


def aggregate_cases() -> list[tuple[str, Case, Case]]:
    return [
        (
            label,
            Case(f"{label} tumbling", by_k(item, TUMBLING), tshare),
            Case(f"{label} sliding", by_k(item, SLIDING), sshare),
        )
        for label, item, tshare, sshare in AGGREGATES
    ]


def operator_of(sql: str, plain: bool) -> str:
    """The aggregating operator of the plan ``engine.explain`` shows (e.g. ``Paned-WID``);
    ``plain``: sliding windows planned as plain WID, never Paned-WID."""
    engine = Engine(paned_min_overlap=sys.maxsize) if plain else Engine()
    engine.create_stream("S", {"k": "int64", "len": "int32", "ts": "int64"}, progressing="ts")
    for line in engine.explain(sql).splitlines():
        if " Aggregate" in line:
            return line.split(". ", 1)[-1].split(" Aggregate", 1)[0]
    return "?"


def prefix(load: Workload, share: int) -> Workload:
    batches = max(2, len(load.batches) // share)
    return Workload(load.batches[:batches], load.punctuation[:batches])


def adjacent_baseline(load: Workload) -> float:
    """Baseline tuples/s measured right before a run (best of 3: it takes milliseconds)."""
    return load.rows / min(baseline(load, KEYS) for _ in range(3))


def measure(case: Case, load: Workload, runs: int) -> Cell:
    """Median tuples/s over ``runs``, and the median ratio of each run to a baseline measured just
    before it (so that load from other processes shifts both alike)."""
    select.RERANK = sys.maxsize if case.written_order else RERANK_DEFAULT
    strategies.fusable = fusable if case.fused else (lambda calls, types: False)
    try:
        operator = operator_of(case.sql, case.plain)
        part = prefix(load, case.share)
        whole = prefix(load, len(load.batches))
        run_query(case.sql, whole, False, plain=case.plain)  # numba compiles off the clock
        timings, ratios = [], []
        for _ in range(runs):
            base = adjacent_baseline(load)
            timings.append(run_query(case.sql, part, False, plain=case.plain))
            ratios.append(part.rows / timings[-1][0] / base)
    finally:
        select.RERANK = RERANK_DEFAULT
        strategies.fusable = fusable
    seconds = statistics.median(t for t, _, _ in timings)
    return Cell(
        case,
        operator,
        part.rows,
        part.rows / seconds,
        statistics.median(ratios),
        max(p for _, p, _ in timings),
        timings[0][2],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=int, default=10, help="tuples per ms of event time (default 10)")
    parser.add_argument("--quick", action="store_true", help="1M rows, 1 run: a smoke run")
    args = parser.parse_args(argv)
    rows, runs = (1_000_000, 1) if args.quick else (args.rows, args.runs)
    workloads.RATE_PER_MS = args.rate
    load = workload(rows, KEYS, strings=False)

    baseline(prefix(load, len(load.batches)), KEYS)  # compile
    base = statistics.median(adjacent_baseline(load) for _ in range(runs))
    span_s = load.rows / args.rate / 1000
    lines = [
        f"rows={load.rows:,} ({span_s:,.0f} s of event time at {args.rate * 1000:,} tuples/s), "
        f"{KEYS:,} int keys, batch={workloads.BATCH:,}, 20% delayed up to {workloads.MAX_DELAY_MS} ms, "
        f"punctuation after each batch; median of {runs} run(s).",
        "",
        f"Baseline (dense numba tumbling count, same process): **{base / 1e6:.1f} M tuples/s** at the "
        "start; each ratio is the median over runs of run / a baseline measured just before that run.",
        "",
        f"## Window types (count(*), sum(len) by {KEYS:,} keys)",
        "",
        "| window | operator | rows | M tuples/s | vs baseline | peak state | result rows |",
        "|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), file=sys.stderr)
    windows = []
    for case in WINDOW_CASES:
        cell = measure(case, load, runs)
        windows.append(cell)
        lines.append(
            f"| {case.label} | {cell.operator} | {cell.rows:,} | {cell.tuples_per_s / 1e6:.2f} | "
            f"{cell.ratio:.2g}x | {cell.peak_bytes / 1e6:.1f} MB | {cell.results:,} |"
        )
        print(lines[-1], file=sys.stderr)

    lines += [
        "",
        f"## Aggregates (one aggregate by {KEYS:,} keys)",
        "",
        "| aggregate | tumbling 1 s: operator | rows | M tuples/s | vs baseline "
        "| sliding 10 s / 1 s: operator | rows | M tuples/s | vs baseline |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines[-5:]), file=sys.stderr)
    aggregates = []
    for label, tumbling, sliding in aggregate_cases():
        pair = (measure(tumbling, load, runs), measure(sliding, load, runs))
        aggregates.append((label, *pair))
        lines.append(
            f"| {label} | "
            + " | ".join(
                f"{c.operator} | {c.rows:,} | {c.tuples_per_s / 1e6:.2f} | {c.ratio:.2g}x" for c in pair
            )
            + " |"
        )
        print(lines[-1], file=sys.stderr)

    lines += [
        "",
        "## Filters: a WHERE of two conjuncts, the selective one written last (tumbling 1 s)",
        "",
        "| plan | M tuples/s | vs baseline |",
        "|---|---|---|",
    ]
    for case in FILTER_CASES:
        cell = measure(case, load, runs)
        lines.append(f"| {case.label} | {cell.tuples_per_s / 1e6:.2f} | {cell.ratio:.2g}x |")
        print(lines[-1], file=sys.stderr)

    command = " ".join(["python bench/throughput.py", *(argv if argv is not None else sys.argv[1:])])
    lines += ["", f"Command: `{command.strip()}`"]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "throughput.md").write_text("\n".join(lines) + "\n")
    plot(base, windows, aggregates)
    print("\n".join(lines))
    return 0


def plot(base: float, windows: list[Cell], aggregates: list[tuple[str, Cell, Cell]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6.5))
    ys = np.arange(len(windows))
    left.barh(ys, [c.ratio for c in windows], color="tab:blue")
    left.set_yticks(ys, [f"{c.case.label} [{c.operator}]" for c in windows], fontsize=8)
    left.set_title(f"Window types: count(*), sum(len) by {KEYS:,} keys")

    ys = np.arange(len(aggregates))
    height = 0.4
    right.barh(ys - height / 2, [t.ratio for _, t, _ in aggregates], height, label="tumbling 1 s")
    right.barh(ys + height / 2, [s.ratio for _, _, s in aggregates], height, label="sliding 10 s / 1 s")
    right.set_yticks(ys, [label for label, _, _ in aggregates], fontsize=8)
    right.set_title(f"One aggregate by {KEYS:,} keys")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel(f"throughput / dense numba baseline ({base / 1e6:.0f} M tuples/s), log")
        axis.invert_yaxis()
        axis.grid(True, axis="x", which="both", alpha=0.3)
        for bar in axis.patches:
            axis.annotate(
                f"{bar.get_width():.2g}x",
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=6,
            )
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(RESULTS / "throughput.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
