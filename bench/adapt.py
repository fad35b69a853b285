"""Experiment (f): AdaptWID against WID on skewed group distributions (§6.3.5, Figure 6-19).

Five data sets DS1-DS5 as in Table 6-2: every data set has the same number of packets; a small
group holds one packet, a medium group 15 on average, a large group 300 on average; small groups
get 1, 3, 5, 7 or 9 % of the packets, medium groups 20 %, large groups the rest - so 39 % to 87 %
of the groups are small. Groups are flows: a flow's packets fall uniformly within its lifetime
(medium flows ``--medium-life`` s, large flows ``--large-life`` s) starting anywhere in the run.

* Q6-7, tumbling sum over one link: ``SELECT srcIP, sum(len) [RANGE 1 second, SLIDE 1 second,
  WA ts] FROM Main GROUP BY srcIP``; the link sends 100 ms batches in time order, each followed
  by its punctuation.
* Q6-8, sliding count over the union of three links: ``SELECT srcIP, count(*) [RANGE 10 seconds,
  SLIDE 1 second, WA ts] FROM Main2 UNION (Main1 UNION Control) GROUP BY srcIP``; the two main
  links carry the packets (half each, in time order, synchronised), the Control link almost
  none and ``--skew`` seconds behind them, which holds the union's punctuation back.

Operators are driven directly: links -> Meld -> Bucket -> WID or AdaptWID Aggregate -> a sink
that keeps the results. Figures: peak state bytes (the aggregate's ``state_bytes()``, sampled
after every batch and punctuation), wall time and tuples/s of the whole pipeline, and whether
the two operators' results are identical (every row, every value). Writes
``bench/results/adapt.md`` and ``bench/results/adapt.png``.

    python bench/adapt.py [--quick] [--packets 1000000] [--skew 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.batch import Batch
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.base import Operator
from lowtide.operators.bucket import Bucket
from lowtide.operators.meld import Meld
from lowtide.operators.paned_wid import PanedWIDAggregate
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.operators.windows import Sliding, pane_of
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.schema import ColumnType

RESULTS = Path(__file__).resolve().parent / "results"
SECOND = 1000  # ts in milliseconds
STEP = 100  # ms of a link's batch
RATE = 8000  # packets per second over the main links together
SMALL_SHARE = {"DS1": 0.01, "DS2": 0.03, "DS3": 0.05, "DS4": 0.07, "DS5": 0.09}
MEDIUM_SHARE, MEDIUM_SIZE, LARGE_SIZE = 0.20, 15, 300
CONTROL_SHARE = 0.001  # of the packets on Q6-8's Control link
INT64, INT32 = ColumnType("int64"), ColumnType("int32")


@dataclass(frozen=True)
class Query:
    name: str
    window: Sliding
    call: AggregateCall
    links: int  # 1: Main; 3: Main1, Main2, Control


Q6_7 = Query(
    "Q6-7", Sliding(SECOND, SECOND, "ts"), AggregateCall(AggFunc.SUM, "len", INT32, None, "bytes"), 1
)
Q6_8 = Query(
    "Q6-8", Sliding(10 * SECOND, SECOND, "ts"), AggregateCall(AggFunc.COUNT_STAR, None, None, None, "n"), 3
)
# Q6-8 with a holistic aggregate: the planner's choice between AdaptWID and per-slice summaries.
Q6_8_MEDIAN = Query(
    "Q6-8 median", Q6_8.window, AggregateCall(AggFunc.MEDIAN, "len", INT32, None, "median_len"), 3
)
MODES = ("wid", "adapt", "sliced")


def packets(share: float, n: int, seconds: int, medium_life: float, large_life: float, seed: int) -> Any:
    """(ts, srcIP, len) of ``n`` packets in time order: Table 6-2's small, medium and large groups."""
    rng = np.random.default_rng(seed)
    span = seconds * SECOND
    n_small = round(share * n)
    n_medium = round(MEDIUM_SHARE * n)
    n_large = n - n_small - n_medium
    groups_medium = max(1, round(n_medium / MEDIUM_SIZE))
    groups_large = max(1, round(n_large / LARGE_SIZE))
    # Group ids: small 0.., then medium, then large; shuffled so size says nothing about the id.
    ids = rng.permutation(n_small + groups_medium + groups_large)
    medium_g = rng.integers(0, groups_medium, n_medium)
    large_g = rng.integers(0, groups_large, n_large)
    ts_parts = [rng.integers(0, span, n_small)]
    for g, count, life in ((medium_g, groups_medium, medium_life), (large_g, groups_large, large_life)):
        life_ms = min(int(life * SECOND), span - 1)
        start = rng.integers(0, span - life_ms, count)  # each flow's first possible ts
        ts_parts.append(start[g] + rng.integers(0, life_ms + 1, g.shape[0]))
    ts = np.concatenate(ts_parts)
    local = np.concatenate([np.arange(n_small), n_small + medium_g, n_small + groups_medium + large_g])
    key = ids[local].astype(np.int64)
    length = rng.integers(40, 1500, n).astype(np.int32)
    order = np.argsort(ts, kind="stable")
    return ts[order], key[order], length[order], (n_small, groups_medium, groups_large)


