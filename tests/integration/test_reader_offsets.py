"""CommitOffset: a reader tells the server how far it has processed a query's output (what
Spark's ``format("lowtide")`` reader does at each commit); ListQueries and the metrics show it."""

from __future__ import annotations

import pytest
from server_harness import Server, running_server, scrape, wait_for

from lowtide import InvalidArgument, NotFound, OutOfRange, ResourceExhausted
from lowtide.clients import Client

pytestmark = pytest.mark.integration

SQL = "SELECT k, count(*) AS n [RANGE 10, WA ts] FROM S GROUP BY k"


def lag(server: Server) -> dict[str, float]:
    """lowtide_reader_lag_items of query q by reader, from a real scrape."""
    samples = scrape(server).get("lowtide_reader_lag_items", {})
    return {
        dict(labels)["reader"]: value for labels, value in samples.items() if dict(labels)["query"] == "q"
    }


def test_committed_offsets_are_listed_never_lowered_and_their_lag_is_scraped() -> None:
    with running_server(workers=1) as server, Client(server.target, timeout=30) as client:
        client.create_stream("S", {"k": "string", "ts": "int64"})
        client.register_query(SQL, name="q")
        with client.producer("S", linger_ms=0) as producer:
            for step in range(3):  # a result table and a punctuation for each window closed
                producer.send({"k": ["a", "b"], "ts": [10 * step, 10 * step + 1]})
                producer.punctuate(10 * step + 10)
        wait_for(
            "the query's items", lambda: client.list_queries()[0]["next_offset"] >= 6, 30, server.stderr_tail
        )
        end = client.list_queries()[0]["next_offset"]
        client.commit_offset("q", "parquet-job", 2)
        client.commit_offset("q", "dashboard", end)
        client.commit_offset("q", "parquet-job", 1)  # behind what it said: kept at 2
        assert client.list_queries()[0]["readers"] == {"parquet-job": 2, "dashboard": end}
        expected = {"parquet-job": float(end - 2), "dashboard": 0.0}
        wait_for("the readers' lag in a scrape", lambda: lag(server) == expected, 30, server.stderr_tail)
        with pytest.raises(OutOfRange, match=f"0 to {end}"):
            client.commit_offset("q", "dashboard", end + 1)
        with pytest.raises(NotFound, match="unknown query 'nope'"):
            client.commit_offset("nope", "dashboard", 0)
        with pytest.raises(InvalidArgument, match="a reader needs a name of 1 to 256 printable characters"):
            client.commit_offset("q", "", 0)
        for name in range(62):  # a query keeps at most 64 readers
            client.commit_offset("q", f"r{name}", 0)
        with pytest.raises(ResourceExhausted, match="at most 64 readers"):
            client.commit_offset("q", "one-too-many", 0)
        assert client.list_queries()[0]["readers"]["dashboard"] == end
