"""``lowtide workers``, ``Client.list_workers()`` and the metric ``lowtide_worker_info`` against a
real server of two local worker processes, its own (its state bytes are then the queries' here
alone): each worker's index, node (``localhost``), pid (the children of the server's fork server), restarts,
status (``running``), the queries with operators on it (a grouped query on both, an ungrouped
one on one) and their state bytes, the same figures the ``lowtide_state_bytes`` metric sums per
query. A worker that dies is counted where it is restarted: tests/integration/
test_server_lifecycle.py (local) and test_ray.py (Ray).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_harness import Server, processes, running_server, scrape, wait_for
from test_cli import ok

from lowtide.clients import AsyncClient, Client

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("workers")]

SPLIT = "SELECT k, count(*) AS n [RANGE 100, SLIDE 100, WA ts] FROM W GROUP BY k"
SINGLE = "SELECT count(*) AS n [RANGE 100, SLIDE 100, WA ts] FROM W"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Stream W with a grouped and an ungrouped query over it, and tuples in open windows."""
    with running_server(workers=2) as running, Client(running.target, timeout=30) as client:
        client.create_stream("W", {"k": "string", "ts": "int64"})
        client.register_query(SPLIT, name="split")
        client.register_query(SINGLE, name="single")
        with client.producer("W", linger_ms=0) as producer:  # no punctuation: every window stays open
            producer.send({"k": [f"k{i}" for i in range(64)], "ts": list(range(64))})
        yield running


@pytest.fixture(scope="module")
def workers(server: Server) -> list[dict[str, Any]]:
    """``list_workers()`` once every worker has reported its state (statistics come every second)
    and the metric's snapshot holds the same figures."""

    def settled() -> list[dict[str, Any]] | None:
        with Client(server.target, timeout=30) as client:
            listed = client.list_workers()
        state = scrape(server).get("lowtide_state_bytes", {})
        per_query = sum(state.get((("query", q),), 0) for q in ("split", "single"))
        held = [w["state_bytes"] for w in listed]
        return listed if all(held) and sum(held) == per_query else None

    return wait_for("the workers' state in list_workers() and in lowtide_state_bytes", settled)


def test_list_workers_gives_each_workers_place_queries_and_state(
    server: Server, workers: list[dict[str, Any]]
) -> None:
    assert [sorted(w) for w in workers] == [
        ["index", "node", "pid", "queries", "restarts", "state_bytes", "status"]
    ] * 2
    assert [w["index"] for w in workers] == [0, 1]
    assert {w["node"] for w in workers} == {"localhost"}
    assert sorted(w["pid"] for w in workers) == sorted(server.worker_pids())
    assert [w["restarts"] for w in workers] == [0, 0]
    assert [w["status"] for w in workers] == ["running", "running"]
    assert all("split" in w["queries"] for w in workers)  # grouped: on every worker
    assert sum(w["queries"].count("single") for w in workers) == 1  # one worker holds it whole
    assert asyncio.run(_list_async(server.target)) == workers  # the async client's is the same


def test_the_workers_are_forks_of_a_fork_server_that_imported_their_modules(server: Server) -> None:
    """A worker (first or started again) is a fork, not an interpreter that imports numpy, numba and
    the operators again (docs/design.md, "Runners"): the server's one fork server has them mapped,
    and the workers are its children."""
    table = processes()
    (fork_server,) = [
        pid for pid, (ppid, _, cmd) in table.items() if ppid == server.pid and b"forkserver" in cmd
    ]
    assert sorted(server.worker_pids()) == sorted(
        pid for pid, (ppid, _, _) in table.items() if ppid == fork_server
    )
    assert len(server.worker_pids()) == 2
    mapped = Path(f"/proc/{fork_server}/maps").read_text()
    assert "/numba/" in mapped and "/numpy/" in mapped  # imported once, before any fork


async def _list_async(target: str) -> list[dict[str, Any]]:
    async with AsyncClient(target, timeout=30) as client:
        return await client.list_workers()


def test_lowtide_workers_prints_the_same_as_a_table_or_json(
    server: Server, workers: list[dict[str, Any]]
) -> None:
    assert json.loads(ok(server.target, "workers", "--format", "json")) == workers
    header, *rows = ok(server.target, "workers").splitlines()
    assert header.split() == ["index", "node", "pid", "restarts", "state_bytes", "queries", "status"]
    for row, w in zip(rows, workers, strict=True):
        shown = [
            w["index"],
            w["node"],
            w["pid"],
            w["restarts"],
            w["state_bytes"],
            ",".join(w["queries"]),
            w["status"],
        ]
        assert row.split() == [str(cell) for cell in shown]


def test_lowtide_worker_info_labels_each_worker_with_its_node(
    server: Server, workers: list[dict[str, Any]]
) -> None:
    info = scrape(server)["lowtide_worker_info"]
    assert info == {(("node", "localhost"), ("worker", str(w["index"]))): 1.0 for w in workers}
