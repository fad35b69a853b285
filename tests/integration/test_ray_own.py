"""Servers on a Ray cluster (docs/ray.md): what the cluster's failures do to them.

Without a state directory, a worker actor that dies takes the queries that had state on it
(their subscribers end ``ABORTED``, saying why) and the server goes on, the actor placed again.
A cluster that goes away stops the server: its log says why in one line, subscribers end
``UNAVAILABLE`` with that reason, and so does every call after.

The first runs on the session's cluster (``ray_cluster``); the second starts a one-node cluster
of its own and shuts it down under the server.
"""

from __future__ import annotations

import os
import random
import re
import signal

import grpc
import pytest
from ray.cluster_utils import Cluster
from ray_harness import loopback_cluster
from server_harness import Server, running_server, start_server, wait_for
from wire import CLOSE, Mirror, Subscription, assert_same, connect, failure_of, packets, rows, table

from lowtide import END_OF_STREAM
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ray")]

T0 = 1_700_000_000_000 // 60_000 * 60_000
MINUTE = 60_000
GROUPED = "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM {s} GROUP BY srcIP"


def placements(server: Server) -> list[tuple[int, int]]:
    """(worker, pid) of every placement the server's log reports, in order."""
    log = server.stderr.read_text()
    line = r"^lowtide: worker (\d+) \(lowtide-worker-\d+\) (?:placed again )?on .*, pid (\d+)$"
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
        ended = subscription.end(timeout=10)
        assert (ended.code, ended.reason) == (grpc.StatusCode.UNAVAILABLE, f"the server stops: {why}")
        with pytest.raises(grpc.RpcError) as raised:
            mirror.stub.Health(pb.HealthRequest(), timeout=10)
        assert failure_of(raised.value).code == grpc.StatusCode.UNAVAILABLE
    finally:
        if server.process.poll() is None:  # the test failed: leave nothing running
            server.process.kill()
        cluster.shutdown()
