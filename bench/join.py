"""Experiment (e): OA-Join against an order-preserving output-buffered join (Figure 7-6, Q7-2).

Q7-2 counts, per minute, the packet pairs of one flow in opposite directions within a band of
``n`` seconds: ``SELECT count(*) [RANGE 1 minute, SLIDE 1 minute, WA M1.ts] FROM M1 [RANGE n
seconds, WA ts], M2 [RANGE n seconds, WA ts] WHERE <same flow, opposite direction>``. Two links
of 20k packets/s over 20,000 flows, 100 ms batches in time order, each followed by its link's
punctuation; ``n`` from 1 to 9 seconds.

* OA-Join (lowtide): the whole query in the engine; join results flow straight into the window
  count, which closes on punctuation. Memory: the query's state bytes (join tables + windows).
* OPOB-Join: the same join in the engine (its hash tables are the same), but its results wait
  in an output buffer until no later result can precede them in ``M1.ts`` (punctuation minus
  the band), are sorted on ``M1.ts``, and feed the in-order count of ``bench/iop.py``.
  Memory: join state + output buffer + count.

Peak memory, total seconds, and the median time from a punctuation to the window result it
releases (latency). Writes ``bench/results/join.md`` and ``bench/results/join.png``.

    python bench/join.py [--seconds 60] [--bands 1,3,5,7,9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from iop import InOrderCount

from lowtide import Engine

RESULTS = Path(__file__).resolve().parent / "results"
RATE = 20_000  # packets per second per link
FLOWS = 20_000
STEP_MS = 100
MINUTE = 60_000
SCHEMA = {"srcIP": "int64", "destIP": "int64", "srcPort": "int64", "destPort": "int64", "ts": "int64"}
FLOW = (
    "M1.srcIP = M2.destIP AND M1.destIP = M2.srcIP AND M1.srcPort = M2.destPort AND M1.destPort = M2.srcPort"
)


def links(seconds: int, seed: int = 5) -> list[tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Per step: (punctuation, M1 batch, M2 batch); M2 carries the flows' reverse direction."""
    rng = np.random.default_rng(seed)
    ends = rng.integers(0, 1 << 20, (FLOWS, 4))
    per_step = RATE * STEP_MS // 1000
    steps = []
    for step in range(seconds * 1000 // STEP_MS):
        batches = []
        for reverse in (False, True):
            flow = ends[rng.integers(0, FLOWS, per_step)]
            a, b, p, q = (flow[:, j] for j in ((1, 0, 3, 2) if reverse else (0, 1, 2, 3)))
            ts = np.sort(rng.integers(step * STEP_MS, (step + 1) * STEP_MS, per_step))
            batches.append({"srcIP": a, "destIP": b, "srcPort": p, "destPort": q, "ts": ts})
        steps.append(((step + 1) * STEP_MS, batches[0], batches[1]))
    return steps


def engine_with(sql: str) -> Engine:
    engine = Engine()
    for name in ("M1", "M2"):
        engine.create_stream(name, SCHEMA, progressing="ts", sources=["link"])
    engine.register_query(sql, name="q")
    return engine


def feed(engine: Engine, punctuation: int, m1: dict[str, np.ndarray], m2: dict[str, np.ndarray]) -> float:
    """One step of both links; returns the time just before the punctuation that completes it."""
    engine.push("M1", m1, source="link")
    engine.push("M2", m2, source="link")
    engine.punctuate("M1", punctuation, source="link")
    at = time.perf_counter()
    engine.punctuate("M2", punctuation, source="link")
    return at


def run_oa(steps: list, band: int) -> tuple[int, float, float]:
    sql = (
        f"SELECT count(*) AS pairs [RANGE 1 minute, SLIDE 1 minute, WA M1.ts] "
        f"FROM M1 [RANGE {band} seconds, WA ts], M2 [RANGE {band} seconds, WA ts] WHERE {FLOW}"
    )
    engine = engine_with(sql)
    peak, latencies = 0, []
    began = time.perf_counter()
    for punctuation, m1, m2 in steps:
        at = feed(engine, punctuation, m1, m2)
        if any(isinstance(i, pa.Table) and i.num_rows for i in engine.poll("q")):
            latencies.append(time.perf_counter() - at)
        peak = max(peak, engine.state_bytes("q"))
    return peak, time.perf_counter() - began, _median(latencies)


def run_opob(steps: list, band: int) -> tuple[int, float, float]:
    sql = (
        f"SELECT M1.ts AS ts FROM M1 [RANGE {band} seconds, WA ts], M2 [RANGE {band} seconds, WA ts] "
        f"WHERE {FLOW}"
    )
    engine = engine_with(sql)
    count = InOrderCount(MINUTE, 1)
    held: list[np.ndarray] = []  # the output buffer: join results not yet in order
    peak, latencies = 0, []
    began = time.perf_counter()
    for punctuation, m1, m2 in steps:
        at = feed(engine, punctuation, m1, m2)
        held += [
            i.column("ts").cast(pa.int64()).to_numpy() for i in engine.poll("q") if isinstance(i, pa.Table)
        ]
        buffered = np.concatenate(held) if held else np.empty(0, np.int64)
        # A later result pairs a tuple still to come (ts >= punctuation) with one up to a band
        # older: only results below punctuation - band are final in M1.ts order.
        settled = punctuation - band * 1000
        ready = buffered < settled
        out = np.sort(buffered[ready])  # the sort OA-Join never does
        held = [buffered[~ready]]
        emitted = count.emitted
        count.push(out, np.zeros(out.shape[0], np.int64))
        count.punctuate(settled)
        if count.emitted > emitted:
            latencies.append(time.perf_counter() - at)
        peak = max(peak, engine.state_bytes("q") + held[0].nbytes + count.nbytes())
    return peak, time.perf_counter() - began, _median(latencies)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60 * 3)
    parser.add_argument("--bands", default="1,3,5,7,9")
    args = parser.parse_args(argv)
    steps = links(args.seconds)
    run_oa(links(2), 1)  # numba compiles off the clock
    found = {}
    for band in (int(b) for b in args.bands.split(",")):
        found[band] = {"oa": run_oa(steps, band), "opob": run_opob(steps, band)}
        print(band, found[band], file=sys.stderr)
    lines = [
        f"## Q7-2: OA-Join against OPOB-Join ({RATE:,} packets/s per link, {FLOWS:,} flows, "
        f"{args.seconds} s)",
        "",
        "| band | OA-Join memory | OPOB memory | OA-Join time | OPOB time | OA-Join latency | OPOB latency |",
        "|---|---|---|---|---|---|---|",
    ]
    for band, by in found.items():
        (oa_mem, oa_s, oa_lat), (ob_mem, ob_s, ob_lat) = by["oa"], by["opob"]
        lines.append(
            f"| {band} s | {oa_mem / 1e6:.1f} MB | {ob_mem / 1e6:.1f} MB | {oa_s:.2f} s | {ob_s:.2f} s | "
            f"{oa_lat * 1e3:.2f} ms | {ob_lat * 1e3:.2f} ms |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "join.md").write_text("\n".join(lines) + "\n")
    plot(found)
    print("\n".join(lines))
    return 0


def plot(found: dict[int, dict[str, tuple[int, float, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bands = sorted(found)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for axis, index, label, scale in zip(
        axes, range(3), ("peak memory (MB)", "time (s)", "median latency (ms)"), (1e-6, 1.0, 1e3), strict=True
    ):
        for mode, style, name in (("opob", "o--", "OPOB-Join"), ("oa", "s-", "OA-Join (lowtide)")):
            axis.plot(bands, [found[b][mode][index] * scale for b in bands], style, label=name)
        axis.set_xlabel("band (s)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle("Q7-2 (Figure 7-6)")
    fig.tight_layout()
    fig.savefig(RESULTS / "join.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
