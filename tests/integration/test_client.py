"""The Python clients against a real server: every call, the producer's batching, subscriptions,
and each error coming back as the lowtide exception the server raised."""

from __future__ import annotations

import asyncio
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lowtide import (
    END_OF_STREAM,
    AlreadyExists,
    InvalidArgument,
    LowtideError,
    NotFound,
    Punctuation,
    QuerySyntaxError,
    RegressingPunctuation,
    SchemaMismatch,
    UnsupportedQuery,
)
from lowtide.clients import AsyncClient, Client, ServerUnavailable, Subscription
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SCHEMA = {"k": "string", "len": "int32", "ts": "int64"}
WAIT = 30.0


def count_sql(stream: str, slide: int = 10) -> str:
    return f"SELECT k, count(*) AS n [RANGE {slide}, SLIDE {slide}, WA ts] FROM {stream} GROUP BY k"


class Collector:
    """A subscription read by a thread into a queue, so a test can wait for what it expects."""

    def __init__(self, client: Client, query: str, from_oldest: bool = False) -> None:
        self.subscription = client.subscribe(query, from_oldest=from_oldest)
        self.items: queue.Queue[Any] = queue.Queue()
        self.seen: list[Any] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.subscription:
                self.items.put(item)
        except LowtideError as exc:
            self.items.put(exc)

    def until(self, done: Callable[[Any], bool], timeout: float = WAIT) -> list[Any]:
        """Items up to and including the first for which ``done`` holds."""
        deadline = time.monotonic() + timeout
        got: list[Any] = []
        while True:
            item = self.items.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(item, Exception):
                raise item
            got.append(item)
            self.seen.append(item)
            if done(item):
                return got

    def close(self) -> None:
        self.subscription.cancel()
        self.thread.join(5)


def punctuation_at_least(value: int) -> Callable[[Any], bool]:
    return lambda item: isinstance(item, Punctuation) and item.value >= value


def counts(items: list[Any]) -> Counter[tuple[int, str]]:
    out: Counter[tuple[int, str]] = Counter()
    for item in items:
        if isinstance(item, pa.Table):
            for row in item.to_pylist():
                out[(row["window_start"], row["k"])] += row["n"]
    return out


