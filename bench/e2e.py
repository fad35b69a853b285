"""End-to-end benchmark: producer processes -> ``lowtide serve`` (2 workers) -> a subscriber.

Shape (issue 3): Q6-3, ``SELECT k, count(*) [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S
GROUP BY k`` over ``S(k int64, ts int64)`` (ts in ms), 1,000 keys (and 10,000: the latency floor
is stated at 10k groups per window), 20% of tuples delayed uniformly up to 2 s, 10k-row batches,
each followed by that source's punctuation ``last arrival - 2 s`` (so no tuple is late). Event
time runs at 100k tuples per second over all producers, so a window closes every 10 batches.

Processes (multiprocessing, spawn): the server (``lowtide serve --port 0 --workers 2
--metrics-port 0``, a fresh one per run, warmed up by a small run of the same query so numba has
compiled before the clock starts), 1-3 producers, each its own declared source of ``S``, and one
subscriber (``Client.subscribe(q, from_oldest=True)``: nothing is missed however late it
connects). Producers build their whole workload as Arrow IPC bytes before the start signal and
send it through the raw gRPC stub (``--path producer`` sends the same tables through
``Client.producer`` instead, to measure the client's batching path).

Figures (median of ``--runs``):

* end-to-end tuples/s: all tuples / (start signal -> the subscriber receives the output
  punctuation that covers the last window), so it includes draining the workers and results.
* ingest tuples/s: all tuples / (start signal -> the last producer's call is answered).
* punctuation-to-result latency: for each window end ``E`` (multiple of 1 s) that some input
  punctuation crosses, ``in(E)`` is when the *last* source handed gRPC a punctuation ``>= E`` (the
  stream's progress is the minimum over its sources, so only then can ``E`` close), and
  ``out(E)`` is when the subscriber received the output punctuation this releases: the
  aggregate publishes the first window end still open, so ``window_end >= E + 1 s`` (it follows
  ``E``'s result rows). Latency = ``out(E) - in(E)``; both clocks are CLOCK_MONOTONIC,
  shared by every process of the machine. Windows released only by the final close are skipped.
  At full speed this includes queueing: the punctuation waits behind the batches already in
  the sockets and the front's queues. So latency is also measured with the producers paced
  below saturation (``--paced-rate``, 10k keys: the floor's 10k groups per window), and the
  server's own histogram (``lowtide_punctuation_to_result_seconds``, from the punctuation's
  arrival at the front to the result leaving it; bucket bounds) is shown beside it.
* peak RSS (VmHWM from /proc/<pid>/status) of every process: the server front, each process
  under it (workers, the multiprocessing resource tracker), each producer (its prebuilt workload
  included), the subscriber.
* the in-process engine (``lowtide.Engine``) on the same batches in this process, as a ratio.

    python bench/e2e.py [--rows 20000000] [--runs 3] [--producers 1,2,3] [--keys 1000,10000]
                        [--path raw|producer] [--paced-rate 2000000] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

BATCH = 10_000
RATE_PER_MS = 100  # event time: 100k tuples per second over all producers
MAX_DELAY_MS = 2_000
SLIDE_MS, RANGE_MS = 1_000, 10_000
QUERY = "SELECT k, count(*) [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM {stream} GROUP BY k"
SCHEMA = {"k": "int64", "ts": "int64"}
READY = re.compile(r"^lowtide serving on (\S+):(\d+) with (\d+) workers; metrics on (\S+)$")
BUCKET = re.compile(
    r'^lowtide_punctuation_to_result_seconds_bucket\{(?=[^}]*query="q")(?=[^}]*le="([^"]+)")[^}]*\} (\S+)$'
)
FLOOR_TUPLES_S = 5_000_000
FLOOR_P99_MS = 50.0


# -- workload -------------------------------------------------------------------------------------
@dataclass
class Share:
    """One producer's batches (columns) and the punctuation after each."""

    keys: list[np.ndarray[Any, Any]]
    ts: list[np.ndarray[Any, Any]]
    punctuation: list[int]

    @property
    def rows(self) -> int:
        return sum(len(t) for t in self.ts)

    def tables(self) -> list[pa.Table]:
        return [pa.table({"k": k, "ts": t}) for k, t in zip(self.keys, self.ts, strict=True)]


