"""A Ray cluster that churns (docs/ray.md, "When a worker's actor dies"), walked in order on one
server: two node losses 3 s apart with a node joining between (the second while the first
worker has nowhere to go yet), a node lost while a checkpoint is being taken, a node lost while
the workers still restore from the loss before, and the head node's worker lost.

The cluster is the module's own, every node on 127.0.0.1: a head and two nodes of 1 CPU each,
so the three worker actors (1 CPU each) sit one on every node, and nodes join as the tests
remove others. The server keeps a state directory and checkpoints every 0.3 s. Each test feeds
a stream and query of its own the same calls as the in-process engine, and its subscriber must
see every window exactly once; the server's log says how long each placement and recovery
took. The test process stays out of this cluster (the session's ``ray_cluster`` may hold it as a
driver): it reads each worker's node and pid from the server's log, and holds a worker still
with SIGSTOP where a test needs a step not to end before the next (the checkpoint a stopped
worker has not answered stays open; the restore it has not made keeps the recovery going).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster
from ray_harness import join_at_once, join_nodes, loopback_cluster, outlived_start
from server_harness import Server, running_server, wait_for
from thesis import PACKET
from wire import Mirror, Subscription, assert_same, connect, packets, rows, schedule

from lowtide import END_OF_STREAM

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ray")]

T0 = 1_700_000_000_000 // 60_000 * 60_000
SPAN = 20 * 60_000
SQL = (
    "SELECT srcIP, sum(len) AS bytes, count(*) AS n [RANGE 2 minutes, SLIDE 1 minute, WA ts] FROM {s} "
    "GROUP BY srcIP"
)
PLACED = re.compile(  # a worker's placement, as the server logs it: its node's id (8 digits) and pid
    r"^lowtide: worker (\d+) \(lowtide-worker-\d+\) (?:placed again )?on Ray node \S+ \((\w+)\), pid (\d+)",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    churned = loopback_cluster(head_cpus=1, nodes=2, node_cpus=1)
    try:
        yield churned
    finally:
        churned.shutdown()


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("churn")


@pytest.fixture(scope="module")
def server(cluster: Cluster, state_dir: Path) -> Iterator[Server]:
    config = {
        "state_dir": str(state_dir),
        "checkpoint_interval_s": 0.3,
        "restart_initial_backoff_s": 0.5,
        "restart_attempt_timeout_s": 10.0,
    }
    with running_server("--ray", cluster.address, workers=3, config=config) as running:
        yield running


def where(server: Server) -> dict[int, tuple[str, int]]:
    """Each worker's node id (its first 8 digits, as the log gives it) and pid, as last placed."""
    return {int(w): (node, int(pid)) for w, node, pid in PLACED.findall(server.stderr.read_text())}


def node(cluster: Cluster, prefix: str, server: Server) -> Any:
    found = [n for n in [cluster.head_node, *cluster.worker_nodes] if n.node_id.startswith(prefix)]
    assert found, f"no node {prefix} in the cluster; the server's log:\n{server.stderr_tail(200)}"
    return found[0]


def head_worker(cluster: Cluster, at: dict[int, tuple[str, int]]) -> int:
    """The worker on the head node (it has room for one)."""
    (worker,) = [w for w, (prefix, _) in at.items() if cluster.head_node.node_id.startswith(prefix)]
    return worker


def placed_again(server: Server) -> int:
    return server.stderr.read_text().count("placed again on")


def await_placements(server: Server, count: int) -> None:
    wait_for(f"{count} placements", lambda: placed_again(server) >= count, 120.0, server.stderr_tail)


@dataclass
class Feed:
    """A stream and a grouped sliding query, a third of the calls before a checkpoint, a third
    after it (the log's), and the rest once the churn is over."""

    mirror: Mirror
    query: str
    subscription: Subscription
    calls: list[Any]

    @staticmethod
    def start(server: Server, name: str, seed: int) -> Feed:
        mirror = Mirror(connect(server.target))
        stream = name.upper()
        mirror.create_stream(stream, sources=["a", "b"])
        query = mirror.register(SQL.format(s=stream), name)
        subscription = Subscription(mirror.stub, query, from_oldest=True)
        rnd = random.Random(seed)
        data = {(stream, s): packets(rnd, 300, T0, T0 + SPAN) for s in ("a", "b")}
        calls = schedule(data, rnd, {stream: PACKET})
        feed = Feed(mirror, query, subscription, calls)
        third = len(calls) // 3
        feed.send(third)
        server.await_checkpoint()
        feed.send(third)
        return feed

    def send(self, count: int | None = None) -> None:
        count = len(self.calls) if count is None else count
        for call in self.calls[:count]:
            self.mirror.ingest(*call)
        del self.calls[:count]

    def finish(self) -> None:
        self.send()
        expected = self.mirror.results(self.query)
        assert rows(expected)
        assert_same(self.subscription.until(END_OF_STREAM), expected, self.query)