def expected(keys: list[str], ts: list[int], slide: int = 10) -> Counter[tuple[int, str]]:
    return Counter((t // slide * slide, k) for k, t in zip(keys, ts, strict=True))


def stream_info(client: Client, name: str) -> dict[str, Any]:
    return next(s for s in client.list_streams() if s["name"] == name)


# -- control calls --------------------------------------------------------------------------------
def test_health(target: str) -> None:
    with Client(target, timeout=10) as client:
        health = client.health()
    assert health["status"] == "SERVING"
    assert health["workers"] == 2
    assert health["version"]


def test_stream_create_list_drop(target: str, fresh: Callable[[str], str]) -> None:
    name = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(
            name, SCHEMA, progressing="ts", punctuation="bounded:5", sources=["a", "b"], idle_timeout=30
        )
        info = stream_info(client, name)
        assert info["schema"] == SCHEMA
        assert info["progressing"] == "ts"
        assert info["punctuation"].startswith("bounded")
        assert set(info["sources"]) == {"a", "b"}
        assert info["tuples_ingested"] == 0
        with pytest.raises(AlreadyExists, match=name):
            client.create_stream(name, SCHEMA)
        client.drop_stream(name)
        assert name not in {s["name"] for s in client.list_streams()}
        with pytest.raises(NotFound, match="unknown stream"):
            client.drop_stream(name)


def test_an_unknown_name_suggests_the_closest_one(target: str, fresh: Callable[[str], str]) -> None:
    """The server's NotFound names the closest stream or query (issue 22, item 10)."""
    stream, query = fresh("Typo_Mainstream"), fresh("typo_packets")
    typo_stream, typo_query = stream.replace("Main", "Mian"), query.replace("packets", "pakcets")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        client.register_query(f"SELECT count(*) AS n [RANGE 10, WA ts] FROM {stream}", name=query)
        try:
            calls = {
                "drop stream": lambda: client.drop_stream(typo_stream),
                "FROM": lambda: client.register_query(
                    f"SELECT count(*) AS n [RANGE 10, WA ts] FROM {typo_stream}"
                ),
                "producer": lambda: client.producer(typo_stream),
            }
            for what, call in calls.items():
                with pytest.raises(NotFound) as raised:
                    call()
                reason = str(raised.value)
                assert reason.startswith(
                    f"unknown stream '{typo_stream}' (did you mean '{stream}'?); streams: "
                ), what
            with pytest.raises(
                NotFound, match=rf"^unknown query '{typo_query}' \(did you mean '{query}'\?\); queries: "
            ):
                client.drop_query(typo_query)
            with pytest.raises(
                NotFound, match=rf"^unknown query '{typo_query}' \(did you mean '{query}'\?\); queries: "
            ):
                next(iter(client.subscribe(typo_query)))
        finally:
            client.drop_query(query)
            client.drop_stream(stream)


def test_control_errors_are_the_servers_exceptions(target: str, fresh: Callable[[str], str]) -> None:
    name = fresh("S")
    with Client(target, timeout=10) as client:
        with pytest.raises(InvalidArgument, match="unknown column type"):
            client.create_stream(name, {"k": "strin", "ts": "int64"})
        with pytest.raises(InvalidArgument, match="progressing attribute"):
            client.create_stream(name, {"k": "string"}, progressing="ts")
        client.create_stream(name, SCHEMA)
        with pytest.raises(QuerySyntaxError) as syntax:
            client.register_query(f"SELEC k FROM {name}")
        assert (syntax.value.line, syntax.value.column) == (1, 1)
        assert str(syntax.value).startswith("line 1, column 1:")
        with pytest.raises(UnsupportedQuery, match="unknown column 'nope'"):
            client.register_query(f"SELECT nope, count(*) [RANGE 10, WA ts] FROM {name} GROUP BY nope")
        with pytest.raises(NotFound, match="unknown stream"):
            client.register_query("SELECT count(*) [RANGE 10, WA ts] FROM NoSuchStream")
        with pytest.raises(NotFound, match="unknown query"):
            client.drop_query(fresh("q"))
        with pytest.raises(NotFound):
            next(iter(client.subscribe(fresh("q"))))
        client.drop_stream(name)


def test_unreachable_server_is_server_unavailable() -> None:
    unreachable = re.escape("127.0.0.1:1")
    with Client("127.0.0.1:1", timeout=5) as client, pytest.raises(ServerUnavailable, match=unreachable):
        client.list_streams()


def test_query_register_explain_list_drop(target: str, fresh: Callable[[str], str]) -> None:
    stream, name = fresh("S"), fresh("q")
    sql = count_sql(stream)
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        plan = client.explain(sql)
        assert "Aggregate" in plan
        query = client.register_query(sql, name=name, late="update", allowed_lateness=20)
        assert isinstance(query, str) and query == name and query.sql == sql
        unnamed = client.register_query(sql)
        assert unnamed and unnamed != name
        with pytest.raises(AlreadyExists):
            client.register_query(sql, name=name)
        info = next(q for q in client.list_queries() if q["name"] == name)
        assert info["sql"] == sql
        assert info["late"] == "update"
        assert info["columns"] == ["window_start", "window_end", "k", "n", "revision"]
        assert info["schema"]["n"] == "int64"
        with pytest.raises(InvalidArgument, match="read by query"):
            client.drop_stream(stream)
        client.drop_query(query)
        client.drop_query(unnamed)
        assert name not in {q["name"] for q in client.list_queries()}
        client.drop_stream(stream)


# -- producer -------------------------------------------------------------------------------------
def test_single_row_sends_travel_as_few_batches(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    rows = 20_000
    keys = [f"k{i % 7}" for i in range(rows)]
    ts = [(i * 37) % 1000 for i in range(rows)]
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream))
        collector = Collector(client, query, from_oldest=True)
        with client.producer(stream, source="rows", linger_ms=60_000, max_batch_rows=5_000) as producer:
            for k, t in zip(keys, ts, strict=True):
                producer.send({"k": k, "len": 60, "ts": t})
            producer.punctuate(1000)
            result = producer.close()
        assert (result.tuples, result.batches, result.duplicates) == (rows, 4, 0)
        assert result.low_watermark == END_OF_STREAM
        assert stream_info(client, stream)["tuples_ingested"] == rows
        got = collector.until(punctuation_at_least(1000))
        collector.close()
        assert counts(got) == expected(keys, ts)
        assert next(q for q in client.list_queries() if q["name"] == query)["results"] == len(
            expected(keys, ts)
        )


def test_linger_sends_pending_rows_without_flush(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        with client.producer(stream, linger_ms=20) as producer:
            for i in range(10):
                producer.send({"k": "a", "len": 1, "ts": i})
            deadline = time.monotonic() + WAIT
            while stream_info(client, stream)["tuples_ingested"] < 10:
                assert time.monotonic() < deadline, "lingering rows never reached the server"
                time.sleep(0.02)
            producer.send({"k": "a", "len": 1, "ts": 10})
            producer.flush()
        assert producer.result is not None and producer.result.tuples == 11
        assert producer.result.batches == 2
        # Leaving the block ends the call but not the source: it may send again.
        with client.producer(stream) as again:
            again.punctuate(5)
        assert stream_info(client, stream)["low_watermark"] == 5


def test_every_kind_of_batch(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    n = 100
    with Client(target, timeout=10) as client:
        client.create_stream(stream, {"k": "string", "len": "int32", "ts": "timestamp[ms]"})
        with client.producer(stream, linger_ms=0) as producer:
            producer.send({"k": ["a"] * n, "len": np.arange(n, dtype=np.int32), "ts": np.arange(n)})
            producer.send(pd.DataFrame({"k": ["b"] * n, "len": np.arange(n), "ts": np.arange(n) + 100}))
            producer.send(pa.table({"k": ["c"] * n, "len": pa.array(range(n), pa.int32()), "ts": range(n)}))
            producer.send(
                pa.table({"k": ["d"], "len": [1], "ts": pa.array([5], pa.timestamp("ms"))}).to_batches()[0]
            )
            producer.send({"k": "e", "len": 2, "ts": 7})
            result = producer.close()
        assert result.tuples == 3 * n + 2
        assert stream_info(client, stream)["tuples_ingested"] == 3 * n + 2


def test_batch_ids_apply_once(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    batch = {"k": ["a", "b"], "len": [1, 2], "ts": [1, 2]}
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        with client.producer(stream, source="spark") as producer:
            producer.send(batch, batch_id=1)
            producer.send(batch, batch_id=2)
        with client.producer(stream, source="spark") as replay:
            replay.send(batch, batch_id=2)
            result = replay.close()
        assert (result.tuples, result.batches, result.duplicates) == (0, 0, 1)
        assert stream_info(client, stream)["tuples_ingested"] == 4


def test_one_send_that_becomes_many_messages(target: str, fresh: Callable[[str], str]) -> None:
    """More messages from one send than the producer queues: they stream out, none waits forever."""
    stream = fresh("S")
    rows = {"k": ["a"] * 1000, "len": list(range(1000)), "ts": list(range(1000))}
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        with client.producer(stream, max_batch_rows=10, timeout=WAIT) as producer:
            producer.send(rows)  # 100 batches
            producer.send(rows, batch_id=1)  # one batch in 100 parts
            producer.send(rows, batch_id=1)  # its replay
            result = producer.close()
        assert (result.tuples, result.batches, result.duplicates) == (2000, 101, 1)
        assert stream_info(client, stream)["tuples_ingested"] == 2000


def test_a_batch_that_does_not_fit_raises_at_its_send(target: str, fresh: Callable[[str], str]) -> None:
    """As docs/design.md, "Producers" says: checked against the schema fetched at open; nothing of
    it is sent, the producer goes on (this used to surface on the next call and end the
    producer)."""
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        producer = client.producer(stream, linger_ms=0)
        producer.send({"k": ["a"], "len": [1], "ts": [1]})
        with pytest.raises(SchemaMismatch, match=r"lacks column.*'len'"):
            producer.send({"k": ["a"], "ts": [2]})
        producer.send({"k": ["a"], "len": [1], "ts": [3]})
        result = producer.close()
        assert (result.tuples, result.batches) == (2, 2)
        assert stream_info(client, stream)["tuples_ingested"] == 2


def test_a_row_that_does_not_fit_raises_at_its_send(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        producer = client.producer(stream, linger_ms=60_000)
        producer.send({"k": "a", "len": 1, "ts": 1})
        with pytest.raises(SchemaMismatch, match="column 'k' is string, got int"):
            producer.send({"k": 2, "len": 1, "ts": 2})
        producer.send({"k": "b", "len": 1, "ts": 3})
        producer.flush()
        assert producer.result is not None and producer.result.tuples == 2
        assert producer.close().tuples == 2
        assert stream_info(client, stream)["tuples_ingested"] == 2


def test_regressing_punctuation_and_unknown_stream(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        producer = client.producer(stream)
        producer.punctuate(100)
        with pytest.raises(RegressingPunctuation, match="goes back"):
            producer.punctuate(50)  # at once, nothing sent
        assert producer.close().low_watermark == END_OF_STREAM
        with pytest.raises(InvalidArgument, match="integer"):
            client.producer(stream).punctuate(1.5)  # type: ignore[arg-type]
        with pytest.raises(NotFound, match="unknown stream"):
            client.producer(fresh("nope"))  # fetched at open


# -- subscriptions ----------------------------------------------------------------------------------
def test_subscribe_from_oldest_and_from_now(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    first_keys, first_ts = ["a", "b", "a"], [1, 2, 15]
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream))
        with client.producer(stream) as producer:
            producer.send({"k": first_keys, "len": [1, 1, 1], "ts": first_ts})
            producer.punctuate(20)
        oldest = Collector(client, query, from_oldest=True)
        assert counts(oldest.until(punctuation_at_least(20))) == expected(first_keys, first_ts)
        oldest.close()

        now = Collector(client, query)
        with client.producer(stream) as producer:
            # Advance one slide at a time until the new subscription sees punctuation: it is live.
            value = 20
            while True:
                value += 10
                producer.punctuate(value)
                producer.flush()
                try:
                    now.until(punctuation_at_least(value), timeout=0.5)
                    break
                except queue.Empty:
                    assert value < 2000, "the subscription never saw punctuation"
            producer.send({"k": ["c", "c"], "len": [1, 1], "ts": [value + 1, value + 2]})
            producer.punctuate(value + 10)
        got = now.until(punctuation_at_least(value + 10))
        now.close()
        assert counts(got) == Counter({(value, "c"): 2})
        assert all(p.attribute == "window_end" for p in got if isinstance(p, Punctuation))


def test_late_side_stream(target: str, fresh: Callable[[str], str]) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream))
        with client.producer(stream) as producer:
            producer.send({"k": ["a"], "len": [1], "ts": [50]})
            producer.punctuate(40)
            producer.flush()
            producer.send({"k": ["late"], "len": [1], "ts": [3]})
        late = Collector(client, f"{query}.late", from_oldest=True)
        tables = late.until(lambda item: isinstance(item, pa.Table))
        late.close()
        assert tables[-1].column("k").to_pylist() == ["late"]
        assert stream_info(client, stream)["late_tuples"] == 1


def test_behind_punctuation_counts_in_open_windows(target: str, fresh: Callable[[str], str]) -> None:
    """Beam's transcript through the server (docs/design.md, "Punctuation and lateness"):
    punctuation 5, then 2, 3, 7, 8, then 11: the workers count all four in [0, 10), nothing is
    late."""
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        query = client.register_query(count_sql(stream))
        results = Collector(client, query, from_oldest=True)
        with client.producer(stream) as producer:
            producer.punctuate(5)
            producer.send({"k": ["a"] * 4, "len": [1] * 4, "ts": [2, 3, 7, 8]})
            producer.punctuate(11)
        got = results.until(punctuation_at_least(20))  # [0, 10) complete: the first open is [10, 20)
        results.close()
        assert counts(got) == Counter({(0, "a"): 4})
        assert stream_info(client, stream)["late_tuples"] == 2  # behind punctuation, counted per stream
        assert next(q for q in client.list_queries() if q["name"] == query)["late_tuples"] == 0


# -- asyncio ---------------------------------------------------------------------------------------
def test_async_client(target: str, fresh: Callable[[str], str]) -> None:
    stream, name = fresh("S"), fresh("q")
    keys = [f"k{i % 3}" for i in range(3000)]
    ts = [i % 100 for i in range(3000)]

    async def scenario() -> None:
        async with AsyncClient(target, timeout=10) as client:
            assert (await client.health())["status"] == "SERVING"
            await client.create_stream(stream, SCHEMA)
            with pytest.raises(AlreadyExists):
                await client.create_stream(stream, SCHEMA)
            assert "Aggregate" in await client.explain(count_sql(stream))
            query = await client.register_query(count_sql(stream), name=name)
            assert query == name
            async with client.producer(stream, linger_ms=50, max_batch_rows=1000) as producer:
                for k, t in zip(keys, ts, strict=True):
                    await producer.send({"k": k, "len": 1, "ts": t})
                await producer.punctuate(100)
                result = await producer.close()
            assert (result.tuples, result.batches) == (3000, 3)
            streams = await client.list_streams()
            assert next(s for s in streams if s["name"] == stream)["tuples_ingested"] == 3000
            got: list[Any] = []
            async with client.subscribe(query, from_oldest=True) as subscription:
                async for item in subscription:
                    got.append(item)
                    if punctuation_at_least(100)(item):
                        break
            assert counts(got) == expected(keys, ts)
            assert [q["name"] for q in await client.list_queries() if q["name"] == name] == [name]

            bad = client.producer(stream, source="other", linger_ms=0)
            with pytest.raises(SchemaMismatch, match="unknown column"):
                await bad.send({"k": ["a"], "len": [1], "ts": [200], "extra": [1]})
            await bad.send({"k": ["a"], "len": [1], "ts": [200]})  # the producer goes on
            await bad.flush()
            assert bad.result is not None and bad.result.tuples == 1
            with pytest.raises(NotFound):
                async for _ in client.subscribe(fresh("nope")):
                    pass
            await client.drop_query(query)
            await client.drop_stream(stream)
            with pytest.raises(NotFound):
                await client.drop_stream(stream)

    asyncio.run(scenario())


# -- the end of a subscription ----------------------------------------------------------------------
def read_to_end(subscription: Subscription, timeout: float = WAIT) -> list[Any]:
    """Every item of ``for item in subscription``, which must end by itself within ``timeout``."""
    got: list[Any] = []
    failed: list[LowtideError] = []

    def run() -> None:
        try:
            for item in subscription:
                got.append(item)
        except LowtideError as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        subscription.cancel()
        thread.join(5)
        pytest.fail(f"the subscription did not end within {timeout} s, after {got}")
    if failed:
        raise failed[0]
    return got


async def read_to_end_async(target: str, query: str) -> list[Any]:
    async with AsyncClient(target, timeout=10) as client:
        return [item async for item in client.subscribe(query)]


def ended_query(client: Client, stream: str) -> str:
    """A query whose only source closed: its output ended; one tuple was late (ts 3 after 20)."""
    client.create_stream(stream, SCHEMA)
    query = client.register_query(count_sql(stream))
    with client.producer(stream) as producer:
        producer.send({"k": ["a", "b", "a"], "len": [1, 1, 1], "ts": [1, 2, 15]})
        producer.punctuate(20)
        producer.flush()
        producer.send({"k": ["late"], "len": [1], "ts": [3]})
        producer.close()
    return query


def test_a_subscription_ends_after_the_end_of_stream_punctuation(
    target: str, fresh: Callable[[str], str]
) -> None:
    """``for item in subscribe(q)`` stops after the END_OF_STREAM punctuation: both clients."""
    with Client(target, timeout=10) as client:
        query = ended_query(client, fresh("S"))
        got = read_to_end(client.subscribe(query))
    assert got[-1] == Punctuation(END_OF_STREAM, "window_end")
    assert not any(isinstance(i, Punctuation) and i.value >= END_OF_STREAM for i in got[:-1])
    assert counts(got) == expected(["a", "b", "a"], [1, 2, 15])
    assert asyncio.run(asyncio.wait_for(read_to_end_async(target, query), WAIT)) == got


def test_the_late_side_stream_carries_its_querys_punctuation_and_ends_with_it(
    target: str, fresh: Callable[[str], str]
) -> None:
    """``<query>.late``: each output punctuation of the query as ``<query>.<attribute>``, after
    the late tuples found before it; the end-of-stream one last, and the subscription ends."""
    with Client(target, timeout=10) as client:
        query = ended_query(client, fresh("S"))
        results = read_to_end(client.subscribe(query))
        late = read_to_end(client.subscribe(f"{query}.late"))
    tables = [item for item in late if isinstance(item, pa.Table)]
    assert [row["k"] for t in tables for row in t.to_pylist()] == ["late"]
    markers = [item for item in late if isinstance(item, Punctuation)]
    assert {m.attribute for m in markers} == {f"{query}.window_end"}
    assert [m.value for m in markers] == [p.value for p in results if isinstance(p, Punctuation)]
    found = late.index(tables[0])  # found late after the output reached 20: after that marker
    assert any(isinstance(i, Punctuation) and i.value >= 20 for i in late[:found])
    assert late[-1] == Punctuation(END_OF_STREAM, f"{query}.window_end")


def test_a_subscription_to_an_ended_query_past_its_end_ends_at_once(
    target: str, fresh: Callable[[str], str]
) -> None:
    """From now, or from an offset past the end-of-stream punctuation: no item, a clean end."""
    with Client(target, timeout=10) as client:
        query = ended_query(client, fresh("S"))
        for name in (query, f"{query}.late"):
            whole = client.subscribe(name)
            last = read_to_end(whole)[-1]
            end = whole.offset
            assert end is not None and last.value == END_OF_STREAM
            assert read_to_end(client.subscribe(name, from_oldest=False)) == []
            assert read_to_end(client.subscribe(name, from_offset=end + 1)) == []
            assert read_to_end(client.subscribe(name, from_offset=end + 100)) == []
            assert read_to_end(client.subscribe(name, from_offset=end)) == [last]


def test_the_clients_stop_at_the_end_even_if_the_server_keeps_the_call_open() -> None:
    """A server that keeps a subscription open after the end-of-stream punctuation (lowtide did
    before it ended them there): both clients stop after yielding it and close the call."""
    closed: list[threading.Event] = []

    class KeepsOpen(pb_grpc.LowtideServicer):  # type: ignore[misc]
        def Subscribe(self, request: Any, context: Any) -> Iterator[pb.SubscribeResponse]:
            done = threading.Event()
            closed.append(done)
            context.add_callback(done.set)  # the call ends: the client closed it
            for offset, value in enumerate((10, END_OF_STREAM)):
                punctuation = pb.Punctuation(value=value, attribute="window_end")
                yield pb.SubscribeResponse(punctuation=punctuation, offset=offset)
            done.wait(WAIT)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_LowtideServicer_to_server(KeepsOpen(), server)
    target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        want = [Punctuation(10, "window_end"), Punctuation(END_OF_STREAM, "window_end")]
        with Client(target, timeout=10) as client:
            subscription = client.subscribe("q")
            assert read_to_end(subscription) == want
            assert subscription.offset == 1
        assert asyncio.run(asyncio.wait_for(read_to_end_async(target, "q"), WAIT)) == want
        assert len(closed) == 2 and all(done.wait(WAIT) for done in closed)
    finally:
        server.stop(None)
