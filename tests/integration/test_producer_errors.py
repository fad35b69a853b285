"""Producer errors against a real server (docs/design.md, "Producers"), for ``Producer``,
``AsyncProducer`` and ``lowtide send``: what the client can know raises at the call that made it,
with nothing sent; what only the server can refuse is raised by the next call, names its batch, and
leaves the producer usable - what follows the rejected batch is applied, exactly once."""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from server_harness import lowtide_command

from lowtide import (
    END_OF_STREAM,
    LateTuple,
    LowtideError,
    NotFound,
    Punctuation,
    RegressingPunctuation,
    SchemaMismatch,
)
from lowtide.clients import AsyncClient, Client
from lowtide.clients import _producer_core as producer_core
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc

pytestmark = pytest.mark.integration

SCHEMA = {"k": "string", "len": "int32", "ts": "int64"}
WAIT = 30.0


def rows(keys: list[str], ts: list[int]) -> dict[str, list[Any]]:
    return {"k": keys, "len": [1] * len(keys), "ts": ts}


def info(client: Client, stream: str) -> dict[str, Any]:
    return next(s for s in client.list_streams() if s["name"] == stream)


def count_sql(stream: str) -> str:
    return f"SELECT k, count(*) AS n [RANGE 10, SLIDE 10, WA ts] FROM {stream} GROUP BY k"


def counts_until(client: Client, query: str, value: int) -> Counter[tuple[int, str]]:
    """Every result row of ``query`` up to punctuation ``value``, as (window_start, k) -> n."""
    out: Counter[tuple[int, str]] = Counter()
    with client.subscribe(query, from_oldest=True) as subscription:
        for item in subscription:
            if isinstance(item, Punctuation):
                if item.value >= value:
                    return out
                continue
            for row in item.to_pylist():
                out[(row["window_start"], row["k"])] += row["n"]
    raise AssertionError("the subscription ended early")


def expected(keys: list[str], ts: list[int]) -> Counter[tuple[int, str]]:
    return Counter((t // 10 * 10, k) for k, t in zip(keys, ts, strict=True))


def calls_raising(calls: list[Callable[[], Any]], kind: type[LowtideError]) -> list[str]:
    """Run every call; the reasons of those that raised ``kind`` (the rejection may surface on any)."""
    raised = []
    for call in calls:
        try:
            call()
        except kind as exc:
            raised.append(str(exc))
    return raised


# -- what the client can know: raised at that call, nothing sent -----------------------------------
@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"k": ["a"], "len": ["x"], "ts": [5]}, "column 'len' is int32, got string"),
        ({"k": ["a"], "len": [1]}, "lacks the progressing attribute 'ts'"),
        ({"k": ["a"], "len": [1], "ts": [5], "extra": [1]}, r"unknown column\(s\) 'extra'"),
        ({"k": ["a", "b"], "len": [1, 1], "ts": [5, None]}, r"column 'ts' \(int64\) has nulls"),
        ({"k": "a", "len": 1, "ts": None}, r"column 'ts' \(int64\) has nulls"),  # one row
        ({"k": "a", "len": "1", "ts": 5}, "column 'len' is int32, got str"),  # one row
    ],
)
def test_a_send_that_does_not_fit_raises_there_and_the_next_goes_through(
    target: str, fresh: Callable[[str], str], bad: dict[str, Any], reason: str
) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream))
        with client.producer(stream, linger_ms=60_000) as producer:
            producer.send(rows(["a"], [1]))
            with pytest.raises(SchemaMismatch, match=reason):
                producer.send(bad)
            producer.flush()
            assert info(client, stream)["tuples_ingested"] == 1  # nothing of the bad send
            producer.send(rows(["b", "b"], [2, 12]))
            producer.send({"k": "c", "len": 1, "ts": 13})
            producer.punctuate(20)
            result = producer.close()
        assert (result.tuples, result.batches, result.duplicates) == (4, 3, 0)
        assert result.low_watermark == END_OF_STREAM
        assert counts_until(client, query, 20) == expected(["a", "b", "b", "c"], [1, 2, 12, 13])


