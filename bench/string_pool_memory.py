"""What strings and small queries cost in memory, at the front and in each worker (issue 30, item 7).

Three measurements, each the growth of resident memory without file and shared-memory pages
(``RssAnon`` from /proc: the worker channels' segments left out):

* *the pool in-process*: ``--strings`` new short strings (``host-<n>``, 16 ASCII characters)
  coded into a front's pool 100,000 at a time, as batches apply; against what the pool charges
  its streams for them (``lowtide.strings.cost``: the string object plus ``ENTRY_BYTES``);
* *a server, strings*: one stream ``S(k string, ts int64)``, one query reading ``k``
  (``SELECT count(*) ... WHERE k != 'none'``), the same strings ingested: the front's and each
  worker's growth;
* *a server, queries*: ``--queries`` small queries ``SELECT port, count(*) [RANGE 10, WA ts] FROM
  P GROUP BY port`` and one 1,000-row batch whose ports spread over 65,000 values: each worker's
  growth, and what the queries report as state (``lowtide_state_bytes``).

    python bench/string_pool_memory.py [--strings 2000000] [--queries 1000] [--workers 2]

Prints a table and writes ``bench/results/string_pool_memory.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import urllib.request
from pathlib import Path

import e2e
import numpy as np
import pyarrow as pa

from lowtide.clients import Client
from lowtide.strings import ENTRY_BYTES, StringPool

RESULTS = Path(__file__).resolve().parent / "results"
CHUNK = 100_000
MIB = 1 << 20


def anon(pid: int | str = "self") -> int:
    """RssAnon of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no RssAnon for {pid}")


def strings(chunk: int) -> pa.Array:
    return pa.array([f"host-{chunk:02d}-{i:08d}" for i in range(CHUNK)])


def in_process(n: int) -> tuple[float, float]:
    """Bytes a string takes in a front's pool, and what the pool charges for it."""
    chunks = [strings(c) for c in range(n // CHUNK)]
    gc.collect()
    before = anon()
    pool = StringPool(mirrored=True)
    for chunk in chunks:
        pool.encode({"k": chunk}, "S")
        pool.take_unsent()  # the workers' share, sent
    gc.collect()
    return (anon() - before) / n, pool.bytes / n


def worker_pids(front: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == front and b"spawn_main" in cmdline:
                found.append(int(entry.name))
    return sorted(found)


def state_bytes(metrics: str) -> int:
    with urllib.request.urlopen(metrics, timeout=10) as response:
        text = response.read().decode()
    return int(
        sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("lowtide_state_bytes{"))
    )


def on_server_strings(n: int, workers: int) -> tuple[float, list[float]]:
    """MiB the front and each worker grow by with ``n`` new strings a query reads."""
    server = e2e.Server.start(workers)
    try:
        with Client(server.target, timeout=600) as client:
            client.create_stream("S", {"k": "string", "ts": "int64"})
            client.register_query("SELECT count(*) AS n [RANGE 10, WA ts] FROM S WHERE k != 'none'", name="q")
            with client.producer("S", linger_ms=0) as producer:
                producer.send({"k": ["warm"], "ts": [0]})
            time.sleep(1)
            front, pids = server.process.pid, worker_pids(server.process.pid)
            before = [anon(pid) for pid in [front, *pids]]
            with client.producer("S", linger_ms=0, max_batch_rows=CHUNK) as producer:
                for chunk in range(n // CHUNK):
                    producer.send({"k": strings(chunk), "ts": np.full(CHUNK, chunk % 10, np.int64)})
                producer.punctuate(10)
            for _ in client.subscribe("q", from_oldest=True):
                break  # the window's result: every worker has taken every batch
            after = [anon(pid) for pid in [front, *pids]]
    finally:
        server.stop()
    grown = [(a - b) / MIB for a, b in zip(after, before, strict=True)]
    return grown[0], grown[1:]


def on_server_queries(queries: int, workers: int) -> tuple[list[float], float]:
    """MiB each worker grows by with ``queries`` small queries and one 1,000-row batch; and the
    state bytes the queries report, per query."""
    server = e2e.Server.start(workers)
    try:
        with Client(server.target, timeout=600) as client:
            client.create_stream("P", {"port": "int64", "ts": "int64"})
            sql = "SELECT port, count(*) AS n{} [RANGE 10, WA ts] FROM P GROUP BY port"
            client.register_query(sql.format("warm"), name="warm")
            batch = {"port": np.arange(1000, dtype=np.int64) * 65, "ts": np.arange(1000, dtype=np.int64) % 10}
            with client.producer("P", linger_ms=0) as producer:
                producer.send(batch)
            time.sleep(1)
            pids = worker_pids(server.process.pid)
            before = [anon(pid) for pid in pids]
            for i in range(queries):
                client.register_query(sql.format(i), name=f"q{i}")
            with client.producer("P", linger_ms=0) as producer:
                producer.send(batch)
                producer.punctuate(5)
            time.sleep(3)  # workers report their state every second
            after = [anon(pid) for pid in pids]
            reported = state_bytes(server.metrics) / (queries + 1)
    finally:
        server.stop()
    return [(a - b) / MIB for a, b in zip(after, before, strict=True)], reported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strings", type=int, default=2_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    real, charged = in_process(args.strings)
    front, grown = on_server_strings(args.strings, args.workers)
    per_query, reported = on_server_queries(args.queries, args.workers)
    lines = [
        "| measurement | figure |",
        "| --- | --- |",
        f"| pool in-process, {args.strings:,} strings of 16 ASCII characters | {real:.0f} B a string "
        f"(charged {charged:.0f}: object + {ENTRY_BYTES}) |",
        f"| server, the same strings: front | +{front:.0f} MiB ({front * MIB / args.strings:.0f} B each) |",
        f"| server, the same strings: each worker | {', '.join(f'+{g:.0f}' for g in grown)} MiB |",
        f"| server, {args.queries:,} small queries + one 1,000-row batch: each worker | "
        f"{', '.join(f'+{g:.0f} MiB ({g * 1024 / args.queries:.0f} KiB a query)' for g in per_query)} |",
        f"| ... state the queries report | {reported / 1024:.0f} KiB a query (both workers) |",
    ]
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "string_pool_memory.md").write_text(
        f"# String pool and query memory\n\n`python bench/string_pool_memory.py --strings {args.strings} "
        f"--queries {args.queries} --workers {args.workers}` ({os.cpu_count()} cores)\n\n"
        + "\n".join(lines)
        + "\n"
    )


if __name__ == "__main__":
    main()
