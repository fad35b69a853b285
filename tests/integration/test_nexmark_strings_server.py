"""Nexmark's q10, q15, q16, q17 and q22, which make strings (DATE_FORMAT, SPLIT_INDEX), and q14,
which reads them (count_char), as Flink SQL users write them, through a real server with two
workers: the front makes and reads the strings (a worker's pool cannot code them, nor holds
their text), and every query's rows - and those of queries reading its strings, grouped across
the workers by them - equal the in-process engine's fed the same deliveries, across a worker's
``kill -9`` and a ``kill -9`` of the whole server after a checkpoint. A query that would make
strings inside a worker is refused in one line."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nexmark as nx
import pyarrow as pa
import pytest
from server_harness import kill9, rows_until_end, running_server, start_server

from lowtide import Engine, UnsupportedQuery
from lowtide.clients.client import Client

pytestmark = pytest.mark.integration

MIDNIGHT = 1_600_041_600_000  # 2020-09-14 00:00 UTC: the bids straddle it
QUERIES = {
    **{f"q{n}": nx.query(n) for n in (10, 14, 15, 16, 17, 22)},
    # Queries reading the strings those make: grouped by q16's day (a key the workers split by,
    # as codes of the front), by a derived table's piece of the URL, and filtered on it.
    "days": "SELECT day, count(*) AS channels, sum(total_bids) AS bids FROM q16 GROUP BY window_end, day",
    "dirs": "SELECT dir, count(*) AS n [RANGE 10 seconds, WA dateTime] FROM (SELECT SPLIT_INDEX(url, '/', 4) "
    "AS dir, `dateTime` FROM bid) AS d WHERE dir <> '2' GROUP BY dir",
}
Deliveries = Sequence[tuple[str, list[nx.Row], int]]


def bids(seconds: int = 12) -> Deliveries:
    """Nexmark's bids over ``seconds`` around midnight, disordered, in batches of 1 to 40."""
    events = nx.generate(seed=5, seconds=seconds, bids_per_second=40)
    shift = MIDNIGHT - nx.BASE - seconds * 500
    rows = [{**row, "dateTime": row["dateTime"] + shift} for row in events.rows["bid"]]
    arrival = [t + shift for t in events.arrival["bid"]]
    return list(nx.deliveries(nx.Events({"bid": rows}, {"bid": arrival}, events.delay), seed=5))


def engine_rows(deliveries: Deliveries) -> dict[str, Counter[tuple[Any, ...]]]:
    engine = Engine()
    engine.create_stream("bid", nx.SCHEMAS["bid"], progressing="dateTime", sources=["p"])
    for name, sql in QUERIES.items():
        engine.register_query(sql, name=name)
    for stream, rows, progress in deliveries:
        engine.push(stream, nx.arrow(stream, rows), source="p")
        engine.punctuate(stream, progress, source="p")
    engine.close_source("bid", "p")
    return {
        name: _multiset(
            row for item in engine.poll(name) if isinstance(item, pa.Table) for row in item.to_pylist()
        )
        for name in QUERIES
    }


def _multiset(rows: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted((k, nx.ms(v)) for k, v in row.items())) for row in rows)


def _send(client: Client, deliveries: Deliveries, close: bool) -> None:
    producer = client.producer("bid", source="p")
    for stream, rows, progress in deliveries:
        producer.send(nx.arrow(stream, rows))
        producer.punctuate(progress)
    if close:
        producer.close()
    else:
        producer.flush()


def _server_rows(client: Client) -> dict[str, Counter[tuple[Any, ...]]]:
    got = {}
    for name in QUERIES:
        got[name] = _multiset(rows_until_end(client, name))
    return got


def test_queries_that_make_strings_through_a_server_across_kills(tmp_path: Path) -> None:
    deliveries = bids()
    want = engine_rows(deliveries)
    assert all(len(rows) > 1 for rows in want.values()), want  # every query answers something
    assert {dict(row)["day"] for row in want["q15"]} == {"2020-09-13", "2020-09-14"}
    config = {"state_dir": str(tmp_path / "state"), "retained_items": 100_000, "checkpoint_interval_s": 0.2}
    cut = [len(deliveries) * k // 4 for k in range(5)]
    server = start_server(config=config)
    with Client(server.target, timeout=60) as client:
        client.create_stream("bid", nx.SCHEMAS["bid"], progressing="dateTime", sources=["p"])
        for name, sql in QUERIES.items():
            client.register_query(sql, name=name)
        assert "the front runs its last Project, which makes or reads strings" in client.explain(nx.query(16))
        with pytest.raises(UnsupportedQuery, match="in WHERE would make strings in a server worker"):
            client.register_query("SELECT auction FROM bid WHERE DATE_FORMAT(`dateTime`, 'HH') = '00'")
        _send(client, deliveries[: cut[1]], close=False)
        server.await_checkpoint()
        _send(client, deliveries[cut[1] : cut[2]], close=False)
        os.kill(server.worker_pids()[0], signal.SIGKILL)  # every worker starts over from the checkpoint
        _send(client, deliveries[cut[2] : cut[3]], close=False)
        server.await_checkpoint()
    kill9(server)
    with running_server(config=config) as restarted, Client(restarted.target, timeout=60) as client:
        _send(client, deliveries[cut[3] :], close=True)
        got = _server_rows(client)
    for name in QUERIES:
        assert got[name] == want[name], name
