"""Every query of thesis.sql through a real server with 2 workers gives what the in-process engine
gives (docs/design.md: "Windows", "Results and offsets", "Runners"), plus queries over query
results, multi-source progress, idle sources and subscriptions that join late or reconnect
("Data model", "Punctuation and lateness", "Results and offsets").

One server runs for the module. Each test feeds its own streams through ``wire.Mirror``: the same
Ingest calls go to the server and, in the same order, to an in-process ``lowtide.Engine``.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from server_harness import Server, running_server
from thesis import thesis_queries
from wire import (
    CLOSE,
    PACKET,
    Mirror,
    Subscription,
    assert_same,
    connect,
    packets,
    requests,
    rows,
    schedule,
    streams,
    table,
)

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine, ManualClock, Punctuation
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("server_queries")]

STREAMS = ["Main", "Main1", "Main2", "Control", "M", "M1", "M2", "A", "B", "C", "D", "S0", "S1", "packets"]
SOURCES = ["p0", "p1", "p2"]
SPAN = 20 * 60_000  # 20 minutes of event time, in ms
T0 = 1_700_000_000_000 // 60_000 * 60_000
_names = itertools.count()


REPLIES = [("M1", "M2"), ("S0", "S1"), ("A", "C"), ("B", "D"), ("Main1", "Main2")]


def reply(row: dict[str, Any], rnd: random.Random) -> dict[str, Any]:
    """The answer to a packet: addresses and ports swapped, a few seconds later (SYN: SYN_ACK)."""
    out = {
        **row,
        "srcIP": row["destIP"],
        "destIP": row["srcIP"],
        "srcPort": row["destPort"],
        "destPort": row["srcPort"],
        "ts": min(row["ts"] + rnd.randrange(0, 4000), T0 + SPAN - 1),
    }
    if "flags" in row:
        out["flags"] = "SYN_ACK" if row["flags"] == "SYN" else "ACK"
    return out


def schema_of(stream: str) -> dict[str, str]:
    return {**PACKET, "flags": "string"} if stream in ("S0", "S1") else PACKET


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(workers=2) as running:
        yield running


@pytest.fixture
def mirror(server: Server) -> Mirror:
    assert server.alive(), server.stderr_tail()
    return Mirror(connect(server.target))


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


def test_every_thesis_query_gives_the_engines_results(mirror: Mirror) -> None:
    queries = thesis_queries()
    rnd = random.Random(2008)
    for stream in STREAMS:
        mirror.create_stream(stream, schema_of(stream), sources=SOURCES)
    names = {label: mirror.register(sql, "q" + label.replace("-", "_")) for label, sql in queries.items()}
    subs = {label: Subscription(mirror.stub, name, from_oldest=True) for label, name in names.items()}
    data = {
        (stream, source): packets(rnd, rnd.randint(25, 45), T0, T0 + SPAN, flags=stream in ("S0", "S1"))
        for stream in STREAMS
        for source in SOURCES
    }
    for first, second in REPLIES:  # flows answered within seconds: the joins find partners
        for (stream, _), sent in list(data.items()):
            if stream == first:
                for row in rnd.sample(sent, len(sent) // 3):
                    data[(second, rnd.choice(SOURCES))].append(reply(row, rnd))
    for call in schedule(data, rnd, {s: schema_of(s) for s in STREAMS}, close=False):
        mirror.ingest(*call)
    # Before the end: every query has emitted what the engine emitted, up to the same punctuation.
    problems = _compare(names, subs, mirror, settle=True)
    for stream, source in data:
        mirror.ingest(stream, source, [CLOSE])
    ingested = streams(mirror.stub)
    for stream in STREAMS:
        sent = sum(len(r) for (s, _), r in data.items() if s == stream)
        assert ingested[stream].tuples_ingested == sent, stream
        assert ingested[stream].low_watermark == END_OF_STREAM, stream
    problems += _compare(names, subs, mirror, settle=False)
    assert not problems, "\n".join(problems)


def _compare(names: dict[str, str], subs: dict[str, Subscription], mirror: Mirror, settle: bool) -> list[str]:
    """Each query's items against the engine's: settled (same last punctuation) or at the end."""
    problems = []
    for label, name in names.items():
        expected = mirror.results(name)
        sub = subs[label]
        try:
            assert settle or rows(expected), f"{label} gives no rows: the comparison would be empty"
            if settle:
                assert_same(sub.reach(expected), expected, f"{label} before the sources closed")
            else:
                assert_same(sub.until(END_OF_STREAM), expected, f"{label} at the end")
        except AssertionError as exc:
            problems.append(f"{label}: {str(exc).splitlines()[0]}")
    return problems


def test_concurrent_producers_give_the_same_results(mirror: Mirror) -> None:
    """Order-insensitive queries: producers streaming at once, compared to the engine fed in turn."""
    rnd = random.Random(7)
    a, b = fresh("cA"), fresh("cB")
    for stream in (a, b):
        mirror.create_stream(stream, sources=SOURCES)
    sqls = {
        "count": f"SELECT srcIP, count(*) [RANGE 10 minutes, SLIDE 1 minute, WA ts] FROM {a} GROUP BY srcIP",
        "union": f"SELECT srcIP, sum(len) [RANGE 10 sec, SLIDE 1 sec, WA ts] "
        f"FROM {a} UNION {b} GROUP BY srcIP",
        "join": f"SELECT {a}.srcIP, {b}.destIP, {b}.ts FROM {a} [RANGE 3 minutes, WA ts], "
        f"{b} [RANGE 2 minutes, WA ts] WHERE {a}.srcIP = {b}.destIP",
        "session": f"SELECT srcIP, count(*) AS n, max(len) [SESSION 20 s, WA ts] FROM {a} GROUP BY srcIP",
    }
    names = {key: mirror.register(sql, fresh(f"c_{key}")) for key, sql in sqls.items()}
    subs = {key: Subscription(mirror.stub, name, from_oldest=True) for key, name in names.items()}
    data = {(s, src): packets(rnd, 60, T0, T0 + SPAN) for s in (a, b) for src in SOURCES}
    calls = schedule(data, rnd, {a: PACKET, b: PACKET})
    per_source: dict[tuple[str, str], list[Any]] = {}
    for stream, source, items in calls:
        per_source.setdefault((stream, source), []).extend(items)

    def produce(stream: str, source: str, items: list[Any]) -> None:
        def paced() -> Iterator[Any]:
            for message in requests(stream, source, items):
                time.sleep(rnd.random() * 0.005)  # paced on purpose: the producers interleave
                yield message

        results.append(mirror.stub.Ingest(paced(), timeout=60).tuples)

    results: list[int] = []
    threads = [threading.Thread(target=produce, args=(*key, items)) for key, items in per_source.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(results) == sum(len(r) for r in data.values())
    for stream, source, items in calls:  # the oracle gets the same calls one after another
        for item in items:
            mirror.apply(stream, source, item)
    for key, name in names.items():
        assert_same(subs[key].until(END_OF_STREAM), mirror.results(name), key)


def test_sessions_split_by_group_give_the_engines_results(mirror: Mirror) -> None:
    """Session windows (docs/design.md, "Windows") over a union fed by three producers each:
    grouped, they split across both workers by the group columns; without GROUP BY one worker holds
    the one group."""
    rnd = random.Random(13)
    a, b = fresh("sA"), fresh("sB")
    for stream in (a, b):
        mirror.create_stream(stream, sources=SOURCES)
    aggregates = (
        "count(*) AS n, sum(len) AS bytes, avg(len) AS mean, stddev(len) AS sd, median(len) AS med, "
        "count_distinct(destIP) AS peers, heavy_hitters(destPort, 0.4) AS ports"
    )
    sqls = {
        "grouped": f"SELECT srcIP, destPort, {aggregates} [SESSION 25 s, WA ts] FROM {a} UNION {b} "
        "GROUP BY srcIP, destPort HAVING count(*) > 1",
        "global": f"SELECT count(*) AS n, min(ts) AS first [SESSION 2 s, WA ts] FROM {a} UNION {b}",
    }
    plan = mirror.stub.ExplainQuery(pb.ExplainQueryRequest(sql=sqls["grouped"])).plan
    assert "Session Aggregate" in plan and "split across 2 workers by srcIP, destPort" in plan, plan
    plan = mirror.stub.ExplainQuery(pb.ExplainQueryRequest(sql=sqls["global"])).plan
    assert "Session Aggregate" in plan and "runs on 1 worker" in plan, plan
    names = {key: mirror.register(sql, fresh(f"s_{key}")) for key, sql in sqls.items()}
    subs = {key: Subscription(mirror.stub, name, from_oldest=True) for key, name in names.items()}
    data = {(s, src): packets(rnd, 150, T0, T0 + SPAN) for s in (a, b) for src in SOURCES}
    calls = schedule(data, rnd, {a: PACKET, b: PACKET}, close=False)
    for call in calls:
        mirror.ingest(*call)
    problems = _compare(names, subs, mirror, settle=True)
    for stream, source in data:
        mirror.ingest(stream, source, [CLOSE])
    problems += _compare(names, subs, mirror, settle=False)
    assert not problems, "\n".join(problems)
    spans = [r["window_end"] - r["window_start"] for r in rows(mirror.results(names["grouped"]))]
    assert max(spans) > 50_000, "no session spans two gaps: the test would not see sessions grow and merge"


def test_a_query_reads_another_querys_results(mirror: Mirror) -> None:
    rnd = random.Random(11)
    stream = fresh("R")
    mirror.create_stream(stream, sources=["a", "b"])
    base = mirror.register(
        f"SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM {stream} GROUP BY srcIP",
        fresh("base"),
    )
    top = mirror.register(
        f"SELECT srcIP, sum(n) AS total, max(n) AS peak [RANGE 5 minutes, SLIDE 5 minutes, WA window_end] "
        f"FROM {base} GROUP BY srcIP",
        fresh("top"),
    )
    subs = {q: Subscription(mirror.stub, q, from_oldest=True) for q in (base, top)}
    data = {(stream, s): packets(rnd, 120, T0, T0 + SPAN) for s in ("a", "b")}
    for call in schedule(data, rnd, {stream: PACKET}):
        mirror.ingest(*call)
    for q in (base, top):
        expected = mirror.results(q)
        assert rows(expected)
        assert_same(subs[q].until(END_OF_STREAM), expected, q)
    assert sum(r["total"] for r in rows(mirror.results(top))) == 240


def _tumbling(stream: str) -> str:
    return f"SELECT srcIP, count(*) AS n [RANGE 1 minute, SLIDE 1 minute, WA ts] FROM {stream} GROUP BY srcIP"


def test_a_declared_source_that_has_not_punctuated_holds_the_stream_back(mirror: Mirror) -> None:
    rnd = random.Random(5)
    stream = fresh("held")
    mirror.create_stream(stream, sources=["a", "b"])
    query = mirror.register(_tumbling(stream), fresh("held_q"))
    sub = Subscription(mirror.stub, query, from_oldest=True)
    mirror.ingest(stream, "a", [table(packets(rnd, 80, T0, T0 + 5 * 60_000)), T0 + 5 * 60_000])
    # Acknowledged and held back: a row out now would come before b's punctuation below, and
    # the comparison "after b punctuated" would count it.
    assert mirror.results(query) == []
    assert streams(mirror.stub)[stream].low_watermark == NO_PROGRESS
    mirror.ingest(stream, "b", [table(packets(rnd, 20, T0 + 3 * 60_000, T0 + 4 * 60_000)), T0 + 3 * 60_000])
    expected = mirror.results(query)
    assert rows(expected) and max(r["window_end"] for r in rows(expected)) == T0 + 3 * 60_000
    assert_same(sub.until(T0 + 3 * 60_000), expected, "after b punctuated")
    assert streams(mirror.stub)[stream].low_watermark == T0 + 3 * 60_000
    mirror.ingest(stream, "a", [CLOSE])
    mirror.ingest(stream, "b", [CLOSE])
    assert_same(sub.until(END_OF_STREAM), mirror.results(query), "after both closed")


def test_an_idle_source_stops_holding_the_stream_back(mirror: Mirror) -> None:
    """b never speaks: 1 s after the stream's creation it stops holding a back, then rejoins. On a
    stream fed alike whose idle timeout is an hour, b holds a back all along."""
    rnd = random.Random(6)
    stream, held = fresh("idle"), fresh("idle_held")
    clock = ManualClock()  # the oracle's time: b idle (1 s since creation), a not (heard at 0.5 s)
    mirror.engine = Engine(clock=clock)
    began = time.monotonic()
    mirror.create_stream(stream, sources=["a", "b"], idle_timeout_s=1.0)
    mirror.create_stream(held, sources=["a", "b"], idle_timeout_s=3600.0)
    query = mirror.register(_tumbling(stream), fresh("idle_q"))
    held_query = mirror.register(_tumbling(held), fresh("idle_held_q"))
    sub = Subscription(mirror.stub, query, from_oldest=True)
    held_sub = Subscription(mirror.stub, held_query, from_oldest=True)
    clock.set(0.5)
    first = table(packets(rnd, 80, T0, T0 + 4 * 60_000))
    for name in (stream, held):
        mirror.ingest(name, "a", [first, T0 + 4 * 60_000])
    assert mirror.results(query) == [] and mirror.results(held_query) == []
    # a keeps speaking (a source silent for 1 s goes idle too); b went idle: a alone moves the stream.
    while not any(isinstance(i, Punctuation) for i in sub.items):
        assert time.monotonic() - began < 10, "b never went idle"
        mirror.ingest(stream, "a", [T0 + 4 * 60_000])
        time.sleep(0.2)  # a polls on wall time until b's idle timeout (the behaviour under test)
    items = sub.until(T0 + 4 * 60_000, timeout=10)
    assert time.monotonic() - began >= 1.0
    clock.set(1.0)
    assert_same(items, mirror.results(query), "with b idle")
    assert streams(mirror.stub)[stream].low_watermark == T0 + 4 * 60_000
    # Past 1 s, within the hour: on the held stream b has not gone idle, so a alone moves nothing.
    mirror.ingest(held, "a", [T0 + 4 * 60_000])
    assert streams(mirror.stub)[held].low_watermark == NO_PROGRESS
    assert mirror.results(held_query) == []
    # b speaks again: it rejoins the minimum (none of its tuples is late here), then both close.
    mirror.ingest(stream, "b", [table(packets(rnd, 30, T0 + 4 * 60_000, T0 + 6 * 60_000)), T0 + 4 * 60_000])
    mirror.ingest(stream, "a", [table(packets(rnd, 30, T0 + 4 * 60_000, T0 + 8 * 60_000)), CLOSE])
    mirror.ingest(stream, "b", [CLOSE])
    assert_same(sub.until(END_OF_STREAM), mirror.results(query), "after b rejoined and both closed")
    assert streams(mirror.stub)[stream].late_tuples == 0
    # b closes on the held stream: a alone moves it now.
    mirror.ingest(held, "b", [CLOSE])
    mirror.ingest(held, "a", [CLOSE])
    assert_same(held_sub.until(END_OF_STREAM), mirror.results(held_query), "with b held, then both closed")


def test_late_and_reconnecting_subscribers(mirror: Mirror) -> None:
    rnd = random.Random(9)
    stream = fresh("subs")
    minute = 60_000
    mirror.create_stream(stream, sources=["a"])
    query = mirror.register(_tumbling(stream), fresh("subs_q"))
    first = Subscription(mirror.stub, query, from_oldest=True)
    mirror.ingest(stream, "a", [table(packets(rnd, 100, T0, T0 + 6 * minute)), T0 + 6 * minute])
    phase1 = first.until(T0 + 6 * minute)
    assert_same(phase1, mirror.results(query), "phase 1")
    # Joining late from the oldest retained item: the same items as the one that was there.
    oldest = Subscription(mirror.stub, query, from_oldest=True)
    oldest.wait(lambda: len(oldest.items) >= len(phase1), 10, "replay")
    assert _same_items(oldest.items, phase1)
    # Joining from now: nothing retained, only what comes after it is attached. Probe with
    # punctuation (one more window closed each time) until it hears something.
    now = Subscription(mirror.stub, query, from_oldest=False)
    progress = T0 + 6 * minute
    while not now.items:
        assert progress < T0 + 30 * minute, "the from-now subscriber never heard anything"
        progress += minute
        mirror.ingest(stream, "a", [table(packets(rnd, 5, progress, progress + minute)), progress])
        time.sleep(0.2)  # a poll: the loop re-checks until it hears something (bounded above)
    mirror.ingest(
        stream, "a", [table(packets(rnd, 60, progress, progress + 5 * minute)), progress + 5 * minute]
    )
    progress += 5 * minute
    everything = first.until(progress)
    heard = now.until(progress)
    assert _same_items(heard, everything[len(everything) - len(heard) :])
    old = max(p.value for p in phase1 if isinstance(p, Punctuation))
    assert all(p.value > old for p in heard if isinstance(p, Punctuation)), "from now replayed old items"
    assert all(r["window_end"] > old for r in rows(heard)), "from now replayed old results"
    # Reconnect: cancel, more data while away, subscribe again from the oldest retained item.
    first.cancel()
    mirror.ingest(stream, "a", [table(packets(rnd, 40, progress, progress + 3 * minute)), CLOSE])
    again = Subscription(mirror.stub, query, from_oldest=True)
    assert_same(again.until(END_OF_STREAM), mirror.results(query), "after reconnecting")
    assert_same(oldest.until(END_OF_STREAM), mirror.results(query), "the late joiner")


def _same_items(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, pa.Table) != isinstance(y, pa.Table):
            return False
        if (x.to_pylist() != y.to_pylist()) if isinstance(x, pa.Table) else x != y:
            return False
    return True


def test_sliding_queries_share_slices_in_the_workers(mirror: Mirror) -> None:
    """Queries on one stream read one set of slices in the workers, fed once by the query that
    started them: readers that join midway (grouped, global on one worker, holistic) and a
    feeder dropped while others still read give the engine's results."""
    rnd = random.Random(31)
    stream = fresh("shared")
    mirror.create_stream(stream, sources=["a", "b"])

    def sql(minutes: int, aggs: str = "count(*) AS n, sum(len) AS bytes", by: bool = True) -> str:
        group = " GROUP BY srcIP" if by else ""
        key = "srcIP, " if by else ""
        return f"SELECT {key}{aggs} [RANGE {minutes} minutes, SLIDE 1 minute, WA ts] FROM {stream}{group}"

    feeders = [mirror.register(sql(5), fresh("feed")), mirror.register(sql(4, by=False), fresh("feed_all"))]
    plan = mirror.stub.ExplainQuery(pb.ExplainQueryRequest(sql=sql(10, "median(len) AS m"))).plan
    assert "Paned-WID" in plan and "shared with 1 query" in plan, plan
    data = {(stream, s): packets(rnd, 150, T0, T0 + SPAN) for s in ("a", "b")}
    calls = schedule(data, rnd, {stream: PACKET})
    readers = [mirror.register(sql(10, "median(len) AS m, count(*) AS n"), fresh("holistic"))]
    for call in calls[: len(calls) // 3]:
        mirror.ingest(*call)
    readers += [mirror.register(sql(10), fresh("later")), mirror.register(sql(8, by=False), fresh("all"))]
    subs = {q: Subscription(mirror.stub, q, from_oldest=True) for q in readers}
    for call in calls[len(calls) // 3 : 2 * len(calls) // 3]:
        mirror.ingest(*call)
    for name in feeders:  # the slices stay fed for the queries still reading them
        mirror.stub.DropQuery(pb.DropQueryRequest(name=name))
        mirror.engine.drop_query(name)
    for call in calls[2 * len(calls) // 3 :]:
        mirror.ingest(*call)
    for name in readers:
        expected = mirror.results(name)
        assert rows(expected), name
        assert_same(subs[name].until(END_OF_STREAM), expected, name)
