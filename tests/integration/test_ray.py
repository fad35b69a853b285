"""Workers as actors of a real Ray cluster (docs/ray.md): the session's (``ray_cluster``: a head
without CPUs and two nodes of 2 CPUs, every one on 127.0.0.1), and for the module a real
``lowtide serve --ray <address> --workers 2`` with a state directory.

The workers are actors named ``lowtide-worker-<i>`` in the namespace ``lowtide``, one on each
node (SPREAD: either node has room for both); tumbling, sliding (sharing slices), session,
holistic and join queries give what the in-process engine gives on the same disordered input;
an actor killed is placed again and restored from the state directory, its subscriber missing
nothing, and so are the actors of a node removed mid-stream, twice, with a node added between;
``lowtide workers`` and ``lowtide_worker_info`` say where each actor runs and how often it was
placed again. Without Ray installed, or with a cluster address that does not answer, the start
stops in one line. (test_ray_own.py: a cluster gone, no state directory; test_chaos.py: kills
through Ray.)
"""

from __future__ import annotations

import random
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster
from ray_harness import LOOPBACK, join_nodes
from server_harness import Server, lowtide_command, running_server, scrape, wait_for
from thesis import PACKET
from wire import Mirror, Subscription, assert_same, connect, packets, rows, schedule

from lowtide import END_OF_STREAM
from lowtide.clients import Client
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ray")]

T0 = 1_700_000_000_000 // 60_000 * 60_000
SPAN = 20 * 60_000  # 20 minutes of event time, in ms