def test_punctuation_that_goes_back_raises_at_once(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        with client.producer(stream, source="p") as producer:
            producer.punctuate(500)
            with pytest.raises(RegressingPunctuation, match=r"goes back from 500 \(this producer's last"):
                producer.punctuate(10)
            producer.punctuate(500)
            producer.flush()
        assert info(client, stream)["source_punctuation"]["p"] == 500
        # A new producer of the source reads the server's punctuation when it opens.
        with client.producer(stream, source="p") as again:
            with pytest.raises(RegressingPunctuation, match=r"from 500 \(the source's on the server"):
                again.punctuate(499)
            again.send(rows(["a"], [600]))
            again.punctuate(700)
        assert info(client, stream)["source_punctuation"]["p"] == 700
        assert client.producer(stream, source="p").close().low_watermark == END_OF_STREAM
        with pytest.raises(RegressingPunctuation, match="is closed"):
            client.producer(stream, source="p").punctuate(800)


def test_an_unknown_stream_raises_when_the_producer_opens(target: str, fresh: Callable[[str], str]) -> None:
    with Client(target, timeout=10) as client, pytest.raises(NotFound, match="unknown stream"):
        client.producer(fresh("nope"))


# -- what only the server can refuse: raised by the next call, named, the producer goes on ---------
def test_a_server_rejection_names_its_batch_and_later_sends_apply_once(
    target: str, fresh: Callable[[str], str]
) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream), late="error")
        producer = client.producer(stream, linger_ms=0)
        producer.send(rows(["a"], [50]))  # batch 1, send #1
        producer.punctuate(40)
        producer.flush()
        later_keys = [f"k{i % 3}" for i in range(40)]
        later_ts = [60 + i for i in range(40)]
        calls: list[Callable[[], Any]] = [lambda: producer.send(rows(["late"], [3]))]  # batch 2: late
        calls += [lambda i=i: producer.send(rows([later_keys[i]], [later_ts[i]])) for i in range(40)]
        calls += [lambda: producer.punctuate(110), producer.flush]
        raised = calls_raising(calls, LateTuple)
        assert raised == [
            "batch 2 (row 1 of send #2) was rejected: 1 tuple(s) of stream "
            f"'{stream}' are below its punctuation 40 and a query reading it has late='error'"
        ]
        assert info(client, stream)["tuples_ingested"] == 41  # the late one refused, the rest once
        assert info(client, stream)["low_watermark"] == 110
        producer.flush()  # raised once
        producer.send(rows(["z"], [115]))  # usable afterwards
        result = producer.close()
        assert (result.tuples, result.batches, result.duplicates) == (42, 42, 0)
        assert info(client, stream)["tuples_ingested"] == 42
        want = expected(["a", *later_keys, "z"], [50, *later_ts, 115])
        assert counts_until(client, query, END_OF_STREAM) == want


def test_late_error_rejects_only_tuples_whose_window_is_gone(
    target: str, fresh: Callable[[str], str]
) -> None:
    """Behind punctuation (docs/design.md, "Punctuation and lateness") through the server: the front
    judges ``late='error'`` as the workers count.
    Punctuation 5, then 2, 3, 7, 8: behind it, yet [0, 10) is open - applied. Punctuation 11,
    then 4: [0, 10) was emitted - rejected, named, and nothing else lost."""
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream), late="error")
        producer = client.producer(stream, linger_ms=0)
        producer.punctuate(5)
        producer.send(rows(["a"] * 4, [2, 3, 7, 8]))  # batch 1
        producer.punctuate(11)
        producer.flush()
        calls: list[Callable[[], Any]] = [lambda: producer.send(rows(["a"], [4]))]  # batch 2: late
        calls += [lambda: producer.send(rows(["a", "b"], [12, 15])), producer.flush]  # batch 3: on time
        raised = calls_raising(calls, LateTuple)
        assert len(raised) == 1 and raised[0].startswith("batch 2 (row 4 of send #2) was rejected: "), raised
        assert "below its punctuation 11" in raised[0]
        assert info(client, stream)["tuples_ingested"] == 6
        result = producer.close()
        assert (result.tuples, result.batches) == (6, 2)
        assert counts_until(client, query, END_OF_STREAM) == expected(["a"] * 5 + ["b"], [2, 3, 7, 8, 12, 15])


def test_a_rejected_batch_with_an_id_and_replays_after_it(target: str, fresh: Callable[[str], str]) -> None:
    """Batches in parts after the rejected one are sent again whole; a replayed id stays applied once."""
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        client.register_query(count_sql(stream), late="error")
        with client.producer(stream, max_batch_rows=3) as producer:
            producer.send(rows(["a"] * 4, [50, 51, 52, 53]), batch_id=1)
            producer.punctuate(40)
            producer.flush()
            calls: list[Callable[[], Any]] = [
                lambda: producer.send(
                    rows(["x"] * 5, [60, 61, 3, 62, 63]), batch_id=2
                ),  # its 1st part is late
                lambda: producer.send(rows(["b"] * 7, list(range(70, 77))), batch_id=3),  # 3 parts
                lambda: producer.send(rows(["a"] * 4, [50, 51, 52, 53]), batch_id=1),  # a replay
                producer.flush,
            ]
            raised = calls_raising(calls, LateTuple)
            assert len(raised) == 1 and raised[0].startswith("batch 2 (batch_id 2, rows 4..8 of send #2) was")
        result = producer.result
        assert result is not None and (result.tuples, result.batches, result.duplicates) == (11, 2, 1)
        assert info(client, stream)["tuples_ingested"] == 11


def test_flush_returns_once_everything_is_acknowledged(
    target: str, fresh: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_core, "CALL_MAX_MESSAGES", 5)  # calls end and begin as they fill up
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        producer = client.producer(stream, linger_ms=60_000, max_batch_rows=10)
        sent = 0
        for round_ in range(3):
            for i in range(95):
                producer.send({"k": "a", "len": i, "ts": round_ * 100 + i})
            sent += 95
            producer.punctuate(round_ * 100 + 95)
            producer.flush()  # no waiting: acknowledged means applied
            assert info(client, stream)["tuples_ingested"] == sent
            assert info(client, stream)["source_punctuation"]["default"] == round_ * 100 + 95
        result = producer.close()
        assert (result.tuples, result.batches, result.duplicates) == (285, 30, 0)


