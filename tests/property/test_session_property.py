"""Session windows ``[SESSION gap, WA ts]`` against the brute-force reference, under any delivery.

(a) rows equal the reference's sessions (per group its tuples sorted by ts, each joining the
    session of the one before it when less than ``gap`` after it), every aggregate, HAVING, with
    GROUP BY or without (the whole stream one group);
(b) whatever the arrival order, batch split, source interleaving (one stream, or a UNION) and
    punctuation placement;
(c)-(f) each session once at revision 0, never before punctuation reaches its ``window_end`` and
    always once it does; output punctuation exactly ``min(ends of the sessions not complete,
    p - L + 1)`` after each punctuation ``p`` (every session held ends above ``p - L``), rising,
    END_OF_STREAM at the end;
(g) tuples behind punctuation (docs/design.md, "Punctuation and lateness"): a tuple counts iff its
    own session ``[t, t + gap)`` ends above ``p - L`` and it is at or above the end of every session
    of its group gone by then (:func:`reference.session_counts`; L: allowed lateness under
    ``update``, 0 under ``drop``); the others, and only they, are in the late side stream, once.
    ``update``: the revisions and retractions, replayed as a changelog, end at the reference over
    the tuples counted, and hold every complete session after each call; ``error``: a batch is
    rejected iff it holds a tuple behind punctuation;
(h) the session table's kernel, batch by batch, holds the reference's sessions of every group.

A timeline (gap 10, one group)::

    ts:    0    5         17  20            40
           [----x----x---)                           session [0, 15)
                          [-x--x---------)           session [17, 30)
                                          [-x------) session [40, 50)
    a late 12 (when counted) merges the first two: [0, 30), the later one retracted if it was shown.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from harness import (
    Model,
    Observed,
    behind_expectation,
    check_emission,
    check_late,
    check_query,
    key_of,
    late_rows,
    make_engine,
    run,
)
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Row, Spec, Window, assert_rows_equal, evaluate, session_counts, sessions_of
from strategies import (
    AGGREGATES,
    Close,
    Event,
    Punct,
    Push,
    Sources,
    ahead_deliveries,
    deliveries,
    examples,
    rows,
    session_windows,
    specs,
    sql_of,
    stream_sources,
    tuples,
)

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine, ManualClock, UnsupportedQuery
from lowtide.operators.session_table import SessionTable

pytestmark = pytest.mark.property

sessions = specs(session_windows)


@settings(max_examples=examples(100), deadline=None)
@given(spec=sessions, sources=stream_sources(1), declared=st.booleans(), data=st.data())
def test_sessions_equal_reference(spec: Spec, sources: Any, declared: bool, data: Any) -> None:
    check_query(spec, sources, data, declared=declared)


@settings(max_examples=examples(60), deadline=None)
@given(spec=sessions, sources=stream_sources(2), data=st.data())
def test_sessions_over_a_union_equal_reference(spec: Spec, sources: Any, data: Any) -> None:
    check_query(spec, sources, data, max_size=20)


@settings(max_examples=examples(40), deadline=None)
@given(spec=sessions, sources=stream_sources(1), data=st.data())
def test_far_apart_sessions_equal_reference(spec: Spec, sources: Any, data: Any) -> None:
    k = 1 << 40  # values near 2^46: no int32 shortcut, ends far from 0
    window = Window("session", 0, gap=spec.window.gap * k)
    check_query(Spec(window, spec.group_by, spec.aggs, spec.having), sources, data, scale=k)


def late_run(
    spec: Spec, sources: Any, data: Any, late: str, lateness: int | None = None, merging: bool = False
) -> Observed:
    """Dishonest punctuation (late tuples), or with ``merging`` sessions shown first and late
    tuples among them after."""
    make = (
        merging_deliveries
        if merging
        else (lambda streams, sources: deliveries(streams, sources, honest=False))
    )
    streams = {s: data.draw(tuples(max_size=25), label=f"tuples {s}") for s in sources}
    return run(
        spec,
        sql_of(spec, list(sources)),
        sources,
        data.draw(make(streams, sources), label="events"),
        late,
        lateness,
    )


@st.composite
def merging_deliveries(draw: Any, streams: dict[str, list[Row]], sources: Sources) -> list[Event]:
    """Each stream's tuples in two parts: the first sent (any source, any batches), then every
    source punctuates, so that sessions are shown; then the second part, late, among them, with
    punctuation rising now and then; then every source closes."""
    events: list[Event] = []
    parts = {s: draw(st.integers(0, len(rows)), label=f"first part of {s}") for s, rows in streams.items()}
    for second in (False, True):
        queue = [
            (s, row)
            for s, rows in streams.items()
            for row in (rows[parts[s] :] if second else rows[: parts[s]])
        ]
        queue = draw(st.permutations(queue))
        while queue:
            size = draw(st.integers(1, min(6, len(queue))))
            stream = queue[0][0]
            batch = tuple(row for s, row in queue[:size] if s == stream)
            queue = [item for item in queue[:size] if item[0] != stream] + queue[size:]
            events.append(Push(stream, draw(st.sampled_from(sources[stream])), batch))
            if second and draw(st.integers(0, 3)) == 0:
                events += punctuate_all(draw, sources, events)
        if not second:
            events += punctuate_all(draw, sources, events)
    return events + [Close(s, src) for s, names in sources.items() for src in names]


def punctuate_all(draw: Any, sources: Sources, events: list[Event]) -> list[Event]:
    """Every source punctuates, at or above what it punctuated before."""
    out: list[Event] = []
    for stream, names in sources.items():
        for source in names:
            last = max((e.value for e in events if isinstance(e, Punct) and e.source == source), default=-30)
            out.append(Punct(stream, source, draw(st.integers(last, max(last, 70)))))
    return out


@settings(max_examples=examples(60), deadline=None)
@given(spec=sessions, sources=stream_sources(2), data=st.data())
def test_drop_counts_behind_tuples_whose_sessions_are_not_gone(spec: Spec, sources: Any, data: Any) -> None:
    obs = late_run(spec, sources, data, "drop")
    expected, late = behind_expectation(spec, obs, counts=True)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    check_late(obs, late)


def check_update(spec: Spec, obs: Observed, allowed: int) -> None:
    """Replay the rows as a changelog per group: a row at revision 0 adds a session overlapping
    none shown; a revision replaces the one shown session it overlaps (and holds), at the revision
    before; a retraction removes the session shown with its bounds, at the revision before. Every
    row not retracted is complete when it comes out. After each call every complete session of
    the tuples counted so far is shown as the reference has it; at the end what is shown equals
    the reference."""
    arrived = [row for row, _ in obs.arrivals]
    judged = session_counts(spec, list(zip(arrived, obs.arrival_query_progress, strict=True)), allowed)
    counted = [row for row, c in zip(arrived, judged, strict=True) if c]
    shown: dict[tuple[Any, ...], dict[tuple[int, int], Row]] = {}
    bound = NO_PROGRESS  # the output punctuation so far
    items: list[tuple[int, Row | int]] = []  # (call, row or output punctuation) in emission order
    emitted = iter(zip(obs.row_call, obs.rows, strict=True))
    values = iter(zip(obs.punct_call, obs.punctuation, strict=True))
    for kind in obs.kinds:
        items.append(next(values) if kind == "punct" else next(emitted))
    items.reverse()
    for call, progress in enumerate(obs.progress):
        while items and items[-1][0] == call:
            item = items.pop()[1]
            if isinstance(item, int):
                bound = item
                continue
            replay(spec, shown, item, progress, bound)
        so_far = [
            row for row, c, at in zip(arrived, judged, obs.arrival_call, strict=True) if c and at <= call
        ]
        complete = [row for row in evaluate(spec, so_far) if row["window_end"] <= progress]
        found = [
            shown.get(tuple(row[k] for k in spec.keys), {}).get(key_of(row, spec)[:2]) for row in complete
        ]
        assert None not in found, f"a complete session is not shown after call {call}"
        assert_rows_equal([row for row in found if row is not None], complete, spec)
    assert_rows_equal(
        [row for group in shown.values() for row in group.values()], evaluate(spec, counted), spec
    )
    revised, retracted = any(r["revision"] > 0 for r in obs.rows), any(r["retracted"] for r in obs.rows)
    tally(f"revisions: {revised}, retractions: {retracted}")
    assert all(a < b for a, b in zip(obs.punctuation, obs.punctuation[1:], strict=False))
    assert obs.punctuation and obs.punctuation[-1] == END_OF_STREAM
    check_late(obs, [row for row, c in zip(arrived, judged, strict=True) if not c])


def replay(
    spec: Spec, shown: dict[tuple[Any, ...], dict[tuple[int, int], Row]], row: Row, progress: int, bound: int
) -> None:
    """One changelog row (see :func:`check_update`), the query's progress then ``progress`` and
    the output punctuation so far ``bound``."""
    extent = (row["window_start"], row["window_end"])
    group = shown.setdefault(tuple(row[k] for k in spec.keys), {})
    if row["retracted"]:
        assert extent in group and group.pop(extent)["revision"] == row["revision"] - 1, row
        return
    assert row["window_end"] <= progress, (row, progress)
    overlapped = [e for e in group if e[0] < extent[1] and extent[0] < e[1]]
    if row["revision"] == 0:
        assert not overlapped, (row, group)
        assert row["window_end"] >= bound, f"{row} after output punctuation {bound}"
    else:
        assert len(overlapped) == 1, (row, group)
        (old,) = overlapped
        assert extent[0] <= old[0] and old[1] <= extent[1], (row, old)
        assert group.pop(old)["revision"] == row["revision"] - 1, row
    group[extent] = row


@settings(max_examples=examples(100), deadline=None)
@given(
    spec=specs(session_windows, having=False),
    merging=st.sampled_from([True, True, False]),
    sources=stream_sources(2),
    having=st.booleans(),
    data=st.data(),
)
def test_update_revises_and_retracts_sessions(
    spec: Spec, merging: bool, sources: Any, having: bool, data: Any
) -> None:
    """``merging``: two groups and a lateness that keeps most late tuples: sessions merge."""
    lateness = data.draw(st.integers(20, 80) if merging else st.none() | st.integers(0, 15), label="lateness")
    group_by = ("b",) if merging else spec.group_by
    if having:  # monotone under more tuples: a session once shown is never held back again
        spec = Spec(spec.window, group_by, spec.aggs, (Agg("count*", None, "_h"), ">", 1))
    else:
        spec = Spec(spec.window, group_by, spec.aggs)
    check_update(spec, late_run(spec, sources, data, "update", lateness, merging), lateness or 0)


# -- punctuation ahead of the data ----------------------------------------------------------------
@st.composite
def ahead_case(draw: Any, late: str) -> tuple[Spec, Sources, list[Event], int | None]:
    """A grouped session query (several groups) and a delivery with punctuation ahead."""
    gap = draw(st.integers(1, 12), label="gap")
    group_by = draw(st.sampled_from([("k1",), ("k2",), ("k1", "k2"), ("b",)]), label="group by")
    chosen = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3), label="aggregates")
    aggs = tuple(Agg(a.func, a.column, f"a{i}", a.param) for i, a in enumerate(chosen))
    spec = Spec(Window("session", 0, gap=gap), group_by, aggs)
    sources = draw(st.sampled_from([1, 1, 2]).flatmap(lambda n: stream_sources(n, 2)), label="sources")
    near = st.integers(3, 25).flatmap(  # dense enough for sessions to grow and merge
        lambda n: st.lists(rows(st.integers(0, 40)), min_size=n, max_size=n)
    )
    streams = {s: draw(near, label=f"tuples {s}") for s in sources}
    lateness = draw(st.none() | st.integers(0, 15), label="lateness") if late == "update" else None
    return (
        spec,
        sources,
        draw(
            ahead_deliveries(streams, sources, st.integers(1, 2 * gap) | st.integers(-2, 0)), label="events"
        ),
        lateness,
    )


def why_late(spec: Spec, obs: Observed, allowed: int) -> str:
    """For the statistics: how many tuples came behind the query's punctuation, how many of those
    counted, and how many were late by (b) alone (a session gone, their own ending in time)."""
    progress = obs.arrival_query_progress
    arrived = [row for row, _ in obs.arrivals]
    judged = session_counts(spec, list(zip(arrived, progress, strict=True)), allowed)
    behind = [c for row, c, p in zip(arrived, judged, progress, strict=True) if row["ts"] < p]
    by_b = [
        row
        for row, c, p in zip(arrived, judged, progress, strict=True)
        if not c and row["ts"] + spec.window.gap > p - allowed
    ]
    counted = sum(behind)
    return f"behind: {min(len(behind), 5)}+, counted: {min(counted, 3)}+, by (b): {min(len(by_b), 2)}+"


@settings(max_examples=examples(150), deadline=None)
@given(
    case=st.sampled_from(["drop", "update"]).flatmap(lambda late: st.tuples(st.just(late), ahead_case(late)))
)
def test_behind_tuples_count_unless_a_session_of_theirs_is_gone(case: Any) -> None:
    """Drop: the rows, the emission and the late side stream are those of the reference judging
    each tuple when it came; update: the changelog replays to it, within the allowed lateness."""
    late, (spec, sources, events, lateness) = case
    obs = run(spec, sql_of(spec, list(sources)), sources, events, late, lateness)
    tally(f"{late}: {why_late(spec, obs, lateness or 0)}")
    if late == "update":
        check_update(spec, obs, lateness or 0)
        return
    expected, missed = behind_expectation(spec, obs, counts=True)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    check_late(obs, missed)


@settings(max_examples=examples(60), deadline=None)
@given(case=ahead_case("error"))
def test_error_rejects_every_batch_behind_punctuation(case: Any) -> None:
    """Under ``error`` a rule of punctuation alone cannot see the sessions gone: a batch is
    rejected iff it holds a tuple behind its stream's punctuation; the others are counted."""
    spec, sources, events, _ = case
    obs = run(spec, sql_of(spec, list(sources)), sources, events, "error")
    model, accepted, rejected = Model(sources), [], 0
    for event in events:
        if isinstance(event, Push):
            if any(row["ts"] < model.progress[event.stream] for row in event.rows):
                rejected += 1
            else:
                accepted += event.rows
        elif isinstance(event, Punct):
            model.raise_to(event.stream, event.source, event.value)
        else:
            model.raise_to(event.stream, event.source, END_OF_STREAM)
    assert obs.rejected == rejected and [row for row, _ in obs.arrivals] == accepted
    tally(f"rejected: {min(rejected, 3)}+")
    expected = evaluate(spec, accepted)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    assert obs.late == []


