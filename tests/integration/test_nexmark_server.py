"""Nexmark's windowed queries, as Flink SQL users write them, through a real server with two
workers: each registers, its derived tables run as parts of it (listed under it, dropped with
it), and its rows equal its definition's (tests/nexmark.py) on disordered events, across a
``kill -9`` and restart too."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import nexmark as nx
import pytest
from server_harness import kill9, rows_until_end, running_server, start_server

from lowtide import InvalidArgument
from lowtide.clients.client import Client

pytestmark = pytest.mark.integration


def _register(client: Client) -> None:
    for stream, schema in nx.SCHEMAS.items():
        client.create_stream(stream, schema, progressing="dateTime")
    for n in nx.COLUMNS:
        client.register_query(nx.query(n), name=f"q{n}")


def _send(client: Client, deliveries: Sequence[tuple[str, list[nx.Row], int]], close: bool) -> None:
    producers = {s: client.producer(s) for s in nx.SCHEMAS}
    for stream, rows, progress in deliveries:
        producers[stream].send(nx.arrow(stream, rows))
        for producer in producers.values():
            producer.punctuate(progress)
    for producer in producers.values():
        if close:
            producer.close()
        else:
            producer.flush()


def _check(client: Client, events: nx.Events) -> None:
    for n, columns in nx.COLUMNS.items():
        rows = rows_until_end(client, f"q{n}")
        assert nx.multiset(rows, columns) == getattr(nx, f"q{n}")(events), n


def test_nexmark_through_a_server() -> None:
    events = nx.generate(seed=7, seconds=30)
    with running_server(workers=2) as server, Client(server.target, timeout=60) as client:
        _register(client)
        assert sorted(q["name"] for q in client.list_queries()) == sorted(f"q{n}" for n in nx.COLUMNS)
        plan = client.explain(nx.query(5))
        assert "query~3:" in plan and "1. Input query~3" in plan and "OA-Join" in plan, plan
        _send(client, list(nx.deliveries(events, seed=7)), close=True)
        _check(client, events)
        with pytest.raises(InvalidArgument, match="derived table of query 'q5'"):
            client.drop_query("q5~1")
        client.drop_query("q5")
        assert "q5" not in {q["name"] for q in client.list_queries()}
        client.register_query(nx.query(5), name="q5")  # its parts went with it


def test_nexmark_across_a_kill(tmp_path: Path) -> None:
    """Killed after a checkpoint and more input, restarted: the derived tables' state comes back
    with their query's, and every query's rows are still exactly its definition's."""
    events = nx.generate(seed=11, seconds=30)
    deliveries = list(nx.deliveries(events, seed=11))
    config = {"state_dir": str(tmp_path / "state"), "retained_items": 100_000, "checkpoint_interval_s": 0.3}
    server = start_server(config=config)
    with Client(server.target, timeout=60) as client:
        _register(client)
        _send(client, deliveries[: len(deliveries) // 2], close=False)
        server.await_checkpoint()
        _send(client, deliveries[len(deliveries) // 2 : len(deliveries) * 3 // 4], close=False)
    kill9(server)
    with running_server(config=config) as restarted, Client(restarted.target, timeout=60) as client:
        _send(client, deliveries[len(deliveries) * 3 // 4 :], close=True)
        _check(client, events)
