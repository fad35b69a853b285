"""Work per step and windows per tuple stay within the limits (issue 21, item 5), in process.

A landmark window emits every slide from the first tuple's up to the punctuation: one tuple with
a timestamp in seconds in a ``timestamp[ms]`` stream, then a punctuation in milliseconds, is 28
million windows. Past ``max_windows_per_step`` the query fails alone with RESOURCE_EXHAUSTED,
before anything is emitted; the stream's other queries go on. Below it, a catch-up emits the same
rows as punctuation slide by slide. A window putting each tuple in more windows than
``max_windows_per_tuple`` (RANGE / SLIDE) is refused when the query registers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lowtide import Engine, Limits, ManualClock, Punctuation
from lowtide.errors import InvalidArgument, ResourceExhausted
from lowtide.operators import wid_aggregate
from lowtide.server.config import ServerConfig

MS = {"ts": "timestamp[ms]", "k": "int64", "v": "int64"}
SECONDS_AS_MS = 1_700_000_000  # the tuple: a timestamp in seconds, read as milliseconds
LANDMARK = "SELECT count(*) AS n [RANGE ALL, SLIDE 1 minute, WA ts] FROM S"
TUMBLING = "SELECT count(*) AS n, sum(v) AS s [RANGE 1 minute, WA ts] FROM S"


def stamp(values: list[int], keys: list[int] | None = None) -> pa.Table:
    keys = keys if keys is not None else [0] * len(values)
    return pa.table(
        {"ts": pa.array(values, pa.timestamp("ms")), "k": pa.array(keys, pa.int64()), "v": [1] * len(values)}
    )


def tables(items: list[Any]) -> pa.Table | None:
    found = [item for item in items if isinstance(item, pa.Table)]
    return pa.concat_tables(found) if found else None


def engine(**limits: int) -> Engine:
    made = Engine(clock=ManualClock(), limits=Limits(**limits))
    made.create_stream("S", MS)
    return made


def test_a_punctuation_in_other_units_fails_the_landmark_query_alone() -> None:
    """The issue's case: no 28 million rows, no hang; the tumbling query beside it is intact."""
    made, alone = engine(), engine()
    made.register_query(LANDMARK, name="landmark")
    for target in (made, alone):
        target.register_query(TUMBLING, name="tumbling")
        target.push("S", stamp([SECONDS_AS_MS]))
        target.punctuate("S", 1_700_000_000_000)
    with pytest.raises(ResourceExhausted) as raised:
        made.poll("landmark")
    reason = str(raised.value)
    assert "'landmark'" in reason and "max_windows_per_step = 1000000" in reason, reason
    assert "28305000 windows" in reason and "\n" not in reason, reason
    with pytest.raises(ResourceExhausted):  # it stays failed, and takes no more input
        made.poll("landmark")
    assert made.poll("tumbling") == alone.poll("tumbling")
    for target in (made, alone):
        target.push("S", stamp([1_700_000_030_000, 1_700_000_050_000]))
        target.close_source("S")
    assert made.poll("tumbling") == alone.poll("tumbling")


@pytest.mark.parametrize("limit", [99, 100])
def test_the_limit_counts_the_windows_of_one_punctuation(limit: int) -> None:
    made = engine(max_windows_per_step=limit)
    made.register_query("SELECT count(*) AS n [RANGE ALL, SLIDE 10, WA ts] FROM S", name="q")
    made.push("S", stamp([5]))
    made.punctuate("S", 500)  # slides 0..49: 50 windows
    first = tables(made.poll("q"))
    assert first is not None and first.column("window_end").to_pylist() == list(range(10, 510, 10))
    made.punctuate("S", 1_500)  # slides 50..149: 100 windows in one step
    if limit < 100:
        with pytest.raises(ResourceExhausted, match="would emit 100 windows"):
            made.poll("q")
        return
    emitted = tables(made.poll("q"))
    assert emitted is not None and emitted.column("window_end").to_pylist() == list(range(510, 1_510, 10))
    assert set(emitted.column("n").to_pylist()) == {1}


