"""Fuzz the door in-process: every hostile payload gets a status a client may get
(docs/design.md, "Errors" and "Security").

The real gRPC ``Service`` of the front runs in this process (``hostile.InProcess``: workers that
run nothing), so a payload that used to crash the front would crash this test's process - the
SIGSEGV of the issue is also replayed in a subprocess, where a crash fails the test without
taking pytest down. Each property asserts that every outcome is OK or an allowed code
(INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED, OUT_OF_RANGE) with a one-line
reason - an exception escaping the service would have been UNKNOWN on a real server - and, where
the rule is known, which of the two it must be.

Cases by default (the same every run; ``LOWTIDE_FUZZ_EXAMPLES=k`` runs k times as many):
10 properties of 300 + 150 + 150 + 200 + 100 + 200 + 200 + 150 + 200 + 200 = 1,850 generated
cases, plus 24 hand-built payloads (``HAND_BUILT``), the issue's payload (in a subprocess and
through the service), 15 nesting and 6 size cases and 9 safety-net cases.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from hostile import (
    ALLOWED,
    MAX_ROWS,
    NAME_TEXT,
    SCHEMA,
    T0,
    Context,
    InProcess,
    assert_allowed,
    bad_bitmaps,
    bad_offsets,
    column_ok,
    examples,
    good_table,
    ipc,
    mutated,
    odd_columns,
    source_ok,
    stream_name_ok,
    with_column,
)
from hypothesis import given
from hypothesis import strategies as st

from lowtide import Engine, Limits, LowtideError
from lowtide.ipc import read_ipc
from lowtide.proto import lowtide_pb2 as pb
from lowtide.query.parser import MAX_NESTING

pytestmark = pytest.mark.fuzz

# The issue's payload: a string column whose offsets run backwards and far past its 6-byte data
# buffer. Arrow's cheap checks (first offset 0, last one the data's size) pass it.
SEGFAULT = """
import numpy as np, pyarrow as pa
offsets = np.array([0, 1 << 30, 2, 1 << 29, 6], dtype=np.int32)
buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"abcdef")]
strings = pa.Array.from_buffers(pa.string(), 4, buffers)
table = pa.table({"k": strings, "ts": pa.array([1, 2, 3, 4], pa.int64())})
sink = pa.BufferOutputStream()
with pa.ipc.new_stream(sink, table.schema) as writer:
    writer.write_table(table)
payload = sink.getvalue().to_pybytes()
"""


@pytest.fixture(scope="module")
def door() -> Iterator[InProcess]:
    made = InProcess()
    yield made
    made.close()


def engine() -> Engine:
    made = Engine(limits=Limits(max_batch_rows=MAX_ROWS))
    made.create_stream("S", SCHEMA)
    return made


def push_outcome(eng: Engine, data: object) -> str:
    """The class of what ``Engine.push`` raised, or OK."""
    try:
        eng.push("S", data, source="s")
    except LowtideError as exc:
        return type(exc).__name__
    return "OK"


# -- the issue ------------------------------------------------------------------------------------
def test_the_issue_payload_is_refused_and_crashes_nothing() -> None:
    """In a subprocess: a crash there (SIGSEGV: returncode -11) fails this test, not pytest."""
    script = SEGFAULT + textwrap.dedent(
        """
        from lowtide import Engine, SchemaMismatch
        from lowtide.ipc import read_ipc
        try:
            read_ipc(payload)
        except SchemaMismatch as exc:
            print("read_ipc:", exc)
        else:
            raise SystemExit("read_ipc accepted the payload")
        engine = Engine()
        engine.create_stream("S", {"k": "string", "ts": "int64"})
        unchecked = pa.ipc.open_stream(payload).read_all()  # what the front used to admit
        try:
            engine.push("S", unchecked)
        except SchemaMismatch as exc:
            print("push:", exc)
        else:
            raise SystemExit("the engine admitted the payload")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "read_ipc: malformed Arrow IPC stream: " in done.stdout, done.stdout
    assert "Offset invariant failure" in done.stdout, done.stdout