def share(rows: int, keys: int, index: int, producers: int, seed: int = 11) -> Share:
    """Producer ``index`` of ``producers``: every ``producers``-th tuple of one global timeline."""
    rng = np.random.default_rng(seed * 1000 + index)
    mine = rows // producers
    out = Share([], [], [])
    for start in range(0, mine, BATCH):
        n = min(BATCH, mine - start)
        arrival = ((start + np.arange(n, dtype=np.int64)) * producers + index) // RATE_PER_MS
        delayed = rng.random(n) < 0.2
        out.ts.append(arrival - np.where(delayed, rng.integers(0, MAX_DELAY_MS, n), 0))
        out.keys.append(rng.integers(0, keys, n, dtype=np.int64))
        out.punctuation.append(int(arrival[-1]) - MAX_DELAY_MS)
    return out


def final_window_end(rows: int) -> int:
    """The end of the last window holding the last tuple: the subscriber stops there."""
    last_arrival = (rows - 1) // RATE_PER_MS
    return last_arrival // SLIDE_MS * SLIDE_MS + RANGE_MS


def peak_rss_mb(pid: int | str = "self") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# -- processes ------------------------------------------------------------------------------------
def producer_main(
    target: str,
    stream: str,
    index: int,
    producers: int,
    rows: int,
    keys: int,
    path: str,
    rate: float,
    start: Any,
    out: Any,
) -> None:
    """Build this source's batches, wait for the start, send them (at ``rate`` tuples/s if > 0)."""
    import grpc

    from lowtide.clients import Client
    from lowtide.clients._wire import CHANNEL_OPTIONS, arrow_bytes
    from lowtide.proto import lowtide_pb2 as pb
    from lowtide.proto import lowtide_pb2_grpc as pb_grpc

    source = f"p{index}"
    work = share(rows, keys, index, producers)
    tables = work.tables()
    messages: list[Any] = []
    if path == "raw":
        for number, (table, p) in enumerate(zip(tables, work.punctuation, strict=True)):
            header: dict[str, Any] = {"stream": stream, "source": source} if number == 0 else {}
            messages.append(pb.IngestRequest(arrow=arrow_bytes([table]), **header))
            messages.append(pb.IngestRequest(punctuation=p))
        messages.append(pb.IngestRequest(close=True))
    sent: list[tuple[int, float]] = []
    seconds_per_batch = BATCH * producers / rate if rate > 0 else 0.0
    out.put(("ready", index))
    start.wait()
    began = time.monotonic()

    def pace(batch: int) -> None:
        if seconds_per_batch:
            time.sleep(max(0.0, began + batch * seconds_per_batch - time.monotonic()))

    if path == "raw":

        def requests() -> Iterator[Any]:
            for number, message in enumerate(messages):
                if message.WhichOneof("item") == "punctuation":
                    sent.append((message.punctuation, time.monotonic()))
                elif message.WhichOneof("item") == "arrow":
                    pace(number // 2)
                yield message

        with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            pb_grpc.LowtideStub(channel).Ingest(requests())
    else:
        with (
            Client(target) as client,
            client.producer(stream, source=source, linger_ms=5, max_batch_rows=BATCH) as producer,
        ):
            for number, (table, p) in enumerate(zip(tables, work.punctuation, strict=True)):
                pace(number)
                producer.send(table)
                producer.punctuate(p)
                sent.append((p, time.monotonic()))
            producer.close()
    out.put(("producer", index, time.monotonic(), sent, peak_rss_mb()))


def subscriber_main(target: str, query: str, final: int, out: Any) -> None:
    from lowtide import Punctuation
    from lowtide.clients import Client

    received: list[tuple[int, float]] = []
    rows = 0
    with Client(target) as client:
        out.put(("ready", -1))
        with client.subscribe(query, from_oldest=True) as subscription:
            for item in subscription:
                if isinstance(item, Punctuation):
                    received.append((item.value, time.monotonic()))
                    if item.value >= final:
                        break
                else:
                    rows += item.num_rows
    out.put(("subscriber", rows, received, peak_rss_mb()))


@dataclass
class Server:
    process: subprocess.Popen[str]
    target: str
    metrics: str

    @staticmethod
    def start(workers: int = 2, serve: Sequence[str] = ()) -> Server:
        """``serve``: more ``lowtide serve`` options (``--ray ADDRESS``: bench/cluster.py)."""
        script = Path(sys.executable).with_name("lowtide")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "lowtide.clients.cli"]
        command += [
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--workers",
            str(workers),
            "--metrics-port",
            "0",
            *serve,
        ]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = process.stdout.readline() if process.stdout else ""
        match = READY.match(line.strip())
        if match is None:
            process.kill()
            raise SystemExit(f"lowtide serve did not start: {line!r}")
        return Server(process, f"{match.group(1)}:{match.group(2)}", match.group(4))

    def latency_quantiles_ms(self, *quantiles: float) -> list[float]:
        """The server's own punctuation-to-result histogram of query q: each quantile's bucket bound."""
        try:
            with urllib.request.urlopen(self.metrics, timeout=10) as response:
                text = response.read().decode()
        except (OSError, ValueError):
            return [float("nan")] * len(quantiles)
        buckets = sorted(
            (float(m.group(1)), float(m.group(2))) for m in map(BUCKET.match, text.splitlines()) if m
        )
        total = buckets[-1][1] if buckets else 0.0
        out = []
        for q in quantiles:
            bound = next((le for le, count in buckets if total and count >= q * total), float("nan"))
            out.append(bound * 1000)
        return out

    def tree_rss_mb(self) -> dict[str, float]:
        """Peak RSS of the front and of every process below it, by role."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    parent = int(stat.rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry.name))
        out = {"front": peak_rss_mb(self.process.pid)}
        todo = list(children.get(self.process.pid, []))
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            role = "tracker" if "resource_tracker" in cmdline else "worker"
            out[f"{role} {pid}"] = peak_rss_mb(pid)
        return out

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


# -- one run --------------------------------------------------------------------------------------
@dataclass
class Run:
    e2e_tuples_s: float
    ingest_tuples_s: float
    latencies_ms: list[float]
    result_rows: int
    server_p50_p99_ms: list[float]
    rss_mb: dict[str, float] = field(default_factory=dict)

    def p(self, q: float) -> float:
        """Percentile ``q`` of this run's latencies (ms)."""
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