def test_a_catch_up_in_chunks_equals_punctuation_slide_by_slide(monkeypatch: pytest.MonkeyPatch) -> None:
    """One far punctuation (chunked: a few result rows a batch) gives the rows, and the output
    punctuation, of punctuation at every slide; slides holding tuples cut the runs."""
    monkeypatch.setattr(wid_aggregate, "LANDMARK_CHUNK", 7)
    calls = "count(*) AS n, sum(v) AS s, median(v) AS m"
    sql = f"SELECT k, {calls} [RANGE ALL, SLIDE 10, WA ts] FROM S GROUP BY k"
    rng = np.random.default_rng(5)
    ts = np.sort(rng.choice(np.arange(30, 3_000), 40, replace=False)).tolist()
    keys = rng.integers(0, 4, 40).tolist()
    jump, steps = engine(), engine()
    for target in (jump, steps):
        target.register_query(sql, name="q")
        target.push("S", stamp(ts, keys))
    jump.punctuate("S", 4_000)
    for p in range(10, 4_001, 10):
        steps.punctuate("S", p)
    jumped, stepped = jump.poll("q"), steps.poll("q")
    assert tables(jumped) == tables(stepped)
    last = [i for i in stepped if isinstance(i, Punctuation)][-1]
    assert [i for i in jumped if isinstance(i, Punctuation)] == [last] == [Punctuation(4_010, "window_end")]
    assert sum(isinstance(i, pa.Table) for i in jumped) > 1  # chunks


def test_the_end_of_the_stream_counts_too() -> None:
    """At the end of the stream a landmark emits up to its last slide holding a tuple."""
    made = engine(max_windows_per_step=1_000)
    made.register_query(LANDMARK, name="q")
    made.push("S", stamp([SECONDS_AS_MS, 1_700_000_000_000]))
    made.close_source("S")
    with pytest.raises(ResourceExhausted, match="the end of the stream would emit 28305001 windows"):
        made.poll("q")


def test_early_results_count_too() -> None:
    clock = ManualClock()
    made = Engine(clock=clock, limits=Limits(max_windows_per_step=1_000))
    made.create_stream("S", MS)
    made.register_query(
        "SELECT count(*) AS n [RANGE ALL, SLIDE 1 minute, WA ts, EMIT EVERY 1 second] FROM S", name="q"
    )
    made.push("S", stamp([SECONDS_AS_MS, 1_700_000_000_000]))
    clock.advance(2.0)
    with pytest.raises(ResourceExhausted, match="one EMIT EVERY round would emit 28305001 windows"):
        made.poll("q")


@pytest.mark.parametrize(
    ("window", "per_tuple"),
    [
        ("[RANGE 1000000000, SLIDE 1, WA ts]", 1_000_000_000),
        ("[RANGE 1 day, SLIDE 1 ms, WA ts]", 86_400_000),
        ("[RANGE 200001 rows, SLIDE 2 rows, WA row-num]", 100_001),
    ],
)
def test_a_window_putting_a_tuple_in_too_many_windows_is_refused(window: str, per_tuple: int) -> None:
    made = engine()
    with pytest.raises(ResourceExhausted) as raised:
        made.register_query(f"SELECT count(*) AS n {window} FROM S", name="q")
    reason = str(raised.value)
    assert f"in {per_tuple} windows" in reason and "max_windows_per_tuple = 100000" in reason, reason
    assert made.list_queries() == []


def test_at_the_windows_per_tuple_limit_a_query_is_accepted_and_runs() -> None:
    made = engine(max_windows_per_tuple=50)
    made.register_query("SELECT count(*) AS n [RANGE 50, SLIDE 1, WA ts] FROM S", name="q")
    with pytest.raises(ResourceExhausted, match="in 51 windows"):
        made.register_query("SELECT count(*) AS n [RANGE 101, SLIDE 2, WA ts] FROM S", name="r")
    made.push("S", stamp([7]))
    made.close_source("S")
    emitted = tables(made.poll("q"))
    assert emitted is not None and emitted.num_rows == 50 and set(emitted.column("n").to_pylist()) == {1}


def test_the_server_config_takes_the_window_limits_and_refuses_less_than_one() -> None:
    config = ServerConfig.load(None, max_windows_per_tuple=10, max_windows_per_step=20)
    assert (config.max_windows_per_tuple, config.max_windows_per_step) == (10, 20)
    with pytest.raises(InvalidArgument, match="max_windows_per_tuple and max_windows_per_step"):
        ServerConfig.load(None, max_windows_per_step=0)
