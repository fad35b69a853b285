"""The engine demo: three disordered, skewed links through Meld into Q1-2, Q6-8 and Q8-1.

Links Main1, Main2 and Control carry packets with band disorder (20% of packets up to 2 s late),
time skew (Main2 runs 4 s behind) and a lull (Control is silent for 20 s but keeps punctuating).
Every link also feeds the multi-source stream Main (one source per link), whose progress is the
minimum over its sources. Results print as punctuation closes each window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from rich.console import Console

from lowtide.engine import Engine
from lowtide.punctuation.model import Punctuation

SCHEMA = {
    "srcIP": "string",
    "srcPort": "int32",
    "destIP": "string",
    "destPort": "int32",
    "len": "int32",
    "ts": "timestamp[ms]",
}
LINKS = ("Main1", "Main2", "Control")
QUERIES = {
    "Q1-2": "SELECT count(*) AS packets [RANGE 1 minute, SLIDE 1 minute, WA ts] "
    "FROM Control UNION Main1 UNION Main2",
    "Q6-8": "SELECT srcIP, count(*) AS packets [RANGE 10 sec, SLIDE 1 sec, WA ts] "
    "FROM (Main2 UNION (Main1 UNION Control)) GROUP BY srcIP",
    "Q8-1": "SELECT srcIP, destIP, count(*) AS packets [RANGE 1 minute, SLIDE 1 minute, WA ts] "
    "FROM Main GROUP BY srcIP, destIP",
}
BATCH_MS = 250
MAX_DELAY_MS = 2_000
SKEW_MS = {"Main1": 0, "Main2": 4_000, "Control": 0}
START_MS = 1_700_000_000_000


@dataclass
class LinkTick:
    """One link's ``BATCH_MS`` of arrival time: its batch (None in a lull), then its punctuation."""

    link: str
    batch: dict[str, Any] | None
    punctuation: int


def link_ticks(link: str, seconds: int, rate: int) -> Iterator[LinkTick]:
    """One link's traffic: a batch per ``BATCH_MS`` of arrival time, each with its punctuation."""
    rng = np.random.default_rng(LINKS.index(link) + 1)
    hosts = pa.array([f"10.0.{i // 250}.{i % 250}" for i in range(2_000)])
    popularity = 1.0 / np.arange(1, 2_001) ** 0.9  # a few heavy sources, a long tail
    popularity /= popularity.sum()
    per_batch = rate * BATCH_MS // 1000
    for arrival in range(START_MS, START_MS + seconds * 1000, BATCH_MS):
        now = arrival - SKEW_MS[link]
        lull = link == "Control" and START_MS + 30_000 <= arrival < START_MS + 50_000
        batch = None
        if not lull:
            base = now + rng.integers(0, BATCH_MS, per_batch)
            delay = np.where(rng.random(per_batch) < 0.2, rng.integers(0, MAX_DELAY_MS, per_batch), 0)
            batch = {
                "srcIP": pa.DictionaryArray.from_arrays(rng.choice(2_000, per_batch, p=popularity), hosts),
                "srcPort": rng.integers(1024, 65535, per_batch).astype(np.int32),
                "destIP": pa.DictionaryArray.from_arrays(rng.integers(0, 50, per_batch), hosts),
                "destPort": rng.choice(np.array([53, 80, 443], np.int32), per_batch),
                "len": rng.integers(40, 1500, per_batch).astype(np.int32),
                "ts": base - delay,
            }
        yield LinkTick(link, batch, now + BATCH_MS - MAX_DELAY_MS)


def packets(seconds: int, rate: int) -> Iterator[LinkTick]:
    """The three links interleaved tick by tick, as they would reach one process."""
    for ticks in zip(*(link_ticks(link, seconds, rate) for link in LINKS), strict=True):
        yield from ticks


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000))


def show(console: Console, name: str, table: pa.Table) -> int:
    """Print one line per window of a result table; returns the number of windows."""
    rows = table.to_pylist()
    windows: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        windows.setdefault(int(row["window_start"]), []).append(row)
    for start, group in sorted(windows.items()):
        end = int(group[0]["window_end"])
        total = sum(int(r["packets"]) for r in group)
        top = max(group, key=lambda r: int(r["packets"]))
        key = ", ".join(str(top[c]) for c in ("srcIP", "destIP") if c in top)
        detail = f"{len(group):5} groups, top {key} = {top['packets']}" if key else ""
        console.print(f"[bold]{name}[/] [{_clock(start)}, {_clock(end)})  packets={total:<8} {detail}")
    return len(windows)


def declare(target: Any, console: Console) -> None:
    """The demo's streams and queries, on an Engine or a Client (they take the same calls)."""
    for link in LINKS:
        target.create_stream(link, SCHEMA, progressing="ts", sources=["link"])
    target.create_stream("Main", SCHEMA, progressing="ts", sources=list(LINKS))
    for name, sql in QUERIES.items():
        target.register_query(sql, name=name)
        console.print(f"[dim]{name}: {sql}[/]")
    console.print(f"[dim]{target.explain(QUERIES['Q6-8'])}[/]")


def run(seconds: int = 120, rate: int = 20_000, console: Console | None = None) -> dict[str, float]:
    console = console or Console()
    engine = Engine()
    declare(engine, console)
    tuples = windows = 0
    peak = 0
    began = time.perf_counter()

    def drain() -> None:
        nonlocal windows
        for name in QUERIES:
            for item in engine.poll(name):
                if not isinstance(item, Punctuation):
                    windows += show(console, name, item)

    for tick in packets(seconds, rate):
        if tick.batch is not None:
            engine.push(tick.link, tick.batch, source="link")
            engine.push("Main", tick.batch, source=tick.link)
            tuples += 2 * len(tick.batch["ts"])
        engine.punctuate(tick.link, tick.punctuation, source="link")
        engine.punctuate("Main", tick.punctuation, source=tick.link)
        if tick.link == LINKS[-1]:
            drain()
            peak = max(peak, sum(engine.state_bytes(name) for name in QUERIES))
    for link in LINKS:
        engine.close_source(link, "link")
        engine.close_source("Main", link)
    drain()
    elapsed = time.perf_counter() - began
    late = sum(q["late_tuples"] for q in engine.list_queries())
    summary = {
        "tuples": tuples,
        "seconds": elapsed,
        "tuples_per_s": tuples / elapsed,
        "windows": windows,
        "late": late,
        "peak_state_bytes": peak,
    }
    console.print(
        f"\n[bold green]done[/]: {tuples:,} tuples in {elapsed:.1f} s = "
        f"{tuples / elapsed / 1e6:.1f}M tuples/s, "
        f"{windows} windows, {late} late tuples, peak state {peak / 1e6:.1f} MB"
    )
    return summary
