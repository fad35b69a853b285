"""Every error docs/design.md lists under "Errors", from a real server: the right status code, a
one-line reason and the right ``lowtide-error`` class - and then the server still serves, with
everything accepted before the error intact: more data afterwards gives the in-process engine's
results.

The module's server runs with small limits (1 MiB messages, 1000-row batches, 100 kB of state per
query); the stream and query count limits get a server of their own.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from server_harness import Server, running_server
from wire import (
    CLOSE,
    PACKET,
    Failure,
    Mirror,
    Subscription,
    arrow_bytes,
    assert_same,
    connect,
    create_stream,
    failure,
    failure_of,
    ingest,
    packets,
    register,
    rows,
    streams,
    table,
)

from lowtide import END_OF_STREAM, Engine, Limits
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("server_errors")]

LIMITS = {"max_message_bytes": 1 << 20, "max_batch_rows": 1000, "max_query_state_bytes": 100_000}
MINUTE = 60_000
T0 = 1_700_000_000_000 // MINUTE * MINUTE
Code = grpc.StatusCode
_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


def assert_error(found: Failure, code: grpc.StatusCode, kind: str) -> None:
    assert (found.code, found.kind) == (code, kind), found
    assert found.reason.strip() and "\n" not in found.reason, found


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(workers=2, config=LIMITS) as running:
        yield running


class Scene:
    """A stream fed by source ``p``; a query split across the workers and one on a single worker,
    each with a subscriber; data before the error, whose results reached the subscribers."""

    def __init__(self, target: str) -> None:
        self.mirror = Mirror(connect(target), Engine(limits=Limits(max_batch_rows=1000)))
        self.stub = self.mirror.stub
        self.stream = fresh("err")
        self.rnd = random.Random(self.stream)
        self.mirror.create_stream(self.stream, sources=["p"])
        sqls = [
            f"SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 2 minutes, SLIDE 1 minute, WA ts] "
            f"FROM {self.stream} GROUP BY srcIP",
            f"SELECT max(len) AS top, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] "
            f"FROM {self.stream}",
        ]
        self.queries = [self.mirror.register(sql, fresh("errq")) for sql in sqls]
        self.subs = [Subscription(self.stub, q, from_oldest=True) for q in self.queries]
        self.now = T0
        self.sent = 0
        self.push(150, 3)
        for query, sub in zip(self.queries, self.subs, strict=True):
            expected = self.mirror.results(query)
            assert rows(expected)
            assert_same(sub.reach(expected), expected, f"{query} before the error")

    def rows(self, n: int, minutes: int = 1) -> pa.Table:
        return table(packets(self.rnd, n, self.now, self.now + minutes * MINUTE))

    def push(self, n: int, minutes: int) -> None:
        batch = self.rows(n, minutes)
        self.now += minutes * MINUTE
        self.mirror.ingest(self.stream, "p", [batch, self.now])
        self.sent += n

    def ingested(self) -> int:
        return int(streams(self.stub)[self.stream].tuples_ingested)

    def finish(self) -> None:
        """The server still serves; earlier data and results are intact; more data works."""
        health = self.stub.Health(pb.HealthRequest(), timeout=10)
        assert health.status == "SERVING"
        assert self.ingested() == self.sent
        self.push(120, 2)
        self.mirror.ingest(self.stream, "p", [CLOSE])
        assert self.ingested() == self.sent
        for query, sub in zip(self.queries, self.subs, strict=True):
            assert_same(sub.until(END_OF_STREAM), self.mirror.results(query), f"{query} after the error")


@pytest.fixture
def scene(server: Server) -> Iterator[Scene]:
    assert server.alive(), server.stderr_tail()
    made = Scene(server.target)
    yield made
    assert server.alive(), server.stderr_tail()


def test_malformed_arrow_bytes(scene: Scene) -> None:
    good = scene.rows(40)
    for bad in (b"definitely not arrow", arrow_bytes(good)[:-40], b"\xff\xff\xff\xff" + b"\0" * 64):
        found = scene.mirror.reject(scene.stream, "p", [good, bad])
        scene.sent += good.num_rows  # the batch before the bad one stays
        assert_error(found, Code.INVALID_ARGUMENT, "SchemaMismatch")
        assert scene.ingested() == scene.sent
    scene.finish()


def test_schema_mismatch_rejects_the_batch_whole(scene: Scene) -> None:
    good = scene.rows(50)
    wrong_type = good.set_column(4, "len", pa.array([str(v) for v in good.column("len").to_pylist()]))
    one_out_of_range = good.set_column(
        4, "len", pa.array([*good.column("len").to_pylist()[:-1], 2**40], type=pa.int64())
    )
    null_in_int = good.set_column(
        4, "len", pa.array([*good.column("len").to_pylist()[:-1], None], pa.int32())
    )
    for bad in (
        wrong_type,
        one_out_of_range,
        null_in_int,
        good.drop_columns(["destPort"]),
        good.append_column("extra", pa.array([1] * good.num_rows)),
        good.drop_columns(["ts"]),
    ):
        assert_error(scene.mirror.reject(scene.stream, "p", [bad]), Code.INVALID_ARGUMENT, "SchemaMismatch")
        assert scene.ingested() == scene.sent, "a rejected batch was counted in part"
    scene.finish()


def part(data: pa.Table | bytes, batch_id: int, parts: int) -> pb.IngestRequest:
    payload = data if isinstance(data, bytes) else arrow_bytes(data)
    return pb.IngestRequest(arrow=payload, batch_id=batch_id, batch_parts=parts)


def test_a_batch_in_parts_is_applied_whole_or_not_at_all(scene: Scene) -> None:
    good, more = scene.rows(600), scene.rows(600)
    bad = more.drop_columns(["destPort"])
    cut_short = [
        ([part(good, 5, 2), part(bad, 5, 2)], "SchemaMismatch"),  # the last part is wrong
        ([part(good, 6, 2)], "InvalidArgument"),  # the call ends after the first part
        ([part(good, 7, 2), scene.now], "InvalidArgument"),  # punctuation before the last part
        ([part(good, 8, 2), part(more, 9, 2)], "InvalidArgument"),  # another batch begins
        ([part(good, 10, 2), part(b"not arrow", 10, 2)], "SchemaMismatch"),
    ]
    for items, kind in cut_short:
        found = failure(ingest, scene.stub, scene.stream, "p", items)
        assert_error(found, Code.INVALID_ARGUMENT, kind)
        assert scene.ingested() == scene.sent, f"{kind}: part of a batch was applied"
    # 1,200 rows pass a 1,000-row limit as two parts, once; the replay is acknowledged, skipped.
    for attempt in range(2):
        response = ingest(scene.stub, scene.stream, "p", [part(good, 11, 2), part(more, 11, 2)])
        assert (response.batches, response.duplicates) == ((1, 0) if attempt == 0 else (0, 1))
    for data in (good, more):
        scene.mirror.apply(scene.stream, "p", data)
    scene.sent += 1_200
    assert scene.ingested() == scene.sent
    scene.finish()


def test_one_batch_id_on_two_calls_at_once_applies_once(scene: Scene) -> None:
    """A retried task racing its first attempt (Spark's speculation): both send batch 21."""
    good, more = scene.rows(300), scene.rows(300)
    feed: queue.Queue[pb.IngestRequest | None] = queue.Queue()
    sent = threading.Semaphore(0)

    def first_attempt() -> Iterator[pb.IngestRequest]:
        yield pb.IngestRequest(stream=scene.stream, source="p")
        while (item := feed.get()) is not None:
            yield item
            sent.release()  # gRPC asks for the next message once it has sent this one

    slow = scene.stub.Ingest.future(first_attempt(), timeout=60)
    feed.put(part(good, 21, 2))
    assert sent.acquire(timeout=30), "the first attempt never sent its first part"
    retry = ingest(scene.stub, scene.stream, "p", [part(good, 21, 2), part(more, 21, 2)])
    feed.put(part(more, 21, 2))
    feed.put(None)
    first = slow.result()
    assert sorted([(retry.batches, retry.duplicates), (first.batches, first.duplicates)]) == [(0, 1), (1, 0)]
    for data in (good, more):
        scene.mirror.apply(scene.stream, "p", data)
    scene.sent += 600
    assert scene.ingested() == scene.sent
    scene.finish()


def test_unknown_streams_and_queries(scene: Scene) -> None:
    stub = scene.stub
    cases = [
        (ingest, stub, "no_such_stream", "p", [scene.rows(5)]),
        (stub.Ingest, iter([pb.IngestRequest(source="p", punctuation=1)])),  # no stream named
        (stub.DropStream, pb.DropStreamRequest(name="no_such_stream")),
        (stub.DropQuery, pb.DropQueryRequest(name="no_such_query")),
        (register, stub, "SELECT count(*) [RANGE 1 minute, WA ts] FROM no_such_stream", fresh("q")),
        (ingest, stub, scene.stream, "never_spoke", [CLOSE]),  # closing a source the stream lacks
    ]
    for call, *args in cases:
        assert_error(failure(call, *args), Code.NOT_FOUND, "NotFound")
    for query in ("no_such_query", "no_such_query.late"):
        assert_error(Subscription(stub, query).end(), Code.NOT_FOUND, "NotFound")
    scene.finish()


def test_duplicate_names(scene: Scene) -> None:
    stub, stream, query = scene.stub, scene.stream, scene.queries[0]
    sql = f"SELECT count(*) [RANGE 1 minute, WA ts] FROM {stream}"
    for call, *args in [
        (create_stream, stub, stream),
        (create_stream, stub, query),  # a query's result is a stream by that name
        (register, stub, sql, query),
        (register, stub, sql, stream),
    ]:
        assert_error(failure(call, *args), Code.ALREADY_EXISTS, "AlreadyExists")
    scene.finish()


def test_regressing_punctuation(scene: Scene) -> None:
    batch = scene.rows(30, 1)
    found = scene.mirror.reject(scene.stream, "p", [batch, scene.now + 30_000, scene.now + 10_000])
    assert_error(found, Code.INVALID_ARGUMENT, "RegressingPunctuation")
    scene.sent += batch.num_rows
    # A closed source promises +inf: any punctuation after it goes back.
    scene.mirror.ingest(scene.stream, "other", [scene.now, CLOSE])
    found = scene.mirror.reject(scene.stream, "other", [scene.now + MINUTE])
    assert_error(found, Code.INVALID_ARGUMENT, "RegressingPunctuation")
    scene.now += 30_000  # p promised this much already
    scene.finish()


def test_late_tuples_under_the_error_policy(scene: Scene) -> None:
    strict = scene.mirror.register(
        f"SELECT count(*) [RANGE 1 minute, WA ts] FROM {scene.stream}", "strict", "error"
    )
    late = table(packets(scene.rnd, 5, T0, T0 + MINUTE))
    assert_error(scene.mirror.reject(scene.stream, "p", [late]), Code.INVALID_ARGUMENT, "LateTuple")
    assert scene.ingested() == scene.sent
    scene.finish()
    assert_same(Subscription(scene.stub, strict, from_oldest=True).until(), scene.mirror.results(strict))


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELEC count(*) FROM x", "QuerySyntaxError"),
        ("SELECT count(*) [RANGE 1 minute, WA ts] FROM {s} WHERE", "QuerySyntaxError"),
        ("SELECT count(*) [RANGE 1 minute, SLIDE] FROM {s}", "QuerySyntaxError"),
        ("SELECT foo(len) [RANGE 1 minute, WA ts] FROM {s}", "UnsupportedQuery"),
        ("SELECT nosuch [RANGE 1 minute, WA ts] FROM {s}", "UnsupportedQuery"),
    ],
)
def test_unparsable_or_unplannable_query(scene: Scene, sql: str, kind: str) -> None:
    text = sql.format(s=scene.stream)
    name = fresh("bad")
    found = failure(register, scene.stub, text, name)
    assert_error(found, Code.INVALID_ARGUMENT, kind)
    if kind == "QuerySyntaxError":
        assert found.reason.startswith("line 1, column "), found
    assert_error(
        failure(scene.stub.ExplainQuery, pb.ExplainQueryRequest(sql=text)), Code.INVALID_ARGUMENT, kind
    )
    assert name not in {q.name for q in scene.stub.ListQueries(pb.ListQueriesRequest()).queries}
    scene.finish()


