"""Work per step and state per query stay within the limits, through a real server (issue 21,
item 5): the query that passes one fails alone with RESOURCE_EXHAUSTED and a one-line reason;
the server answers, the other queries on the same stream go on with the in-process engine's
results, and at the end SIGTERM drains it within the harness's 30 s (``running_server``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest
from server_harness import Server, running_server
from wire import CLOSE, Mirror, Subscription, assert_same, connect, failure, packets, register, table

from lowtide import Engine, ManualClock
from lowtide.errors import ResourceExhausted
from lowtide.proto import lowtide_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("window_limits_server")]

MINUTE = 60_000
T0 = 1_700_000_000_000 // MINUTE * MINUTE
STATE_LIMIT = 100_000
Code = grpc.StatusCode
_names = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(workers=2, config={"max_query_state_bytes": STATE_LIMIT}) as running:
        yield running
        assert running.alive(), running.stderr_tail()


def test_one_tuple_in_seconds_fails_the_landmark_query_alone(server: Server) -> None:
    """The issue's case: one tuple stamped in seconds, punctuation in milliseconds, under
    ``[RANGE ALL, SLIDE 1 minute]``: 28 million windows. The query fails at once."""
    mirror = Mirror(connect(server.target), Engine(clock=ManualClock()))
    stream = fresh("units")
    mirror.create_stream(stream, sources=["p"])
    landmark = mirror.register(f"SELECT count(*) AS n [RANGE ALL, SLIDE 1 minute, WA ts] FROM {stream}", "lm")
    other = mirror.register(
        f"SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 2 minutes, SLIDE 1 minute, WA ts] "
        f"FROM {stream} GROUP BY srcIP",  # split across both workers
        fresh("per_ip"),
    )
    subs = {q: Subscription(mirror.stub, q) for q in (landmark, other)}
    seconds = table(packets(random.Random(1), 1, T0 // 1000, T0 // 1000 + 1))
    mirror.ingest(stream, "p", [seconds, T0])
    found = subs[landmark].end(timeout=30)
    assert (found.code, found.kind) == (Code.RESOURCE_EXHAUSTED, "ResourceExhausted"), found
    assert "'lm'" in found.reason and "max_windows_per_step = 1000000" in found.reason, found
    assert "\n" not in found.reason, found
    with pytest.raises(ResourceExhausted, match="max_windows_per_step"):  # the engine agrees
        mirror.results(landmark)
    assert mirror.stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING"
    rnd = random.Random(2)
    for k in range(3):
        mirror.ingest(stream, "p", [table(packets(rnd, 200, T0 + k * MINUTE, T0 + (k + 1) * MINUTE))])
    mirror.ingest(stream, "p", [T0 + 3 * MINUTE, CLOSE])
    assert_same(subs[other].until(), mirror.results(other), "the other query on the stream")


def test_a_window_with_too_many_windows_per_tuple_is_refused(server: Server) -> None:
    mirror = Mirror(connect(server.target))
    stream = fresh("ratio")
    mirror.create_stream(stream, sources=["p"])
    sql = f"SELECT count(*) AS n [RANGE 1 day, SLIDE 1 ms, WA ts] FROM {stream}"
    found = failure(register, mirror.stub, sql, "wide")
    assert (found.code, found.kind) == (Code.RESOURCE_EXHAUSTED, "ResourceExhausted"), found
    assert "86400000 windows" in found.reason and "max_windows_per_tuple = 100000" in found.reason, found
    listed = mirror.stub.ListQueries(pb.ListQueriesRequest(), timeout=10).queries
    assert "wide" not in {q.name for q in listed}


@pytest.mark.parametrize(
    "window",
    ["[RANGE ALL, SLIDE 1 minute, WA ts]", "[SESSION 10 minutes, WA ts]"],
    ids=["landmark", "session"],
)
def test_the_state_limit_fires_for_growing_state(server: Server, window: str) -> None:
    """A landmark's running prefix and open sessions grow with new keys: past
    ``max_query_state_bytes`` the query fails; a query beside it keeps its results."""
    mirror = Mirror(connect(server.target))
    stream = fresh("grows")
    mirror.create_stream(stream, sources=["p"])
    wide = fresh("wide")  # on the server only: the engine has no state limit
    register(mirror.stub, f"SELECT srcPort, count(*) AS n {window} FROM {stream} GROUP BY srcPort", wide)
    other = mirror.register(f"SELECT count(*) AS n [RANGE 1 minute, WA ts] FROM {stream}", fresh("small"))
    subs = {q: Subscription(mirror.stub, q) for q in (wide, other)}
    rnd = random.Random(window)
    now = T0
    for _ in range(8):  # thousands of new ports a batch: the state only grows
        batch = table(packets(rnd, 1000, now, now + MINUTE))
        ports = pa.array([rnd.randrange(1 << 30) for _ in range(1000)], pa.int32())
        now += MINUTE
        mirror.ingest(stream, "p", [batch.set_column(1, "srcPort", ports), now])
    found = subs[wide].end(timeout=15)  # state is measured every second
    assert (found.code, found.kind) == (Code.RESOURCE_EXHAUSTED, "ResourceExhausted"), found
    assert "state" in found.reason and wide in found.reason and str(STATE_LIMIT) in found.reason, found
    mirror.ingest(stream, "p", [CLOSE])
    assert_same(subs[other].until(), mirror.results(other), "the query beside it")
