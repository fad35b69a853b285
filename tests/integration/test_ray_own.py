"""Servers on a Ray cluster (docs/ray.md): what the cluster's failures do to them.

Without a state directory, a worker actor that dies takes the queries that had state on it
(their subscribers end ``ABORTED``, saying why) and the server goes on, the actor placed again.
A cluster that goes away stops the server: its log says why in one line, subscribers end
``UNAVAILABLE`` with that reason, and so does every call after; stopping, it starts no Ray
instance of its own (a placement still being attempted ends before Ray shuts down).

A server told to give up placing a worker (``restart_max_attempts``) stops with one line, and
its state directory needs no repair: started again on a cluster with room, it goes on with
every window exactly once. ``--ray local`` keeps every listener of its private cluster on
127.0.0.1 (the kernel's socket tables of the server's process tree), even without the test
suite's own setting that keeps Ray there, and writes no token into the user's home.

The first and the third run on the session's cluster (``ray_cluster``); the second starts a
one-node cluster of its own and shuts it down under the server. (test_ray_churn.py: node losses
close together.)
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
from pathlib import Path

import grpc
import pytest
from ray.cluster_utils import Cluster
from ray_harness import LOOPBACK, join_nodes, listening, loopback, loopback_cluster, process_tree
from server_harness import Server, processes, running_server, start_server, wait_for
from thesis import PACKET
from wire import (
    CLOSE,
    Mirror,
    Subscription,
    assert_same,
    connect,
    failure_of,
    packets,
    rows,
    schedule,
    table,
)

from lowtide import END_OF_STREAM
from lowtide.clients import Client
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ray")]

T0 = 1_700_000_000_000 // 60_000 * 60_000
MINUTE = 60_000
GROUPED = "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM {s} GROUP BY srcIP"


def placements(server: Server) -> list[tuple[int, int]]:
    """(worker, pid) of every placement the server's log reports, in order."""
    log = server.stderr.read_text()
    line = r"^lowtide: worker (\d+) \(lowtide-worker-\d+\) (?:placed again )?on .*, pid (\d+)(?:;.*)?$"
    found = re.findall(line, log, re.MULTILINE)
    return [(int(worker), int(pid)) for worker, pid in found]


def running_query(server: Server, name: str) -> tuple[Mirror, Subscription]:
    """A grouped query over a stream ``S``, subscribed, with five minutes of results out."""
    mirror = Mirror(connect(server.target))
    mirror.create_stream("S", sources=["p"])
    query = mirror.register(GROUPED.format(s="S"), name)
    subscription = Subscription(mirror.stub, query, from_oldest=True)
    mirror.ingest("S", "p", [table(packets(random.Random(5), 200, T0, T0 + 5 * MINUTE)), T0 + 5 * MINUTE])
    assert_same(subscription.reach(mirror.results(query)), mirror.results(query), query)
    return mirror, subscription


def test_without_a_state_directory_a_dead_actor_aborts_its_queries_and_the_server_goes_on(
    ray_cluster: Cluster,
) -> None:
    with running_server("--ray", ray_cluster.address, workers=1, metrics=False) as server:
        mirror, subscription = running_query(server, "lost")
        [(_, pid)] = placements(server)
        os.kill(pid, signal.SIGKILL)  # the actor's process, as the kernel's OOM killer would
        ended = subscription.end(timeout=60)
        assert ended.code == grpc.StatusCode.ABORTED, ended
        assert "worker" in ended.reason and "\n" not in ended.reason, ended
        wait_for("the actor placed again", lambda: len(placements(server)) == 2, 60.0, server.stderr_tail)
        assert placements(server)[1][1] != pid
        said = "lowtide: worker 0 started again, empty (no --state-dir): lost ABORTED"
        assert said in server.stderr.read_text(), server.stderr_tail()
        # The server goes on: a query registered now runs on the actor placed again.
        mirror.create_stream("T", sources=["p"])
        fresh = mirror.register(GROUPED.format(s="T"), "fresh")
        fresh_subscription = Subscription(mirror.stub, fresh, from_oldest=True)
        mirror.ingest("T", "p", [table(packets(random.Random(6), 200, T0, T0 + 5 * MINUTE)), CLOSE])
        expected = mirror.results(fresh)
        assert rows(expected)
        assert_same(fresh_subscription.until(END_OF_STREAM), expected, fresh)


