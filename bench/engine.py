"""Engine throughput benchmark (one process): tuples/s, state bytes, ratios to a same-process baseline.

Shapes (issue 2): Q6-7 (tumbling 1 s sum per key) and Q6-3 (RANGE 10 s, SLIDE 1 s count per key)
with 1,000 and 100,000 integer keys and with string keys; 20% of tuples delayed up to 2 s; 100k-row
batches each followed by punctuation; and a Q5-8 band join. Every figure is the median of
``--runs`` runs. The baseline is a dense numba tumbling count over the same columns (no windows
state management, no punctuation): the ceiling a per-tuple loop reaches here.

    python bench/engine.py [--rows 10000000] [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide import Engine

BATCH = 100_000
RATE_PER_MS = 1_000  # event-time rate: 1M tuples per second of ts
MAX_DELAY_MS = 2_000


@dataclass
class Workload:
    batches: list[dict[str, npt.NDArray[np.generic] | list[str]]]
    punctuation: list[int]

    @property
    def rows(self) -> int:
        return sum(len(b["ts"]) for b in self.batches)


def workload(rows: int, keys: int, strings: bool, seed: int = 7) -> Workload:
    """Band disorder: 20% of tuples carry a timestamp up to 2 s before their arrival time."""
    rng = np.random.default_rng(seed)
    batches, punct = [], []
    names = np.array([f"10.0.{k // 256}.{k % 256}" for k in range(keys)], dtype=object) if strings else None
    for start in range(0, rows, BATCH):
        n = min(BATCH, rows - start)
        arrival = (start + np.arange(n)) // RATE_PER_MS
        delayed = rng.random(n) < 0.2
        ts = arrival - np.where(delayed, rng.integers(0, MAX_DELAY_MS, n), 0)
        key = rng.integers(0, keys, n)
        batch: dict[str, npt.NDArray[np.generic] | list[str]] = {
            "k": names[key] if names is not None else key.astype(np.int64),
            "len": rng.integers(40, 1500, n).astype(np.int32),
            "ts": ts.astype(np.int64),
        }
        batches.append(batch)
        punct.append(int(arrival[-1]) - MAX_DELAY_MS)
    return Workload(batches, punct)


def run_query(sql: str, load: Workload, strings: bool, *, plain: bool = False) -> tuple[float, int, int]:
    """Seconds to push every batch and punctuation; peak state bytes; result rows. ``plain``:
    sliding windows run as plain WID, never Paned-WID."""
    engine = Engine(paned_min_overlap=sys.maxsize) if plain else Engine()
    kind = "string" if strings else "int64"
    engine.create_stream("S", {"k": kind, "len": "int32", "ts": "int64"}, progressing="ts")
    q = engine.register_query(sql, name="q")
    peak = results = 0
    began = time.perf_counter()
    for batch, p in zip(load.batches, load.punctuation, strict=True):
        engine.push("S", batch)
        engine.punctuate("S", p)
        peak = max(peak, engine.state_bytes("q"))
        results += sum(item.num_rows for item in engine.poll(q) if hasattr(item, "num_rows"))
    engine.close_source("S")
    results += sum(item.num_rows for item in engine.poll(q) if hasattr(item, "num_rows"))
    return time.perf_counter() - began, peak, results


def run_join(rows: int, keys: int = 100_000) -> tuple[float, int]:
    """Q5-8 shape: Main1 [RANGE 3 min], Main2 [RANGE 2 min] on srcIP = destIP.

    Each input carries 1 tuple per ms of ts (20% delayed up to 2 s), so a tuple meets about
    300 000 / ``keys`` tuples of the other side; returns (seconds, output pairs).
    """
    engine = Engine()
    schema = {"srcIP": "int64", "destIP": "int64", "ts": "int64"}
    engine.create_stream("Main1", schema, progressing="ts")
    engine.create_stream("Main2", schema, progressing="ts")
    q = engine.register_query(
        "SELECT Main1.srcIP, Main2.destIP, Main2.ts FROM Main1 [RANGE 3 minutes, WA ts], "
        "Main2 [RANGE 2 minutes, WA ts] WHERE Main1.srcIP = Main2.destIP",
        name="j",
    )
    rng = np.random.default_rng(3)
    per_side = rows // 2
    sides = []
    for _ in range(2):
        arrival = np.arange(per_side, dtype=np.int64)
        delayed = rng.random(per_side) < 0.2
        ts = arrival - np.where(delayed, rng.integers(0, MAX_DELAY_MS, per_side), 0)
        sides.append((rng.integers(0, keys, per_side), rng.integers(0, keys, per_side), ts))
    pairs = 0
    began = time.perf_counter()
    for start in range(0, per_side, BATCH):
        stop = min(start + BATCH, per_side)
        for name, (src, dst, ts) in zip(("Main1", "Main2"), sides, strict=True):
            engine.push(name, {"srcIP": src[start:stop], "destIP": dst[start:stop], "ts": ts[start:stop]})
            engine.punctuate(name, stop - 1 - MAX_DELAY_MS)
        pairs += sum(item.num_rows for item in engine.poll(q) if hasattr(item, "num_rows"))
    return time.perf_counter() - began, pairs


@nb.njit(cache=True)
def _dense_tumbling_count(
    key: npt.NDArray[np.int64], ts: npt.NDArray[np.int64], out: npt.NDArray[np.int64]
) -> None:
    for i in range(key.shape[0]):
        out[(ts[i] // 1000) % out.shape[0], key[i]] += 1


def baseline(load: Workload, keys: int) -> float:
    out = np.zeros((8, keys), np.int64)
    cols = [(np.asarray(b["k"]), np.asarray(b["ts"])) for b in load.batches]
    began = time.perf_counter()
    for key, ts in cols:
        _dense_tumbling_count(key, ts, out)
    return time.perf_counter() - began


def median_of(runs: int, fn: Callable[..., float]) -> float:
    return statistics.median(fn() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1M rows, 1 run: a smoke run")
    args = parser.parse_args()
    rows, runs = (1_000_000, 1) if args.quick else (args.rows, args.runs)
    shapes = {
        "Q6-7 tumbling 1s sum": "SELECT k, sum(len) [RANGE 1 second, SLIDE 1 second, WA ts] FROM S "
        "GROUP BY k",
        "Q6-3 sliding 10s/1s count": "SELECT k, count(*) [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S "
        "GROUP BY k",
    }
    print(f"rows={rows:,} batch={BATCH:,} delayed=20% up to {MAX_DELAY_MS} ms, median of {runs} run(s)")
    print(f"{'shape':28} {'keys':>12} {'Mtuples/s':>10} {'vs dense':>9} {'peak state':>12} {'10x rows':>12}")
    for keys, strings in ((1_000, False), (100_000, False), (1_000, True)):
        load = workload(rows, keys, strings)
        dense = workload(rows, keys, False)
        base = None if strings else median_of(runs, lambda dense=dense, keys=keys: baseline(dense, keys))
        for label, sql in shapes.items():
            timings = [run_query(sql, load, strings) for _ in range(runs)]
            seconds = statistics.median(t for t, _, _ in timings)
            peak = max(p for _, p, _ in timings)
            ratio = f"{base / seconds:8.2f}x" if base else "       -"
            long_peak = ""
            if keys == 1_000 and not strings and not args.quick:
                _, long_peak_bytes, _ = run_query(sql, workload(rows * 10, keys, strings), strings)
                long_peak = f"{long_peak_bytes / 1e6:9.1f} MB"
            kind = f"{keys:,} {'str' if strings else 'int'}"
            print(
                f"{label:28} {kind:>12} {load.rows / seconds / 1e6:10.1f} {ratio} "
                f"{peak / 1e6:9.1f} MB {long_peak:>12}"
            )
    join_rows = rows // 2
    joins = [run_join(join_rows) for _ in range(runs)]
    seconds = statistics.median(t for t, _ in joins)
    print(
        f"{'Q5-8 band join 3min/2min':28} {'100,000 int':>12} {join_rows / seconds / 1e6:10.1f} "
        f"input tuples/s, {joins[0][1] / seconds / 1e6:.1f}M pairs/s"
    )


if __name__ == "__main__":
    main()
