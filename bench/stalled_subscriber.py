"""Front RSS with and without a subscriber that never reads (issue 21, item 4;
docs/design.md, "Bounded memory").

One ``lowtide serve`` per run (``--workers``, the bounds from ``--max-subscriber-mib`` and
``--retained-mib``), warmed up by ``bench/e2e.py``'s small run so that no compile holds results
back into one burst, then one stream ``S(k int64, ts int64)`` and one sliding query,
``SELECT k, count(*) [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k``: every key
once per second of event time (``--keys`` tuples per second, in order), so each slide emits a
result table of ``--keys`` rows. A producer process sends ``--rows`` tuples in 10k-row batches,
each followed by punctuation, in one Ingest call; a subscriber in this process reads every result
to the end of the stream. The second run adds a raw ``Subscribe`` call that is never read until
the end: it must end with ``RESOURCE_EXHAUSTED`` once ``max_subscriber_bytes`` behind, and the
front's RSS (VmRSS from /proc, sampled every 0.2 s) must stay within the first run's plus that
bound.

    python bench/stalled_subscriber.py [--rows 8000000] [--keys 20000] [--workers 2]
    python bench/stalled_subscriber.py --rows 20000000      # the issue's figure

Prints one line per run and writes ``bench/results/stalled_subscriber.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import e2e
import grpc
import numpy as np
import pyarrow as pa

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client
from lowtide.clients._wire import CHANNEL_OPTIONS, arrow_bytes
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc

RESULTS = Path(__file__).resolve().parent / "results"
QUERY = "SELECT k, count(*) AS n [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k"
BATCH = 10_000
MIB = 1 << 20
ENDLESS = 30.0


def rss_mb(pid: int) -> tuple[float, float]:
    """VmRSS and RssAnon of ``pid`` in MiB: all it has resident, and without the pages of files
    and shared memory (the worker channels' segments count in the first only)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["RssAnon"].split()[0]) / 1024


def start(workers: int, max_subscriber_bytes: int, retained_bytes: int) -> e2e.Server:
    config = Path(tempfile.mkdtemp(prefix="lowtide-bench-")) / "lowtide.toml"
    config.write_text(f"max_subscriber_bytes = {max_subscriber_bytes}\nretained_bytes = {retained_bytes}\n")
    script = Path(sys.executable).with_name("lowtide")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "lowtide.clients.cli"]
    command += ["serve", "--config", str(config), "--host", "127.0.0.1", "--port", "0"]
    command += ["--workers", str(workers), "--metrics-port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline() if process.stdout else ""
    match = e2e.READY.match(line.strip())
    if match is None:
        process.kill()
        raise SystemExit(f"lowtide serve did not start: {line!r}")
    return e2e.Server(process, f"{match.group(1)}:{match.group(2)}", match.group(4))


def requests(rows: int, keys: int) -> Iterator[pb.IngestRequest]:
    """Every key once per second of event time (ts in ms), batch by batch, each punctuated."""
    yield pb.IngestRequest(stream="S", source="p")
    for first in range(0, rows, BATCH):
        n = min(BATCH, rows - first)
        index = first + np.arange(n, dtype=np.int64)
        ts = index * 1000 // keys
        table = pa.table({"k": index % keys, "ts": ts})
        yield pb.IngestRequest(arrow=arrow_bytes([table]))
        yield pb.IngestRequest(punctuation=int(ts[-1]))
    yield pb.IngestRequest(close=True)


def produce(target: str, rows: int, keys: int) -> None:
    """The producer, in a process of its own (the reader in this one keeps its core)."""
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        pb_grpc.LowtideStub(channel).Ingest(requests(rows, keys), timeout=3600)


@dataclass
class Run:
    stalled: bool
    seconds: float
    items: int
    result_mb: float
    rss_start_mb: float
    rss_peak_mb: float
    rss_end_mb: float
    anon_peak_mb: float
    stalled_end: str


def run_once(rows: int, keys: int, workers: int, limit: int, retained: int, stalled: bool) -> Run:
    server = start(workers, limit, retained)
    pid = server.process.pid
    try:
        e2e.warm_up(server.target, keys)
        with Client(server.target, timeout=60) as client:
            client.create_stream("S", e2e.SCHEMA, sources=["p"])
            client.register_query(QUERY, name="q")
        samples = [rss_mb(pid)]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                samples.append(rss_mb(pid))

        counted = {"items": 0, "bytes": 0}

        def read_all() -> None:
            with Client(server.target) as client, client.subscribe("q", from_oldest=True) as items:
                for item in items:
                    counted["items"] += 1
                    if isinstance(item, Punctuation):
                        if item.value >= END_OF_STREAM:
                            break
                    else:
                        counted["bytes"] += item.get_total_buffer_size()

        channel = grpc.insecure_channel(server.target, options=CHANNEL_OPTIONS)
        never_read = None
        if stalled:
            never_read = pb_grpc.LowtideStub(channel).Subscribe(
                pb.SubscribeRequest(query="q", from_oldest=True)
            )
        sampler, reader = threading.Thread(target=sample), threading.Thread(target=read_all)
        sampler.start()
        reader.start()
        began = time.monotonic()
        producer = mp.get_context("spawn").Process(target=produce, args=(server.target, rows, keys))
        producer.start()
        producer.join()
        reader.join()
        seconds = time.monotonic() - began
        done.set()
        sampler.join()
        samples.append(rss_mb(pid))
        end = "-"
        if never_read is not None:
            # Read it now; a server that never ended it (it kept everything) is cancelled after
            # ENDLESS seconds: the call then says CANCELLED.
            timer = threading.Timer(ENDLESS, never_read.cancel)
            timer.start()
            received = 0
            try:
                for _ in never_read:
                    received += 1
                end = f"read {received} items, then the call ended OK"
            except grpc.RpcError as exc:
                end = f"{received} items, then {exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
            timer.cancel()
        channel.close()
    finally:
        server.stop()
    resident = [rss for rss, _ in samples]
    return Run(
        stalled,
        seconds,
        counted["items"],
        counted["bytes"] / MIB,
        resident[0],
        max(resident),
        resident[-1],
        max(anon for _, anon in samples),
        end,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-subscriber-mib", type=int, default=64)
    parser.add_argument("--retained-mib", type=int, default=256)
    args = parser.parse_args()
    limit, retained = args.max_subscriber_mib * MIB, args.retained_mib * MIB
    head = (
        f"rows={args.rows:,} keys={args.keys:,} workers={args.workers} max_subscriber_bytes="
        f"{args.max_subscriber_mib} MiB retained_bytes={args.retained_mib} MiB; query: {QUERY}"
    )
    print(head)
    runs = [run_once(args.rows, args.keys, args.workers, limit, retained, s) for s in (False, True)]
    lines = [
        "| stalled subscriber | seconds | result items | result MiB | front VmRSS start | peak | end "
        "| RssAnon peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {'yes' if r.stalled else 'no'} | {r.seconds:.1f} | {r.items:,} | {r.result_mb:.0f} | "
            f"{r.rss_start_mb:.0f} MiB | {r.rss_peak_mb:.0f} MiB | {r.rss_end_mb:.0f} MiB | "
            f"{r.anon_peak_mb:.0f} MiB |"
        )
    without, with_stalled = runs
    extra = with_stalled.rss_peak_mb - without.rss_peak_mb
    extra_anon = with_stalled.anon_peak_mb - without.anon_peak_mb
    verdict = "within" if max(extra, extra_anon) <= args.max_subscriber_mib else "OVER"
    tail = [
        f"The stalled subscriber: {with_stalled.stalled_end}",
        f"Peak front VmRSS with it minus without: {extra:+.0f} MiB (RssAnon {extra_anon:+.0f} MiB), "
        f"{verdict} max_subscriber_bytes ({args.max_subscriber_mib} MiB).",
    ]
    text = "\n".join([head, "", *lines, "", *tail])
    print(text.split("\n", 2)[2])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stalled_subscriber.md").write_text(f"# bench/stalled_subscriber.py\n\n{text}\n")


if __name__ == "__main__":
    main()
