"""``lowtide nexmark``: the streams it creates and the events it sends, as nexmark's generator
models them (hot auctions, bidders and sellers, auctions that close), disordered within the
bound its punctuation keeps, through a real server; Nexmark's queries, registered as Flink SQL
users write them, give their definitions' rows (tests/nexmark.py, brute force over the same
events), and so the punctuation lost no event."""

from __future__ import annotations

import subprocess
from typing import Any

import nexmark as nx
import pytest
from server_harness import lowtide_command, rows_until_end, running_server

from lowtide.clients import nexmark as generator
from lowtide.clients.client import Client

pytestmark = pytest.mark.integration

EVENTS = {"events": 20_000, "rate": 2_000, "seed": 5, "disorder_ms": 1_500, "base_ms": nx.BASE}
QUERIES = (4, 5, 7, 8, 9, 11, 19)


def _command(target: str, *flags: str, **options: Any) -> subprocess.CompletedProcess[str]:
    given = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
    return subprocess.run(
        [*lowtide_command(), "--server", target, "nexmark", *given, *flags, "--no-pace"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _as_references_read_them() -> nx.Events:
    """The events the command sends, each row a dict with its times in ms."""
    events = generator.generate(**EVENTS)
    rows = {
        name: [{c: nx.ms(v) for c, v in row.items()} for row in table.to_pylist()]
        for name, table in events.tables.items()
    }
    return nx.Events(rows, {name: [] for name in rows}, EVENTS["disorder_ms"])


def test_nexmark_sends_the_generators_events_and_the_queries_answer_exactly() -> None:
    with running_server(workers=2) as server, Client(server.target, timeout=60) as client:
        # On a fresh server it creates the streams: a few events long before the test's own.
        early = _command(server.target, "--keep-open", events=50, base_ms=nx.BASE - 600_000)
        assert early.returncode == 0, early.stderr
        assert "sent 50 events" in early.stderr, early.stderr
        streams = {s["name"]: s for s in client.list_streams()}
        assert {name: dict(streams[name]["schema"]) for name in nx.SCHEMAS} == nx.SCHEMAS
        for n in QUERIES:
            client.register_query(nx.query(n), name=f"q{n}")
        sent = _command(server.target, **EVENTS)  # closes the sources at its end
        assert sent.returncode == 0, sent.stderr
        events = _as_references_read_them()
        for n in QUERIES:
            rows = rows_until_end(client, f"q{n}")
            expected = getattr(nx, f"q{n}")(events)
            assert sum(expected.values()) > 0, n  # the events make the query answer something
            assert nx.multiset(rows, nx.COLUMNS[n]) == expected, n


def test_nexmark_refuses_a_stream_of_other_columns() -> None:
    with running_server(workers=1) as server, Client(server.target, timeout=60) as client:
        client.create_stream("bid", {"auction": "int64", "dateTime": "timestamp[ms]"}, progressing="dateTime")
        refused = _command(server.target, events=10)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and "stream 'bid' exists with other columns" in refused.stderr
