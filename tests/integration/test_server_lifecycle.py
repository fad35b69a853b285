"""A real server's life (docs/design.md, "Interfaces" and "Runners"): SIGTERM drains; a killed
worker is noticed at once and fails only the queries it served; a producer faster than the workers
is slowed, never dropped.

Each test starts its own server (``server_harness.running_server``), since each ends or damages it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import running_server, start_server, wait_for
from wire import (
    CLOSE,
    PACKET,
    Mirror,
    Subscription,
    assert_same,
    connect,
    packets,
    requests,
    rows,
    streams,
    table,
)

from lowtide import END_OF_STREAM
from lowtide.clients import Client
from lowtide.proto import lowtide_pb2 as pb

pytestmark = pytest.mark.integration

MINUTE = 60_000
T0 = 1_700_000_000_000 // MINUTE * MINUTE
SPLIT = (
    "SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 2 minutes, SLIDE 1 minute, WA ts] "
    "FROM {s} GROUP BY srcIP"
)
SINGLE = "SELECT max(len) AS top, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM {s}"


def test_sigterm_mid_stream_drains_what_was_acknowledged() -> None:
    with running_server(workers=2) as server:
        mirror = Mirror(connect(server.target))
        mirror.create_stream("S", sources=["p", "q"])
        queries = [
            mirror.register(SPLIT.format(s="S"), "split"),
            mirror.register(SINGLE.format(s="S"), "single"),
        ]
        subs = [Subscription(mirror.stub, q, from_oldest=True) for q in queries]
        rnd = random.Random(1)
        # A producer mid-stream: it promised the far future, sent a batch, and is still talking.
        release = threading.Event()
        far = T0 + 600 * MINUTE
        pending = [far, table(packets(rnd, 50, far, far + MINUTE))]

        def mid_stream() -> Iterator[pb.IngestRequest]:
            yield from requests("S", "mid", pending)
            release.wait(30)

        outcome: list[Any] = []
        thread = threading.Thread(target=lambda: outcome.append(_call(mirror.stub.Ingest, mid_stream())))
        thread.start()
        wait_for("the mid-stream batch", lambda: streams(mirror.stub)["S"].tuples_ingested == 50, 20.0)
        for item in pending:
            mirror.apply("S", "mid", item)
        # Acknowledged calls, the last one large: the workers still chew on it at SIGTERM.
        now = T0
        for source, n in [("p", 500), ("q", 500), ("p", 20_000), ("q", 150_000)]:
            batch = table(packets(rnd, n, now, now + 20 * MINUTE))
            assert mirror.ingest("S", source, [batch, now + 20 * MINUTE]).tuples == n
            if source == "q":
                now += 20 * MINUTE
        server.process.send_signal(signal.SIGTERM)
        for sub in subs:
            ended = sub.end(timeout=30)
            assert ended.code == grpc.StatusCode.OK, ended
        release.set()  # within the drain's grace, whatever the comparison below takes
        thread.join(30)
        assert not thread.is_alive() and outcome, "the mid-stream producer's call never ended"
        for query, sub in zip(queries, subs, strict=True):
            expected = mirror.results(query)
            assert rows(expected)
            assert_same(sub.items, expected, f"{query} drained")
        server.stop()


def _call(method: Any, *args: Any) -> Any:
    try:
        return method(*args, timeout=60)
    except grpc.RpcError as error:
        return error


def _on_worker(name: str, workers: int = 2) -> int:
    """The worker a single-worker query runs on (server/process_runner.py: crc32 of the name)."""
    return zlib.crc32(name.encode()) % workers


def test_sigterm_to_the_whole_process_group_drains_and_exits() -> None:
    """systemd (KillMode=control-group), ``timeout`` and a terminal signal every process of the
    group: the workers leave their stopping to the front, which drains and exits 0 at once."""
    server = start_server(own_group=True)
    workers = server.worker_pids()
    began = time.monotonic()
    os.killpg(server.pid, signal.SIGTERM)
    assert server.stop(timeout=30) == 0
    assert time.monotonic() - began < 15, "the drain waited on workers that were gone"
    wait_for("the workers to end", lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers), 20.0)


def test_a_killed_worker_fails_its_queries_and_the_server_goes_on() -> None:
    with running_server(workers=2, metrics=True) as server:
        mirror = Mirror(connect(server.target))
        mirror.create_stream("S", sources=["p"])
        solo = {_on_worker(n): n for n in (f"solo{i}" for i in range(20))}  # one query on each worker
        queries = {
            "split": mirror.register(SPLIT.format(s="S"), "split"),  # on both workers
            "solo0": mirror.register(SINGLE.format(s="S"), solo[0]),
            "solo1": mirror.register(SINGLE.format(s="S"), solo[1]),
        }
        subs = {key: Subscription(mirror.stub, q, from_oldest=True) for key, q in queries.items()}
        rnd = random.Random(2)
        mirror.ingest("S", "p", [table(packets(rnd, 300, T0, T0 + 5 * MINUTE)), T0 + 5 * MINUTE])
        for key, query in queries.items():
            assert_same(subs[key].reach(mirror.results(query)), mirror.results(query), key)
        workers = server.worker_pids()
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)  # worker 0, the first started
        began = time.monotonic()
        for key in ("split", "solo0"):
            ended = subs[key].end(timeout=10)
            assert ended.code == grpc.StatusCode.ABORTED, (key, ended)
            assert "worker" in ended.reason and "\n" not in ended.reason, ended
        assert time.monotonic() - began < 5, "the dead worker was not noticed at once"
        # The server goes on: health, a respawned worker, the surviving query, a new query.
        assert mirror.stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING"
        wait_for(
            "a respawned worker",
            lambda: len(server.worker_pids()) == 2 and workers[0] not in server.worker_pids(),
            20.0,
        )
        mirror.create_stream("T", sources=["p"])
        sql = (
            "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] "
            "FROM T WHERE destIP = '10.0.0.2' GROUP BY srcIP"  # a string seen before the restart
        )
        fresh = mirror.register(sql, "after_restart")
        fresh_sub = Subscription(mirror.stub, fresh, from_oldest=True)
        mirror.ingest("S", "p", [table(packets(rnd, 200, T0 + 5 * MINUTE, T0 + 9 * MINUTE)), CLOSE])
        mirror.ingest("T", "p", [table(packets(rnd, 400, T0, T0 + 6 * MINUTE)), CLOSE])
        assert_same(subs["solo1"].until(END_OF_STREAM), mirror.results(queries["solo1"]), "surviving query")
        expected = mirror.results(fresh)
        assert rows(expected)
        assert_same(fresh_sub.until(END_OF_STREAM), expected, "query registered after the restart")
        assert server.metrics_url is not None
        metrics = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
        restarts = re.findall(r"^lowtide_worker_restarts_total(\{[^}]*\})? (\S+)$", metrics, re.MULTILINE)
        assert sum(float(value) for _, value in restarts) == 1, restarts
        assert any('worker="0"' in labels for labels, value in restarts if float(value) == 1), restarts
        # lowtide workers: worker 0 is its new process, restarted once; the failed queries are on none.
        with Client(server.target, timeout=30) as client:
            listed = client.list_workers()
        (respawned,) = set(server.worker_pids()) - {workers[1]}
        assert [(w["index"], w["pid"], w["restarts"]) for w in listed] == [
            (0, respawned, 1),
            (1, workers[1], 0),
        ]
        assert [w["queries"] for w in listed] == [[fresh], [queries["solo1"], fresh]], listed


def test_a_fast_producer_is_slowed_not_dropped() -> None:
    n, per_batch = 2_000_000, 100_000
    with running_server(workers=2) as server:
        mirror = Mirror(connect(server.target))
        mirror.create_stream("S", sources=["p"])
        too_many = f"{n} tuples, beyond a brute-force evaluation"
        queries = [
            mirror.register(SPLIT.format(s="S"), "split", engine_because=too_many),
            mirror.register(SINGLE.format(s="S"), "single", engine_because=too_many),
        ]
        subs = [Subscription(mirror.stub, q, from_oldest=True) for q in queries]
        rng = np.random.default_rng(3)
        ips = pa.array([f"10.1.{i // 8}.{i % 8}" for i in range(64)])
        batches = []
        for start in range(0, n, per_batch):
            ts = T0 + (start + np.arange(per_batch)) * 3 + rng.integers(0, 30_000, per_batch)  # band disorder
            columns = {
                "srcIP": ips.take(pa.array(rng.integers(0, 64, per_batch))),
                "srcPort": pa.array(rng.integers(0, 65536, per_batch), pa.int32()),
                "destIP": ips.take(pa.array(rng.integers(0, 64, per_batch))),
                "destPort": pa.array(rng.integers(0, 65536, per_batch), pa.int32()),
                "len": pa.array(rng.integers(40, 1500, per_batch), pa.int32()),
                "ts": pa.array(ts, pa.timestamp("ms")),
            }
            batches.append(pa.table(columns).select(list(PACKET)))
        response = mirror.ingest("S", "p", [*batches, CLOSE])  # one call, as fast as it goes
        assert response.tuples == n and response.batches == len(batches)
        assert streams(mirror.stub)["S"].tuples_ingested == n
        for query, sub in zip(queries, subs, strict=True):
            got = sub.until(END_OF_STREAM, timeout=120)
            expected = mirror.results(query)
            if query == "single":  # tumbling: every tuple counted once
                assert sum(r["n"] for r in rows(got)) == n
            assert_same(got, expected, query)
