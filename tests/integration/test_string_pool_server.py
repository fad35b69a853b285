"""The string pool through a real server: a batch that would take its stream past ``max_strings``
is rejected whole and the server goes on; a column no query reads adds nothing; ``DropStream``
frees what the stream held (``lowtide_string_pool_entries``); workers hold the strings of query
literals alone; a producer of one stream cannot deny another its strings (issue 30, item 5)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from server_harness import Server, kill9, running_server, start_server, wait_for
from wire import (
    CLOSE,
    Mirror,
    Subscription,
    arrow_bytes,
    assert_same,
    connect,
    failure,
    requests,
    streams,
    table,
)

from lowtide import END_OF_STREAM, Engine, Limits
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("string_pool_server")]

MAX_STRINGS = 100
MINUTE = 60_000
T0 = 1_700_000_000_000 // MINUTE * MINUTE
WAIT = 60.0  # seconds: worker statistics reach the front once a second
ENTRIES = re.compile(r'^lowtide_string_pool_entries\{process="([^"]+)"\} (\S+)$', re.MULTILINE)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(workers=2, config={"max_strings": MAX_STRINGS}) as running:
        yield running


def packets(prefix: str, n: int, minute: int) -> pa.Table:
    """``n`` rows in one minute, each with a srcIP and a destIP of its own."""
    return table(
        [
            {
                "srcIP": f"{prefix}-src-{i}",
                "srcPort": 80,
                "destIP": f"{prefix}-dest-{i}",
                "destPort": 443,
                "len": 100 + i,
                "ts": T0 + minute * MINUTE + i,
            }
            for i in range(n)
        ]
    )


def pool_entries(server: Server) -> dict[str, int]:
    assert server.metrics_url is not None
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {process: int(float(value)) for process, value in ENTRIES.findall(text)}


def eventually(what: str, probe: Callable[[], bool], server: Server) -> None:
    wait_for(what, probe, WAIT, lambda: str(pool_entries(server)))


def settled(server: Server, front: int, workers: int) -> Callable[[], bool]:
    """Whether the front holds ``front`` strings and both workers ``workers`` (the strings of
    query literals: a worker decodes no other, see server/process_runner.py)."""
    return lambda: pool_entries(server) == {"front": front, "worker 0": workers, "worker 1": workers}


def test_a_batch_past_max_strings_is_rejected_whole_and_the_server_goes_on(server: Server) -> None:
    mirror = Mirror(connect(server.target), Engine(limits=Limits(max_strings=MAX_STRINGS)))
    stub = mirror.stub
    eventually("the workers to report their pools", lambda: len(pool_entries(server)) == 3, server)
    before, literals = pool_entries(server)["front"], pool_entries(server)["worker 0"]
    mirror.create_stream("lim", sources=["p"])
    sql = "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM lim GROUP BY srcIP"
    query = mirror.register(sql, "limq")
    subscription = Subscription(stub, query, from_oldest=True)
    mirror.ingest("lim", "p", [packets("a", 60, 0)])  # 60 srcIPs; destIP: no query reads it
    found = mirror.reject("lim", "p", [packets("b", 50, 1)])
    assert (found.code, found.kind) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "ResourceExhausted"), found
    assert "max_strings" in found.reason and "\n" not in found.reason, found
    assert streams(stub)["lim"].tuples_ingested == 60  # nothing of it applied
    # Within the limit only if nothing of the rejected batch was added: 60 + 30 <= 100 < 60 + 50.
    mirror.ingest("lim", "p", [packets("c", 30, 1), T0 + 2 * MINUTE, CLOSE])
    assert_same(subscription.until(END_OF_STREAM), mirror.results(query), "after the rejection")
    eventually("the front to hold the 90 srcIPs accepted", settled(server, before + 90, literals), server)
    stub.DropQuery(pb.DropQueryRequest(name=query), timeout=30)
    stub.DropStream(pb.DropStreamRequest(name="lim"), timeout=30)
    eventually("the dropped stream's strings to be freed", settled(server, before, literals), server)


def test_drop_stream_frees_its_strings_at_the_front_and_in_every_worker(server: Server) -> None:
    mirror = Mirror(connect(server.target), Engine())
    stub = mirror.stub
    eventually("the workers to report their pools", lambda: len(pool_entries(server)) == 3, server)
    before, literals = pool_entries(server)["front"], pool_entries(server)["worker 0"]
    mirror.create_stream("gone", sources=["p"])
    sql = "SELECT srcIP, sum(len) AS bytes [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM gone GROUP BY srcIP"
    query = mirror.register(sql, "goneq")  # split across both workers by srcIP
    subscription = Subscription(stub, query, from_oldest=True)
    mirror.ingest("gone", "p", [packets("d", 40, 0), T0 + MINUTE, CLOSE])
    assert_same(subscription.until(END_OF_STREAM), mirror.results(query), "the stream's results")
    eventually("the front to hold the stream's 40 srcIPs", settled(server, before + 40, literals), server)
    # A query that decodes strings (heavy_hitters ranks its hits by text): the workers mirror all.
    hot = mirror.register(
        "SELECT heavy_hitters(srcIP, 0.5) AS hot [RANGE 1 minute, WA ts] FROM gone", "goneh"
    )
    eventually("every pool to hold the stream's 40 srcIPs", settled(server, before + 40, before + 40), server)
    stub.DropQuery(pb.DropQueryRequest(name=hot), timeout=30)
    eventually("the workers to forget them", settled(server, before + 40, literals), server)
    stub.DropQuery(pb.DropQueryRequest(name=query), timeout=30)
    stub.DropStream(pb.DropStreamRequest(name="gone"), timeout=30)
    eventually("the dropped stream's strings to be freed", settled(server, before, literals), server)


def test_late_rows_show_the_strings_of_a_column_no_query_reads(server: Server) -> None:
    mirror = Mirror(connect(server.target), Engine())
    mirror.create_stream("late", sources=["p"])
    sql = "SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM late GROUP BY srcIP"
    query = mirror.register(sql, "lateq")  # destIP: no query reads it, the late side stream shows it
    late = Subscription(mirror.stub, f"{query}.late", from_oldest=True)
    mirror.ingest("late", "p", [packets("e", 20, 0), T0 + 2 * MINUTE, packets("f", 10, 1), CLOSE])
    expected = mirror.late_results(query)  # the reference judges what is late
    tables = [t for t in expected if isinstance(t, pa.Table)]
    assert sum(t.num_rows for t in tables) == 10 and "f-dest-9" in tables[0].column("destIP").to_pylist()
    assert_same(late.reach(expected), expected, "the late side stream")


def test_codes_freed_and_given_out_again_survive_a_kill(tmp_path: Path) -> None:
    """The pool's holes and reused codes are checkpointed and replayed: after kill -9 the query
    reading the reused codes goes on with the right strings."""
    config = {"state_dir": str(tmp_path / "state"), "checkpoint_interval_s": 0.3}
    server = start_server(config=config)
    mirror = Mirror(connect(server.target), Engine())
    mirror.create_stream("old", sources=["p"])
    old = mirror.register(
        "SELECT srcIP, count(*) AS n [RANGE 1 minute, WA ts] FROM old GROUP BY srcIP", "oldq"
    )
    mirror.ingest("old", "p", [packets("g", 30, 0)])
    mirror.stub.DropQuery(pb.DropQueryRequest(name=old), timeout=30)
    mirror.stub.DropStream(pb.DropStreamRequest(name="old"), timeout=30)
    mirror.engine.drop_query(old)
    mirror.engine.drop_stream("old")
    mirror.create_stream("new", sources=["p"])
    sql = "SELECT srcIP, destIP, count(*) AS n [RANGE 1 minute, WA ts] FROM new GROUP BY srcIP, destIP"
    query = mirror.register(sql, "newq")
    mirror.ingest("new", "p", [packets("h", 20, 0)])  # codes the old stream's strings had
    taken = server.stderr_tail(1000).count("lowtide: checkpoint at change")
    eventually(
        "a checkpoint after the drop",
        lambda: server.stderr_tail(1000).count("lowtide: checkpoint at change") > taken,
        server,
    )
    kill9(server)
    with running_server(config=config) as again:
        mirror.stub = connect(again.target)
        mirror.ingest("new", "p", [packets("i", 20, 0), T0 + MINUTE, CLOSE])
        subscription = Subscription(mirror.stub, query, from_oldest=True)
        assert_same(subscription.until(END_OF_STREAM), mirror.results(query), "after the kill")


def words(prefix: str, n: int) -> pa.Table:
    """``n`` rows, each with a ``k`` of its own."""
    return pa.table({"k": [f"{prefix}-{i}" for i in range(n)], "ts": pa.array(range(n), pa.int64())})


def test_a_producer_of_one_stream_cannot_deny_another_its_strings(tmp_path: Path) -> None:
    """Issue 30, item 5: a producer scoped to stream Main cuts three multi-part calls short after
    their first part (33 new strings each), then fills Main close to its own ``max_strings``. A
    cut batch adds nothing, and Main's strings count against Main's limit alone: the admin's
    batch on Other is taken, and the front holds just the strings of batches that applied."""
    admin, producer = "a" * 48, "b" * 48
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[tokens]\n"{admin}" = "admin"\n[tokens."{producer}"]\nrole = "producer"\nstreams = ["Main"]\n'
    )
    config = {"max_strings": MAX_STRINGS}
    with running_server("--tokens", str(tokens), workers=1, warm_up=False, config=config) as server:
        stub = connect(server.target)
        as_admin = {"timeout": 30, "metadata": [("authorization", f"Bearer {admin}")]}
        as_producer = {"timeout": 30, "metadata": [("authorization", f"Bearer {producer}")]}
        for name in ("Main", "Other"):
            columns = [pb.Column(name="k", type="string"), pb.Column(name="ts", type="int64")]
            stub.CreateStream(pb.CreateStreamRequest(name=name, schema=columns, progressing="ts"), **as_admin)
            sql = f"SELECT k, count(*) AS n [RANGE 10, WA ts] FROM {name} GROUP BY k"
            stub.RegisterQuery(pb.RegisterQueryRequest(sql=sql, name=f"{name}_q"), **as_admin)
        eventually("the front to report its pool", lambda: "front" in pool_entries(server), server)
        before = pool_entries(server)["front"]
        for call in range(3):
            part = arrow_bytes(words(f"cut{call}", 33))
            first = pb.IngestRequest(arrow=part, batch_id=call + 1, batch_parts=2)
            cut = failure(stub.Ingest, requests("Main", "p", [first]), **as_producer)
            assert cut.code == grpc.StatusCode.INVALID_ARGUMENT, cut
            assert "after 1 of its 2 parts" in cut.reason, cut
        own = stub.Ingest(requests("Main", "p", [words("main", 95)]), **as_producer)
        other = stub.Ingest(requests("Other", "p", [words("other", 50)]), **as_admin)
        assert (own.tuples, other.tuples) == (95, 50)
        over = failure(stub.Ingest, requests("Main", "p", [words("more", 6)]), **as_producer)
        assert over.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "stream 'Main'" in over.reason, over
        assert "max_strings" in over.reason and "\n" not in over.reason, over
        applied = before + 95 + 50  # the pool's entries are scraped from a copy made every second
        eventually(
            "the front to hold the strings applied", lambda: pool_entries(server)["front"] == applied, server
        )
