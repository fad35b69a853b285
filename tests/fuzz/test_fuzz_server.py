"""Fuzz a real server over raw gRPC: hostile requests get an allowed status and break nothing.

One server (one worker, 4 MiB messages, 1000-row batches) serves the module. A stream holds data
and a query over it has results, read by a subscriber, before anything hostile is sent. Every
hostile request - undecodable protobuf, bad names and definitions, garbage and damaged Arrow
(the issue's SIGSEGV payload among them), hostile queries and options - must be answered with
INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED or OUT_OF_RANGE and a one-line
reason: never UNKNOWN, INTERNAL or UNAVAILABLE (a dead server). After each test the server
still answers Health, the stream's ``tuples_ingested`` and the query's results are what they
were, and its log holds no internal error.

Cases by default: ``HOSTILE`` (102 hand-built requests) + the issue's payload + a batch of
timestamps 2^62 ms apart + 200 damaged Arrow streams (``test_damaged_arrow_streams``,
the same every run; ``LOWTIDE_FUZZ_EXAMPLES`` scales it).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from hostile import (
    QUERY,
    SCHEMA,
    T0,
    examples,
    good_table,
    ipc,
    mutated,
    with_column,
)
from hypothesis import given
from server_harness import Server, running_server
from wire import Failure, Subscription, connect, failure_of, rows

from lowtide import Punctuation
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.fuzz, pytest.mark.integration, pytest.mark.xdist_group("fuzz-server")]

CONFIG = {"max_message_bytes": 4 << 20, "max_batch_rows": 1000}
REFUSALS = {"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "OUT_OF_RANGE"}
SERVICE = "/lowtide.v1.Lowtide/"
COLUMNS = [pb.Column(name=n, type=t) for n, t in SCHEMA.items()]


@dataclass
class Scene:
    server: Server
    stub: Any
    channel: grpc.Channel
    subscription: Subscription
    ingested: int
    results: list[dict[str, Any]]

    def answer(self, call: Callable[[], Any]) -> Failure:
        """The status of one request (code OK when it went through)."""
        try:
            response = call()
            if isinstance(response, Iterator):
                for _ in response:
                    pass
        except grpc.RpcError as error:
            return failure_of(error)
        return Failure(grpc.StatusCode.OK, "", "")

    def raw(self, method: str, payload: bytes) -> Failure:
        """A request whose bytes are sent as they are, protobuf or not."""
        same = lambda data: data  # noqa: E731
        if method in ("Ingest", "Stage"):
            call = self.channel.stream_unary(
                SERVICE + method, request_serializer=same, response_deserializer=same
            )
            return self.answer(lambda: call(iter([payload]), timeout=30))
        if method == "Subscribe":
            stream = self.channel.unary_stream(
                SERVICE + method, request_serializer=same, response_deserializer=same
            )
            return self.answer(lambda: stream(payload, timeout=30))
        unary = self.channel.unary_unary(
            SERVICE + method, request_serializer=same, response_deserializer=same
        )
        return self.answer(lambda: unary(payload, timeout=30))

    def ingest(self, *messages: pb.IngestRequest) -> Failure:
        return self.answer(lambda: self.stub.Ingest(iter(messages), timeout=30))

    def arrow(self, payload: bytes, stream: str = "fz") -> Failure:
        return self.ingest(pb.IngestRequest(stream=stream, source="p"), pb.IngestRequest(arrow=payload))

    def stage(self, *messages: pb.StageRequest) -> Failure:
        return self.answer(lambda: self.stub.Stage(iter(messages), timeout=30))

    def staged_parts(self) -> int:
        """The parts staged for batch 1 of fz/p (the batch the Stage cases name), dropped."""
        request = pb.AbortStagedRequest(stream="fz", source="p", batch_id=1)
        return int(self.stub.AbortStaged(request, timeout=10).parts)

    def assert_intact(self) -> None:
        assert self.server.alive(), self.server.stderr_tail()
        assert self.stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING"
        info = {s.name: s for s in self.stub.ListStreams(pb.ListStreamsRequest(), timeout=10).streams}
        assert info["fz"].tuples_ingested == self.ingested
        again = Subscription(self.stub, "fzq", from_oldest=True)
        assert rows(again.until(T0 + 60_000, timeout=30)) == self.results
        again.cancel()
        log = self.server.stderr.read_text(errors="replace")
        assert "Traceback" not in log and "internal error" not in log, self.server.stderr_tail()


def refused(found: Failure, what: object) -> None:
    assert found.code.name in REFUSALS, (found, what)
    assert found.reason.strip() and "\n" not in found.reason and len(found.reason) <= 500, (found, what)


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    with running_server(workers=1, metrics=False, config=CONFIG) as server:
        channel = grpc.insecure_channel(server.target, options=[("grpc.max_send_message_length", -1)])
        stub = connect(server.target)
        stub.CreateStream(pb.CreateStreamRequest(name="fz", schema=COLUMNS, progressing="ts"), timeout=30)
        stub.CreateStream(
            pb.CreateStreamRequest(name="fz_side", schema=COLUMNS, progressing="ts"), timeout=30
        )
        stub.RegisterQuery(pb.RegisterQueryRequest(sql=QUERY.format(s="fz"), name="fzq"), timeout=30)
        stub.RegisterQuery(
            pb.RegisterQueryRequest(sql=QUERY.format(s="fz_side"), name="fz_sideq"), timeout=30
        )
        subscription = Subscription(stub, "fzq", from_oldest=True)
        batches = [good_table(300, t0=T0 + k * 20_000, seed=k) for k in range(3)]
        messages = [pb.IngestRequest(stream="fz", source="p")]
        messages += [pb.IngestRequest(arrow=ipc(batch)) for batch in batches]
        messages.append(pb.IngestRequest(punctuation=T0 + 60_000))
        stub.Ingest(iter(messages), timeout=60)
        results = rows(subscription.until(T0 + 60_000, timeout=60))
        assert results, "the query has results before anything hostile is sent"
        made = Scene(server, stub, channel, subscription, 900, results)
        yield made
        subscription.cancel()
        channel.close()


# -- the issue ------------------------------------------------------------------------------------
def the_issue_payload() -> bytes:
    """A string column whose offsets run backwards and far past its 6-byte data buffer."""
    offsets = np.array([0, 1 << 30, 2, 1 << 29, 6], dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"abcdef")]
    strings = pa.Array.from_buffers(pa.string(), 4, buffers)
    return ipc(with_column("host", strings))


def test_the_issue_payload_against_a_real_server(scene: Scene) -> None:
    """It used to take the front down with SIGSEGV."""
    found = scene.arrow(the_issue_payload())
    refused(found, "the issue's payload")
    assert found.code == grpc.StatusCode.INVALID_ARGUMENT and found.kind == "SchemaMismatch", found
    assert "Offset invariant failure" in found.reason, found
    scene.assert_intact()


# -- hand-built hostile requests ------------------------------------------------------------------
def _bad_utf8_string(field: int) -> bytes:
    return bytes([field << 3 | 2, 2]) + b"\xff\xfe"


def _compressed() -> bytes:
    return ipc(good_table(50), compression="zstd")


def _null_rows() -> bytes:
    nulls = pa.Array.from_buffers(pa.null(), 2**40, [None])
    return ipc(pa.table({name: nulls for name in SCHEMA}), allow_64bit=True)


def _patched_row_count() -> bytes:
    """A valid batch whose metadata claims 2^62 rows."""
    from hostile import patch_points

    data = bytearray(ipc(good_table(10)))
    struct.pack_into("<q", data, patch_points(bytes(data))[0], 2**62)
    return bytes(data)


def _create(**fields: Any) -> Callable[[Scene], Failure]:
    fields = {"name": "fz_new", "schema": COLUMNS, "progressing": "ts", **fields}
    return lambda s: s.answer(lambda: s.stub.CreateStream(pb.CreateStreamRequest(**fields), timeout=30))


def _register(**fields: Any) -> Callable[[Scene], Failure]:
    fields = {"sql": QUERY.format(s="fz"), "name": "fz_newq", **fields}
    return lambda s: s.answer(lambda: s.stub.RegisterQuery(pb.RegisterQueryRequest(**fields), timeout=30))


def _explain(sql: str) -> Callable[[Scene], Failure]:
    return lambda s: s.answer(lambda: s.stub.ExplainQuery(pb.ExplainQueryRequest(sql=sql), timeout=30))


def _subscribe(query: str) -> Callable[[Scene], Failure]:
    return lambda s: s.answer(lambda: s.stub.Subscribe(pb.SubscribeRequest(query=query), timeout=30))


def _ingest(*messages: pb.IngestRequest) -> Callable[[Scene], Failure]:
    return lambda s: s.ingest(*messages)


def _from(stream: str, source: str, **item: Any) -> Callable[[Scene], Failure]:
    """An Ingest call of one item (``arrow=``, ``punctuation=``, ``close=``, ...) after its header."""
    return _ingest(pb.IngestRequest(stream=stream, source=source), pb.IngestRequest(**item))


def _arrow(payload: bytes, stream: str = "fz") -> Callable[[Scene], Failure]:
    return lambda s: s.arrow(payload, stream)


def _raw(method: str, payload: bytes) -> Callable[[Scene], Failure]:
    return lambda s: s.raw(method, payload)


def _staged(payload: bytes, **first: Any) -> list[pb.StageRequest]:
    """The messages of a Stage call: its first (part p0 of batch 1 of fz/p, unless ``first``
    says otherwise), then one carrying ``payload``."""
    header = pb.StageRequest(**{"stream": "fz", "source": "p", "batch_id": 1, "part": "p0", **first})
    return [header, pb.StageRequest(arrow=payload), pb.StageRequest(last=True)]


def _stage(payload: bytes, **first: Any) -> Callable[[Scene], Failure]:
    messages = _staged(payload, **first)
    return lambda s: s.stage(*messages)


def _commit(**fields: Any) -> Callable[[Scene], Failure]:
    fields = {"stream": "fz", "source": "p", "batch_id": 1, "parts": ["p0"], **fields}
    request = pb.CommitStagedRequest(**fields)
    return lambda s: s.answer(lambda: s.stub.CommitStaged(request, timeout=30))


def _abort(**fields: Any) -> Callable[[Scene], Failure]:
    request = pb.AbortStagedRequest(**{"stream": "fz", "source": "p", "batch_id": 1, **fields})
    return lambda s: s.answer(lambda: s.stub.AbortStaged(request, timeout=30))


def _schema(*columns: tuple[str, str]) -> list[pb.Column]:
    return [pb.Column(name=n, type=t) for n, t in columns]


LONG = "x" * 10_000
# A Stage call whose second message passes max_message_bytes: the transport refuses it after the
# first, which carried rows, and before the message marked last: nothing is staged.
CUT_STAGE = "Stage cut by a message over 4 MiB"
UNARY = ("CreateStream", "DropStream", "RegisterQuery", "ExplainQuery", "DropQuery", "Subscribe")
GOOD = ipc(good_table(5, t0=T0 + 100_000))
NEST = "SELECT count(*) [RANGE 1 minute, WA ts] FROM fz WHERE "
HOSTILE: list[tuple[str, Callable[[Scene], Failure]]] = [
    # protobuf that does not decode: bad UTF-8 in a string field, a cut varint, garbage
    *[(f"{m}: bad UTF-8", _raw(m, _bad_utf8_string(1))) for m in UNARY],
    ("Ingest: bad UTF-8", _raw("Ingest", _bad_utf8_string(1))),
    ("Ingest: cut varint", _raw("Ingest", b"\x0a\x80\x80\x80")),
    ("CreateStream: garbage", _raw("CreateStream", b"\xff" * 32)),
    ("RegisterQuery: cut length", _raw("RegisterQuery", b"\x0a" + b"\x80" * 11)),
    # names
    ("stream name with '/'", _create(name="a/b")),
    ("stream name '..'", _create(name="..")),
    ("stream name with NUL", _create(name="a\x00b")),
    ("stream name of 10 kB", _create(name=LONG)),
    ("stream name taken", _create(name="fz")),
    ("source with a '..' segment", _from("fz", "a/../b", punctuation=1)),
    ("source with NUL", _from("fz", "a\x00", punctuation=1)),
    ("source of 10 kB", _from("fz", LONG, punctuation=1)),
    ("column with a newline", _create(schema=_schema(("a\nb", "int64"), ("ts", "int64")))),
    ("column of 10 kB", _create(schema=_schema((LONG, "int64"), ("ts", "int64")))),
    ("query name with '/'", _register(name="q/x")),
    ("query name of 10 kB", _register(name=LONG)),
    ("query name taken", _register(name="fzq")),
    ("query name of a stream", _register(name="fz")),
    # definitions
    ("two columns of one name", _create(schema=_schema(("a", "int64"), ("a", "string"), ("ts", "int64")))),
    ("type list<", _create(schema=_schema(("a", "list<"), ("ts", "int64")))),
    ("type timestamp[xx]", _create(schema=_schema(("a", "timestamp[xx]"), ("ts", "int64")))),
    ("type of 10 kB", _create(schema=_schema(("a", LONG), ("ts", "int64")))),
    ("no progressing column", _create(progressing="nope")),
    ("string progressing column", _create(progressing="host")),
    ("no columns", _create(schema=[])),
    ("negative idle timeout", _create(idle_timeout_s=-1.0)),
    ("NaN idle timeout", _create(idle_timeout_s=float("nan"))),
    ("infinite idle timeout", _create(idle_timeout_s=float("inf"))),
    ("slack of 5000 digits", _create(punctuation="bounded:" + "9" * 5000)),
    ("slack of 1e400", _create(punctuation="bounded:1e400")),
    ("heartbeat of garbage", _create(punctuation="heartbeat:x,y")),
    # queries and their options
    ("late='bogus'", _register(late="bogus")),
    ("allowed lateness of 5000 digits", _register(late="update", allowed_lateness="9" * 5000)),
    ("allowed lateness '1e400'", _register(late="update", allowed_lateness="1e400")),
    ("allowed lateness '\u00b2'", _register(late="update", allowed_lateness="\u00b2")),
    ("allowed lateness '-5'", _register(late="update", allowed_lateness="-5")),
    ("1 MB query", _explain("SELECT count(*) FROM fz -- " + "x" * (1 << 20))),
    ("1 MB query, registered", _register(sql="SELECT count(*) FROM fz -- " + "x" * (1 << 20))),
    ("10,000 parentheses", _explain(NEST + "(" * 10_000 + "port > 1" + ")" * 10_000)),
    ("10,000 NOTs", _explain(NEST + "NOT " * 10_000 + "port > 1")),
    ("a + chain of 3000", _explain(NEST + "port" + " + 1" * 3000 + " > 1")),
    ("an integer past int64", _explain(NEST + "port > 99999999999999999999999999")),
    ("RANGE 1e400", _explain("SELECT count(*) [RANGE 1e400, WA ts] FROM fz")),
    ("RANGE 9e30 ROWS", _explain(f"SELECT count(*) [RANGE {9 * 10**30} ROWS, WA row-num] FROM fz")),
    ("query on no stream", _explain("SELECT count(*) [RANGE 1 minute, WA ts] FROM nope")),
    ("subscribe to no query", _subscribe("nope")),
    ("subscribe to 10 kB", _subscribe(LONG)),
    # Ingest
    ("Ingest naming no stream", _ingest(pb.IngestRequest(source="p", punctuation=1))),
    ("Ingest to no stream", _from("nope", "p", arrow=GOOD)),
    ("Ingest to a query's stream", _from("fzq", "p", arrow=GOOD)),
    ("Ingest punctuating a query's stream", _from("fzq", "p", punctuation=T0)),
    ("Ingest punctuating a query's stream as the query", _from("fzq", "fzq", punctuation=T0)),
    ("Ingest closing a query's stream", _from("fzq", "fzq", close=True)),
    ("garbage arrow", _arrow(b"\x00\x01garbage")),
    ("empty arrow", _arrow(b"")),
    ("compressed arrow", _arrow(_compressed())),
    ("2^40 null rows", _arrow(_null_rows())),
    ("a claim of 2^62 rows", _arrow(_patched_row_count())),
    ("2^32-1 parts, one sent", _from("fz", "p", arrow=GOOD, batch_id=7, batch_parts=2**32 - 1)),
    ("parts without an id", _from("fz", "p", arrow=GOOD, batch_parts=3)),
    ("a message over 4 MiB", _arrow(b"\x00" * (5 << 20))),
    ("close an unknown source", _from("fz", "never", close=True)),
    # Stage, CommitStaged, AbortStaged (staged batches)
    *[(f"{m}: bad UTF-8", _raw(m, _bad_utf8_string(1))) for m in ("Stage", "CommitStaged", "AbortStaged")],
    ("Stage: bad UTF-8 part name", _raw("Stage", _bad_utf8_string(4))),
    ("Stage: cut varint", _raw("Stage", b"\x0a\x80\x80\x80")),
    ("CommitStaged: garbage", _raw("CommitStaged", b"\xff" * 32)),
    ("AbortStaged: cut length", _raw("AbortStaged", b"\x0a" + b"\x80" * 11)),
    ("Stage of no messages", lambda s: s.stage()),
    ("Stage naming no stream", _stage(GOOD, stream="")),
    ("Stage to no stream", _stage(GOOD, stream="nope")),
    ("Stage to a query's stream", _stage(GOOD, stream="fzq")),
    ("Stage with batch_id 0", _stage(GOOD, batch_id=0)),
    ("Stage with no part name", _stage(GOOD, part="")),
    ("Stage with a part name of 10 kB", _stage(GOOD, part=LONG)),
    ("Stage with a part name with NUL", _stage(GOOD, part="p\x00")),
    ("Stage with a source with a '..' segment", _stage(GOOD, source="a/../b")),
    ("Stage of the issue's payload", _stage(the_issue_payload())),
    ("Stage of garbage arrow", _stage(b"\x00\x01garbage")),
    ("Stage of compressed arrow", _stage(_compressed())),
    ("Stage of 2^40 null rows", _stage(_null_rows())),
    ("Stage of a claim of 2^62 rows", _stage(_patched_row_count())),
    (CUT_STAGE, lambda s: s.stage(*_staged(GOOD)[:2], pb.StageRequest(arrow=b"\x00" * (5 << 20)))),
    ("CommitStaged naming no stream", _commit(stream="")),
    ("CommitStaged to no stream", _commit(stream="nope")),
    ("CommitStaged with batch_id 0", _commit(batch_id=0)),
    ("CommitStaged of a part never staged", _commit(parts=["never"])),
    ("CommitStaged of a part name of 10 kB", _commit(parts=[LONG])),
    ("CommitStaged of a part twice", _commit(parts=["p0", "p0"])),
    ("CommitStaged of 10,000 parts", _commit(parts=[f"p{i}" for i in range(10_000)])),
    ("CommitStaged with a source with NUL", _commit(source="a\x00")),
    ("CommitStaged punctuating a query's stream", _commit(stream="fzq", parts=[], punctuation=5)),
    ("AbortStaged to no stream", _abort(stream="nope")),
    ("AbortStaged with batch_id 0", _abort(batch_id=0)),
    ("AbortStaged with a source of 10 kB", _abort(source=LONG)),
]


@pytest.mark.parametrize("case", [name for name, _ in HOSTILE])
def test_hostile_requests(scene: Scene, case: str) -> None:
    send = dict(HOSTILE)[case]
    refused(send(scene), case)
    if case.startswith("Stage"):  # nothing staged
        assert scene.staged_parts() == 0, f"{case}: a refused Stage left a part"
    scene.assert_intact()


def test_a_stage_call_cut_by_the_transport_stages_nothing(scene: Scene) -> None:
    found = dict(HOSTILE)[CUT_STAGE](scene)
    assert found.code == grpc.StatusCode.RESOURCE_EXHAUSTED, found
    assert scene.staged_parts() == 0


# -- damaged Arrow --------------------------------------------------------------------------------
def test_damaged_arrow_streams(scene: Scene) -> None:
    """Bit flips, truncations, splices, overwrites and metadata patches of valid streams, sent to
    the second stream (a damaged stream may still be valid: then it is taken, there)."""
    seen: dict[str, int] = {}

    @examples(200)
    @given(payload=mutated())
    def send(payload: bytes) -> None:
        found = scene.arrow(payload, "fz_side")
        seen[found.code.name] = seen.get(found.code.name, 0) + 1
        if found.code != grpc.StatusCode.OK:
            refused(found, payload[:64])

    started = time.monotonic()
    send()
    assert seen.get("INVALID_ARGUMENT", 0) > 0, seen
    assert time.monotonic() - started < 60, seen
    scene.assert_intact()


def test_timestamps_far_apart_fail_at_most_their_query(scene: Scene) -> None:
    """Tuples 2^62 ms apart, at the ends of the domain: the window operators size a batch's
    per-window state by the span it covers, so a query over them may fail (its subscribers get
    ABORTED with a reason) - but the worker process stays up, and so does everything else."""
    stub, pids = scene.stub, scene.server.worker_pids()
    stub.CreateStream(pb.CreateStreamRequest(name="fz_far", schema=COLUMNS, progressing="ts"), timeout=30)
    stub.RegisterQuery(pb.RegisterQueryRequest(sql=QUERY.format(s="fz_far"), name="fz_farq"), timeout=30)
    watch = Subscription(stub, "fz_farq")
    far = with_column("ts", pa.array([-(2**62), 0, 2**62 - 1], pa.timestamp("ms")))  # the domain's ends
    header = pb.IngestRequest(stream="fz_far", source="p")
    found = scene.ingest(header, pb.IngestRequest(arrow=ipc(far)), pb.IngestRequest(punctuation=2**62))
    if found.code != grpc.StatusCode.OK:
        refused(found, "timestamps far apart")
    # The worker has taken the batch once the query's output moves on or the query has failed.
    moved = lambda: watch.ended is not None or any(isinstance(i, Punctuation) for i in watch.items)  # noqa: E731
    watch.wait(moved, 30, "the query's punctuation or its end")
    assert watch.ended is None or "died" not in watch.ended.reason, watch.ended
    assert scene.server.worker_pids() == pids, scene.server.stderr_tail()
    scene.assert_intact()
