"""Flink's and Spark's session windows, written as they write them, against Flink's definition.

``GROUP BY SESSION(ts, gap)``, ``TABLE(SESSION(TABLE A, DESCRIPTOR(ts), gap))`` and Spark's
``session_window(ts, gap)`` merge sessions that touch: each tuple's window is ``[t, t + gap)`` and
two windows merge when they intersect with their ends included (Flink's ``TimeWindow.intersects``,
``start <= other.end && end >= other.start``; Spark merges while a start is ``<=`` the current
end), so a tuple exactly ``gap`` after the last one joins its session. The reference below is
Flink's ``TimeWindow.mergeWindows`` over every tuple, written from that definition alone (not
from lowtide's session table):

(a) rows equal the reference's sessions, whatever the arrival order, batch split and punctuation
    placement, with differences of exactly ``gap`` and ``gap`` +- 1 between tuples drawn often;
(b) each session once at revision 0, only once punctuation is past its ``window_end`` (a tuple
    at ``window_end`` would still join it) and by the call that moves it past;
(c) output punctuation is the query's progress ``p`` itself (a tuple at ``p - gap`` may still
    start a session ending at ``p``), END_OF_STREAM at the end;
(d) behind punctuation (``drop``, and ``update`` with allowed lateness ``L``): a tuple counts iff
    its own window ``[t, t + gap)`` would still intersect a tuple at the horizon ``p - L``
    (``t + gap >= p - L``) and it intersects no session of its group complete there (one whose
    end is below the horizon); the others, and only they, are in the late side stream;
    ``update``'s changelog ends at the reference over the tuples counted;
(e) the session table's kernel with ``reach`` 1, batch by batch, holds the reference's sessions,
    and purging at the cutoff the window's logic completes at a horizon takes exactly those whose
    end is below it.

The bracket form ``[SESSION gap, WA ts]`` keeps the dissertation's rule (less than ``gap``):
tests/property/test_session_property.py checks it; an example below shows the two apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import nexmark as nx
import numpy as np
import pyarrow as pa
import pytest
from harness import Observed, check_late, late_rows, make_engine, run
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Row
from strategies import (
    Close,
    Event,
    Punct,
    Push,
    Sources,
    ahead_deliveries,
    deliveries,
    examples,
    stream_sources,
)

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine
from lowtide.operators.session import SessionAggregate
from lowtide.operators.session_table import SessionTable
from lowtide.operators.window_logic import SessionLogic
from lowtide.operators.windows import Session

pytestmark = pytest.mark.property

Key = tuple[Any, ...]
AGGREGATES = "count(*) AS n, sum(v) AS s, min(ts) AS lo, max(ts) AS hi"


# -- the reference: Flink's definition ----------------------------------------------------------
def flink_sessions(gap: int, values: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """(start, end, member indexes) of one group's sessions, as Flink's ``TimeWindow.mergeWindows``
    makes them: every value's window ``[t, t + gap)`` sorted by start, each merged into the
    current one when they intersect, ends included, the merged window covering both."""
    merged: list[tuple[int, int, list[int]]] = []
    for start, end, i in sorted((t, t + gap, i) for i, t in enumerate(values)):
        if merged and merged[-1][0] <= end and merged[-1][1] >= start:
            first, last, members = merged[-1]
            merged[-1] = (min(first, start), max(last, end), [*members, i])
        else:
            merged.append((start, end, [i]))
    return merged


def key_of(row: Row, keys: Sequence[str]) -> Key:
    return tuple(row[k] for k in keys)


def counted_by_flink(
    gap: int, keys: Sequence[str], arrivals: Sequence[tuple[Row, int]], lateness: int
) -> list[bool]:
    """Whether each tuple, in arrival order with the query's progress ``p`` then, counts: its own
    window still intersects a value at the horizon ``h = p - L`` and it intersects no session of
    the tuples of its group counted before it that is complete at ``h`` (ends below it: no value
    at or above ``h`` intersects it)."""
    counted: dict[Key, list[int]] = {}
    out = []
    for row, p in arrivals:
        horizon, t = p - lateness, row["ts"]
        mine = counted.setdefault(key_of(row, keys), [])
        complete = [(s, e) for s, e, _ in flink_sessions(gap, mine) if e < horizon]
        counts = t + gap >= horizon and not any(s <= t + gap and e >= t for s, e in complete)
        if counts:
            mine.append(t)
        out.append(counts)
    return out


def expected_rows(gap: int, keys: Sequence[str], tuples: Sequence[Row]) -> list[Row]:
    """The query's rows (but revision) over ``tuples``: per group, Flink's sessions."""
    groups: dict[Key, list[Row]] = {}
    for row in tuples:
        groups.setdefault(key_of(row, keys), []).append(row)
    rows = []
    for key, members in groups.items():
        for start, end, index in flink_sessions(gap, [m["ts"] for m in members]):
            inside = [members[i] for i in index]
            rows.append(
                {
                    "window_start": start,
                    "window_end": end,
                    **dict(zip(keys, key, strict=True)),
                    "n": len(inside),
                    "s": sum(m["v"] for m in inside),
                    "lo": min(m["ts"] for m in inside),
                    "hi": max(m["ts"] for m in inside),
                }
            )
    return rows


def content(rows: Sequence[Row], keys: Sequence[str]) -> list[tuple[Any, ...]]:
    names = ("window_start", "window_end", *keys, "n", "s", "lo", "hi")
    return sorted(tuple(row[name] for name in names) for row in rows)


# -- queries and data ---------------------------------------------------------------------------
def flink_sql(form: str, gap: int, grouped: bool) -> str:
    """The query in one of the spellings; grouped by k1 or not at all."""
    select = f"SELECT {'k1, ' if grouped else ''}{AGGREGATES}"
    by = ", k1" if grouped else ""
    if form == "flink group window":
        return f"{select} FROM A GROUP BY SESSION(ts, INTERVAL '{gap}' MILLISECOND){by}"
    if form == "flink window table":
        return (
            f"{select} FROM TABLE(SESSION(TABLE A, DESCRIPTOR(ts), INTERVAL '{gap}' MILLISECOND)) "
            f"GROUP BY window_start, window_end{by}"
        )
    return f"{select} FROM A GROUP BY session_window(ts, '{gap} milliseconds'){by}"


FORMS = st.sampled_from(["flink group window", "flink window table", "spark session_window"])


@st.composite
def touching_tuples(draw: Any, gap: int) -> list[Row]:
    """Per key a chain of values whose steps are often exactly ``gap``, ``gap`` +- 1 or 0 (ts
    around [-20, 60], where the deliveries punctuate)."""
    out: list[Row] = []
    for key in ["a", "b", "c"][: draw(st.integers(1, 3))]:
        t = draw(st.integers(-20, 20))
        for _ in range(draw(st.integers(1, 12))):
            out.append({"k1": key, "k2": 0, "v": draw(st.integers(-5, 20)), "f": 0.0, "b": False, "ts": t})
            t += draw(st.sampled_from([gap, gap, gap - 1, gap + 1, 0]) | st.integers(0, 2 * gap + 1))
    return out


@st.composite
def shown_then_behind(draw: Any, rows: list[Row], sources: Sources) -> list[Event]:
    """The tuples shuffled, in two parts sent in batches from any source: after the first every
    source punctuates just ahead of them all (sessions come out); the second arrives behind,
    among them, punctuation rising now and then; every source closes."""
    rows = draw(st.permutations(rows))
    cut = draw(st.integers(0, len(rows)), label="first part")
    events: list[Event] = []
    top = max((row["ts"] for row in rows[:cut]), default=0) + draw(st.integers(1, 12))
    for part, behind in ((rows[:cut], False), (rows[cut:], True)):
        while part:
            size = draw(st.integers(1, min(6, len(part))))
            events.append(Push("A", draw(st.sampled_from(sources["A"])), tuple(part[:size])))
            part = part[size:]
            if behind and draw(st.booleans()):
                top += draw(st.integers(0, 10))
                events += [Punct("A", source, top) for source in sources["A"]]
        if not behind:
            events += [Punct("A", source, top) for source in sources["A"]]
    return events + [Close("A", source) for source in sources["A"]]


@st.composite
def cases(draw: Any, honest: bool) -> tuple[int, str, bool, dict[str, tuple[str, ...]], list[Any]]:
    gap = draw(st.integers(1, 8), label="gap")
    form = draw(FORMS, label="form")
    grouped = draw(st.booleans(), label="grouped")
    sources = draw(stream_sources(1, 2), label="sources")
    data = {"A": draw(touching_tuples(gap), label="tuples")}
    dishonest = st.one_of(  # punctuation a little ahead of the data, or far (up to 70)
        ahead_deliveries(data, sources, st.integers(-2, 2 * gap + 2)),
        deliveries(data, sources, honest=False),
        shown_then_behind(data["A"], sources),
    )
    events = draw(deliveries(data, sources) if honest else dishonest, label="events")
    return gap, form, grouped, sources, events


# -- checks ---------------------------------------------------------------------------------------
def check_drop(gap: int, keys: Sequence[str], obs: Observed) -> list[Row]:
    """(a)-(d) under ``drop``; the rows expected."""
    arrived = [row for row, _ in obs.arrivals]
    judged = counted_by_flink(gap, keys, list(zip(arrived, obs.arrival_query_progress, strict=True)), 0)
    expected = expected_rows(gap, keys, [row for row, c in zip(arrived, judged, strict=True) if c])
    assert content(obs.rows, keys) == content(expected, keys)
    assert all(row["revision"] == 0 for row in obs.rows)
    emitted = {}
    for row, call in zip(obs.rows, obs.row_call, strict=True):
        assert row["window_end"] < obs.progress[call], f"{row} out at progress {obs.progress[call]}"
        emitted[(row["window_start"], row["window_end"], *key_of(row, keys))] = call
    for row in expected:  # out by the call that moved punctuation past its end
        due = next(i for i, p in enumerate(obs.progress) if p > row["window_end"])
        assert emitted[(row["window_start"], row["window_end"], *key_of(row, keys))] <= due, row
    promised, values = None, iter(zip(obs.punctuation, obs.punct_call, strict=True))
    pending = next(values, None)
    for call, progress in enumerate(obs.progress):
        while pending is not None and pending[1] == call:
            promised, pending = pending[0], next(values, None)
        assert promised == (None if progress == NO_PROGRESS else progress), (call, promised, progress)
    check_late(obs, [row for row, c in zip(arrived, judged, strict=True) if not c])
    return expected


def replayed(obs: Observed, keys: Sequence[str]) -> list[Row]:
    """``update``'s rows as a changelog: a retraction removes the session shown with its bounds
    (at the revision before), a revision replaces the one shown session of its group within its
    bounds (at the revision before), revision 0 adds one; what is shown at the end. Every row not
    retracted is complete when it comes out (punctuation past its end)."""
    shown: dict[Key, dict[tuple[int, int], Row]] = {}
    for row, call in zip(obs.rows, obs.row_call, strict=True):
        group = shown.setdefault(key_of(row, keys), {})
        extent = (row["window_start"], row["window_end"])
        if row["retracted"]:
            assert group.pop(extent)["revision"] == row["revision"] - 1, row
            continue
        assert row["window_end"] < obs.progress[call], (row, obs.progress[call])
        within = [e for e in group if extent[0] <= e[0] and e[1] <= extent[1]]
        if row["revision"] == 0:
            assert not within, (row, group)
        else:
            assert len(within) == 1 and group.pop(within[0])["revision"] == row["revision"] - 1, (row, group)
        group[extent] = row
    return [row for group in shown.values() for row in group.values()]


# -- properties -------------------------------------------------------------------------------------
@settings(max_examples=examples(150), deadline=None)
@given(case=cases(honest=True))
def test_flink_sessions_equal_flinks_definition(case: Any) -> None:
    gap, form, grouped, sources, events = case
    keys = ("k1",) if grouped else ()
    obs = run(None, flink_sql(form, gap, grouped), sources, events)
    expected = check_drop(gap, keys, obs)
    touching = sum(
        b - a == gap
        for group in {key_of(r, keys) for r, _ in obs.arrivals}
        for a, b in itertools.pairwise(sorted(r["ts"] for r, _ in obs.arrivals if key_of(r, keys) == group))
    )
    tally(f"tuples exactly gap apart: {min(touching, 3)}+, sessions: {min(len(expected) // 3 * 3, 9)}+")


@settings(max_examples=examples(150), deadline=None)
@given(case=cases(honest=False))
def test_behind_tuples_count_unless_their_flink_session_is_complete(case: Any) -> None:
    gap, form, grouped, sources, events = case
    keys = ("k1",) if grouped else ()
    obs = run(None, flink_sql(form, gap, grouped), sources, events)
    check_drop(gap, keys, obs)
    arrived = [row for row, _ in obs.arrivals]
    behind = sum(row["ts"] < p for row, p in zip(arrived, obs.arrival_query_progress, strict=True))
    tally(f"behind: {min(behind, 5)}+, late: {min(len(obs.late), 3)}+")


@settings(max_examples=examples(100), deadline=None)
@given(case=cases(honest=False), lateness=st.integers(0, 40))
def test_update_ends_at_flinks_sessions_of_the_tuples_counted(case: Any, lateness: int) -> None:
    gap, form, grouped, sources, events = case
    keys = ("k1",) if grouped else ()
    obs = run(None, flink_sql(form, gap, grouped), sources, events, "update", lateness)
    arrived = [row for row, _ in obs.arrivals]
    judged = counted_by_flink(
        gap, keys, list(zip(arrived, obs.arrival_query_progress, strict=True)), lateness
    )
    expected = expected_rows(gap, keys, [row for row, c in zip(arrived, judged, strict=True) if c])
    assert content(replayed(obs, keys), keys) == content(expected, keys)
    assert obs.punctuation[-1] == END_OF_STREAM
    check_late(obs, [row for row, c in zip(arrived, judged, strict=True) if not c])
    revised, retracted = any(r["revision"] > 0 for r in obs.rows), any(r["retracted"] for r in obs.rows)
    tally(f"revisions: {revised}, retractions: {retracted}")


@settings(max_examples=examples(200), deadline=None)
@given(
    gap=st.integers(1, 8),
    values=st.lists(st.tuples(st.integers(0, 3), st.integers(-30, 60)), max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=6),
    horizon=st.integers(-10, 70),
)
def test_touching_session_table_holds_flinks_sessions(
    gap: int, values: list[tuple[int, int]], cuts: list[int], horizon: int
) -> None:
    """(e): batch by batch each group's list is Flink's sessions of its values; a purge at a
    horizon takes exactly those that no value at or above it intersects."""
    table = SessionTable(gap, reach=1)
    bounds = sorted({0, len(values), *(c for c in cuts if c <= len(values))})
    for lo, hi in itertools.pairwise(bounds):
        table.fit(4)
        gid = np.array([g for g, _ in values[lo:hi]], np.int64)
        ts = np.array([t for _, t in values[lo:hi]], np.int64)
        slot, gone, _ = table.add(gid, ts)
        assert (table.sgid[slot] == gid).all() and (table.start[slot] <= ts).all()
        assert (ts < table.end[slot]).all()  # each tuple is in the session it went to
        table.release(gone)
        for g in range(4):
            listed, s = [], int(table.head[g])
            while s >= 0:
                listed.append((int(table.start[s]), int(table.end[s])))
                s = int(table.nxt[s])
            assert listed == [
                (a, b) for a, b, _ in flink_sessions(gap, [t for k, t in values[:hi] if k == g])
            ]
    sessions = {g: flink_sessions(gap, [t for k, t in values if k == g]) for g in range(4)}
    table.fit(4)
    purged = table.purge(SessionLogic(Session(gap, "ts", touching=True)).close_for(horizon))
    assert sorted((int(table.start[s]), int(table.end[s])) for s in purged) == sorted(
        (a, b) for g in range(4) for a, b, _ in sessions[g] if b < horizon
    )
    for g in range(4):
        assert table.gone[g] == max((b for _, b, _ in sessions[g] if b < horizon), default=NO_PROGRESS)


# -- examples -----------------------------------------------------------------------------------
def engine_with_a() -> Engine:
    return make_engine({"A": ("s",)})


def rows_of(engine: Engine, query: str) -> tuple[list[tuple[int, int, int]], list[int]]:
    rows, punctuation = [], []
    for item in engine.poll(query):
        if isinstance(item, pa.Table):
            rows += [(r["window_start"], r["window_end"], r["n"]) for r in item.to_pylist()]
        else:
            punctuation.append(item.value)
    return rows, punctuation


def push(engine: Engine, ts: list[int]) -> None:
    n = len(ts)
    engine.push(
        "A",
        {"k1": ["x"] * n, "k2": [0] * n, "v": [1] * n, "f": [0.0] * n, "b": [False] * n, "ts": ts},
        source="s",
    )


def test_a_tuple_exactly_gap_later_joins_in_flinks_spelling_only() -> None:
    engine = engine_with_a()
    flink = engine.register_query(flink_sql("flink group window", 10, True), name="flink")
    bracket = engine.register_query(
        f"SELECT k1, {AGGREGATES} [SESSION 10, WA ts] FROM A GROUP BY k1", name="b"
    )
    push(engine, [0, 10, 25])
    engine.punctuate("A", 20, source="s")
    assert rows_of(engine, bracket) == ([(0, 10, 1), (10, 20, 1)], [21])
    assert rows_of(engine, flink) == ([], [20])  # [0, 20) is open at 20: a tuple at 20 would join it
    engine.punctuate("A", 21, source="s")
    assert rows_of(engine, flink) == ([(0, 20, 2)], [21])
    push(engine, [20, 35])  # 20: late, it would have joined [0, 20); 35 touches [25, 35)
    engine.close_source("A", "s")
    assert rows_of(engine, flink) == ([(25, 45, 2)], [END_OF_STREAM])
    assert [row["ts"] for row in late_rows(engine, flink)] == [20]


def test_explain_says_the_sessions_touch_and_the_bracket_form_is_unchanged() -> None:
    engine = engine_with_a()
    for form in ("flink group window", "flink window table", "spark session_window"):
        assert "session GAP 10 on ts, touching: a tuple GAP after the last joins" in engine.explain(
            flink_sql(form, 10, True)
        )
    plan = engine.explain("SELECT k1, count(*) AS n [SESSION 10, WA ts] FROM A GROUP BY k1")
    assert "Session Aggregate n by k1, session GAP 10 on ts\n" in plan, plan


def test_a_snapshot_of_strict_sessions_restores_into_touching_ones() -> None:
    """The rule is configuration, not state: a state saved under the strict rule (as the Flink
    spelling made before it merged touching sessions) restores, and the touching rule reads it."""
    strict = engine_with_a()
    q = strict.register_query(f"SELECT k1, {AGGREGATES} [SESSION 10, WA ts] FROM A GROUP BY k1", name="q")
    push(strict, [0, 10, 40])
    state = strict.runner.plan(q).operators[-1].snapshot()
    touching = engine_with_a()
    r = touching.register_query(flink_sql("flink group window", 10, True), name="r")
    operator = touching.runner.plan(r).operators[-1]
    assert isinstance(operator, SessionAggregate) and operator.window == Session(10, "ts", touching=True)
    operator.restore(state)
    push(touching, [30, 5])  # 30 touches [40, 50): they merge; 5 merges [0, 10) and [10, 20)
    touching.close_source("A", "s")
    assert sorted(rows_of(touching, r)[0]) == [(0, 20, 3), (30, 50, 2)]


BID = nx.SCHEMAS["bid"]


def test_nexmark_q11_as_flink_writes_it() -> None:
    """Bidder 7 bids at 0 s and exactly 10 s later: one session in Flink, two in the bracket form."""
    engine = Engine()
    engine.create_stream("bid", BID, progressing="dateTime", sources=["s"])
    q11 = engine.register_query(nx.query(11), name="q11")  # as the nexmark project writes it
    bracket = engine.register_query(
        "SELECT bidder, count(*) AS bid_count [SESSION 10 seconds, WA dateTime] FROM bid GROUP BY bidder",
        name="bracket",
    )
    ts = [0, 10_000, 25_000, 1_000, 11_001, 5_000]
    engine.push(
        "bid",
        {
            "auction": [1] * 6,
            "bidder": [7, 7, 7, 8, 8, 9],
            "price": [100] * 6,
            "channel": ["web"] * 6,
            "url": ["u"] * 6,
            "dateTime": ts,
            "extra": [""] * 6,
        },
        source="s",
    )
    engine.close_source("bid", "s")

    def rows(query: str, *bounds: str) -> list[tuple[int, int, int, int]]:
        tables = [item for item in engine.poll(query) if isinstance(item, pa.Table)]
        table = pa.concat_tables(tables)
        columns = ["window_start", "window_end", "bidder", "bid_count", *bounds, "revision"]
        assert table.column_names == columns
        start, end = bounds or ("window_start", "window_end")
        return sorted((r["bidder"], r[start], r[end], r["bid_count"]) for r in table.to_pylist())

    assert rows(q11, "starttime", "endtime") == [
        (7, 0, 20_000, 2),  # 10 s apart: the same session
        (7, 25_000, 35_000, 1),
        (8, 1_000, 11_000, 1),  # 10.001 s apart: two
        (8, 11_001, 21_001, 1),
        (9, 5_000, 15_000, 1),
    ]
    assert rows(bracket)[:2] == [(7, 0, 10_000, 1), (7, 10_000, 20_000, 1)]


def test_compaction_keeps_what_is_gone_while_a_touching_tuple_would_join_it() -> None:
    """Past 4096 groups the group table forgets groups without a session unless their gone one
    can still make a tuple late: under the touching rule also one exactly at its end."""
    engine = engine_with_a()
    q = engine.register_query(flink_sql("flink group window", 10, True), name="q")
    n = 5_000
    ts = [0 if i < 3_000 else 15 for i in range(n)]
    engine.push(
        "A",
        {
            "k1": [f"g{i}" for i in range(n)],
            "k2": [0] * n,
            "v": [1] * n,
            "f": [0.0] * n,
            "b": [False] * n,
            "ts": ts,
        },
        source="s",
    )
    engine.punctuate("A", 20, source="s")  # [0, 10) gone for g0..g2999; the floor is 10
    assert (
        len(engine.runner.plan(q).operators[-1].groups) == n
    )  # none forgotten: gone 10 can make a tuple at the floor (10) late
    # g5 at 10 would have joined [0, 10), gone: late (10 is at the floor; a group forgotten would
    # have counted it).
    engine.push("A", {"k1": ["g5"], "k2": [0], "v": [1], "f": [0.0], "b": [False], "ts": [10]}, source="s")
    engine.close_source("A", "s")
    assert [(row["k1"], row["ts"]) for row in late_rows(engine, q)] == [("g5", 10)]