# -- the session table's kernel, on its own --------------------------------------------------------
@settings(max_examples=examples(150), deadline=None)
@given(
    gap=st.integers(1, 12),
    values=st.lists(st.tuples(st.integers(0, 3), st.integers(-30, 60)), max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=6),
)
def test_session_table_holds_the_reference_sessions(gap: int, values: Any, cuts: list[int]) -> None:
    """Batch by batch, each group's list is its values' sessions, sorted, at least gap apart;
    every slot is a session of one list or free, and merged-away slots went into live ones."""
    table = SessionTable(gap)
    bounds = sorted({0, len(values), *(c for c in cuts if c <= len(values))})
    for lo, hi in itertools.pairwise(bounds):
        gid = np.array([g for g, _ in values[lo:hi]], np.int64)
        ts = np.array([t for _, t in values[lo:hi]], np.int64)
        table.fit(4)
        slot, gone, into = table.add(gid, ts)
        assert (table.sgid[slot] == gid).all() and (table.sgid[into] >= 0).all()
        assert (table.start[slot] <= ts).all() and (ts < table.end[slot]).all()
        table.release(gone)
        seen = 0
        for g in range(4):
            listed, s = [], int(table.head[g])
            while s >= 0:
                listed.append((int(table.start[s]), int(table.end[s])))
                s = int(table.nxt[s])
            mine = [t for k, t in values[:hi] if k == g]
            assert listed == [(start, end) for start, end, _ in sessions_of(gap, mine)]
            seen += len(listed)
        assert seen == table.live() == int((table.sgid[: table.used] >= 0).sum())
    cutoff = 20
    before = {g: [end for _, end, _ in sessions_of(gap, [t for k, t in values if k == g])] for g in range(4)}
    table.fit(4)
    purged = table.purge(cutoff)
    assert (table.end[purged] <= cutoff).all()
    left = table.sgid[: table.used] >= 0
    assert not (left & (table.end[: table.used] <= cutoff)).any()
    for g, ends in before.items():  # the largest end purged of each group
        assert table.gone[g] == max((end for end in ends if end <= cutoff), default=NO_PROGRESS)