def test_the_issue_payload_through_the_service(door: InProcess) -> None:
    namespace: dict[str, object] = {}
    exec(SEGFAULT, namespace)  # builds the payload only; nothing reads it
    payload = namespace["payload"]
    assert isinstance(payload, bytes)
    table = good_table(4)
    bad = pa.ipc.open_stream(payload).read_all().column("k")
    as_host = ipc(table.set_column(0, "host", bad))
    before = door.ingested()
    code, details = door.arrow(as_host)
    assert code == "INVALID_ARGUMENT" and "Offset invariant failure" in details, (code, details)
    assert door.ingested() == before


# -- hand-built payloads: handled or refused, each with a known answer ----------------------------
def _deeply_nested() -> bytes:
    values: pa.Array = pa.array([1, 2, 3], pa.int64())
    for _ in range(60):  # Arrow writes and reads at most 64 levels
        values = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
    return ipc(with_column("port", values))


def _many_null_rows() -> bytes:
    nulls = pa.Array.from_buffers(pa.null(), 2**40, [None])  # no bytes: rows claimed for free
    return ipc(pa.table({name: nulls for name in SCHEMA}), allow_64bit=True)


def _strings(offsets: list[int], data: bytes) -> pa.Array:
    raw = np.array(offsets, np.int32).tobytes()
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1, [None, pa.py_buffer(raw), pa.py_buffer(data)])


def _extension(kind: pa.DataType, storage: pa.Array) -> pa.Array:
    return pa.ExtensionArray.from_storage(kind, storage)


def _in(name: str, values: pa.Array) -> bytes:
    return ipc(with_column(name, values))


BAD = "INVALID_ARGUMENT"
HAND_BUILT = [
    ("empty bytes", b"", BAD, "malformed"),
    ("not arrow", b"definitely not arrow", BAD, "malformed"),
    ("only a schema", ipc(good_table(0)), "OK", ""),
    ("a schema and garbage", ipc(good_table(0))[:-8] + b"\xff" * 64, BAD, "malformed"),
    ("compressed body", ipc(good_table(50), compression="zstd"), BAD, "compressed"),
    ("2^40 null rows", _many_null_rows(), "RESOURCE_EXHAUSTED", "over the limit"),
    ("one row past the limit", ipc(good_table(MAX_ROWS + 1)), "RESOURCE_EXHAUSTED", "over the limit"),
    ("dictionary strings", _in("host", pa.array(["a", "b"] * 3).dictionary_encode()), "OK", ""),
    (
        "dictionary with a null value",
        _in("host", pa.DictionaryArray.from_arrays(pa.array([0, 1, 1], pa.int8()), pa.array(["a", None]))),
        "OK",
        "",
    ),
    ("dictionary ints", _in("port", pa.array([1, 2, 1], pa.int32()).dictionary_encode()), BAD, "port"),
    ("list column", _in("bytes", pa.array([[1], [2]], pa.list_(pa.int64()))), BAD, "bytes"),
    ("60 nested lists", _deeply_nested(), BAD, "port"),
    ("uuid extension", _in("host", _extension(pa.uuid(), pa.array([b"0" * 16], pa.binary(16)))), BAD, "host"),
    ("json extension", _in("host", _extension(pa.json_(), pa.array(["{}"]))), BAD, "host"),
    ("bool8 extension", _in("ok", _extension(pa.bool8(), pa.array([1], pa.int8()))), BAD, "ok"),
    ("bad UTF-8", _in("host", _strings([0, 2], b"\xff\xfe")), BAD, "UTF8"),
    ("offsets backwards", _in("host", _strings([0, 5, 2, 6], b"abcdef")), BAD, "Offset"),
    (
        "duplicate column",
        ipc(good_table(3).append_column("port", pa.array([1, 2, 3], pa.int32()))),
        BAD,
        "once",
    ),
    ("ts in ns, not whole ms", _in("ts", pa.array([T0 * 10**6 + 1], pa.timestamp("ns"))), BAD, "exactly"),
    ("ts in ns, whole ms", _in("ts", pa.array([T0 * 10**6], pa.timestamp("ns"))), "OK", ""),
    ("ts in s past int64 as ms", _in("ts", pa.array([2**62], pa.timestamp("s"))), BAD, "exactly"),
    ("ts near the end of int64", _in("ts", pa.array([T0, 2**63 - 7], pa.timestamp("ms"))), BAD, "domain"),
    ("ts at the start of int64", _in("ts", pa.array([-(2**63)], pa.timestamp("ms"))), BAD, "domain"),
    ("ts at the domain's ends", _in("ts", pa.array([-(2**62), 2**62 - 1], pa.timestamp("ms"))), "OK", ""),
    ("uint64 past int64", _in("bytes", pa.array([2**63], pa.uint64())), BAD, "range"),
    ("float past int64", _in("bytes", pa.array([1e19])), BAD, "range"),
    ("nulls in a string for float64", _in("load", pa.array(["1.5", None])), BAD, "load"),
]


