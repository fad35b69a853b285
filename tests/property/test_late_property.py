"""Late tuples (below their stream's published progress at arrival) under each late policy.

(h) ``drop``: counted in the windows not yet emitted (behind punctuation is not late,
docs/design.md, "Punctuation and lateness"), late for the rest: counted, readable from
``<query>.late``; ``update`` with allowed lateness L: a late tuple still counts in the windows whose
end + L > progress, emitted windows re-emit their corrected rows with revision + 1, and it is in the
side stream once if it missed a window forgotten already; ``error``: the batch is rejected whole
with ``LateTuple`` and the results are those of the accepted batches.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import (
    Observed,
    behind_expectation,
    check_emission,
    check_late,
    extents,
    key_of,
    late_rows,
    run,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Row, Spec, Window, assert_rows_equal, evaluate
from strategies import (
    Close,
    Event,
    Punct,
    Push,
    any_window,
    deliveries,
    examples,
    specs,
    sql_of,
    stream_sources,
    time_windows,
    tuples,
)

from lowtide import Engine

pytestmark = pytest.mark.property


def late_run(spec: Spec, sources: Any, data: Any, late: str, lateness: int | None = None) -> Any:
    streams = {s: data.draw(tuples(max_size=25), label=f"tuples {s}") for s in sources}
    events = data.draw(deliveries(streams, sources, honest=False), label="events")
    partition = spec.window.partition if spec.window.kind == "rows" else ()
    return run(spec, sql_of(spec, list(sources)), sources, events, late, lateness, partition)


@settings(max_examples=examples(250), deadline=None)
@given(spec=specs(any_window), sources=stream_sources(2), data=st.data())
def test_drop_keeps_late_tuples_out_of_results_and_in_the_side_stream(
    spec: Spec, sources: Any, data: Any
) -> None:
    obs = late_run(spec, sources, data, "drop")
    behind = [row for row, p in obs.arrivals if row["ts"] < p]
    # Behind punctuation is late only for windows already emitted (tests/property/test_behind_property.py).
    expected, late = behind_expectation(spec, obs, obs.counts_behind)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    check_late(obs, late)
    assert sum(s["behind"] for s in obs.stats["streams"].values()) == len(behind)


@settings(max_examples=examples(150), deadline=None)
@given(spec=specs(time_windows, having=False), sources=stream_sources(1), data=st.data())
def test_error_rejects_late_batches_whole(spec: Spec, sources: Any, data: Any) -> None:
    obs = late_run(spec, sources, data, "error")
    if obs.counts_behind:
        # Applied: on time, or behind with every window still open; rejected: one was late.
        assert all(
            all(end > q for _, end in extents(spec, row))
            for row, q in zip([row for row, _ in obs.arrivals], obs.arrival_query_progress, strict=True)
        )
        assert all(
            any(any(end <= q for _, end in extents(spec, r)) for r in rows)
            for rows, q in obs.rejected_batches
        )
    else:
        assert all(row["ts"] >= p for row, p in obs.arrivals)  # every applied tuple was on time
    expected = evaluate(spec, [row for row, _ in obs.arrivals])
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    assert obs.late == []


def check_update(spec: Spec, obs: Observed, allowed: int) -> None:
    """Each cell's revisions count up from 0; its last one equals the reference; a tuple that
    missed a window forgotten already (end + L <= progress): once in the side stream."""
    arrivals, query = obs.arrivals, obs.arrival_query_progress  # the query's progress decides retention
    expected = evaluate(
        spec, [row for row, _ in arrivals], counts_in=lambda i, start, end: end + allowed > query[i]
    )
    latest: dict[tuple[Any, ...], Row] = {}
    for row, call in zip(obs.rows, obs.row_call, strict=True):
        key = key_of(row, spec)
        assert row["revision"] == (latest[key]["revision"] + 1 if key in latest else 0), (key, row)
        assert row["window_end"] <= obs.progress[call], (key, obs.progress[call])
        latest[key] = row
    assert_rows_equal(latest.values(), expected, spec)
    assert all(a < b for a, b in zip(obs.punctuation, obs.punctuation[1:], strict=False))
    too_late = [
        row
        for (row, p), q in zip(arrivals, query, strict=True)
        if row["ts"] < p and any(end + allowed <= q for _, end in extents(spec, row))
    ]
    check_late(obs, [row for row in too_late if extents(spec, row)])


@settings(max_examples=examples(300), deadline=None)
@given(
    spec=specs(time_windows, having=False),
    sources=stream_sources(2),
    lateness=st.one_of(st.none(), st.integers(0, 15)),
    having=st.booleans(),
    data=st.data(),
)
def test_update_revises_windows_within_the_allowed_lateness(
    spec: Spec, sources: Any, lateness: int | None, having: bool, data: Any
) -> None:
    if having:  # monotone under late tuples: a row once shown never needs taking back
        spec = Spec(spec.window, spec.group_by, spec.aggs, (Agg("count*", None, "_h"), ">", 1))
    check_update(spec, late_run(spec, sources, data, "update", lateness), lateness or 0)


@pytest.mark.parametrize("late", ["drop", "update"])
def test_many_groups_compacted_under_both_policies(late: str) -> None:
    """Past 4096 groups the aggregate compacts its group table; revisions must survive it."""
    aggs = (Agg("count*", None, "n"), Agg("median", "v", "m"), Agg("var", "f", "s"))
    spec = Spec(Window("sliding", 50, 100), ("k2",), aggs)
    rows = [
        {"k1": "a", "k2": i // 2, "v": i % 7, "f": (i % 5) / 4, "b": i % 3 == 0, "ts": i // 10}
        for i in range(12_000)
    ]
    events: list[Event] = []
    for b in range(0, 12_000, 1_000):
        events += [Push("A", "s", tuple(rows[b : b + 1_000])), Punct("A", "s", rows[b + 999]["ts"] - 60)]
    stale = [{**r, "ts": r["ts"] - 150} for r in rows[11_000:11_400:7]]  # late; within 200 for some windows
    events += [Push("A", "s", tuple(stale)), Punct("A", "s", 1_300), Close("A", "s")]
    obs = run(spec, sql_of(spec, ["A"]), {"A": ("s",)}, events, late, 200 if late == "update" else None)
    if late == "update":
        check_update(spec, obs, 200)
    else:
        assert_rows_equal(obs.rows, evaluate(spec, rows), spec)
        check_late(obs, stale)
    assert obs.stats["queries"]["q"]["open_windows"] == 0


def test_update_example_revises_an_emitted_window() -> None:
    engine = Engine()
    engine.create_stream("A", {"k": "string", "ts": "int64"}, sources=["s"])
    q = engine.register_query(
        "SELECT k, count(*) AS n [RANGE 10, WA ts] FROM A GROUP BY k", late="update", allowed_lateness=10
    )
    engine.push("A", {"k": ["x", "x"], "ts": [1, 12]}, source="s")
    engine.punctuate("A", 15, source="s")
    engine.push("A", {"k": ["x", "y"], "ts": [3, 4]}, source="s")  # late: [0, 10) ends 10, 10 + 10 > 15
    engine.punctuate("A", 25, source="s")
    engine.push("A", {"k": ["x"], "ts": [5]}, source="s")  # too late: 10 + 10 <= 25
    rows = [r for t in engine.poll(q) if not hasattr(t, "value") for r in t.to_pylist()]
    assert [(r["window_start"], r["k"], r["n"], r["revision"]) for r in rows] == [
        (0, "x", 1, 0),
        (0, "x", 2, 1),
        (0, "y", 1, 0),
        (10, "x", 1, 0),
    ]
    assert [r["ts"] for r in late_rows(engine, q)] == [5]
