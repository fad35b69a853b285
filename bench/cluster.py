"""Workers on a Ray cluster against local worker processes (issue 24), same machine, same run.

1. Throughput and latency: the ``bench/e2e.py`` shape (Q6-3 over ``S(k, ts)``, 10k-row batches,
   20% of tuples delayed up to 2 s, raw gRPC producers, one subscriber; a fresh ``lowtide
   serve --workers 2`` per run, warmed up first) run once with local process workers and once
   with ``--ray ADDRESS``, alternating which goes first, for ``--rounds`` rounds. Each round
   also runs both paced (``--paced-rate`` tuples/s in all, 10,000 keys, as e2e's latency floor).
   Figures: medians over the rounds of end-to-end tuples/s, their ratio (Ray / local), and the
   paced punctuation-to-result p50 / p99 (e2e's definition: the last source's punctuation
   handed to gRPC -> the output punctuation it releases reaches the subscriber).
2. Recovery after a node loss, for each ``--state-mb`` size: a server with ``--ray`` and a
   ``--state-dir`` gets bench/checkpoints.py's query holding N groups open (filled until a
   checkpoint holds about that many MB), then a ticker producer on another stream sends a small
   batch and its punctuation every :data:`TICK_S`, each closing a one-second window of two
   subscribed queries (one grouped, spread over both workers; one global). Once a checkpoint has
   been taken while ticking, the node holding worker 1 is removed (``Cluster.remove_node``).
   Recovery time, per subscribed query: from that call to the end of the last silence of its
   output after it longer than :data:`OUTAGE_S` (the run goes on until each query has output of
   input sent after the server's log said the worker was placed again: then the recovery is
   over); the longest silence any subscriber saw beside it. With ``--two-losses`` (the smallest
   size): :data:`SECOND_LOSS_S` after the first removal a node joins and the node of worker 0 is
   removed too (a rack, a wave of spot reclaims), and recovery runs to the output of input sent
   after the last placement. Every worker starts over from the last checkpoint and the log
   (docs/ray.md), so the held state is restored before either ticker query moves again; the held
   query itself closes nothing within the hour its window spans.

The Ray side is a ``ray.cluster_utils.Cluster`` on 127.0.0.1: a head without CPUs (the GCS and
the front's driver) and two nodes of 2 CPUs (each worker reserves 1), like
tests/integration/test_ray.py: actors on nodes other than the driver's, so columns cross Ray's
object transfer between nodes as on a real cluster (on loopback). ``--ray local`` measures the
private one-node Ray that ``lowtide serve --ray local`` starts instead (throughput only: a node
loss needs a cluster).

    python bench/cluster.py [--rows 10000000] [--rounds 3] [--producers 2] [--keys 1000]
                            [--paced-rate 1000000] [--state-mb 10,1000] [--ray cluster|local]
                            [--skip throughput|recovery] [--two-losses] [--quick]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

# Every socket on loopback: Ray reads this as it is imported (tests/conftest.py does the same),
# and the servers started here inherit it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Ray's token authentication takes this token, rather than one it would write to ~/.ray.
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))

import numpy as np
import pyarrow as pa
from checkpoints import config as checkpoint_config
from checkpoints import fill_to, taken
from durability import Server
from e2e import Run, run_once

LOOPBACK = "127.0.0.1"
NODES, NODE_CPUS = 2, 2
TICK_S = 0.02  # wall time between ticker batches: the resolution of a recovery time
TICK_ROWS = 100
TICK_SCHEMA = {"k": "int64", "ts": "int64"}
TICK_QUERIES = {
    "tick_by_key": "SELECT k, count(*) AS n [RANGE 1 second, SLIDE 1 second, WA ts] FROM T GROUP BY k",
    "tick_all": "SELECT count(*) AS n [RANGE 1 second, SLIDE 1 second, WA ts] FROM T",
}
CHECKPOINT_S = 5.0  # checkpoint_interval_s of the recovery runs
OUTAGE_S = 0.5  # a silence of a ticker query this long is an outage's (it has output every TICK_S)
SECOND_LOSS_S = 3.0  # with --two-losses: the second node removed this long after the first
TARGET_RATIO, TARGET_P99_MS = 0.7, 20.0


@contextmanager
def ray_cluster() -> Iterator[Any]:
    """A head without CPUs and :data:`NODES` nodes, all on 127.0.0.1; this process its driver."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False},
    )
    try:
        for _ in range(NODES):
            cluster.add_node(num_cpus=NODE_CPUS, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        cluster.connect(namespace="lowtide")  # finds the worker actors by name (recovery)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


# -- 1. throughput and latency --------------------------------------------------------------------
@dataclass
class Side:
    name: str
    serve: list[str]
    full: list[Run]
    paced: list[Run]


def throughput(
    sides: list[Side], rounds: int, rows: int, keys: int, producers: int, paced_rate: float
) -> None:
    paced_rows = int(paced_rate * 5)  # about 5 s of sending per paced run
    for number in range(rounds):
        order = sides if number % 2 == 0 else sides[::-1]
        for side in order:
            side.full.append(run_once(rows, keys, producers, "raw", serve=side.serve))
            if paced_rate > 0:
                side.paced.append(run_once(paced_rows, 10_000, producers, "raw", paced_rate, side.serve))
            paced = f", paced p99 {side.paced[-1].p(99):.1f} ms" if side.paced else ""
            print(
                f"  round {number + 1} {side.name}: {side.full[-1].e2e_tuples_s / 1e6:.2f} M tuples/s{paced}",
                file=sys.stderr,
                flush=True,
            )


def throughput_table(sides: list[Side], paced_rate: float) -> list[str]:
    def med(runs: list[Run], q: float) -> float:
        return statistics.median(r.p(q) for r in runs) if runs else float("nan")

    lines = [
        f"| workers | e2e M tuples/s (rounds) | ingest M tuples/s "
        f"| paced {paced_rate / 1e6:g}M/s p50 / p99 ms | server's p99 bucket |",
        "|---|---|---|---|---|",
    ]
    for side in sides:
        e2e = statistics.median(r.e2e_tuples_s for r in side.full)
        each = ", ".join(f"{r.e2e_tuples_s / 1e6:.2f}" for r in side.full)
        ingest = statistics.median(r.ingest_tuples_s for r in side.full)
        server = statistics.median(r.server_p50_p99_ms[1] for r in side.paced) if side.paced else float("nan")
        lines.append(
            f"| {side.name} | {e2e / 1e6:.2f} ({each}) | {ingest / 1e6:.2f} | "
            f"{med(side.paced, 50):.1f} / {med(side.paced, 99):.1f} | <= {server:g} ms |"
        )
    local, ray = (statistics.median(r.e2e_tuples_s for r in s.full) for s in sides)
    p99 = med(sides[1].paced, 99)
    lines += [
        "",
        f"Ray / local end to end: {ray / local:.2f}x (target >= {TARGET_RATIO}x); paced p99 through Ray "
        f"{p99:.1f} ms (target <= {TARGET_P99_MS:g} ms).",
    ]
    return lines


# -- 2. recovery after a node loss ----------------------------------------------------------------
@dataclass
class Recovered:
    megabytes: int
    losses: int
    groups: int
    checkpoint_bytes: int
    resumed_s: dict[str, float]  # per subscribed query: node removed -> the end of its longest silence
    silence_s: float  # the longest gap between two outputs of any subscribed query around it
    remove_s: float  # how long Cluster.remove_node itself took
    second_s: float  # with two losses: the second node's removal, from the first's (0: one loss)


class Ticker:
    """Sends a batch of :data:`TICK_ROWS` tuples and its punctuation every :data:`TICK_S`, each
    moving event time one second (closing one window); remembers what it punctuated when."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.sent: list[tuple[int, float]] = []  # (punctuation, monotonic time handed over)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from lowtide.clients import Client

        with Client(self.target, timeout=600) as client, client.producer("T", source="t") as producer:
            second = 0
            while not self.stop.is_set():
                ts = second * 1000 + np.arange(TICK_ROWS, dtype=np.int64) * (1000 // TICK_ROWS)
                producer.send(pa.table({"k": np.arange(TICK_ROWS, dtype=np.int64) % 20, "ts": ts}))
                producer.punctuate((second + 1) * 1000)
                producer.flush()
                self.sent.append(((second + 1) * 1000, time.monotonic()))
                second += 1
                self.stop.wait(TICK_S)


class Listener:
    """A subscriber of one query: each output punctuation's value and arrival time."""

    def __init__(self, target: str, query: str) -> None:
        self.target = target
        self.query = query
        self.received: list[tuple[int, float]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from lowtide import Punctuation
        from lowtide.clients import Client

        with Client(self.target, timeout=600) as client, client.subscribe(self.query) as items:
            for item in items:
                if isinstance(item, Punctuation):
                    self.received.append((item.value, time.monotonic()))


def node_of(cluster: Any, worker: int) -> Any:
    import ray

    actor = ray.get_actor(f"lowtide-worker-{worker}", namespace="lowtide")
    node_id = ray.get(actor.where.remote(), timeout=60)[0]
    return next(n for n in cluster.worker_nodes if n.node_id == node_id)


def recovery(cluster: Any, megabytes: int, scratch: Path, losses: int = 1) -> Recovered:
    from lowtide.clients import Client

    state = Path(tempfile.mkdtemp(prefix=f"cluster-{megabytes}-", dir=scratch))
    settings = checkpoint_config(CHECKPOINT_S) + f'ray = "{cluster.address}"\n'
    running = Server.start(state, "no", scratch, settings)
    try:
        groups, whole = fill_to(running, megabytes, CHECKPOINT_S, state)
        with Client(running.target, timeout=600) as client:
            client.create_stream("T", TICK_SCHEMA, sources=["t"])
            for name, sql in TICK_QUERIES.items():
                client.register_query(sql, name=name)
        listeners = [Listener(running.target, name) for name in TICK_QUERIES]
        for listener in listeners:
            listener.thread.start()
        ticker = Ticker(running.target)
        ticker.thread.start()
        before = len(taken(running))
        deadline = time.monotonic() + 600
        while len(taken(running)) == before:  # a checkpoint of the ticks too: the log after it is short
            if time.monotonic() > deadline:
                raise RuntimeError(f"no checkpoint while ticking: {running.status()}")
            time.sleep(0.05)
        first, second = node_of(cluster, 1), node_of(cluster, 0)
        killed = time.monotonic()
        cluster.remove_node(first)
        removed = time.monotonic()
        second_s = 0.0
        if losses == 2:  # a node joins, and the node of worker 0 goes (with worker 1 if it went there)
            time.sleep(max(0.0, killed + SECOND_LOSS_S - time.monotonic()))
            cluster.add_node(num_cpus=NODE_CPUS, node_ip_address=LOOPBACK)
            second_s = time.monotonic() - killed
            cluster.remove_node(second)
        placements = 2 if losses == 2 else 1  # worker 0 and 1 each at least once
        while sum("placed again on" in line for line in list(running.stderr)) < placements:
            if time.monotonic() > killed + 600:
                raise RuntimeError(f"workers not placed again in 600 s: {running.status()}")
            time.sleep(0.01)
        placed = ticker.sent[-1][0]  # output past its window end comes of input sent after the placement
        while not all(any(value > placed + 1000 for value, _ in list(r.received)) for r in listeners):
            if time.monotonic() > killed + 600:
                raise RuntimeError(f"no output 600 s after the node loss: {running.status()}")
            time.sleep(0.01)
        ticker.stop.set()
        ticker.thread.join(60)
        resumed: dict[str, float] = {}
        for listener in listeners:  # the end of the last outage's silence, from the kill on
            times = [killed] + [at for _, at in listener.received if at > killed]
            gaps = [(a, b) for a, b in pairwise(times) if b - a >= OUTAGE_S] or [(killed, times[1])]
            resumed[listener.query] = gaps[-1][1] - killed
        silence = max(max(b - a for (_, a), (_, b) in pairwise(r.received)) for r in listeners)
        for line in list(running.stderr):  # the server's own account: each placement and recovery
            if "placed again" in line or "recovered" in line or "is gone" in line:
                print(f"    {line.strip()}", file=sys.stderr, flush=True)
        return Recovered(megabytes, losses, groups, whole.bytes, resumed, silence, removed - killed, second_s)
    finally:
        running.stop()
        shutil.rmtree(state, ignore_errors=True)
        if losses == 1:  # two nodes again for the next size (two losses added one already)
            cluster.add_node(num_cpus=NODE_CPUS, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()


def recovery_table(found: list[Recovered]) -> list[str]:
    lines = [
        "| nodes lost | held groups | checkpoint | first node removed -> output moving again, per query "
        "| longest silence | remove_node took |",
        "|---|---|---|---|---|---|",
    ]
    for r in found:
        each = ", ".join(f"{name} {s:.2f} s" for name, s in r.resumed_s.items())
        lost = "1" if r.losses == 1 else f"2, {r.second_s:.1f} s apart (a node joining between)"
        lines.append(
            f"| {lost} | {r.groups:,} | {r.checkpoint_bytes / 1e6:,.0f} MB | {each} | {r.silence_s:.2f} s | "
            f"{r.remove_s:.2f} s |"
        )
    return lines


# -- main -----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000, help="tuples per full-speed run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1000, help="keys of the full-speed runs")
    parser.add_argument(
        "--paced-rate", type=float, default=1_000_000, help="tuples/s of paced runs (0: none)"
    )
    parser.add_argument("--state-mb", default="10,1000", help="held state of the recovery runs, MB")
    parser.add_argument("--ray", choices=("cluster", "local"), default="cluster")
    parser.add_argument("--skip", choices=("throughput", "recovery"), action="append", default=[])
    parser.add_argument(
        "--two-losses",
        action="store_true",
        help=f"also two node losses {SECOND_LOSS_S:g} s apart, a node joining between (smallest size)",
    )
    parser.add_argument("--quick", action="store_true", help="1 round of 2M rows, 10 MB: about a minute")
    parser.add_argument("--scratch", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.rounds, args.paced_rate, args.state_mb = 2_000_000, 1, 200_000, "10"
    if args.ray == "local":
        args.skip.append("recovery")
    where = "a cluster on 127.0.0.1 (head + 2 nodes)" if args.ray == "cluster" else "local"
    print(
        f"{os.cpu_count()} cores; Ray {where}; "
        f"rows={args.rows:,}, {args.producers} producers, {args.keys:,} keys, {args.rounds} round(s)",
        flush=True,
    )
    scratch = Path(tempfile.mkdtemp(prefix="lowtide-cluster-", dir=args.scratch))
    try:
        with ray_cluster() if args.ray == "cluster" else _no_cluster() as cluster:
            address = cluster.address if cluster is not None else "local"
            if "throughput" not in args.skip:
                ray_side = Side(f"Ray ({args.ray})", ["--ray", address], [], [])
                sides = [Side("local processes", [], [], []), ray_side]
                throughput(sides, args.rounds, args.rows, args.keys, args.producers, args.paced_rate)
                print("\n".join(throughput_table(sides, args.paced_rate)), flush=True)
            if "recovery" not in args.skip:
                found = []
                sizes = [int(m) for m in args.state_mb.split(",") if m]
                runs = [(m, 1) for m in sizes] + ([(min(sizes), 2)] if args.two_losses else [])
                for megabytes, losses in runs:
                    found.append(recovery(cluster, megabytes, scratch, losses))
                    print(f"  recovery {megabytes} MB: {found[-1]}", file=sys.stderr, flush=True)
                print("\n".join(recovery_table(found)), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


@contextmanager
def _no_cluster() -> Iterator[Any]:
    yield None


if __name__ == "__main__":
    sys.exit(main())