def warm_up(target: str, keys: int) -> None:
    """Compile the workers' kernels for this query before the clock starts."""
    from lowtide import Punctuation
    from lowtide.clients import Client

    with Client(target, timeout=60) as client:
        client.create_stream("Warm", SCHEMA)
        query = client.register_query(QUERY.format(stream="Warm"), name="warm")
        work = share(200_000, keys, 0, 1)
        with client.producer("Warm", max_batch_rows=BATCH) as producer:
            for table, p in zip(work.tables(), work.punctuation, strict=True):
                producer.send(table)
                producer.punctuate(p)
            producer.close()
        with client.subscribe(query, from_oldest=True) as subscription:
            for item in subscription:
                if isinstance(item, Punctuation) and item.value >= final_window_end(200_000):
                    break
        client.drop_query(query)
        client.drop_stream("Warm")


def run_once(
    rows: int, keys: int, producers: int, path: str, rate: float = 0.0, serve: Sequence[str] = ()
) -> Run:
    from lowtide.clients import Client

    ctx = mp.get_context("spawn")
    server = Server.start(serve=serve)
    try:
        warm_up(server.target, keys)
        sources = [f"p{i}" for i in range(producers)]
        with Client(server.target, timeout=60) as client:
            client.create_stream("S", SCHEMA, sources=sources)
            query = client.register_query(QUERY.format(stream="S"), name="q")
        out = ctx.Queue()
        start = ctx.Event()
        final = final_window_end(rows // producers * producers)
        procs = [ctx.Process(target=subscriber_main, args=(server.target, str(query), final, out))]
        procs += [
            ctx.Process(
                target=producer_main,
                args=(server.target, "S", i, producers, rows, keys, path, rate, start, out),
            )
            for i in range(producers)
        ]
        for proc in procs:
            proc.start()
        for _ in procs:
            kind, _index = out.get(timeout=600)[:2]
            assert kind == "ready"
        time.sleep(0.5)  # the subscription reaches the server; from_oldest covers any race anyway
        began = time.monotonic()
        start.set()
        reports = [out.get(timeout=1800) for _ in procs]
        rss = server.tree_rss_mb()
        server_latency = server.latency_quantiles_ms(0.5, 0.99)
        with Client(server.target, timeout=60) as client:
            info = next(s for s in client.list_streams() if s["name"] == "S")
        for proc in procs:
            proc.join(60)
    finally:
        code = server.stop()
    if code != 0:
        print(f"warning: the server exited {code} on SIGTERM", file=sys.stderr)
    total = rows // producers * producers
    if info["tuples_ingested"] != total or info["late_tuples"]:
        raise SystemExit(f"server ingested {info['tuples_ingested']} of {total}, {info['late_tuples']} late")
    producer_reports = [r for r in reports if r[0] == "producer"]
    _, result_rows, received, subscriber_rss = next(r for r in reports if r[0] == "subscriber")
    ended = max(r[2] for r in producer_reports)
    last_out = received[-1][1]
    latencies = _latencies([r[3] for r in producer_reports], received)
    for _, index, _, _, producer_rss in producer_reports:
        rss[f"producer {index}"] = producer_rss
    rss["subscriber"] = subscriber_rss
    return Run(
        total / (last_out - began), total / (ended - began), latencies, result_rows, server_latency, rss
    )


def _latencies(
    sent_by_source: list[list[tuple[int, float]]], received: list[tuple[int, float]]
) -> list[float]:
    """Latency per window end crossed by input punctuation (see the module docstring).

    Input punctuation ``p`` closes every window ending at or before ``p``, and the aggregate then
    publishes output punctuation at the first window end still open, ``(p // SLIDE + 1) * SLIDE``.
    So when the last source crosses ``E``, the output punctuation to wait for is ``E + SLIDE``.
    """
    crossed: list[dict[int, float]] = []  # per source: window end -> when its punctuation covered it
    for sent in sent_by_source:
        mine: dict[int, float] = {}
        covered = sent[0][0] if sent else 0
        for value, at in sent[1:]:
            for end in range((covered // SLIDE_MS + 1) * SLIDE_MS, value + 1, SLIDE_MS):
                mine[end] = at
            covered = max(covered, value)
        crossed.append(mine)
    values = np.array([v for v, _ in received], dtype=np.int64)
    out: list[float] = []
    for end in sorted(set.intersection(*(set(m) for m in crossed))):
        released = max(m[end] for m in crossed)  # the last source to cover ``end`` lets it close
        i = int(np.searchsorted(values, end + SLIDE_MS))
        if i < len(received):
            out.append((received[i][1] - released) * 1000)
    return out


def in_process_engine(rows: int, keys: int, producers: int) -> float:
    """The same batches through ``lowtide.Engine`` in this process: tuples/s."""
    from lowtide import Engine

    if rows > 200_000:
        in_process_engine(200_000, keys, producers)  # numba compiles outside the clock
    shares = [share(rows, keys, i, producers) for i in range(producers)]
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=[f"p{i}" for i in range(producers)])
    query = engine.register_query(QUERY.format(stream="S"), name="q")
    began = time.perf_counter()
    for number in range(len(shares[0].ts)):
        for i, work in enumerate(shares):
            engine.push("S", {"k": work.keys[number], "ts": work.ts[number]}, source=f"p{i}")
            engine.punctuate("S", work.punctuation[number], source=f"p{i}")
        engine.poll(query)
    for i in range(producers):
        engine.close_source("S", f"p{i}")
    engine.poll(query)
    return sum(w.rows for w in shares) / (time.perf_counter() - began)


# -- report ---------------------------------------------------------------------------------------
def _rss_summary(runs: list[Run]) -> str:
    def med(prefix: str) -> float:
        values = [max((v for k, v in r.rss_mb.items() if k.startswith(prefix)), default=0.0) for r in runs]
        return statistics.median(values)

    workers = statistics.median(
        sum(v for k, v in r.rss_mb.items() if k.startswith("worker"))
        / max(1, sum(k.startswith("worker") for k in r.rss_mb))
        for r in runs
    )
    return (
        f"front {med('front'):.0f}, workers {workers:.0f} each (max {med('worker'):.0f}), "
        f"tracker {med('tracker'):.0f}, producer max {med('producer'):.0f}, "
        f"subscriber {med('subscriber'):.0f}"
    )


def _row(label: str, keys: int, producers: int, done: list[Run], engine: float | None) -> str:
    e2e = statistics.median(r.e2e_tuples_s for r in done)
    ingest = statistics.median(r.ingest_tuples_s for r in done)
    s50 = statistics.median(r.server_p50_p99_ms[0] for r in done)
    s99 = statistics.median(r.server_p50_p99_ms[1] for r in done)
    engine_mt = f"{engine / 1e6:11.2f}" if engine else f"{'-':>11}"
    ratio = f"{e2e / engine:10.2f}" if engine else f"{'-':>10}"
    return (
        f"{label:>6} {keys:>6} {producers:>4} {e2e / 1e6:9.2f} {ingest / 1e6:11.2f} "
        f"{engine_mt} {ratio} {_p(done, 50):7.1f} {_p(done, 99):7.1f} "
        f"{f'<={s50:g}/<={s99:g}':>14} {len(done[0].latencies_ms):>7} {done[0].result_rows:>11,}\n"
        f"{'':>19}peak RSS MB: {_rss_summary(done)}"
    )


def _p(done: list[Run], q: float) -> float:
    return statistics.median(r.p(q) for r in done)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000_000, help="tuples per run over all producers")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--producers", default="1,2,3", help="producer counts to run, comma-separated")
    parser.add_argument("--keys", default="1000,10000", help="key counts to run, comma-separated")
    parser.add_argument("--path", choices=("raw", "producer"), default="raw")
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=2_000_000,
        help="also measure latency with producers paced to this many tuples/s in all, at 10k keys (0: off)",
    )
    parser.add_argument("--quick", action="store_true", help="2M rows, 1 run, 1 and 3 producers, 1,000 keys")
    args = parser.parse_args()
    rows, runs = (2_000_000, 1) if args.quick else (args.rows, args.runs)
    producer_counts = [1, 3] if args.quick else [int(p) for p in args.producers.split(",")]
    key_counts = [1000] if args.quick else [int(k) for k in args.keys.split(",")]
    paced_rows = min(rows, int(args.paced_rate * 5))  # about 5 s of sending per paced run
    print(
        f"rows={rows:,} batch={BATCH:,} delayed=20% up to {MAX_DELAY_MS} ms, event rate "
        f"{RATE_PER_MS * 1000:,}/s, path={args.path}, {os.cpu_count()} cores, median of {runs} run(s); "
        f"paced runs: {paced_rows:,} rows at {args.paced_rate / 1e6:g}M tuples/s"
    )
    print(
        f"{'rate':>6} {'keys':>6} {'prod':>4} {'e2e Mt/s':>9} {'ingest Mt/s':>11} {'engine Mt/s':>11} "
        f"{'e2e/engine':>10} {'p50 ms':>7} {'p99 ms':>7} {'server p50/p99':>14} {'windows':>7} "
        f"{'result rows':>11}"
    )
    best: tuple[float, int, int] = (0.0, 0, 0)
    paced_p99: list[tuple[int, int, float]] = []
    for keys in key_counts:
        for producers in producer_counts:
            done = [run_once(rows, keys, producers, args.path) for _ in range(runs)]
            engine = statistics.median(in_process_engine(rows, keys, producers) for _ in range(runs))
            print(_row("max", keys, producers, done, engine), flush=True)
            best = max(best, (statistics.median(r.e2e_tuples_s for r in done), producers, keys))
        if keys >= 10_000 and args.paced_rate > 0 and not args.quick:
            for producers in producer_counts:
                done = [
                    run_once(paced_rows, keys, producers, args.path, args.paced_rate) for _ in range(runs)
                ]
                print(_row(f"{args.paced_rate / 1e6:g}M", keys, producers, done, None), flush=True)
                paced_p99.append((keys, producers, _p(done, 99)))
    print(
        f"floor e2e >= {FLOOR_TUPLES_S / 1e6:.0f}M tuples/s: best {best[0] / 1e6:.2f}M "
        f"({best[1]} producers, {best[2]:,} keys) = {best[0] / FLOOR_TUPLES_S:.2f}x the floor"
    )
    for keys, producers, p99 in paced_p99:
        print(
            f"floor p99 <= {FLOOR_P99_MS:.0f} ms at {keys:,} groups/window, {producers} producers paced at "
            f"{args.paced_rate / 1e6:g}M tuples/s: {p99:.1f} ms = {p99 / FLOOR_P99_MS:.2f}x the floor"
        )


if __name__ == "__main__":
    main()