def test_bad_definitions_and_wrong_targets(scene: Scene) -> None:
    stub, name = scene.stub, fresh("bad_stream")
    bad_streams = [
        {"schema": {"a": "int16", "ts": "int64"}},
        {"schema": PACKET, "punctuation": "bogus"},
        {"schema": {"a": "int32"}},  # no progressing attribute
    ]
    for options in bad_streams:
        assert_error(failure(create_stream, stub, name, **options), Code.INVALID_ARGUMENT, "InvalidArgument")
    assert_error(failure(create_stream, stub, "a.b"), Code.INVALID_ARGUMENT, "InvalidArgument")
    assert name not in streams(stub)
    sql = f"SELECT count(*) [RANGE 1 minute, WA ts] FROM {scene.stream}"
    assert_error(failure(register, stub, sql, fresh("q"), "bogus"), Code.INVALID_ARGUMENT, "InvalidArgument")
    # A query's result stream takes no input; a stream read by a query cannot be dropped.
    found = failure(ingest, stub, scene.queries[0], "p", [scene.rows(3)])
    assert_error(found, Code.INVALID_ARGUMENT, "InvalidArgument")
    found = failure(stub.DropStream, pb.DropStreamRequest(name=scene.stream))
    assert_error(found, Code.INVALID_ARGUMENT, "InvalidArgument")
    scene.finish()


