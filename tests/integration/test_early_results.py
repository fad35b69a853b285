"""Early results (``EMIT EVERY``, docs/design.md, "Query language") through a real server with
2 workers.

The server's EMIT timers run on wall time, so only the final rows are compared exactly, with the
reference fed the same calls (``wire.Mirror``: it gives final rows only, as the in-process engine
beside it does on a clock that never moves).
Partial rows are checked loosely: ``final`` is false, each is for a window that later gets its
final row, after the partial, and none is below an output punctuation already sent. Every kind
of window aggregate takes part: WID (tumbling, landmark), Paned-WID, AdaptWID and Fused WID.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from server_harness import Server, running_server
from wire import PACKET, Mirror, Subscription, assert_same_rows, connect, packets, rows, schedule

from lowtide import END_OF_STREAM, Engine, ManualClock, Punctuation
from lowtide.proto import lowtide_pb2 as pb

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000 // 60_000 * 60_000
SPAN = 20 * 60_000
_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(workers=2) as running:
        yield running


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


def queries(stream: str) -> dict[str, tuple[str, str]]:
    """Each kind of window aggregate with EMIT, and the operator explain names for it."""
    every = "EMIT EVERY 40 ms"
    return {
        "tumbling": (
            f"SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 1 minute, WA ts, {every}] "
            f"FROM {stream} GROUP BY srcIP",
            "WID Aggregate",
        ),
        "paned": (
            f"SELECT srcIP, count(*) AS n, max(len) AS top [RANGE 8 minutes, SLIDE 1 minute, WA ts] {every} "
            f"FROM {stream} GROUP BY srcIP",
            "Paned-WID Aggregate",
        ),
        "adaptive": (
            f"SELECT destIP, median(len) AS m, count(*) AS n "
            f"[RANGE 3 minutes, SLIDE 1 minute, WA ts, {every}] FROM {stream} GROUP BY destIP",
            "AdaptWID Aggregate",
        ),
        "fused": (
            f"SELECT srcIP, count(*) AS n [RANGE 2 minutes, WA ts, {every}] FROM {stream} "
            "WHERE len > 500 GROUP BY srcIP",
            "Fused Select + Bucket",
        ),
        "landmark": (
            f"SELECT count(*) AS n, sum(len) AS bytes [RANGE ALL, SLIDE 5 minutes, WA ts, {every}] "
            f"FROM {stream}",
            "WID Aggregate",
        ),
    }


def window(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's window and group: its end (a landmark's start is fixed only once punctuation
    passes its first slide) and the group column of the query, if any."""
    return (row["window_end"], row.get("srcIP"), row.get("destIP"))


def check_partials(items: list[Any], what: str) -> int:
    """Partial rows come before their window's final row and never below the output punctuation;
    returns how many there were."""
    punctuation = None
    partial_at: dict[tuple[Any, ...], int] = {}
    final_at: dict[tuple[Any, ...], int] = {}
    for index, item in enumerate(items):
        if isinstance(item, Punctuation):
            punctuation = item.value
            continue
        for row in item.to_pylist():
            key = window(row)
            if row["final"]:
                assert key not in final_at, f"{what}: final row of {key} twice"
                final_at[key] = index
            else:
                assert key not in final_at, f"{what}: a partial row of {key} after its final row"
                below = punctuation is not None and row["window_end"] < punctuation
                assert not below, f"{what}: {row} below the output punctuation {punctuation}"
                partial_at.setdefault(key, index)
    assert set(partial_at) <= set(final_at), f"{what}: partial rows of windows never final"
    return len(partial_at)


def test_emit_queries_give_the_engines_final_rows_and_partials_before_them(server: Server) -> None:
    assert server.alive(), server.stderr_tail()
    mirror = Mirror(connect(server.target), engine=Engine(clock=ManualClock()))  # it never fires
    rnd = random.Random(13)
    stream = fresh("early")
    mirror.create_stream(stream, sources=["a", "b"])
    names: dict[str, str] = {}
    for label, (sql, operator) in queries(stream).items():
        plan = mirror.stub.ExplainQuery(pb.ExplainQueryRequest(sql=sql)).plan
        assert operator in plan and "EMIT EVERY 40 ms" in plan, plan
        names[label] = mirror.register(sql, fresh(label))
    assert not mirror.on_engine(), mirror.on_engine()  # every query's final rows from the reference
    subs = {label: Subscription(mirror.stub, name, from_oldest=True) for label, name in names.items()}
    data = {(stream, s): packets(rnd, 150, T0, T0 + SPAN) for s in ("a", "b")}
    for call in schedule(data, rnd, {stream: PACKET}):
        mirror.ingest(*call)
        time.sleep(0.01)  # paced on purpose: EMIT EVERY fires on wall time while windows are open
    partials: dict[str, int] = {}
    for label, name in names.items():
        items = subs[label].until(END_OF_STREAM)
        tables = [i for i in items if isinstance(i, pa.Table)]
        assert all(t.column_names[-2:] == ["revision", "final"] for t in tables), label
        final = [r for r in rows(items) if r["final"]]
        expected = rows(mirror.results(name))
        assert expected and all(r["final"] for r in expected), label
        assert_same_rows(final, expected, label)
        partials[label] = check_partials(items, label)
    assert all(partials.values()), f"queries without partial rows: {partials}"  # ~2 s of 40 ms timers
