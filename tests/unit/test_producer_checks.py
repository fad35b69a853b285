"""The producer's checks and bookkeeping without a server (docs/design.md, "Producers"): the schema
checks of a send, the punctuation floor, the batcher's messages and how they are named, and what a
rejected Ingest call leaves: the error for the next call, the messages to send again, the result."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from ingest_rejections import Rejected

from lowtide.clients import _producer_core
from lowtide.clients._batching import Batcher
from lowtide.clients._checks import Contract, RowCheck
from lowtide.clients._producer_core import CallLog, ProducerCore
from lowtide.clients._wire import MAX_MESSAGE_BYTES, MessageBound, read_arrow
from lowtide.clients.spark import LowtideSink
from lowtide.errors import (
    InvalidArgument,
    LateTuple,
    NotFound,
    RegressingPunctuation,
    ResourceExhausted,
    SchemaMismatch,
    ServerUnavailable,
)
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS
from lowtide.schema import Schema, check

SCHEMA = {"k": "string", "len": "int32", "x": "float64", "ok": "bool", "ts": "timestamp[ms]"}
INFO = {
    "name": "S",
    "schema": SCHEMA,
    "progressing": "ts",
    "declared": ["a", "b"],
    "source_punctuation": {"a": 100, "gone": END_OF_STREAM},
}


def schema() -> Schema:
    return Schema.of(SCHEMA, "ts")


def good(n: int = 3) -> dict[str, Any]:
    return {
        "k": ["a"] * n,
        "len": pa.array(range(n), pa.int32()),
        "x": [0.5] * n,
        "ok": [True] * n,
        "ts": pa.array(range(n), pa.timestamp("ms")),
    }


# -- tables: the server's door rules, client-side ---------------------------------------------------
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ts": None}, "lacks the progressing attribute 'ts'"),
        ({"len": None}, r"lacks column\(s\) 'len'"),
        ({"extra": [1, 2, 3]}, r"unknown column\(s\) 'extra'"),
        ({"len": ["1", "2", "3"]}, "column 'len' is int32, got string"),
        ({"len": [1, 2, 2**40]}, "column 'len' is int32, got values out of its range"),
        ({"ts": [1.0, 2.5, 3.0]}, "column 'ts' is timestamp.ms., got non-integral numbers"),
        ({"ts": [1, None, 3]}, r"column 'ts' \(timestamp\[ms\]\) has nulls"),
        ({"ok": [1, 0, 1]}, "column 'ok' is bool, got int64"),
        ({"k": [1, 2, 3]}, "column 'k' is string, got int64"),
        ({"x": [True, False, True]}, "column 'x' is float64, got bool"),
        (
            {"ts": pa.array([1_001, 2, 3], pa.timestamp("us"))},
            "column 'ts' is timestamp.ms., got timestamp.us.",
        ),
        (
            {"ts": pa.array([0, 1, 2**63 - 7], pa.timestamp("ms"))},
            r"column 'ts' has 9223372036854775801 at row 2, outside the domain .* \[-2\^62, 2\^62\)",
        ),
        ({"ts": [-(2**63), 1, 2]}, "column 'ts' has -9223372036854775808 at row 0, outside the domain"),
    ],
)
def test_a_table_that_the_door_refuses_is_refused_before_it_leaves(
    change: dict[str, Any], reason: str
) -> None:
    data = good()
    for name, values in change.items():
        if values is None:
            del data[name]
        else:
            data[name] = values
    with pytest.raises(SchemaMismatch, match=reason):
        check(pa.table(data), schema())


def test_tables_the_door_takes_pass() -> None:
    check(pa.table(good()), schema())
    converted = {"k": pa.array(["a", None, "b"]).dictionary_encode(), "len": [1, 2, 3], "x": [1, None, 2]}
    converted |= {"ok": [True, False, True], "ts": [1.0, 2.0, 3.0]}  # integral floats are exact
    check(pa.table(converted), schema())
    check(pa.table({n: pa.array([], pa.null()) for n in SCHEMA}), schema())  # empty: fits any type


# -- rows -----------------------------------------------------------------------------------------
def test_a_row_is_checked_value_by_value_and_typed_as_the_stream() -> None:
    rows = RowCheck(schema())
    names, values = rows({"k": "a", "len": np.int64(3), "x": 1, "ok": np.bool_(True), "ts": 5.0})
    assert names == tuple(SCHEMA)
    assert values == ("a", 3, 1.0, True, 5) and type(values[4]) is int
    when = datetime.datetime(2024, 1, 1, 0, 0, 0, 5000)
    assert rows({"k": None, "len": 1, "x": None, "ok": False, "ts": when})[1][4] == when


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"k": "a", "len": 1, "x": 1.0, "ok": True}, "lacks the progressing attribute 'ts'"),
        ({"k": "a", "x": 1.0, "ok": True, "ts": 1}, r"lacks column\(s\) 'len'"),
        ({"k": "a", "len": 1, "x": 1.0, "ok": True, "ts": 1, "y": 2}, r"unknown column\(s\) 'y'"),
        ({"k": 2, "len": 1, "x": 1.0, "ok": True, "ts": 1}, "column 'k' is string, got int 2"),
        ({"k": "a", "len": True, "x": 1.0, "ok": True, "ts": 1}, "column 'len' is int32, got bool"),
        (
            {"k": "a", "len": 2**31, "x": 1.0, "ok": True, "ts": 1},
            "column 'len' is int32, got 2147483648, out",
        ),
        ({"k": "a", "len": 1, "x": "1", "ok": True, "ts": 1}, "column 'x' is float64, got str"),
        ({"k": "a", "len": 1, "x": 1.0, "ok": 1, "ts": 1}, "column 'ok' is bool, got int"),
        (
            {"k": "a", "len": 1, "x": 1.0, "ok": True, "ts": None},
            r"column 'ts' \(timestamp\[ms\]\) has nulls",
        ),
        (
            {"k": "a", "len": 1, "x": 1.0, "ok": True, "ts": 1.5},
            "column 'ts' is timestamp.ms., got non-integral",
        ),
        (
            {"k": "a", "len": 1, "x": 1.0, "ok": True, "ts": datetime.datetime(2024, 1, 1, 0, 0, 0, 5)},
            "finer than its unit",
        ),
        (
            {"k": "a", "len": 1, "x": 1.0, "ok": True, "ts": 2**62},
            "column 'ts' has 4611686018427387904, outside",
        ),
        ({"k": "a", "len": 1, "x": 1.0, "ok": True, "ts": -(2.0**63)}, "outside the domain"),
    ],
)
def test_a_row_the_door_would_refuse_raises(row: dict[str, Any], reason: str) -> None:
    with pytest.raises(SchemaMismatch, match=reason):
        RowCheck(schema())(row)


def test_a_row_checks_a_datetime_against_the_domain_in_its_unit() -> None:
    """In nanoseconds the domain [-2^62, 2^62) spans the years 1823 to 2116."""
    rows = RowCheck(Schema.of({"ts": "timestamp[ns]"}, "ts"))
    assert rows({"ts": datetime.datetime(2116, 1, 1)})[1] == (datetime.datetime(2116, 1, 1),)
    for year in (1800, 2200):
        with pytest.raises(SchemaMismatch, match="outside the domain"):
            rows({"ts": datetime.datetime(year, 1, 1)})
    with pytest.raises(SchemaMismatch, match="out of bounds"):  # past int64 in nanoseconds
        rows({"ts": datetime.datetime(1, 1, 1)})


def test_rows_become_one_batch_of_the_streams_types() -> None:
    batcher = Batcher("S", "a", 10, 60.0, rows=RowCheck(schema()))
    for i in range(3):
        assert batcher.add({"k": "a", "len": i, "x": i, "ok": True, "ts": float(i)}, send=i + 1) == []
    with pytest.raises(SchemaMismatch):  # refused whole: nothing of it is kept
        batcher.add({"k": "a", "len": "no", "x": 1.0, "ok": True, "ts": 9}, send=4)
    (message,) = batcher.flush()
    table = read_arrow(message.request.arrow)
    assert table.schema == pa.schema([(n, schema().type_of(n).arrow) for n in SCHEMA])
    assert table.column("ts").cast(pa.int64()).to_pylist() == [0, 1, 2]
    assert message.what == "batch 1 (rows 0..2 of sends #1..#3)"
    assert (message.rows, message.sends, message.kind, message.last) == (3, (1, 3), "batch", True)
    check(table, schema())


# -- the batcher's messages and their names --------------------------------------------------------
def test_messages_name_their_batch_rows_and_sends() -> None:
    batcher = Batcher("S", "a", 4, 0.0)
    header = batcher.header()
    assert (header.request.stream, header.request.source, header.kind) == ("S", "a", "header")
    first = batcher.add(pa.table({"ts": [1, 2, 3, 4, 5, 6]}), send=1)  # two batches of at most 4
    assert [m.what for m in first] == ["batch 1 (rows 0..3 of send #1)", "batch 2 (rows 4..5 of send #1)"]
    parts = Batcher("S", "a", 2, 0.0)
    parts.add(pa.table({"ts": [0]}), send=1)
    due = parts.add_batch(pa.table({"ts": [1, 2, 3, 4, 5]}), batch_id=7, send=2)
    assert [(m.unit, m.last, m.request.batch_parts) for m in due] == [
        (2, False, 3),
        (2, False, 3),
        (2, True, 3),
    ]
    assert {m.what for m in due} == {"batch 2 (batch_id 7, rows 1..5 of send #2)"}
    (punctuation,) = parts.punctuation(50, number=1)
    assert (punctuation.what, punctuation.unit) == ("punctuation 50 (punctuate #1)", 3)
    assert parts.close()[-1].what == "close()"
    assert all(not m.request.stream for m in [*first, *due])  # the call's header names the stream


def test_messages_stay_below_the_servers_limit() -> None:
    """Under a server's max_message_bytes every message fits, whatever the sends: one wide table,
    many small ones, a batch in parts; a row that fits in none is dropped, its error kept."""
    limit = 1 << 20
    batcher = Batcher("S", "a", 100_000, 60.0)
    batcher.bound = MessageBound(limit)
    ts = np.arange(300_000, dtype=np.int64)
    wide = pa.table({"k": ts, "v": ts * 2, "ts": ts})  # 7.2 MB
    small = [pa.table({"k": [i], "v": [i], "ts": [i]}) for i in range(20_000)]  # framing beyond nbytes
    due = batcher.add(wide, send=1) + [m for i, t in enumerate(small) for m in batcher.add(t, send=i + 2)]
    due += batcher.flush() + batcher.add_batch(wide, batch_id=7, send=20_002)
    assert all(m.request.ByteSize() <= limit for m in due)
    tables = [read_arrow(m.request.arrow) for m in due]
    assert pa.concat_tables(tables).equals(pa.concat_tables([wide, *small, wide]))
    assert [m.rows for m in due] == [t.num_rows for t in tables]
    parts = [m.request.batch_parts for m in due if m.request.batch_id]
    assert set(parts) == {len(parts)}

    strings = pa.table({"s": ["a", "x" * 2 * limit, "b"], "ts": [1, 2, 3]})
    due = batcher.add(strings, send=20_003) + batcher.flush()
    sent = pa.concat_tables(read_arrow(m.request.arrow) for m in due)
    assert sent.column("s").to_pylist() == ["a", "b"]
    (error,) = batcher.errors
    assert isinstance(error, ResourceExhausted)
    assert str(error).startswith("row 620001 of send #20003 was not sent: it takes ")
    assert str(error).endswith(f"under the server's max_message_bytes ({limit})")
    assert batcher.add(pa.table({"s": ["c"], "ts": [4]}), send=20_004) == []
    with pytest.raises(ResourceExhausted, match=r"^batch_id 8 \(rows 620004..620006 of send #20005\)"):
        batcher.add_batch(strings, batch_id=8, send=20_005)
    (pending,) = batcher.flush()  # what was pending before the batch refused stays
    assert pending.what.endswith("(row 620003 of send #20004)")

    unknown = Batcher("S", "a", 1_000_000, 0.0)  # a server that does not say: messages up to 32 MiB
    (one,) = unknown.add(wide, send=1)
    assert MessageBound().aim == MAX_MESSAGE_BYTES and one.rows == wide.num_rows
    assert len(unknown.add(strings, send=2)) == 1 and unknown.errors == []


# -- the contract: stream, declared sources, punctuation floor -------------------------------------
def test_contract_from_list_streams() -> None:
    contract = Contract.of([INFO], "S", "a")
    assert (contract.declared, contract.punctuation, contract.closed) == (("a", "b"), 100, False)
    assert Contract.of([INFO], "S", "new").punctuation == NO_PROGRESS
    with pytest.raises(NotFound, match="unknown stream 'T'"):
        Contract.of([INFO], "T", "a")


def test_punctuation_never_goes_back() -> None:
    core = ProducerCore("t", "S", "a", 100, 0.0)
    core.open([INFO])
    with pytest.raises(RegressingPunctuation, match=r"goes back from 100 \(the source's on the server"):
        core.punctuate(99)
    core.punctuate(100)  # equal is no step back
    core.punctuate(500)
    with pytest.raises(RegressingPunctuation, match=r"goes back from 500 \(this producer's last"):
        core.punctuate(10)
    assert core.punctuations == 2 and core.last_punctuation == 500
    for outside in (2**63 - 2, 2**62 + 1):  # the end of the stream is close()'s alone
        with pytest.raises(InvalidArgument, match=r"outside the domain .* \[-2\^62, 2\^62\]"):
            core.punctuate(outside)
    unopened = ProducerCore("t", "S", "a", 100, 0.0)
    with pytest.raises(InvalidArgument, match="outside the domain"):
        unopened.punctuate(-(2**63))
    core.punctuate(2**62)  # the top of the domain
    assert core.punctuations == 3 and core.last_punctuation == 2**62
    closed = ProducerCore("t", "S", "gone", 100, 0.0)
    closed.open([INFO])
    with pytest.raises(RegressingPunctuation, match="is closed"):
        closed.punctuate(END_OF_STREAM)


# -- a rejected call --------------------------------------------------------------------------------
def a_call(core: ProducerCore) -> CallLog:
    """One call: batch 1, batch 2 (batch_id 5, in 2 parts), punctuation, batch 4."""
    core.send(pa.table({"k": ["a"], "len": [1], "x": [1.0], "ok": [True], "ts": [1]}), None)
    core.batcher.max_batch_rows = 1
    core.send(pa.table({"k": ["a", "b"], "len": [1, 2], "x": [1.0, 2.0], "ok": [True] * 2, "ts": [2, 3]}), 5)
    core.punctuate(200)
    core.send(pa.table({"k": ["c"], "len": [1], "x": [1.0], "ok": [True], "ts": [300]}), None)
    return queued(core)


def queued(core: ProducerCore) -> CallLog:
    """The core's queued messages, taken as one call after its header."""
    log = CallLog()
    log.add(core.batcher.header())
    while core.backlog:
        log.add(core.backlog.popleft())
    return log