def test_a_message_over_the_size_limit(scene: Scene) -> None:
    huge = scene.rows(300).set_column(0, "srcIP", pa.array(["x" * 5000] * 300))  # 1.5 MB, 300 rows
    found = failure(ingest, scene.stub, scene.stream, "p", [huge])
    assert found.code == Code.RESOURCE_EXHAUSTED and found.kind == "", found  # gRPC's own limit
    assert scene.ingested() == scene.sent
    scene.finish()


def test_a_batch_over_the_row_limit(scene: Scene) -> None:
    found = scene.mirror.reject(scene.stream, "p", [scene.rows(1001)])
    assert_error(found, Code.RESOURCE_EXHAUSTED, "ResourceExhausted")
    assert scene.ingested() == scene.sent
    scene.push(1000, 1)  # at the limit: accepted
    scene.finish()


def test_a_query_over_its_state_limit_fails_alone(scene: Scene) -> None:
    wide = fresh("wide")  # on the server only: the engine has no state limit
    register(
        scene.stub,
        f"SELECT srcPort, destIP, count(*) AS n [RANGE 10 minutes, SLIDE 1 second, WA ts] "
        f"FROM {scene.stream} GROUP BY srcPort, destIP",
        wide,
    )
    sub = Subscription(scene.stub, wide)
    for _ in range(8):  # thousands of ports, no punctuation: its windows stay open, its state grows
        batch = scene.rows(1000, 2)
        ports = pa.array([scene.rnd.randrange(1 << 30) for _ in range(1000)], pa.int32())
        scene.mirror.ingest(scene.stream, "p", [batch.set_column(1, "srcPort", ports)])
        scene.sent += 1000
    found = sub.end(timeout=10)  # state is measured every second
    assert_error(found, Code.RESOURCE_EXHAUSTED, "ResourceExhausted")
    assert "state" in found.reason and wide in found.reason, found
    assert_error(
        Subscription(scene.stub, wide, from_oldest=True).end(), Code.RESOURCE_EXHAUSTED, "ResourceExhausted"
    )
    scene.now += 2 * MINUTE
    scene.finish()  # the other queries on the same stream kept working
    other = scene.mirror.register(
        f"SELECT count(*) AS n [RANGE 1 minute, WA ts] FROM {scene.stream}", fresh("o")
    )
    assert_same(Subscription(scene.stub, other, from_oldest=True).until(), scene.mirror.results(other))