# -- examples ------------------------------------------------------------------------------------
def engine_with_a() -> Engine:
    engine = Engine()
    engine.create_stream("A", {"k": "string", "v": "int64", "ts": "int64"}, sources=["s"])
    return engine


def polled_rows(engine: Engine, query: str) -> tuple[list[Row], list[int]]:
    rows: list[Row] = []
    punctuation: list[int] = []
    for item in engine.poll(query):
        if isinstance(item, pa.Table):
            rows += item.to_pylist()
        else:
            punctuation.append(item.value)
    return rows, punctuation


def test_timeline_of_the_docstring() -> None:
    engine = engine_with_a()
    q = engine.register_query(
        "SELECT k, count(*) AS n, max(ts) AS last [SESSION 10, WA ts] FROM A GROUP BY k"
    )
    engine.push("A", {"k": ["x"] * 5, "v": [0] * 5, "ts": [40, 20, 5, 17, 0]}, source="s")
    engine.punctuate("A", 14, source="s")
    assert polled_rows(engine, q) == ([], [15])  # [0, 15) is not complete at 14: 14 may still join it
    engine.punctuate("A", 15, source="s")
    rows, punctuation = polled_rows(engine, q)
    assert [(r["window_start"], r["window_end"], r["n"], r["last"]) for r in rows] == [(0, 15, 2, 5)]
    assert punctuation == [16]  # a new group's tuple at 15 - 10 + 1 still counts: it would end at 16
    engine.close_source("A", "s")
    rows, punctuation = polled_rows(engine, q)
    assert sorted((r["window_start"], r["window_end"], r["n"]) for r in rows) == [(17, 30, 2), (40, 50, 1)]
    assert punctuation == [END_OF_STREAM]