@pytest.fixture(scope="module")
def server(ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = {"state_dir": str(tmp_path_factory.mktemp("state")), "checkpoint_interval_s": 1.0}
    with running_server("--ray", ray_cluster.address, workers=2, config=state) as running:
        yield running


@pytest.fixture
def mirror(server: Server) -> Mirror:
    assert server.alive(), server.stderr_tail()
    return Mirror(connect(server.target))


SERVE = ["serve", "--host", LOOPBACK, "--port", "0", "--metrics-port", "-1", "--workers", "1"]


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and done.stdout == "", done.stderr
    return lines[0]


def test_a_cluster_address_that_does_not_answer_stops_the_start_in_one_line() -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on once it is closed
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    command = [*lowtide_command(), *SERVE, "--ray", f"{LOOPBACK}:{port}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    line = one_line_failure(done)
    assert line == f"lowtide: cannot reach the Ray cluster at {LOOPBACK}:{port}: connection refused"


def test_without_ray_installed_the_start_says_which_extra_in_one_line() -> None:
    # None in sys.modules is how Python marks a module as absent: `import ray` fails as if it were.
    code = (
        "import sys; sys.modules['ray'] = None; from lowtide.clients.cli import main; "
        f"sys.exit(main({[*SERVE, '--ray', 'auto']!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert one_line_failure(done) == "lowtide: --ray needs Ray: pip install 'lowtide[ray]'"


def places() -> list[tuple[str, str, int]]:
    """(node id, node address, pid) of each worker actor, found by its name."""
    actors = [ray.get_actor(f"lowtide-worker-{i}", namespace="lowtide") for i in range(2)]
    return list(ray.get([actor.where.remote() for actor in actors], timeout=60))


def list_workers(server: Server) -> list[dict[str, Any]]:
    with Client(server.target, timeout=30) as client:
        return client.list_workers()


def test_the_workers_are_named_actors_spread_over_the_nodes(ray_cluster: Cluster, server: Server) -> None:
    found = places()
    assert {node for node, _, _ in found} == {node.node_id for node in ray_cluster.worker_nodes}
    assert {address for _, address, _ in found} == {LOOPBACK}
    log = server.stderr.read_text()
    for i, (_, _, pid) in enumerate(found):
        assert f"worker {i} (lowtide-worker-{i}) on Ray node {LOOPBACK}" in log, log
        assert f"pid {pid}" in log


def test_every_query_kind_gives_the_engines_results(mirror: Mirror) -> None:
    """Tumbling, sliding (sharing slices), session, holistic and join queries."""
    rnd = random.Random(24)
    mirror.create_stream("P", sources=["a", "b"])
    mirror.create_stream("L", sources=["x"])
    mirror.create_stream("R", sources=["y"])

    def sliding(minutes: int, by: bool = True) -> str:
        key, group = ("srcIP, ", " GROUP BY srcIP") if by else ("", "")
        aggs = "count(*) AS n, sum(len) AS bytes"
        return f"SELECT {key}{aggs} [RANGE {minutes} minutes, SLIDE 1 minute, WA ts] FROM P{group}"

    queries = [
        mirror.register(
            "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM P GROUP BY srcIP",
            "tumbling",
        ),
        mirror.register(sliding(5), "sliding_5"),
        mirror.register(sliding(10), "sliding_10"),
        mirror.register(sliding(4, by=False), "sliding_all"),
        mirror.register(
            "SELECT srcIP, count(*) AS n, max(len) AS top [SESSION 30 s, WA ts] FROM P GROUP BY srcIP",
            "session",
        ),
        mirror.register(
            "SELECT srcIP, median(len) AS mid, count_distinct(destIP) AS peers "
            "[RANGE 3 minutes, SLIDE 1 minute, WA ts] FROM P GROUP BY srcIP",
            "holistic",
        ),
        mirror.register(
            "SELECT L.srcIP, L.destIP, R.srcIP, R.destIP, R.ts FROM L, R "
            "[RANGE TUMBLING 5 minutes, WA ts] WHERE L.srcIP = R.destIP",
            "join",
        ),
    ]
    plan = mirror.stub.ExplainQuery(pb.ExplainQueryRequest(sql=sliding(8))).plan
    assert "shared with" in plan, plan  # the sliding queries read one set of slices
    subs = {q: Subscription(mirror.stub, q, from_oldest=True) for q in queries}
    data = {("P", s): packets(rnd, 300, T0, T0 + SPAN) for s in ("a", "b")}
    data[("L", "x")] = packets(rnd, 150, T0, T0 + SPAN)
    data[("R", "y")] = packets(rnd, 150, T0, T0 + SPAN)
    for call in schedule(data, rnd, {"P": PACKET, "L": PACKET, "R": PACKET}):
        mirror.ingest(*call)
    for name in queries:
        expected = mirror.results(name)
        assert rows(expected), name
        assert_same(subs[name].until(END_OF_STREAM), expected, name)


def placed_again(server: Server, more: int, since: int) -> None:
    """Wait until the log reports ``more`` placements after the first ``since``."""

    def placed() -> bool:
        return server.stderr.read_text().count("placed again on") >= since + more

    wait_for(f"{more} more placements", placed, 120.0, server.stderr_tail)


def test_a_killed_worker_actor_is_placed_again_and_restored(mirror: Mirror, server: Server) -> None:
    """With a state directory nothing is lost: the actor is created again under its name, every
    worker starts over from the last checkpoint (which the actors wrote) and the log, and the
    subscriber sees every window exactly once."""
    sql = "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM K GROUP BY srcIP"
    mirror.create_stream("K", sources=["a"])
    query = mirror.register(sql, "recovered")
    subscription = Subscription(mirror.stub, query, from_oldest=True)
    rnd = random.Random(7)
    calls = schedule({("K", "a"): packets(rnd, 400, T0, T0 + SPAN)}, rnd, {"K": PACKET})
    half = len(calls) // 2
    for call in calls[: half // 2]:
        mirror.ingest(*call)
    server.await_checkpoint()
    for call in calls[half // 2 : half]:  # after the checkpoint: the log has them
        mirror.ingest(*call)
    _, _, old_pid = places()[1]
    before = [w["restarts"] for w in list_workers(server)]
    placed = server.stderr.read_text().count("placed again on")
    ray.kill(ray.get_actor("lowtide-worker-1", namespace="lowtide"), no_restart=True)
    placed_again(server, 1, placed)
    assert places()[1][2] != old_pid
    after = list_workers(server)  # lowtide workers counts the restart, and shows the new process
    assert [w["restarts"] for w in after] == [before[0], before[1] + 1]
    assert after[1]["pid"] == places()[1][2]
    for call in calls[half:]:
        mirror.ingest(*call)
    expected = mirror.results(query)
    assert rows(expected)
    assert_same(subscription.until(END_OF_STREAM), expected, query)
    recovered = r"^lowtide: worker 1 recovered: every worker restored from checkpoint \d+ and \d+ logged"
    assert re.search(recovered, server.stderr.read_text(), re.MULTILINE), server.stderr_tail()


def test_two_nodes_lost_one_added_lose_nothing(ray_cluster: Cluster, mirror: Mirror, server: Server) -> None:
    """The node of worker 1 is removed mid-stream (with whatever else runs there): its actor is
    placed again on the node left and restored. A new node joins; then the node holding both
    workers is removed: they go to the new one. The subscriber sees every window exactly once."""
    sql = "SELECT srcIP, sum(len) AS bytes [RANGE 2 minutes, SLIDE 1 minute, WA ts] FROM N GROUP BY srcIP"
    mirror.create_stream("N", sources=["a", "b"])
    query = mirror.register(sql, "node_lost")
    subscription = Subscription(mirror.stub, query, from_oldest=True)
    rnd = random.Random(11)
    data = {("N", s): packets(rnd, 300, T0, T0 + SPAN) for s in ("a", "b")}
    calls = schedule(data, rnd, {"N": PACKET})
    third = len(calls) // 3

    def node_of(worker: int) -> Any:
        node_id = places()[worker][0]
        return next(node for node in ray_cluster.worker_nodes if node.node_id == node_id)

    for call in calls[:third]:
        mirror.ingest(*call)
    server.await_checkpoint()
    placed = server.stderr.read_text().count("placed again on")
    ray_cluster.remove_node(node_of(1))
    placed_again(server, 1, placed)
    assert len({node for node, _, _ in places()}) == 1  # both on the node left
    for call in calls[third : 2 * third]:
        mirror.ingest(*call)
    (added,) = join_nodes(ray_cluster, 2)
    ray_cluster.remove_node(node_of(0))  # both workers' node
    placed_again(server, 3, placed)
    assert {node for node, _, _ in places()} == {added.node_id}
    for call in calls[2 * third :]:
        mirror.ingest(*call)
    expected = mirror.results(query)
    assert rows(expected)
    assert_same(subscription.until(END_OF_STREAM), expected, query)
    join_nodes(ray_cluster, 2)  # two nodes again, for the tests after


def test_lowtide_workers_and_the_metric_say_where_each_actor_runs(server: Server) -> None:
    """After the actors killed and placed again above: each worker's node address and its
    actor's pid, its restarts as often as the log says it was placed again, and one
    ``lowtide_worker_info`` series per worker, on its node (the snapshot is refreshed every second)."""
    listed = list_workers(server)
    assert [(w["index"], w["node"], w["pid"]) for w in listed] == [
        (i, address, pid) for i, (_, address, pid) in enumerate(places())
    ]
    assert {w["node"] for w in listed} == {LOOPBACK}
    assert sum(w["restarts"] for w in listed) == server.stderr.read_text().count("placed again on")
    assert server.metrics_url is not None
    expected = {(("node", LOOPBACK), ("worker", str(i))): 1.0 for i in range(2)}

    def worker_info() -> dict[Any, float]:
        return scrape(server)["lowtide_worker_info"]

    wait_for(
        "lowtide_worker_info on each node",
        lambda: worker_info() == expected,
        30.0,
        lambda: str(worker_info()),
    )
