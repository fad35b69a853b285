"""Chaos: producers and subscribers against a ``--state-dir`` server killed again and again.

Three producers (batch ids, punctuation) feed two streams; subscribers of a tumbling, a sliding,
a holistic and a join query record each item's offset. Meanwhile ``kill -9`` hits a worker, the
front, or the whole server at random moments, several times; after each the server is started
again on the same port and directory. Producers go on from their last acknowledged batch (the
one in flight is sent again under its id), subscribers resume at ``offset + 1``. At the end every
query's rows equal the in-process engine's on the same data, each exactly once. The same again
with the workers as actors of a Ray cluster (``--ray``): a worker killed is its actor's process.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cluster import Cluster, retrying, rows

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine, Punctuation
from lowtide.clients import Client

pytestmark = pytest.mark.integration

ROUNDS = 80
SOURCES = {"a": "s", "b": "s", "c": "t"}  # source -> stream
SCHEMAS = {
    "s": {"k": "string", "v": "int64", "ts": "int64"},
    "t": {"k": "string", "w": "int64", "ts": "int64"},
}
QUERIES = {
    "tumbling": "SELECT k, count(*) AS n, sum(v) AS total [RANGE 10, SLIDE 10, WA ts] FROM s GROUP BY k",
    "sliding": "SELECT k, count(*) AS n, max(v) AS top [RANGE 40, SLIDE 10, WA ts] FROM s GROUP BY k",
    "holistic": "SELECT k, median(v) AS mid [RANGE 20, SLIDE 20, WA ts] FROM s GROUP BY k",
    "join": "SELECT s.k, s.v, t.w, t.ts FROM s, t [RANGE TUMBLING 10, WA ts] WHERE s.k = t.k",
}
KILLS = 5


def batch(source: str, i: int) -> pa.Table:
    """Round ``i`` of a source: event times in [10 i, 10 i + 20), so punctuation 10 i follows."""
    rng = random.Random(f"{source}-{i}")
    ts = [10 * i + rng.randrange(20) for _ in range(30)]
    value = "w" if SOURCES[source] == "t" else "v"
    return pa.table(
        {
            "k": [f"k{rng.randrange(6)}" for _ in ts],
            value: pa.array([rng.randrange(1000) for _ in ts], pa.int64()),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def expected() -> dict[str, Counter[tuple[Any, ...]]]:
    engine = Engine()
    for stream, schema in SCHEMAS.items():
        engine.create_stream(stream, schema, sources=[s for s, of in SOURCES.items() if of == stream])
    for name, sql in QUERIES.items():
        engine.register_query(sql, name=name)
    for i in range(ROUNDS):
        for source, stream in SOURCES.items():
            engine.push(stream, batch(source, i), source)
            engine.punctuate(stream, 10 * i, source)
    for source, stream in SOURCES.items():
        engine.close_source(stream, source)
    return {name: rows(engine.poll(name)) for name in QUERIES}


def produce(cluster: Cluster, source: str, deadline: float, acknowledged: list[int]) -> None:
    """Every round of ``source``; ``acknowledged[0]``: the rounds the server acknowledged."""
    stream = SOURCES[source]

    def run() -> None:
        with Client(cluster.target, timeout=10) as client:
            held = next(s for s in client.list_streams() if s["name"] == stream)["source_punctuation"]
            last = held.get(source, NO_PROGRESS)  # what the server recovered for this source
            with client.producer(stream, source, linger_ms=0) as producer:
                while acknowledged[0] < ROUNDS:
                    i = acknowledged[0]
                    producer.send(batch(source, i), batch_id=i + 1)
                    if 10 * i > last:
                        producer.punctuate(10 * i)
                        last = 10 * i
                    producer.flush()
                    acknowledged[0] += 1
                    time.sleep(0.05)  # paced on purpose: the kills land mid-stream
                producer.close()

    retrying(run, deadline)


def subscribe(cluster: Cluster, query: str, got: list[tuple[int, Any]], deadline: float) -> None:
    def run() -> None:
        start = got[-1][0] + 1 if got else 0
        with (
            Client(cluster.target, timeout=10) as client,
            client.subscribe(query, from_offset=start) as items,
        ):
            for item in items:
                assert items.offset is not None
                got.append((items.offset, item))
                if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                    return
            raise ConnectionError("the subscription ended before the end of the stream")

    retrying(run, deadline)


@pytest.mark.xdist_group("durability")
def test_kill_9_anything_at_any_time_and_every_window_comes_once(tmp_path: Path) -> None:
    chaos(Cluster(tmp_path / "state", checkpoint_interval_s=0.5), seconds=90)


@pytest.mark.xdist_group("ray")
def test_kill_9_anything_through_ray_and_every_window_comes_once(tmp_path: Path, ray_cluster: Any) -> None:
    options = ("--ray", ray_cluster.address)
    chaos(Cluster(tmp_path / "state", checkpoint_interval_s=0.5, options=options), seconds=150)


def chaos(cluster: Cluster, seconds: float) -> None:
    """Producers and subscribers through :data:`KILLS` kills; every window once at the end."""
    deadline = time.monotonic() + seconds
    try:
        with Client(cluster.target, timeout=30) as client:
            for stream, schema in SCHEMAS.items():
                client.create_stream(stream, schema, sources=[s for s, of in SOURCES.items() if of == stream])
            for name, sql in QUERIES.items():
                client.register_query(sql, name=name)
        results: dict[str, list[tuple[int, Any]]] = {name: [] for name in QUERIES}
        acknowledged = {source: [0] for source in SOURCES}
        threads = [
            threading.Thread(target=produce, args=(cluster, s, deadline, acknowledged[s]), daemon=True)
            for s in SOURCES
        ] + [
            threading.Thread(target=subscribe, args=(cluster, name, results[name], deadline), daemon=True)
            for name in QUERIES
        ]
        for thread in threads:
            thread.start()
        rng = random.Random(7)
        kinds = ["worker", "front", "everything"]
        for what in [*kinds, *rng.choices(kinds, k=KILLS - len(kinds))]:
            time.sleep(rng.uniform(0.5, 1.5))  # when to kill: the behaviour under test
            if not any(t.is_alive() for t in threads[: len(SOURCES)]):
                break  # the producers are done: nothing left to interrupt
            cluster.kill(what)
        for thread in threads:
            thread.join(max(1.0, deadline - time.monotonic()))
        progress = {
            "acknowledged": {s: n[0] for s, n in acknowledged.items()},
            "items": {name: got[-1] if got else None for name, got in results.items()},
            "kills": cluster.kills,
        }
        if any(t.is_alive() for t in threads):  # where the server stands, for the failure
            with Client(cluster.target, timeout=10) as client:
                progress["streams"] = {s["name"]: s["low_watermark"] for s in client.list_streams()}
                progress["queries"] = {q["name"]: q["low_watermark"] for q in client.list_queries()}
        assert not any(t.is_alive() for t in threads), (
            f"not done: {progress}\n{cluster.server.stderr_tail() if cluster.server else ''}"
        )
        assert len(cluster.kills) >= 3, cluster.kills
        want = expected()
        for name, got in results.items():
            assert [offset for offset, _ in got] == list(range(len(got))), f"{name}: a gap or a repeat"
            assert rows([item for _, item in got]) == want[name], f"{name} after kills {cluster.kills}"
    finally:
        cluster.stop()