@pytest.mark.parametrize(
    ("payload", "code", "words"), [c[1:] for c in HAND_BUILT], ids=[c[0] for c in HAND_BUILT]
)
def test_hand_built_payloads(door: InProcess, payload: bytes, code: str, words: str) -> None:
    before = door.ingested()
    status = door.arrow(payload)
    assert_allowed(status)
    assert status[0] == code and words in status[1], status
    if code != "OK":
        assert door.ingested() == before


# -- properties: Arrow ----------------------------------------------------------------------------
@examples(300)
@given(payload=mutated())
def test_mutated_ipc_streams(door: InProcess, payload: bytes) -> None:
    before = door.ingested()
    status = door.arrow(payload)
    assert_allowed(status, payload[:64])
    if status[0] != "OK":
        assert door.ingested() == before
    with contextlib.suppress(LowtideError):  # the reader alone: a valid table, or a lowtide error
        read_ipc(payload, MAX_ROWS).validate(full=True)


def _valid(table: pa.Table) -> bool:
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


@examples(150)
@given(table=bad_offsets())
def test_string_offsets_that_pass_the_cheap_checks(door: InProcess, table: pa.Table) -> None:
    status = door.arrow(ipc(table))
    assert_allowed(status)
    if not _valid(table):
        assert status[0] == "INVALID_ARGUMENT", status
        assert push_outcome(engine(), table) == "SchemaMismatch"  # the in-process door checks too


@examples(150)
@given(table=bad_bitmaps())
def test_bitmaps_and_indices_that_disagree(door: InProcess, table: pa.Table) -> None:
    status = door.arrow(ipc(table))
    assert_allowed(status)
    if not _valid(table):
        assert status[0] == "INVALID_ARGUMENT", status
        assert push_outcome(engine(), table) == "SchemaMismatch"


@examples(200)
@given(table=odd_columns())
def test_columns_of_any_name_type_and_count(door: InProcess, table: pa.Table) -> None:
    """Duplicate, missing and unknown columns, every Arrow type: the server answers as the
    in-process engine does for the same table."""
    status = door.arrow(ipc(table))
    assert_allowed(status)
    local = push_outcome(engine(), table)
    assert (status[0] == "OK") == (local == "OK"), (status, local)