def core() -> ProducerCore:
    made = ProducerCore("t", "S", "a", 100, 0.0)
    made.open([INFO])
    return made


def test_a_rejection_names_its_batch_and_what_follows_it_goes_again() -> None:
    producer = core()
    log = a_call(producer)
    assert [e.kind for e in log.entries] == ["header", "batch", "batch", "batch", "punctuation", "batch"]
    # The server rejected the second part of batch 2: the whole batch is refused, what follows goes again.
    resend = producer.failed(log, Rejected("LateTuple", "1 tuple(s) are late", 3, "1,1,0"))
    assert [e.what for e in resend] == ["punctuation 200 (punctuate #1)", "batch 3 (row 3 of send #3)"]
    (error,) = producer.pending
    assert isinstance(error, LateTuple)
    assert str(error) == "batch 2 (batch_id 5, rows 1..2 of send #2) was rejected: 1 tuple(s) are late"
    result = producer.result
    assert result is not None and (result.tuples, result.batches, result.duplicates) == (1, 1, 0)
    with pytest.raises(LateTuple, match="batch 2"):
        producer.raise_pending()
    producer.raise_pending()  # raised once


def test_a_rejected_punctuation_or_close_is_named_too() -> None:
    producer = core()
    log = a_call(producer)
    resend = producer.failed(log, Rejected("RegressingPunctuation", "goes back", 4))
    assert [e.what for e in resend] == ["batch 3 (row 3 of send #3)"]
    assert str(producer.pending[0]) == "punctuation 200 (punctuate #1) was rejected: goes back"
    result = producer.result  # without the server's count: what came before, replays not told apart
    assert result is not None and (result.tuples, result.batches) == (3, 2)
    closing = core()
    closing.close()
    log = queued(closing)
    assert closing.failed(log, Rejected("NotFound", "no source 'a'", 1, "0,0,0")) == []
    assert str(closing.pending[0]) == "close() was rejected: no source 'a'" and not closing.closed