def test_the_server_names_the_rejected_message(target: str, fresh: Callable[[str], str]) -> None:
    """``lowtide-message``: the index of the rejected message in its call (the header is 0);
    ``lowtide-applied``: tuples, batches and duplicates the call applied before it."""
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
    channel = grpc.insecure_channel(target)
    stub = lowtide_pb2_grpc.LowtideStub(channel)
    batch = pa.table({"k": ["a", "b"], "len": pa.array([1, 2], pa.int32()), "ts": [10, 11]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_table(batch)
    arrow = sink.getvalue().to_pybytes()
    messages = [
        pb.IngestRequest(stream=stream, source="raw"),
        pb.IngestRequest(arrow=arrow),
        pb.IngestRequest(punctuation=100),
        pb.IngestRequest(punctuation=50),  # goes back: rejected
        pb.IngestRequest(arrow=arrow),  # never read
    ]
    with pytest.raises(grpc.RpcError) as failed:
        stub.Ingest(iter(messages), timeout=WAIT)
    metadata = dict(failed.value.trailing_metadata())  # type: ignore[attr-defined]
    channel.close()
    assert metadata["lowtide-error"] == "RegressingPunctuation"
    assert (metadata["lowtide-message"], metadata["lowtide-applied"]) == ("3", "2,1,0")
    with Client(target, timeout=10) as client:
        assert info(client, stream)["tuples_ingested"] == 2


# -- asyncio ---------------------------------------------------------------------------------------
def test_async_producer_errors(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")

    async def scenario() -> None:
        async with AsyncClient(target, timeout=10) as client:
            with pytest.raises(NotFound, match="unknown stream"):
                await client.producer(fresh("nope"))
            unopened = client.producer(fresh("nope"))  # opens at its first call
            with pytest.raises(NotFound, match="unknown stream"):
                await unopened.send({"k": "a", "len": 1, "ts": 1})
            await client.create_stream(stream, SCHEMA)
            await client.register_query(count_sql(stream), late="error")
            async with client.producer(stream, linger_ms=0) as producer:
                await producer.send(rows(["a"], [50]))
                with pytest.raises(SchemaMismatch, match="column 'len' is int32, got string"):
                    await producer.send({"k": ["a"], "len": ["x"], "ts": [51]})
                with pytest.raises(SchemaMismatch, match="lacks the progressing attribute 'ts'"):
                    await producer.send({"k": "a", "len": 1})
                await producer.punctuate(40)
                with pytest.raises(RegressingPunctuation, match="goes back from 40"):
                    await producer.punctuate(39)
                await producer.flush()
                streams = {s["name"]: s for s in await client.list_streams()}
                assert streams[stream]["tuples_ingested"] == 1
                raised = []
                for call in [
                    producer.send(rows(["late"], [3])),  # batch 2, send #2: late
                    *(producer.send(rows(["b"], [60 + i])) for i in range(20)),
                    producer.punctuate(100),
                    producer.flush(),
                ]:
                    try:
                        await call
                    except LateTuple as exc:
                        raised.append(str(exc))
                assert len(raised) == 1 and raised[0].startswith("batch 2 (row 1 of send #2) was rejected: ")
                await producer.send(rows(["c"], [101]))
                result = await producer.close()
            assert (result.tuples, result.batches, result.duplicates) == (22, 22, 0)
            streams = {s["name"]: s for s in await client.list_streams()}
            assert streams[stream]["tuples_ingested"] == 22
            assert streams[stream]["low_watermark"] == END_OF_STREAM

    asyncio.run(scenario())


# -- lowtide send ---------------------------------------------------------------------------------
def test_cli_send_warns_about_an_undeclared_source(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA, sources=["link-1", "link-2"])
    data = tmp_path / "rows.csv"
    data.write_text("k,len,ts\na,1,5\nb,2,6\n")

    def send(source: str) -> subprocess.CompletedProcess[str]:
        command = [*lowtide_command(), "--server", target, "send", stream, str(data), "--source", source]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    done = send("link-3")
    assert done.returncode == 0, done.stderr
    warning = (
        f"lowtide: warning: source 'link-3' is not declared on stream '{stream}' (declared: link-1, link-2); "
        "it counts as an extra source: the stream's progress waits for it as well as for each declared source"
    )
    assert warning in done.stderr.splitlines()
    assert "sent 2 tuples" in done.stderr
    done = send("link-1")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("k,len\na,1\n")
    command = [*lowtide_command(), "--server", target, "send", stream, str(bad), "--source", "link-1"]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "its header lacks column(s) 'ts'" in failed.stderr, failed.stderr
    with Client(target, timeout=10) as client:
        assert info(client, stream)["tuples_ingested"] == 4