@examples(100)
@given(
    unit=st.sampled_from(["s", "ms", "us", "ns"]),
    values=st.lists(
        st.one_of(st.integers(-(2**63) + 1, 2**63 - 1), st.integers(-(2**62), 2**62 - 1)),
        min_size=1,
        max_size=5,
    ),
)
def test_timestamps_of_other_units(unit: str, values: list[int]) -> None:
    """Accepted exactly when every value is a whole number of milliseconds within the domain of a
    progressing attribute, [-2^62, 2^62)."""
    table = with_column("ts", pa.array(values, pa.timestamp(unit)))
    per_ms = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 10**6}[unit]
    exact = all(
        (v % per_ms == 0 and -(2**62) <= v // per_ms < 2**62 if per_ms >= 1 else -(2**62) <= v * 1000 < 2**62)
        for v in values
    )
    eng = engine()
    assert push_outcome(eng, table) == ("OK" if exact else "SchemaMismatch")
    if exact:
        assert eng.stats()["streams"]["S"]["ingested"] == len(values)


# -- properties: names, definitions, options ------------------------------------------------------
@examples(200)
@given(kind=st.sampled_from(["stream", "query", "source", "column"]), name=NAME_TEXT)
def test_names(door: InProcess, kind: str, name: str) -> None:
    """Accepted exactly by the documented rules (README "What the server checks")."""
    service, ctx = door.service, Context()
    columns = [pb.Column(name=n, type=t) for n, t in SCHEMA.items()]
    taken = name in ("S", "Q")
    if kind == "stream":
        status = door.outcome(service.CreateStream(pb.CreateStreamRequest(name=name, schema=columns), ctx))
        ok = stream_name_ok(name)
        if status[0] == "OK":
            door.expect_ok(service.DropStream(pb.DropStreamRequest(name=name), ctx))
    elif kind == "query":
        sql = "SELECT count(*) [RANGE 1 minute, WA ts] FROM S"
        status = door.outcome(service.RegisterQuery(pb.RegisterQueryRequest(sql=sql, name=name), ctx))
        ok = stream_name_ok(name) or name == ""  # no name: the server names it
        if status[0] == "OK":
            door.expect_ok(service.DropQuery(pb.DropQueryRequest(name=door.last.name), ctx))
    elif kind == "source":
        status = door.ingest([pb.IngestRequest(stream="S", source=name), pb.IngestRequest(punctuation=T0)])
        ok, taken = source_ok(name) or name == "", False  # no name: the source "default"
    else:
        schema = [pb.Column(name=name, type="int64"), pb.Column(name="ts", type="int64")]
        status = door.outcome(service.CreateStream(pb.CreateStreamRequest(name="C", schema=schema), ctx))
        ok, taken = column_ok(name) and name != "ts", False
        if status[0] == "OK":
            door.expect_ok(service.DropStream(pb.DropStreamRequest(name="C"), ctx))
    assert_allowed(status, name[:50])
    expected = "INVALID_ARGUMENT" if not ok else "ALREADY_EXISTS" if taken else "OK"
    assert status[0] == expected, (kind, name[:50], status)


TYPES = st.one_of(
    st.sampled_from([*SCHEMA.values(), "list<", "list<int64>", "timestamp[xx]", "timestamp[", "INT64 ", ""]),
    st.text(max_size=12),
)
DURATIONS = st.one_of(
    st.sampled_from(["", "5", "-5", "2s", "1e400", "nan", "inf", "\u00b2", "9" * 30, "9" * 5000, "10 s"]),
    st.integers(-(2**70), 2**70).map(str),
    st.text(max_size=8),
)


@examples(200)
@given(
    columns=st.lists(st.tuples(st.sampled_from(["ts", "a", "b", ""]), TYPES), max_size=5),
    progressing=st.sampled_from(["", "ts", "a", "missing"]),
    punctuation=st.one_of(
        st.sampled_from(["", "explicit", "ordered", "bounded:", "heartbeat:1s", "heartbeat:0,0", "bogus"]),
        DURATIONS.map(lambda d: f"bounded:{d}"),
        st.tuples(DURATIONS, DURATIONS).map(lambda p: f"heartbeat:{p[0]},{p[1]}"),
    ),
    idle=st.one_of(st.floats(), st.sampled_from([0.0, -1.0, math.nan, math.inf, 5e-324, 1e308])),
    sources=st.lists(NAME_TEXT, max_size=3),
)
def test_stream_definitions(
    door: InProcess, columns: list[tuple[str, str]], progressing: str, punctuation: str, idle: float,
    sources: list[str],
) -> None:  # fmt: skip
    ctx = Context()
    request = pb.CreateStreamRequest(
        name="D",
        schema=[pb.Column(name=n, type=t) for n, t in columns],
        progressing=progressing,
        punctuation=punctuation,
        sources=sources,
        idle_timeout_s=idle,
    )
    status = door.outcome(door.service.CreateStream(request, ctx))
    assert_allowed(status, request)
    if status[0] == "OK":
        assert 0 < idle < math.inf or idle == 0
        door.expect_ok(door.service.DropStream(pb.DropStreamRequest(name="D"), ctx))


@examples(150)
@given(
    late=st.one_of(st.sampled_from(["", "drop", "update", "error", "bogus", "UPDATE "]), st.text(max_size=6)),
    lateness=DURATIONS,
)
def test_query_options(door: InProcess, late: str, lateness: str) -> None:
    ctx = Context()
    sql = "SELECT count(*) AS n [RANGE 10 seconds, SLIDE 5 seconds, WA ts] FROM S"
    request = pb.RegisterQueryRequest(sql=sql, name="O", late=late, allowed_lateness=lateness)
    status = door.outcome(door.service.RegisterQuery(request, ctx))
    assert_allowed(status, request)
    if status[0] == "OK":
        door.expect_ok(door.service.DropQuery(pb.DropQueryRequest(name="O"), ctx))


# -- properties: query text -----------------------------------------------------------------------
WORDS = [
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "HAVING", "AS", "AND", "OR", "NOT", "UNION", "DISTINCT",
    "RANGE", "SLIDE", "WA", "WATTR", "PA", "RATTR", "SATTR", "ROWS", "ALL", "TUMBLING", "SESSION",
    "EMIT", "EVERY", "row-num", "rank", "count", "sum", "avg", "median", "quantile", "heavy_hitters",
    "count_distinct", "S", "Q", "host", "port", "bytes", "load", "ok", "ts", "S.ts", '"S"', '"x""y"',
    "(", ")", "[", "]", ",", "*", "+", "-", "/", "%", "=", "<>", "<=", ";", "'str'", "'", '"',
    "0", "1", "1.5", "1e400", "99999999999999999999999", "10 seconds", "minute", "ms", "--", "\n", "\x00",
]  # fmt: skip


@examples(200)
@given(
    words=st.lists(st.sampled_from(WORDS), max_size=30),
    head=st.sampled_from(["", "SELECT count(*) [RANGE 1 minute, WA ts] FROM S ", "SELECT host, "]),
)
def test_query_text(door: InProcess, words: list[str], head: str) -> None:
    sql = head + " ".join(words)
    status = door.outcome(door.service.ExplainQuery(pb.ExplainQueryRequest(sql=sql), Context()))
    assert_allowed(status, sql)


NESTINGS = {
    "parentheses": lambda n: "(" * n + "port > 1" + ")" * n,
    "NOT": lambda n: "NOT " * n + "port > 1",
    "unary minus": lambda n: "- " * n + "port > 1",
    "a + chain": lambda n: "port " + "+ 1 " * n + "> 1",
    "an OR chain": lambda n: " OR ".join(["port = 1"] * n),
}


@pytest.mark.parametrize("shape", NESTINGS)
def test_deep_nesting(door: InProcess, shape: str) -> None:
    def explain(n: int) -> tuple[str, str]:
        sql = f"SELECT count(*) [RANGE 1 minute, WA ts] FROM S WHERE {NESTINGS[shape](n)}"
        return door.outcome(door.service.ExplainQuery(pb.ExplainQueryRequest(sql=sql), Context()))

    assert explain(MAX_NESTING - 10) == ("OK", "")
    for n in (MAX_NESTING + 1, 4000):  # 4000 ORs: 48 kB, under the size limit
        code, details = explain(n)
        assert code == "INVALID_ARGUMENT" and "nests too deeply" in details, (n, code, details)


def test_query_text_size(door: InProcess) -> None:
    huge = "SELECT count(*) [RANGE 1 minute, WA ts] FROM S WHERE " + " OR ".join(["port = 1"] * 100_000)
    for sql in (huge, huge[: 64 * 1024 + 1], "-- " + "x" * (1 << 20)):
        for call in (
            door.service.ExplainQuery(pb.ExplainQueryRequest(sql=sql), Context()),
            door.service.RegisterQuery(pb.RegisterQueryRequest(sql=sql, name="big"), Context()),
        ):
            code, details = door.outcome(call)
            assert code == "INVALID_ARGUMENT" and "over the limit of 65536" in details, (code, details)


# -- properties: Ingest message sequences ---------------------------------------------------------
@st.composite
def ingest_message(draw: st.DrawFn) -> pb.IngestRequest:
    fields: dict[str, object] = {}
    if draw(st.booleans()):
        fields["stream"] = draw(st.sampled_from(["S", "Q", "", "nope", "S\x00", "s" * 300]))
    if draw(st.booleans()):
        fields["source"] = draw(st.sampled_from(["s", "", "a/..", "p/p0", "\n"]))
    item = draw(st.sampled_from(["arrow", "garbage", "punctuation", "close", "none"]))
    if item == "arrow":
        fields["arrow"] = ipc(good_table(draw(st.integers(0, 3)), seed=draw(st.integers(0, 3))))
    elif item == "garbage":
        fields["arrow"] = draw(st.binary(max_size=32))
    elif item == "punctuation":
        fields["punctuation"] = draw(st.sampled_from([-(2**63), 0, T0, T0 + 10**6, 2**63 - 1]))
    elif item == "close":
        fields["close"] = draw(st.booleans())
    if draw(st.booleans()):
        fields["batch_id"] = draw(st.sampled_from([0, 1, 2, 2**64 - 1]))
    if draw(st.booleans()):
        fields["batch_parts"] = draw(st.sampled_from([0, 1, 2, 3, 2**32 - 1]))
    return pb.IngestRequest(**fields)  # type: ignore[arg-type]


@examples(200)
@given(messages=st.lists(ingest_message(), max_size=6))
def test_ingest_message_sequences(door: InProcess, messages: list[pb.IngestRequest]) -> None:
    status = door.ingest(messages)
    assert_allowed(status, messages)


# -- afterwards -----------------------------------------------------------------------------------
def test_the_door_still_serves_after_all_of_it(door: InProcess) -> None:
    before = door.ingested()
    batch = good_table(10, t0=T0 + 3_600_000)
    status = door.ingest([pb.IngestRequest(stream="S", source="after"), pb.IngestRequest(arrow=ipc(batch))])
    assert status == ("OK", ""), status
    assert door.ingested() == before + 10
    health = door.loop.run_until_complete(door.service.Health(pb.HealthRequest(), Context()))
    assert health.status == "SERVING"
    assert set(ALLOWED) >= {"OK"}


# -- the safety net -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raised", "code", "words"),
    [
        (RuntimeError("boom\nsecond line"), "INTERNAL", "internal error: RuntimeError: boom"),
        (KeyError("k"), "INTERNAL", "internal error: KeyError: 'k'"),
        (
            RecursionError("maximum recursion depth exceeded"),
            "INVALID_ARGUMENT",
            "the request nests too deeply",
        ),
        (MemoryError(), "RESOURCE_EXHAUSTED", "out of memory serving ListStreams"),
    ],
)
def test_an_unexpected_exception_ends_as_a_status(
    door: InProcess,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    raised: Exception,
    code: str,
    words: str,
) -> None:
    """A bug of ours answers INTERNAL with a one-line reason and logs its traceback; the
    exceptions a request can provoke (too deep, too big) answer as the request's fault."""

    def fail(*_: object) -> None:
        raise raised

    monkeypatch.setattr(door.front.door, "list_streams", fail)
    status = door.outcome(door.service.ListStreams(pb.ListStreamsRequest(), Context()))
    assert status[0] == code and status[1].startswith(words) and "\n" not in status[1], status
    assert any(r.name == "lowtide.server" and r.exc_info for r in caplog.records), caplog.records


def test_subscribe_failures_end_as_a_status(door: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    async def read(query: str) -> None:
        async for _ in door.service.Subscribe(pb.SubscribeRequest(query=query), Context()):
            pass

    for query in ("nope", "x" * 10_000, "Q.late.late", "\x00"):
        code, details = door.outcome(read(query))
        assert code == "NOT_FOUND" and len(details) <= 500, (query[:20], code, details)

    def broken(*_: object) -> None:
        raise ValueError("hub broke")

    monkeypatch.setattr(door.front.hubs["Q"], "subscribe", broken)
    assert door.outcome(read("Q")) == ("INTERNAL", "internal error: ValueError: hub broke")