def test_a_late_tuple_merges_shown_sessions_under_update() -> None:
    engine = engine_with_a()
    q = engine.register_query(
        "SELECT k, count(*) AS n, sum(v) AS s [SESSION 10, WA ts] FROM A GROUP BY k",
        late="update",
        allowed_lateness=25,
    )
    engine.push("A", {"k": ["x", "x", "x"], "v": [1, 2, 4], "ts": [0, 17, 40]}, source="s")
    engine.punctuate("A", 30, source="s")
    rows, punctuation = polled_rows(engine, q)
    assert [(r["window_start"], r["window_end"], r["n"], r["revision"]) for r in rows] == [
        (0, 10, 1, 0),
        (17, 27, 1, 0),
    ]
    assert punctuation == [6]  # a tuple at 30 - 25 - 10 + 1 still counts: it would end at 6
    engine.push("A", {"k": ["x"], "v": [8], "ts": [9]}, source="s")  # late, counted: merges both
    rows, _ = polled_rows(engine, q)
    assert [
        (r["window_start"], r["window_end"], r["n"], r["s"], r["revision"], r["retracted"]) for r in rows
    ] == [
        (17, 27, 1, 2, 1, True),  # merged away: withdrawn as it was shown
        (0, 27, 3, 11, 1, False),  # the survivor's next revision holds both
    ]
    engine.push("A", {"k": ["x"], "v": [16], "ts": [25]}, source="s")  # reopens it: ends at 35 > 30
    assert polled_rows(engine, q) == ([], [])
    engine.punctuate("A", 50, source="s")
    rows, _ = polled_rows(engine, q)
    assert sorted((r["window_start"], r["window_end"], r["n"], r["s"], r["revision"]) for r in rows) == [
        (0, 35, 4, 27, 2),
        (40, 50, 1, 4, 0),
    ]
    engine.push("A", {"k": ["x"], "v": [1], "ts": [20]}, source="s")  # 20 + 10 > 50 - 25: counted
    rows, _ = polled_rows(engine, q)
    assert [(r["window_start"], r["window_end"], r["n"], r["s"], r["revision"]) for r in rows] == [
        (0, 35, 5, 28, 3)
    ]
    engine.punctuate("A", 61, source="s")  # [0, 35) is gone: 35 <= 61 - 25
    assert polled_rows(engine, q) == ([], [37])
    engine.push("A", {"k": ["x", "x"], "v": [1, 1], "ts": [30, 36]}, source="s")
    rows, _ = polled_rows(engine, q)  # 30 would have joined [0, 35): late; 36 joins [40, 50)
    assert [(r["window_start"], r["window_end"], r["n"], r["s"], r["revision"]) for r in rows] == [
        (36, 50, 2, 5, 1)
    ]
    assert [r["ts"] for r in late_rows(engine, q)] == [30]