def recovery_lines(server: Server) -> list[str]:
    """The log's account of each placement and recovery (how long each took)."""
    said = server.stderr.read_text().splitlines()
    return [line for line in said if "placed again" in line or "recovered" in line]


def test_two_node_losses_three_seconds_apart_a_node_joining_between(cluster: Cluster, server: Server) -> None:
    """Worker a's node goes while the cluster has no free CPU: its placement waits. 3 s later a
    node of 2 CPUs joins and worker b's node goes too: both are placed on the new node."""
    feed = Feed.start(server, "apart", 11)
    at, before = where(server), placed_again(server)
    a, b = sorted(w for w in at if w != head_worker(cluster, at))
    cluster.remove_node(node(cluster, at[a][0], server))
    time.sleep(3.0)  # the scenario's own gap between the two losses, not a wait for an event
    # At once, not through join_nodes (which waits out a raylet's start): the scenario's timing.
    # If its raylet ended as it started (Ray's abort, ray_harness), another joins after b's loss.
    started = time.monotonic()
    joined = join_at_once(cluster, 2)
    cluster.remove_node(node(cluster, at[b][0], server))
    if not outlived_start(cluster, joined, started):
        (joined,) = join_nodes(cluster, 2)
    await_placements(server, before + 2)
    wait_for(
        "a and b on the node that joined",
        lambda: {where(server)[w][0] for w in (a, b)} == {joined.node_id[:8]},
        120.0,
        server.stderr_tail,
    )
    feed.finish()
    print("\n".join(recovery_lines(server)))


def checkpoints(state: Path, open_only: bool = False) -> set[str]:
    """The checkpoint directories in the state directory; ``open_only``: those begun and not
    written yet (no manifest: server/checkpoint_store.py)."""
    return {
        d.name
        for d in (state / "checkpoints").iterdir()
        if not (open_only and (d / "MANIFEST.json").exists())
    }


def test_a_node_lost_while_a_checkpoint_is_taken(cluster: Cluster, server: Server, state_dir: Path) -> None:
    """The head's worker is held stopped, so the checkpoint begun next cannot end; the node of
    the two other workers goes meanwhile. The checkpoint is abandoned (the log says so), the
    workers restore from the one before, and the stopped worker goes on where it was told to."""
    feed = Feed.start(server, "midcheckpoint", 12)
    at, before = where(server), placed_again(server)
    held = head_worker(cluster, at)
    others = {prefix for w, (prefix, _) in at.items() if w != held}
    before_stop = checkpoints(state_dir)
    os.kill(at[held][1], signal.SIGSTOP)
    try:
        feed.send(4)  # changes after the last checkpoint: the next one is due
        # One begun after the stop: the stopped worker never answers its barrier, so it stays open.
        wait_for(
            "a checkpoint begun",
            lambda: bool(checkpoints(state_dir, open_only=True) - before_stop),
            30.0,
            server.stderr_tail,
        )
        join_nodes(cluster, 1, count=2)
        for prefix in others:
            cluster.remove_node(node(cluster, prefix, server))
        await_placements(server, before + 2)
    finally:
        os.kill(at[held][1], signal.SIGCONT)
    feed.finish()
    abandoned = r"^lowtide: checkpoint \d+ abandoned: worker \d+ is restored from the one before$"
    assert re.search(abandoned, server.stderr.read_text(), re.MULTILINE), server.stderr_tail()


def test_a_node_lost_while_the_workers_restore_from_the_loss_before(cluster: Cluster, server: Server) -> None:
    """Worker x's node goes; once x is placed again every worker restores, but the head's worker
    is held stopped, so that restore cannot have ended when worker y's node goes as well."""
    feed = Feed.start(server, "midrecovery", 13)
    at, before = where(server), placed_again(server)
    held = head_worker(cluster, at)
    x, y = sorted(w for w in at if w != held)
    join_nodes(cluster, 1, count=2)
    os.kill(at[held][1], signal.SIGSTOP)
    try:
        cluster.remove_node(node(cluster, at[x][0], server))
        await_placements(server, before + 1)
        cluster.remove_node(node(cluster, at[y][0], server))
        await_placements(server, before + 2)
    finally:
        os.kill(at[held][1], signal.SIGCONT)
    feed.finish()
    assert where(server)[held] == at[held]  # held still, never lost


def test_the_head_nodes_worker_lost(cluster: Cluster, server: Server) -> None:
    feed = Feed.start(server, "headlost", 14)
    at, before = where(server), placed_again(server)
    held = head_worker(cluster, at)
    os.kill(at[held][1], signal.SIGKILL)  # as the kernel's OOM killer would
    await_placements(server, before + 1)
    assert where(server)[held][1] != at[held][1]
    feed.finish()
    lines = recovery_lines(server)
    print("\n".join(lines))
    took = r"; \d+\.\d s after it was lost, attempt \d+$"
    assert all(re.search(took, line) for line in lines if "placed again" in line), lines