def link_steps(query: Query, ts: Any, key: Any, length: Any, skew_s: float, seed: int) -> list[Any]:
    """Per 100 ms of arrival: for each link (ts, srcIP, len, punctuation); Control lags ``skew``."""
    rng = np.random.default_rng(seed + 1)
    if query.links == 1:
        link = np.zeros(ts.shape[0], np.int64)
    else:
        link = np.where(rng.random(ts.shape[0]) < CONTROL_SHARE, 2, rng.integers(0, 2, ts.shape[0]))
    lag = [0, 0, int(skew_s * SECOND)][: query.links]
    end = int(ts.max()) + 1 if ts.shape[0] else 0
    steps = []
    for arrival in range(STEP, end + max(lag) + STEP, STEP):
        step = []
        for i in range(query.links):
            high = min(arrival - lag[i], end)  # this link has sent every ts below ``high``
            lo = np.searchsorted(ts, high - STEP) if high - STEP > 0 else 0
            hi = np.searchsorted(ts, high) if high > 0 else 0
            mine = np.flatnonzero(link[lo:hi] == i) + lo
            step.append((ts[mine], key[mine], length[mine], high))
        steps.append(step)
    return steps


class Keep(Operator):
    """The sink: every result batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Batch] = []

    def process(self, batch: Batch, port: int = 0) -> None:
        self.batches.append(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        pass

    def table(self) -> dict[str, Any]:
        """Every result column, rows sorted by (window_start, srcIP)."""
        if not self.batches:
            return {}
        whole = Batch.concat(self.batches)
        order = np.lexsort((whole["srcIP"], whole["window_start"]))
        return {name: values[order] for name, values in whole.columns.items()}


def measure(query: Query, steps: list[Any], mode: str, runs: int) -> dict[str, Any]:
    """The first run's peak state and results, the median run's wall time."""
    found = [run(query, steps, mode) for _ in range(runs)]
    seconds = sorted(f["seconds"] for f in found)[len(found) // 2]
    return {**found[0], "seconds": seconds, "rate": found[0]["tuples"] / seconds}


def run(query: Query, steps: list[Any], mode: str) -> dict[str, Any]:
    """One run of ``mode``: "wid", "adapt" (AdaptWID) or "sliced" (Paned-WID over slices)."""
    columns = ("window_start", "window_end", "srcIP", query.call.output, "revision")
    meld, sink = Meld(query.links), Keep()
    agg: WIDAggregate | AdaptWIDAggregate
    if mode == "sliced":
        slices = SharedSlices(pane_of(query.window).range, ("srcIP",), (INT64,))
        meld.connect(Bucket(pane_of(query.window))).connect(slices)
        agg = PanedWIDAggregate(query.window, slices, (query.call,), columns)
        agg.connect(sink)
        agg.attach()
        state: Operator = slices
    else:
        args = (query.window, ("srcIP",), (INT64,), (query.call,), columns)
        agg = state = AdaptWIDAggregate(*args) if mode == "adapt" else WIDAggregate(*args)
        meld.connect(Bucket(query.window)).connect(agg).connect(sink)
    peak, tuples = 0, 0
    widest = (0, 0.0)  # Cond. 6.9's wed / SLIDE at its largest, and the threshold then
    began = time.perf_counter()
    for step in steps:
        for port, (ts, key, length, high) in enumerate(step):
            if ts.shape[0]:
                meld.process(Batch({"srcIP": key, "len": length, "ts": ts}, ts.shape[0]), port)
                tuples += ts.shape[0]
            meld.punctuate(Punctuation(high, "ts"), port)
            peak = max(peak, state.state_bytes())
            if isinstance(agg, AdaptWIDAggregate):
                widest = max(widest, (agg.windows_open, agg.high))
    for port in range(query.links):
        meld.punctuate(Punctuation(END_OF_STREAM, "ts"), port)
    seconds = time.perf_counter() - began
    out: dict[str, Any] = {"peak": peak, "seconds": seconds, "tuples": tuples, "rows": sink.table()}
    if isinstance(agg, AdaptWIDAggregate):
        out["switches"] = (agg.to_eager, agg.to_lazy)
        out["windows_open"], out["high"] = widest
    return out


def identical(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[name], b[name]) for name in a)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k packets, one run")
    parser.add_argument("--packets", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3, help="wall time: the median of these runs")
    parser.add_argument("--skew", type=float, default=2.0, help="Control link lag behind the mains (s)")
    parser.add_argument("--skews", default="0,2,5,10", help="Q6-8 on DS5 at these lags too (s)")
    parser.add_argument("--medium-life", type=float, default=5.0)
    parser.add_argument("--large-life", type=float, default=30.0)
    args = parser.parse_args(argv)
    n = 100_000 if args.quick else args.packets
    runs = 1 if args.quick else args.runs
    seconds = max(10, n // RATE)
    for query in (Q6_7, Q6_8):  # numba compiles off the clock
        ts, key, length, _ = packets(0.05, 20_000, 4, 1, 2, 0)
        for mode in MODES:
            run(query, link_steps(query, ts, key, length, 0.5, 0), mode)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    lines = [
        f"## AdaptWID against WID (Table 6-2 data sets, {n:,} packets over {seconds} s)",
        "",
        "| query | data set | small / medium / large groups | WID peak state | AdaptWID peak state "
        "| AdaptWID / WID | WID tuples/s | AdaptWID tuples/s | time ratio | to eager / to lazy "
        "| identical results |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for query in (Q6_7, Q6_8):
        for name, share in SMALL_SHARE.items():
            ts, key, length, counts = packets(share, n, seconds, args.medium_life, args.large_life, 7)
            steps = link_steps(query, ts, key, length, args.skew, 7)
            wid, adapt = measure(query, steps, "wid", runs), measure(query, steps, "adapt", runs)
            same = identical(wid["rows"], adapt["rows"])
            found[(query.name, name)] = {"wid": wid, "adapt": adapt, "same": same}
            total = sum(counts)
            mix = " / ".join(f"{100 * c / total:.0f}%" for c in counts)
            cells = [
                query.name,
                name,
                mix,
                f"{wid['peak'] / 1e6:.2f} MB",
                f"{adapt['peak'] / 1e6:.2f} MB",
                f"{adapt['peak'] / wid['peak']:.2f}x",
                f"{wid['rate'] / 1e6:.2f} M",
                f"{adapt['rate'] / 1e6:.2f} M",
                f"{adapt['seconds'] / wid['seconds']:.2f}x",
                f"{adapt['switches'][0]:,} / {adapt['switches'][1]:,}",
                f"{'yes' if same else 'NO'} ({len(wid['rows'].get('srcIP', ())):,} rows)",
            ]
            lines.append(f"| {' | '.join(cells)} |")
            print(lines[-1], file=sys.stderr)
    lines += [
        "",
        f"Q6-8: Control lags the main links by {args.skew:g} s. Medium flows last {args.medium_life:g} s, "
        f"large flows {args.large_life:g} s. Time ratio: AdaptWID's wall time over WID's (median of "
        f"{runs}), the whole pipeline (Meld, Bucket, aggregate, sink).",
        "",
        "## Q6-8 on DS5: arrival-time skew of the Control link",
        "",
        "| Control lag | largest wed / SLIDE | lazy -> eager threshold then (winVol) | WID peak state "
        "| AdaptWID peak state | AdaptWID / WID | identical results |",
        "|---|---|---|---|---|---|---|",
    ]
    ts, key, length, _ = packets(SMALL_SHARE["DS5"], n, seconds, args.medium_life, args.large_life, 7)
    for skew in [float(s) for s in args.skews.split(",")]:
        steps = link_steps(Q6_8, ts, key, length, skew, 7)
        wid, adapt = run(Q6_8, steps, "wid"), run(Q6_8, steps, "adapt")
        same = identical(wid["rows"], adapt["rows"])
        found[("skew", f"{skew:g}")] = {"wid": wid, "adapt": adapt, "same": same}
        cells = [
            f"{skew:g} s",
            str(adapt["windows_open"]),
            f"{adapt['high']:.1f}",
            f"{wid['peak'] / 1e6:.2f} MB",
            f"{adapt['peak'] / 1e6:.2f} MB",
            f"{adapt['peak'] / wid['peak']:.2f}x",
            "yes" if same else "NO",
        ]
        lines.append(f"| {' | '.join(cells)} |")
        print(lines[-1], file=sys.stderr)
    lines += [
        "",
        "## Holistic: Q6-8 with median(len) instead of count(*)",
        "",
        "The planner's choice for overlapping windows with a holistic aggregate. Sliced is Paned-WID "
        "over slices whose per-slice summaries (each value once, in its slice) merge into a "
        "window's when it is emitted.",
        "",
        "| data set | WID peak state | AdaptWID peak state | sliced peak state | WID tuples/s "
        "| AdaptWID tuples/s | sliced tuples/s | identical results |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("DS1", "DS5"):
        ts, key, length, _ = packets(SMALL_SHARE[name], n, seconds, args.medium_life, args.large_life, 7)
        steps = link_steps(Q6_8_MEDIAN, ts, key, length, args.skew, 7)
        by = {mode: measure(Q6_8_MEDIAN, steps, mode, runs) for mode in MODES}
        same = all(identical(by["wid"]["rows"], by[mode]["rows"]) for mode in MODES)
        found[("median", name)] = {"same": same}
        cells = [
            name,
            *[f"{by[mode]['peak'] / 1e6:.2f} MB" for mode in MODES],
            *[f"{by[mode]['rate'] / 1e6:.2f} M" for mode in MODES],
            "yes" if same else "NO",
        ]
        lines.append(f"| {' | '.join(cells)} |")
        print(lines[-1], file=sys.stderr)
    all_same = all(f["same"] for f in found.values())
    lines += ["", f"Results identical in every run: {'yes' if all_same else 'NO'}."]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "adapt.md").write_text("\n".join(lines) + "\n")
    plot(found)
    print("\n".join(lines))
    return 0 if all_same else 1


def plot(found: dict[tuple[str, str], dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = list(SMALL_SHARE)
    x = np.arange(len(names))
    for axis, query in zip(axes, ("Q6-7", "Q6-8"), strict=True):
        wid = [found[(query, d)]["wid"]["peak"] / 1e6 for d in names]
        adapt = [found[(query, d)]["adapt"]["peak"] / 1e6 for d in names]
        axis.bar(x - 0.2, wid, 0.4, label="WID")
        axis.bar(x + 0.2, adapt, 0.4, label="AdaptWID")
        axis.set_xticks(x, names)
        axis.set_ylabel("peak state (MB)")
        axis.set_title(f"{query} (Figure 6-19a)")
        axis.grid(True, axis="y", alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "adapt.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