def test_a_failure_that_names_no_message_sends_nothing_again() -> None:
    producer = core()
    log = a_call(producer)
    assert producer.failed(log, Rejected("", "connection reset", None)) == []
    (error,) = producer.pending
    assert isinstance(error, ServerUnavailable)
    assert "sends #1..#3 and punctuation 200 (punctuate #1) may or may not have been applied" in str(error)
    unknown = core()
    log = a_call(unknown)
    assert unknown.failed(log, Rejected("NotFound", "unknown stream 'S'", 0, "0,0,0")) == []
    assert str(unknown.pending[0]).endswith("; sends #1..#3 and punctuation 200 (punctuate #1) not applied")


def test_results_add_up_over_calls_and_close_is_seen() -> None:
    producer = core()
    assert producer.result is None
    log = a_call(producer)

    class Response:
        tuples, batches, duplicates, low_watermark = 4, 2, 1, 200

    producer.succeeded(log, Response())
    producer.close()
    closing = queued(producer)
    producer.succeeded(closing, Response())
    result = producer.result
    assert result is not None and (result.tuples, result.batches, result.duplicates) == (8, 4, 2)
    assert result.low_watermark == 200 and producer.closed


def test_a_call_ends_at_its_bound_never_inside_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_producer_core, "CALL_MAX_MESSAGES", 3)
    producer = core()
    log = CallLog()
    full = []
    for entry in a_call(producer).entries:
        log.add(entry)
        full.append(log.full())
    # header, batch 1, part 1 of 2, part 2 of 2, punctuation, batch 3
    assert full == [False, False, False, True, True, True]


def test_the_spark_sinks_watermark_stays_within_the_domain() -> None:
    """Event times near the bottom of the domain minus a long delay: the watermark is held at
    -2^62 (below it promises nothing more), not sent below the domain to be refused."""
    sink = LowtideSink("127.0.0.1:1", "S", punctuation="watermark:10 seconds")
    sink._delay, sink._punctuated = 2**62, {sink.source: NO_PROGRESS}
    assert sink._punctuation_after(-(2**62) + 5, NO_PROGRESS) == -(2**62)
    assert sink._punctuation_after(2**62 - 1, NO_PROGRESS) == -1