def test_a_cluster_that_goes_away_stops_the_server_saying_why() -> None:
    cluster = loopback_cluster(head_cpus=1)
    address = cluster.address  # the cluster forgets it when it shuts down
    server = start_server("--ray", address, workers=1, metrics=False)
    try:
        mirror, subscription = running_query(server, "q")
        cluster.shutdown()
        assert server.process.wait(60) == 1
        server.exit_code = 1  # stopped on its own, as it should
        why = f"the Ray cluster at {address} is gone (connection refused for 5 s)"
        said = [line for line in server.stderr.read_text().splitlines() if line.startswith("lowtide: ")]
        assert said[-1] == f"lowtide: {why}; stopping", server.stderr_tail()  # Ray's own lines may follow
        assert "Started a local Ray instance" not in server.stderr.read_text(), server.stderr_tail()
        ended = subscription.end(timeout=10)
        assert (ended.code, ended.reason) == (grpc.StatusCode.UNAVAILABLE, f"the server stops: {why}")
        with pytest.raises(grpc.RpcError) as raised:
            mirror.stub.Health(pb.HealthRequest(), timeout=10)
        assert failure_of(raised.value).code == grpc.StatusCode.UNAVAILABLE
    finally:
        if server.process.poll() is None:  # the test failed: leave nothing running
            server.process.kill()
        cluster.shutdown()


