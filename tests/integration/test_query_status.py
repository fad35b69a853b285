"""A query's status (``running``, ``recovering``, ``aborted`` and why) after a worker dies, as
``ListQueries``, ``lowtide query list`` and the metric ``lowtide_query_status`` show it, against
real servers of two local worker processes (docs/operations.md, "Query status").

Without ``--state-dir`` a worker's death loses the window state on it: its queries are aborted,
saying what ``lowtide tail`` says, until they are dropped. With it every worker is restored, and
the queries recover, then run again. To see them recovering whatever the timing, the other worker
is stopped (SIGSTOP) before the kill: no output is made again until it goes on (SIGCONT).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from server_harness import Server, running_server, scrape, wait_for
from test_cli import ok

from lowtide.clients import Client
from lowtide.errors import ServerError

pytestmark = pytest.mark.integration

SCHEMA = {"k": "string", "ts": "int64"}
SPLIT = "SELECT k, count(*) AS n [RANGE 10, SLIDE 10, WA ts] FROM s GROUP BY k"  # on both workers


def status(client: Client, query: str) -> tuple[str, str] | None:
    """The query's status and its reason, as ListQueries gives them (None: not listed)."""
    listed = {q["name"]: (q["status"], q["status_reason"]) for q in client.list_queries()}
    return listed.get(query)


def metric(server: Server, query: str) -> dict[str, float]:
    """``lowtide_query_status`` of the query on the real /metrics endpoint, by status."""
    found = scrape(server).get("lowtide_query_status", {})
    series = [(dict(labels), value) for labels, value in found.items()]
    return {labels["status"]: value for labels, value in series if labels["query"] == query}


def only(current: str) -> dict[str, float]:
    return {s: 1.0 if s == current else 0.0 for s in ("running", "recovering", "aborted")}


def feed(client: Client, rounds: range) -> None:
    """Each round: a batch of keys in window [10 i, 10 i + 10), then punctuation closing it."""
    with client.producer("s", "a", linger_ms=0) as producer:
        for i in rounds:
            producer.send({"k": [f"k{j}" for j in range(16)], "ts": [10 * i + j % 10 for j in range(16)]})
            producer.punctuate(10 * (i + 1))
        producer.flush()


def test_without_a_state_dir_a_dead_workers_query_is_aborted_until_dropped() -> None:
    with running_server(workers=2) as server, Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a"])
        client.register_query(SPLIT, name="bigq")
        feed(client, range(3))
        assert status(client, "bigq") == ("running", "")
        wait_for("bigq running in the metric", lambda: metric(server, "bigq") == only("running"))

        os.kill(server.worker_pids()[0], signal.SIGKILL)  # worker 0, the first started
        reason = "worker 0 died; query 'bigq' lost its window state"
        wait_for(
            "bigq aborted",
            lambda: status(client, "bigq") == ("aborted", reason),
            diagnostics=lambda: f"{status(client, 'bigq')}\n{server.stderr_tail()}",
        )
        listed = json.loads(ok(server.target, "query", "list", "--format", "json"))
        assert [(q["name"], q["status"], q["status_reason"]) for q in listed] == [("bigq", "aborted", reason)]
        assert f"aborted: {reason}" in ok(server.target, "query", "list")
        with pytest.raises(ServerError) as ended:  # what tail says, in the same words
            for _ in client.subscribe("bigq"):
                pass
        assert ended.value.status == "ABORTED" and reason in str(ended.value)
        wait_for("bigq aborted in the metric", lambda: metric(server, "bigq") == only("aborted"))

        feed(client, range(3, 5))  # the server goes on; the query stays aborted
        assert status(client, "bigq") == ("aborted", reason)

        client.drop_query("bigq")
        client.register_query(SPLIT, name="bigq")  # a new query under the name
        assert status(client, "bigq") == ("running", "")
        wait_for("the new bigq running in the metric", lambda: metric(server, "bigq") == only("running"))


def test_with_a_state_dir_a_dead_workers_queries_recover_then_run(tmp_path: Path) -> None:
    config = {"state_dir": str(tmp_path / "state"), "checkpoint_interval_s": 0}  # the whole log replays
    with running_server(workers=2, config=config) as server, Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a"])
        client.register_query(SPLIT, name="q")
        feed(client, range(4))
        wait_for("q's output", lambda: client.list_queries()[0]["next_offset"] >= 4)
        made = client.list_queries()[0]["next_offset"]
        assert status(client, "q") == ("running", "")

        first, second = server.worker_pids()
        os.kill(second, signal.SIGSTOP)  # q's output waits for it: q stays recovering
        try:
            os.kill(first, signal.SIGKILL)
            recovering = wait_for(
                "q recovering",
                lambda: (found := status(client, "q")) is not None and found[0] == "recovering" and found[1],
                diagnostics=lambda: f"{status(client, 'q')}\n{server.stderr_tail()}",
            )
            assert recovering.startswith("worker 0 died: every worker is restored from the state directory")
            wait_for("q recovering in the metric", lambda: metric(server, "q") == only("recovering"))
            listed = json.loads(ok(server.target, "query", "list", "--format", "json"))
            assert [(q["name"], q["status"]) for q in listed] == [("q", "recovering")]
        finally:
            os.kill(second, signal.SIGCONT)

        wait_for(
            "q running again",
            lambda: status(client, "q") == ("running", ""),
            diagnostics=lambda: f"{status(client, 'q')}\n{server.stderr_tail()}",
        )
        wait_for("q running in the metric", lambda: metric(server, "q") == only("running"))
        feed(client, range(4, 6))  # and it goes on where it was
        wait_for("q's next output", lambda: client.list_queries()[0]["next_offset"] > made)
        assert status(client, "q") == ("running", "")
