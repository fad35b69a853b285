"""The product demo: a real server, three producer processes, live results, the server's metrics.

Starts ``lowtide serve`` on free loopback ports, creates the links Main1, Main2 and Control and the
multi-source stream Main (one source per link), registers Q1-2, Q6-8 and Q8-1, and streams the
links from three producer processes (band disorder, time skew, a lull on Control, as in
:mod:`lowtide.clients.demos.in_process`). Results print as punctuation closes windows, each
window once (the rows of all workers, gathered up to the punctuation that follows them). The
summary counts the tuples the server acknowledged to the producers and reads the server's
Prometheus exposition for punctuation-to-result latency, peak state and late tuples.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from lowtide.clients import Client
from lowtide.clients.cli.io import Collated
from lowtide.clients.demos.in_process import LINKS, QUERIES, declare, link_ticks, show
from lowtide.punctuation.model import END_OF_STREAM, Punctuation

_READY = re.compile(r"serving on (\S+) with \d+ workers; metrics on (\S+)")


def _produce(target: str, link: str, seconds: int, rate: int, acknowledged: Any) -> None:
    """A producer process: one link's traffic to its own stream and to Main. Puts on
    ``acknowledged`` (a multiprocessing queue) ``(link, sent, applied)``: the tuples it sent and
    those the server acknowledged as applied (the producers' close() answers, once all is in)."""
    sent = 0
    with Client(target) as client:
        own = client.producer(link, source="link", linger_ms=20)
        main = client.producer("Main", source=link, linger_ms=20)
        for tick in link_ticks(link, seconds, rate):
            if tick.batch is not None:
                table = pa.table(tick.batch)
                own.send(table)
                main.send(table)
                sent += 2 * table.num_rows
            own.punctuate(tick.punctuation)
            main.punctuate(tick.punctuation)
        applied = own.close().tuples + main.close().tuples
    acknowledged.put((link, sent, applied))


def _subscribe(target: str, name: str, out: queue.Queue[tuple[str, Any]]) -> None:
    with Client(target) as client:
        for item in client.subscribe(name):
            out.put((name, item))
            if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                break
    out.put((name, None))


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """A quantile from cumulative histogram buckets ``(upper bound, count)``, interpolated."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (bound - lower) * share
        lower, below = bound, count
    return lower


@contextlib.contextmanager
def local_server(workers: int = 2) -> Iterator[tuple[str, str]]:
    """``lowtide serve`` on free loopback ports for the length of the block: (target, metrics URL)."""
    command = [sys.executable, "-m", "lowtide.clients.cli", "serve", "--port", "0", "--metrics-port", "0"]
    server = subprocess.Popen([*command, "--workers", str(workers)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        ready = _READY.search(server.stdout.readline())
        if ready is None:
            raise RuntimeError("the server did not start")
        yield ready.group(1), ready.group(2)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def run(
    seconds: int = 60, rate: int = 50_000, workers: int = 2, console: Console | None = None
) -> dict[str, float]:
    console = console or Console()
    with local_server(workers) as (target, metrics_url):
        console.print(f"[bold]server[/] on {target}, metrics at {metrics_url}")
        return _drive(target, metrics_url, seconds, rate, console)


def _drive(target: str, metrics_url: str, seconds: int, rate: int, console: Console) -> dict[str, float]:
    with Client(target) as client:
        declare(client, console)
    results: queue.Queue[tuple[str, Any]] = queue.Queue()
    listeners = [threading.Thread(target=_subscribe, args=(target, n, results), daemon=True) for n in QUERIES]
    for listener in listeners:
        listener.start()
    time.sleep(0.2)  # subscriptions are live before the first window can close
    ctx = mp.get_context("spawn")
    acknowledged = ctx.Queue()
    producers = [
        ctx.Process(target=_produce, args=(target, link, seconds, rate, acknowledged)) for link in LINKS
    ]
    began = time.perf_counter()
    for producer in producers:
        producer.start()
    windows, open_queries, peak_state = 0, len(QUERIES), 0.0
    held = {name: Collated() for name in QUERIES}  # each worker's rows, whole at the punctuation
    last_scrape = 0.0
    while open_queries:
        try:
            name, item = results.get(timeout=0.25)
        except queue.Empty:
            name, item = "", False
        if item is None:
            open_queries -= 1
        elif isinstance(item, pa.Table):
            table = held[name].add(item)
            if table is not None:  # early results (none in the demo's queries)
                windows += show(console, name, table)
        elif isinstance(item, Punctuation):
            table = held[name].release(item)
            if table is not None:
                windows += show(console, name, table)
        if time.perf_counter() - last_scrape > 0.5:
            last_scrape = time.perf_counter()
            state = _scrape(metrics_url).get("lowtide_state_bytes", [])
            peak_state = max(peak_state, sum(value for _, value in state))
    elapsed = time.perf_counter() - began
    # What the server acknowledged, not lowtide_ingested_tuples_total: the front refreshes that
    # snapshot of its workers' counters once a second, so a scrape at the end misses the last one.
    counts = [acknowledged.get(timeout=60) for _ in producers]
    for producer in producers:
        producer.join()
    sent = sum(c[1] for c in counts)
    tuples = sum(c[2] for c in counts)
    samples = _scrape(metrics_url)
    late = sum(v for _, v in samples.get("lowtide_query_late_tuples_total", []))
    buckets: dict[float, float] = {}
    for labels, value in samples.get("lowtide_punctuation_to_result_seconds_bucket", []):
        bound = float(labels["le"])
        buckets[bound] = buckets.get(bound, 0.0) + value
    p50, p99 = (_quantile(list(buckets.items()), q) for q in (0.5, 0.99))
    summary = {
        "sent": sent,
        "tuples": tuples,
        "seconds": elapsed,
        "tuples_per_s": tuples / elapsed,
        "windows": windows,
        "late": late,
        "latency_p50_s": p50,
        "latency_p99_s": p99,
        "peak_state_bytes": peak_state,
    }
    console.print(
        f"\n[bold green]done[/]: {tuples:,} tuples acknowledged by the server (of {sent:,} sent) in "
        f"{elapsed:.1f} s = {tuples / elapsed / 1e6:.2f}M tuples/s through the server, {windows} windows, "
        f"{late:.0f} late tuples, peak state {peak_state / 1e6:.1f} MB; metrics were at {metrics_url}\n"
        f"punctuation-to-result latency p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms: the server's "
        f"histogram, from a punctuation's arrival at the front to its windows' results leaving. The "
        f"producers here send as fast as they can, so each punctuation waits behind the batches queued "
        f"before it: the figure measures that backlog, which varies from run to run with how far the "
        f"producers get ahead of the workers. bench/peers.py and bench/e2e.py pace their producers below "
        f"the server's throughput and measure the latency of the windows themselves (docs/benchmarks.md, "
        f'"End to end, and against Spark and Flink").'
    )
    return summary