def test_a_server_told_to_give_up_stops_in_one_line_and_starts_again_whole(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    """Two workers of 2 CPUs, one on each node; one node goes and nothing has room for its
    worker: after two attempts of 2 s the server stops, saying so. A node joins; the server
    started again on the same state directory restores every query and its results, and with
    the rest of the input the subscriber sees every window exactly once."""
    settings = {
        "state_dir": str(tmp_path / "state"),
        "checkpoint_interval_s": 0.3,
        "restart_max_attempts": 2,
        "restart_attempt_timeout_s": 2.0,
        "restart_initial_backoff_s": 0.5,
    }
    options = ("--ray", ray_cluster.address, "--worker-cpus", "2")
    server = start_server(*options, workers=2, metrics=False, config=settings)
    rnd = random.Random(21)
    calls = schedule({("S", "p"): packets(rnd, 400, T0, T0 + 20 * MINUTE)}, rnd, {"S": PACKET})
    half = len(calls) // 2
    try:
        mirror = Mirror(connect(server.target))
        mirror.create_stream("S", sources=["p"])
        query = mirror.register(GROUPED.format(s="S"), "kept")
        for call in calls[: half // 2]:
            mirror.ingest(*call)
        server.await_checkpoint()
        for call in calls[half // 2 : half]:  # after the checkpoint: the log's
            mirror.ingest(*call)
        (prefix,) = re.findall(
            r"^lowtide: worker 1 .* on Ray node \S+ \((\w+)\)", server.stderr.read_text(), re.M
        )
        lost = next(n for n in ray_cluster.worker_nodes if n.node_id.startswith(prefix))
        ray_cluster.remove_node(lost)
        assert server.process.wait(120) == 1
        server.exit_code = 1  # stopped on its own, as it should
        said = [line for line in server.stderr.read_text().splitlines() if line.startswith("lowtide: ")]
        gave_up = (
            r"lowtide: worker 1 cannot be placed on the Ray cluster: 2 attempts failed in a row "
            r"\(restart_max_attempts\), the last: .+; stopping"
        )
        assert re.fullmatch(gave_up, said[-1]), server.stderr_tail()
    finally:
        if server.process.poll() is None:  # the test failed: leave nothing running
            server.process.kill()
        join_nodes(ray_cluster, 2)  # two nodes again, for the tests after
    del settings["restart_max_attempts"]
    with running_server(*options, workers=2, metrics=False, config=settings) as again:
        mirror.stub = connect(again.target)
        subscription = Subscription(mirror.stub, query, from_oldest=True)
        for call in calls[half:]:
            mirror.ingest(*call)
        expected = mirror.results(query)
        assert rows(expected)
        assert_same(subscription.until(END_OF_STREAM), expected, query)


def test_ray_local_listens_on_loopback_only_and_keeps_its_token_out_of_home(tmp_path: Path) -> None:
    # Without the suite's own setting (tests/conftest.py) and with a home of its own: the
    # server alone must keep its private cluster on loopback and its token in its environment.
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": None,
        "RAY_AUTH_TOKEN": None,
        "RAY_ADDRESS": None,
        "HOME": str(tmp_path),
    }
    with running_server("--ray", "local", workers=2, metrics=False, env=env) as server:
        running_query(server, "private")
        found = listening(process_tree(server.pid))
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for _, _, pid in found}
        assert {"gcs_server", "raylet"} <= names, found  # Ray's own listeners are among those read
        assert [(a, port, pid) for a, port, pid in found if not loopback(a)] == []
        with Client(server.target, timeout=30) as client:
            assert {w["node"] for w in client.list_workers()} == {LOOPBACK}
    assert not (tmp_path / ".ray").exists()


def test_ray_local_starts_its_cluster_again_when_the_raylet_ends_as_it_starts() -> None:
    # Ray 2.60's raylet may abort as it starts (ray-project/ray#58964). Here the first raylet the
    # server starts is killed once it has lived 2.5 s, always before the server's driver joins
    # (at 4.5 s): after it registered on this machine, before on a slower one (then Ray gives up
    # at 30 s); the server undoes that start either way and serves from the second. SIGKILL, not
    # SIGABRT: the real abort comes in the first second, and its 3 s alarm would here end past
    # the check.
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_first_raylet, args=(b"--ray local", 2.5, killed, stop))
    killer.start()
    try:
        with running_server("--ray", "local", workers=2, metrics=False) as server:
            stop.set()
            killer.join()
            assert len(killed) == 1
            log = server.stderr.read_text()
            # The killed raylet is named in a retry line (beside any process Ray's own abort took).
            retries = [
                line for line in log.splitlines() if "of the private Ray cluster ended as it started" in line
            ]
            assert any("raylet exit -9" in line or "raylet, before" in line for line in retries), log
            assert "starting the cluster again, attempt 2 of 5" in log, log
            running_query(server, "again")
            tree = process_tree(server.pid)
            programs = [
                cmdline.split(b" ", 1)[0].rsplit(b"/", 1)[-1]
                for pid, (_, _, cmdline) in processes().items()
                if pid in tree
            ]
            # The first start undone: one control service and one raylet, the second start's.
            assert programs.count(b"gcs_server") == 1 and programs.count(b"raylet") == 1, programs
            assert killed[0] not in tree
            with Client(server.target, timeout=30) as client:
                assert {w["node"] for w in client.list_workers()} == {LOOPBACK}
    finally:
        stop.set()
        killer.join()


def kill_first_raylet(server_marker: bytes, age_s: float, killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first raylet whose parent's command line holds ``server_marker`` once it has
    lived ``age_s`` (its start time in /proc), unless ``stop`` is set first."""
    tick = os.sysconf("SC_CLK_TCK")
    while not stop.is_set():
        found = processes()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        for pid, (parent, started, cmdline) in found.items():
            if not cmdline.split(b" ", 1)[0].endswith(b"/raylet"):
                continue
            if server_marker in found.get(parent, (0, 0, b""))[2] and uptime - started / tick >= age_s:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        stop.wait(0.05)  # polled: a process's age has no event to wait for