def test_behind_tuples_count_unless_a_session_of_theirs_was_emitted() -> None:
    engine = engine_with_a()
    q = engine.register_query("SELECT k, count(*) AS n [SESSION 10, WA ts] FROM A GROUP BY k")
    engine.push("A", {"k": ["x"] * 5, "v": [0] * 5, "ts": [40, 20, 5, 17, 0]}, source="s")
    engine.punctuate("A", 15, source="s")
    rows, punctuation = polled_rows(engine, q)
    assert [(r["window_start"], r["window_end"], r["k"]) for r in rows] == [(0, 15, "x")]
    assert punctuation == [16]
    # Behind 15: x 12 would have joined [0, 15), emitted: late; y 8 starts [8, 18), open: counted;
    # y 3 would make [3, 13), complete already: late.
    engine.push("A", {"k": ["x", "y", "y"], "v": [0] * 3, "ts": [12, 8, 3]}, source="s")
    engine.punctuate("A", 18, source="s")
    rows, punctuation = polled_rows(engine, q)
    assert [(r["window_start"], r["window_end"], r["k"], r["n"]) for r in rows] == [(8, 18, "y", 1)]
    assert punctuation == [19]
    engine.close_source("A", "s")
    rows, _ = polled_rows(engine, q)
    assert sorted((r["window_start"], r["window_end"], r["n"]) for r in rows) == [(17, 30, 2), (40, 50, 1)]
    assert sorted(r["ts"] for r in late_rows(engine, q)) == [3, 12]