def test_too_many_streams_and_queries() -> None:
    with running_server(workers=2, config={"max_streams": 2, "max_queries": 2}) as small:
        mirror = Mirror(connect(small.target), Engine(limits=Limits(max_streams=2, max_queries=2)))
        for stream in ("one", "two"):
            mirror.create_stream(stream, sources=["p"])
        assert_error(
            failure(create_stream, mirror.stub, "three"), Code.RESOURCE_EXHAUSTED, "ResourceExhausted"
        )
        q1 = mirror.register(
            "SELECT srcIP, count(*) AS n [RANGE 1 minute, WA ts] FROM one GROUP BY srcIP", "q1"
        )
        q2 = mirror.register("SELECT count(*) AS n [RANGE 1 minute, WA ts] FROM two", "q2")
        found = failure(register, mirror.stub, "SELECT count(*) [RANGE 1 minute, WA ts] FROM one", "q3")
        assert_error(found, Code.RESOURCE_EXHAUSTED, "ResourceExhausted")
        subs = {q: Subscription(mirror.stub, q, from_oldest=True) for q in (q1, q2)}
        rnd = random.Random(4)
        for stream in ("one", "two"):
            mirror.ingest(stream, "p", [table(packets(rnd, 200, T0, T0 + 5 * MINUTE)), CLOSE])
        for q, sub in subs.items():
            assert_same(sub.until(), mirror.results(q), q)
        mirror.stub.DropQuery(pb.DropQueryRequest(name=q2))  # room again
        register(mirror.stub, "SELECT count(*) [RANGE 1 minute, WA ts] FROM one", "q3")
        assert {q.name for q in mirror.stub.ListQueries(pb.ListQueriesRequest()).queries} == {q1, "q3"}


def test_query_results_do_not_count_as_streams() -> None:
    with running_server(workers=1, metrics=False, config={"max_streams": 2}) as small:
        stub = connect(small.target)
        create_stream(stub, "one")
        register(stub, "SELECT count(*) [RANGE 1 minute, WA ts] FROM one", "q1")
        assert set(streams(stub)) == {"one"}
        try:
            create_stream(stub, "two")  # the second of at most 2 streams
            refused = None
        except grpc.RpcError as error:
            refused = failure_of(error)
    assert refused is None, refused