def test_explain_placement_and_columns() -> None:
    engine = engine_with_a()
    plan = engine.explain("SELECT k, count(*) AS n [SESSION 30 s, WA ts] FROM A GROUP BY k")
    assert "Session Aggregate n by k, session GAP 30000 on ts" in plan, plan
    q = engine.register_query("SELECT k, count(*) AS n [SESSION 5, WA ts] FROM A GROUP BY k")
    op = engine.runner.plan(q).operators[-1]
    assert op.label == "Session Aggregate" and op.placement().keys == (("k",),)
    glob = engine.register_query("SELECT count(*) AS n [SESSION 5, WA ts] FROM A")
    assert engine.runner.plan(glob).operators[-1].placement().split.value == "one worker"
    columns = {row["name"]: row["columns"] for row in engine.list_queries()}
    assert columns[q] == ["window_start", "window_end", "k", "n", "revision"]
    updated = engine.register_query(
        "SELECT k, count(*) AS n [SESSION 5, WA ts] FROM A GROUP BY k", late="update", allowed_lateness=3
    )
    assert {row["name"]: row["columns"] for row in engine.list_queries()}[updated][-1] == "retracted"


@pytest.mark.parametrize(
    "window",
    [
        "[SESSION 5, RANGE 10, WA ts]",
        "[SESSION 5, WA row-num]",
        "[SESSION 0, WA ts]",
        "[SESSION 5, SLIDE 2, WA ts]",
    ],
)
def test_unsupported_session_windows_say_why(window: str) -> None:
    with pytest.raises(UnsupportedQuery) as caught:
        engine_with_a().explain(f"SELECT k, count(*) {window} FROM A GROUP BY k")
    assert "\n" not in str(caught.value)


def test_gap_in_the_timestamps_unit() -> None:
    engine = make_engine({})
    engine.create_stream("T", {"k": "string", "ts": "timestamp[us]"}, sources=["s"])
    assert "session GAP 2000000 on ts" in engine.explain(
        "SELECT count(*) [SESSION 2 s, WA ts] FROM T GROUP BY k"
    )


def test_early_results_of_open_sessions() -> None:
    """EMIT EVERY: the open sessions' current rows (final = false), then each final row once."""
    clock = ManualClock()
    engine = Engine(clock=clock)
    engine.create_stream("A", {"k": "string", "v": "int64", "ts": "int64"}, sources=["s"])
    q = engine.register_query("SELECT k, count(*) AS n [SESSION 10, WA ts, EMIT EVERY 1 s] FROM A GROUP BY k")
    engine.push("A", {"k": ["x", "x", "y"], "v": [1, 2, 3], "ts": [0, 5, 30]}, source="s")
    engine.punctuate("A", 16, source="s")
    clock.advance(1.5)
    engine.tick()
    rows, _ = polled_rows(engine, q)
    assert [(r["window_start"], r["k"], r["n"], r["final"]) for r in rows] == [
        (0, "x", 2, True),  # complete at 16: final
        (30, "y", 1, False),  # open: its current row
    ]
    engine.push("A", {"k": ["y"], "v": [4], "ts": [35]}, source="s")
    engine.close_source("A", "s")
    rows, _ = polled_rows(engine, q)
    assert [(r["window_start"], r["window_end"], r["n"], r["final"]) for r in rows] == [(30, 45, 2, True)]


def test_compacted_groups_keep_what_is_gone_while_it_matters() -> None:
    """Past 4096 groups the group table forgets groups without a session, but not one whose gone
    session can still make a tuple late (its end above the counting floor)."""
    engine = engine_with_a()
    q = engine.register_query("SELECT k, count(*) AS n [SESSION 10, WA ts] FROM A GROUP BY k")
    keys = [f"g{i}" for i in range(5_000)]
    ts = [0 if i < 3_000 else 20 for i in range(5_000)]
    engine.push("A", {"k": keys, "v": [0] * 5_000, "ts": ts}, source="s")
    engine.punctuate("A", 12, source="s")  # [0, 10) gone for g0..g2999: gone 10 > floor 3, kept
    op = engine.runner.plan(q).operators[-1]
    assert len(op.groups) == 5_000
    engine.push("A", {"k": ["g5"], "v": [0], "ts": [5]}, source="s")  # would have joined [0, 10)
    engine.punctuate("A", 31, source="s")  # [20, 30) gone for the rest: floor 22 forgets g0..g2999
    assert len(op.groups) == 2_000
    engine.poll(q)
    # g4000: 25 would have joined [20, 30), emitted: late; g10 and g4001 have nothing gone that
    # matters: counted.
    engine.push("A", {"k": ["g4000", "g10", "g4001"], "v": [0] * 3, "ts": [25, 25, 30]}, source="s")
    engine.close_source("A", "s")
    rows, _ = polled_rows(engine, q)
    assert sorted((r["k"], r["window_start"], r["window_end"]) for r in rows) == [
        ("g10", 25, 35),
        ("g4001", 30, 40),
    ]
    late = [(r["k"], r["ts"]) for r in late_rows(engine, q)]
    assert late == [("g5", 5), ("g4000", 25)]
