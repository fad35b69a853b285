"""Early results (``EMIT EVERY d``, docs/design.md, "Query language") against the brute-force
reference, on a manual clock.

A delivery (strategies.py) is interleaved with moves of the engine's clock. Checked after every
call: the EMIT timer fires exactly when a period has passed (once, however many passed); at a
firing the rows with ``final = false`` are exactly the reference over the tuples seen so far, for
every window punctuation does not cover yet (none below the output punctuation already emitted);
the rows with ``final = true`` are the rows the query gives without EMIT - equal to the
reference, each once at revision 0, never before and always once punctuation covers them (the
properties of test_windows_property); firings change no state that counts (open windows stay as
they are), and a query without EMIT has no ``final`` column. Every window aggregate is driven:
WID (sliding, tumbling, landmark), Paned-WID, Fused WID and AdaptWID (through the planner, and
directly with thresholds that make its groups switch), with and without slow flush.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from harness import Model, Observed, check_emission, columns, key_of, make_engine, max_finite
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Row, Spec, Window, assert_rows_equal, evaluate
from strategies import (
    COMBINABLE,
    HOLISTIC,
    Close,
    Event,
    Punct,
    Push,
    Sources,
    deliveries,
    examples,
    landmark_windows,
    overlapping_windows,
    specs,
    sql_of,
    stream_sources,
    time_windows,
    tuples,
)

from lowtide import END_OF_STREAM, ManualClock, Punctuation, SlowFlush
from lowtide.batch import Batch
from lowtide.errors import UnsupportedQuery
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.bucket import Bucket
from lowtide.operators.windows import Sliding
from lowtide.schema import ColumnType

pytestmark = pytest.mark.property

EVERY_S = 2.0
T0 = 1_000.0


@dataclass(frozen=True)
class Wait:
    """The engine's clock moves on by ``seconds``; the poll that follows runs it."""

    seconds: float


@st.composite
def with_waits(draw: Any, events: list[Event]) -> list[Event | Wait]:
    """``events`` with clock moves between them: less than a period, one, or several."""
    steps = st.sampled_from([0.5, 1.0, EVERY_S, EVERY_S, EVERY_S, 3.0, 2 * EVERY_S + 0.5])
    out: list[Event | Wait] = []
    for event in events:
        out += [Wait(s) for s in draw(st.lists(steps, max_size=2))]
        out.append(event)
    out += [Wait(s) for s in draw(st.lists(steps, max_size=1))]
    return out


@dataclass
class Early:
    """What an EMIT query gave: its final rows as ``Observed`` (for check_emission), and each
    firing's partial rows with the tuples seen and the progress at that point."""

    obs: Observed
    firings: list[tuple[list[Row], list[Row], int, int | None]]  # partials, seen, progress, out punct
    misfires: int = 0  # polls that gave partial rows when the timer was not due (must stay 0)
    plan: str = ""  # the operators the query ran (Engine.plan_of)


def run_early(
    sql: str, sources: Sources, steps: list[Event | Wait], flush: Any = None, keep: Any = None
) -> Early:
    """Feed ``steps`` to an engine on a manual clock, polling after each; ``keep``: which
    tuples the query counts (its WHERE), all when None."""
    clock = ManualClock(T0)
    engine = make_engine(sources, clock=clock, flush=flush)
    query = engine.register_query(sql, name="q")
    model = Model(sources)
    obs = Observed()
    early = Early(obs, [], plan=engine.plan_of(query))
    seen: list[Row] = []
    next_at = T0 + EVERY_S  # the timer's model: a grid of EVERY_S from the registration
    out_punct: int | None = None
    for call, step in enumerate(steps):
        fires = False
        if isinstance(step, Wait):
            clock.advance(step.seconds)
            if clock.now() >= next_at:
                fires = True
                while next_at <= clock.now():
                    next_at += EVERY_S
            windows_before = engine.stats()["queries"]["q"]["open_windows"]
        elif isinstance(step, Push):
            engine.push(step.stream, columns(step.rows), source=step.source)
            model.raise_to(step.stream, step.source, -(2**63))
            seen += [r for r in step.rows if keep is None or keep(r)]
        elif isinstance(step, Punct):
            engine.punctuate(step.stream, step.value, source=step.source)
            model.raise_to(step.stream, step.source, step.value)
        elif isinstance(step, Close):
            engine.close_source(step.stream, step.source)
            model.raise_to(step.stream, step.source, END_OF_STREAM)
        progress = min(model.progress.values())
        obs.progress.append(progress)
        obs.seen.append({})
        partials: list[Row] = []
        punct_before = out_punct
        for item in engine.poll(query):
            if isinstance(item, Punctuation):
                obs.kinds.append("punct")
                obs.punctuation.append(item.value)
                obs.punct_call.append(call)
                out_punct = item.value
                continue
            assert isinstance(item, pa.Table) and item.num_rows > 0
            assert item.schema.field("final").type == pa.bool_()
            for row in item.to_pylist():
                if row["final"]:
                    obs.kinds.append("row")
                    obs.rows.append(row)
                    obs.row_call.append(call)
                else:
                    partials.append(row)
        if fires:
            early.firings.append((partials, list(seen), progress, punct_before))
            assert engine.stats()["queries"]["q"]["open_windows"] == windows_before
        elif partials:
            early.misfires += 1
    return early


def check_early(spec: Spec, early: Early, seen_all: list[Row], slow: bool = False) -> None:
    """Partial rows at each firing and the final rows, against the reference (``slow``: slow
    flush, whose output punctuation may lag: only its bounds are checked)."""
    assert early.misfires == 0, "partial rows without the timer due"
    obs = early.obs
    expected = evaluate(spec, seen_all, progress=max_finite(obs.progress))
    assert_rows_equal(obs.rows, expected, spec)
    if not slow:
        check_emission(obs, spec, expected)
    else:  # as test_slow_flush_property checks it
        for row, call in zip(obs.rows, obs.row_call, strict=True):
            assert row["revision"] == 0 and row["window_end"] <= obs.progress[call]
        assert all(a < b for a, b in itertools.pairwise(obs.punctuation))
        assert obs.punctuation[-1:] == [END_OF_STREAM]

    def window(row: Row) -> tuple[Any, ...]:  # a landmark's start is fixed only once it starts
        return key_of(row, spec)[1:]

    finals = {window(r) for r in obs.rows}
    # The reference over the first n tuples seen: the tuples seen only grow, so firings with no
    # tuple between them saw the same ones.
    over_seen: dict[int, list[Row]] = {}
    for partials, seen, progress, punct in early.firings:
        if len(seen) not in over_seen:
            over_seen[len(seen)] = evaluate(spec, seen)
        want = [r for r in over_seen[len(seen)] if r["window_end"] > progress]  # open windows
        assert all(r["revision"] == 0 for r in partials)
        assert_rows_equal(partials, want, spec)  # once each: a duplicate fails here
        # Output punctuation stays truthful: no partial row below what it promised already.
        assert punct is None or all(r["window_end"] >= punct for r in partials)
        if spec.having is None:  # HAVING may let a partial row out and hold the final one back
            assert {window(r) for r in partials} <= finals
    tally(f"firings with partial rows: {min(sum(bool(p) for p, *_ in early.firings), 3)}+")


def emit_sql(spec: Spec, streams: list[str], every: str = "2 s") -> str:
    sql = sql_of(spec, streams)
    return sql.replace("] FROM", f", EMIT EVERY {every}] FROM", 1)


def check(spec: Spec, sources: Sources, data: Any, flush: Any = None, explains: str = "") -> None:
    """Draw tuples, a delivery and clock moves; run the EMIT form of ``spec``; check it."""
    streams = {s: data.draw(tuples(max_size=25), label=f"tuples {s}") for s in sources}
    events = data.draw(deliveries(streams, sources), label="events")
    steps = data.draw(with_waits(events), label="steps")
    early = run_early(emit_sql(spec, list(sources)), sources, steps, flush)
    assert explains in early.plan
    check_early(spec, early, [r for rows in streams.values() for r in rows], slow=flush is not None)


@settings(max_examples=examples(120), deadline=None)
@given(
    spec=specs(st.one_of(time_windows, landmark_windows)),
    sources=stream_sources(1),
    slow=st.booleans(),
    data=st.data(),
)
def test_partial_rows_are_the_reference_over_the_tuples_seen(
    spec: Spec, sources: Sources, slow: bool, data: Any
) -> None:
    check(spec, sources, data, SlowFlush(1, 1) if slow else None)


@settings(max_examples=examples(40), deadline=None)
@given(spec=specs(landmark_windows), sources=stream_sources(2), data=st.data())
def test_landmark_partials_grow_from_the_first_slide(spec: Spec, sources: Sources, data: Any) -> None:
    check(spec, sources, data, explains="WID Aggregate")


@settings(max_examples=examples(80), deadline=None)
@given(
    spec=specs(overlapping_windows, aggs=st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=4)),
    sources=stream_sources(1),
    slow=st.booleans(),
    data=st.data(),
)
def test_paned_wid_partials_combine_slices(spec: Spec, sources: Sources, slow: bool, data: Any) -> None:
    check(spec, sources, data, SlowFlush(2, 2) if slow else None, explains="Paned-WID Aggregate")


holistic = st.lists(st.sampled_from([*COMBINABLE[:4], Agg("median", "v", "")]), max_size=2).map(
    lambda aggs: [Agg("count_distinct", "v", ""), *aggs]
)
adaptive_windows = st.builds(lambda s, k: Window("sliding", s, s * k), st.integers(1, 3), st.integers(2, 5))


@settings(max_examples=examples(60), deadline=None)
@given(
    spec=specs(adaptive_windows, holistic),
    sources=stream_sources(1),
    data=st.data(),
)
def test_adapt_wid_partials_equal_reference(spec: Spec, sources: Sources, data: Any) -> None:
    assert any(a.func in HOLISTIC for a in spec.aggs)
    check(spec, sources, data, explains="AdaptWID Aggregate")


@settings(max_examples=examples(80), deadline=None)
@given(
    window=st.one_of(  # overlapping less than Paned-WID's ground
        st.integers(1, 6).map(lambda r: Window("sliding", r, r)),
        st.builds(lambda s, k: Window("sliding", s, s * k), st.integers(1, 4), st.integers(2, 3)),
    ),
    group_by=st.sampled_from([("k1",), ("k2",)]),
    aggs=st.lists(
        st.sampled_from([Agg("count*", None, ""), Agg("count", "v", ""), Agg("sum", "v", "")]), min_size=1
    ),
    threshold=st.integers(-5, 15),
    sources=stream_sources(1),
    data=st.data(),
)
def test_fused_wid_partials_filter_like_its_where(
    window: Window, group_by: Any, aggs: Any, threshold: int, sources: Sources, data: Any
) -> None:
    spec = Spec(window, group_by, tuple(Agg(a.func, a.column, f"a{i}") for i, a in enumerate(aggs)))
    rows = data.draw(tuples(max_size=30), label="tuples")
    steps = data.draw(with_waits(data.draw(deliveries({"A": rows}, sources), label="events")), label="steps")
    sql = emit_sql(spec, ["A"]).replace(" GROUP BY", f" WHERE v > {threshold} GROUP BY")

    def keep(row: Row) -> bool:
        return bool(row["v"] > threshold)

    early = run_early(sql, sources, steps, keep=keep)
    assert "Fused Select + Bucket" in early.plan
    check_early(spec, early, [r for r in rows if keep(r)])


# -- AdaptWID directly: thresholds low enough that groups switch between firings -------------------
INT, FLOAT = ColumnType("int64"), ColumnType("float64")


@st.composite
def adapt_case(draw: Any) -> dict[str, Any]:
    slide = draw(st.integers(1, 4))
    size = draw(st.sampled_from([slide, slide * draw(st.integers(2, 4)), slide + draw(st.integers(1, 5))]))
    rows = [
        {
            "k": draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
            "v": draw(st.integers(-5, 20)),
            "ts": draw(st.integers(0, 30)),
        }
        for _ in range(draw(st.integers(0, 50)))
    ]
    rows = draw(st.permutations(rows)) if draw(st.booleans()) else sorted(rows, key=lambda r: r["ts"])
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=8)))
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    punct, low = [], -1
    for i in range(len(batches)):
        rest = [r["ts"] for b in batches[i + 1 :] for r in b]
        top = min(rest) if rest else 40
        low = draw(st.integers(low, max(low, top)))
        punct.append(low)
    thresholds = draw(st.sampled_from([(0.5, 0.0), (1.0, 1.0), (1.0, 3.0), (2.0, 1.0), (None, None)]))
    return {
        "window": Sliding(size, slide, "ts"),
        "batches": batches,
        "punct": punct,
        "thresholds": thresholds,
    }


@settings(max_examples=examples(120), deadline=None)
@given(case=adapt_case())
def test_adapt_wid_partials_while_groups_switch(case: dict[str, Any]) -> None:
    """Eager, lazy and transitional groups, partials after every batch: the reference over
    the tuples so far for the open windows; the final rows are untouched by the firings."""
    from harness import Recorder

    window: Sliding = case["window"]
    calls = (
        AggregateCall(AggFunc.COUNT_STAR, None, None, None, "n"),
        AggregateCall(AggFunc.SUM, "v", INT, None, "s"),
        AggregateCall(AggFunc.MEDIAN, "v", INT, None, "m"),
    )
    names = ("window_start", "window_end", "k", "n", "s", "m", "revision", "final")
    high, low = case["thresholds"]
    adapt = AdaptWIDAggregate(window, ("k",), (INT,), calls, names, high=high, low=low)
    bucket, sink = Bucket(window), Recorder()
    bucket.connect(adapt).connect(sink)
    spec = Spec(
        Window("sliding", window.slide, window.range, "ts"),
        ("k",),
        (Agg("count*", None, "n"), Agg("sum", "v", "s"), Agg("median", "v", "m")),
    )
    seen: list[Row] = []
    finals: list[Row] = []
    covered = -(2**63)  # the punctuation applied so far: windows ending above it are open
    for rows, p in [*zip(case["batches"], case["punct"], strict=True), ([], END_OF_STREAM)]:
        if rows:
            arrays = {c: np.array([r[c] for r in rows], np.int64) for c in ("k", "v", "ts")}
            bucket.process(Batch(arrays, len(rows)))
            seen += rows
        sink.clear()
        adapt.emit_partials()
        partials = [dict(zip(names, values, strict=True)) for values in sink.rows(*names)]
        assert all(not r["final"] and not math.isnan(r["m"]) for r in partials)
        assert_rows_equal(partials, [r for r in evaluate(spec, seen) if r["window_end"] > covered], spec)
        sink.clear()
        bucket.punctuate(Punctuation(p, "ts"))
        covered = p
        finals += [dict(zip(names, values, strict=True)) for values in sink.rows(*names)]
    assert all(r["final"] for r in finals)
    assert_rows_equal(finals, evaluate(spec, seen), spec)
    tally(f"switches: {adapt.to_eager > 0}, {adapt.to_lazy > 0}")


# -- the column and the clause --------------------------------------------------------------------
SPEC = Spec(Window("sliding", 5, 10), ("k1",), (Agg("count*", None, "n"),))


def test_a_query_without_emit_has_no_final_column() -> None:
    engine = make_engine({"A": ("a0",)})
    plain = engine.register_query(sql_of(SPEC, ["A"]), name="plain")
    early = engine.register_query(emit_sql(SPEC, ["A"]), name="early")
    engine.push("A", columns([{"k1": "a", "k2": 0, "v": 1, "f": 0.5, "b": True, "ts": 3}]), source="a0")
    engine.close_source("A", "a0")
    (table, *_) = [t for t in engine.poll(plain) if isinstance(t, pa.Table)]
    assert "final" not in table.column_names and table.column_names[-1] == "revision"
    (table, *_) = [t for t in engine.poll(early) if isinstance(t, pa.Table)]
    assert table.column_names[-2:] == ["revision", "final"]
    assert table.column("final").to_pylist() == [True, True]
    assert [q["columns"][-1] for q in engine.list_queries()] == ["revision", "final"]


def test_explain_mentions_the_emit_and_the_clause_is_checked() -> None:
    engine = make_engine({"A": ("a0",)})
    text = engine.explain(emit_sql(SPEC, ["A"], "500 ms"))
    assert "EMIT EVERY 500 ms" in text and "final" in text
    assert "EMIT" not in engine.explain(sql_of(SPEC, ["A"]))
    both = "SELECT k1, count(*) AS n [RANGE 10, WA ts] EMIT EVERY 1 minute FROM A GROUP BY k1"
    assert "EMIT EVERY 1 min" in engine.explain(both)  # right after the bracket too
    with pytest.raises(UnsupportedQuery, match="EMIT EVERY needs a time window"):
        engine.explain("SELECT count(*) AS n [RANGE 5 rows, WA row-num, EMIT EVERY 1 s] FROM A")
    with pytest.raises(UnsupportedQuery, match="processing time: give 3 a unit"):
        engine.explain(emit_sql(SPEC, ["A"], "3"))
    with pytest.raises(UnsupportedQuery, match="appears twice"):
        engine.explain("SELECT count(*) AS final [RANGE 10, WA ts, EMIT EVERY 1 s] FROM A")
    engine.create_stream("B", {"k1": "string", "ts": "int64"}, sources=["b0"])
    for elsewhere in (
        "SELECT A.k1, B.ts FROM A [RANGE 5, WA ts, EMIT EVERY 1 s], B [RANGE 5, WA ts] WHERE A.k1 = B.k1",
        "SELECT k1, ts FROM A [RANGE 5, WA ts, EMIT EVERY 1 s]",
    ):
        with pytest.raises(UnsupportedQuery, match="early results of a window aggregate"):
            engine.explain(elsewhere)


def test_a_result_stream_carries_final_rows_only() -> None:
    """A query over an EMIT query counts each window once: partial rows stay out of the stream."""
    clock = ManualClock(T0)
    engine = make_engine({"A": ("a0",)}, clock=clock)
    engine.register_query(emit_sql(SPEC, ["A"]), name="inner")
    outer = engine.register_query(
        "SELECT k1, sum(n) AS total [RANGE 100, WA window_end] FROM inner GROUP BY k1", name="outer"
    )
    rows = [{"k1": "a", "k2": 0, "v": 1, "f": 0.5, "b": True, "ts": t} for t in (1, 2, 7, 12)]
    for row in rows:
        engine.push("A", columns([row]), source="a0")
        clock.advance(EVERY_S)
        engine.tick()
    engine.close_source("A", "a0")
    got = [r for t in engine.poll(outer) if isinstance(t, pa.Table) for r in t.to_pylist()]
    assert [(r["k1"], r["total"]) for r in got] == [("a", 8)]  # each tuple in two windows, once each


def test_missed_periods_fire_once_and_firings_keep_their_grid() -> None:
    clock = ManualClock(T0)
    engine = make_engine({"A": ("a0",)}, clock=clock)
    q = engine.register_query(emit_sql(SPEC, ["A"]), name="q")
    engine.push("A", columns([{"k1": "a", "k2": 0, "v": 1, "f": 0.5, "b": True, "ts": 3}]), source="a0")

    def firings() -> int:
        return sum(1 for t in engine.poll(q) if isinstance(t, pa.Table))

    clock.advance(EVERY_S - 0.1)
    assert firings() == 0
    clock.advance(0.1)
    assert firings() == 1  # due at T0 + 2
    clock.advance(3 * EVERY_S + 1)  # T0 + 9: the periods at 4, 6 and 8 fire once
    assert firings() == 1
    clock.advance(0.9)  # T0 + 9.9: the next is due at 10, not 11
    assert firings() == 0
    clock.advance(0.1)
    assert firings() == 1
    assert engine.tick_due(clock.now() + EVERY_S) and not engine.tick_due(clock.now())


def test_partials_after_a_late_update_and_revisions_are_final() -> None:
    """late='update': the open windows' partials count the late tuple; the revision it makes of an
    emitted window is a final row."""
    clock = ManualClock(T0)
    engine = make_engine({"A": ("a0",)}, clock=clock)
    q = engine.register_query(emit_sql(SPEC, ["A"]), name="q", late="update", allowed_lateness=10)
    row = {"k1": "a", "k2": 0, "v": 1, "f": 0.5, "b": True}
    engine.push("A", columns([{**row, "ts": 3}, {**row, "ts": 12}]), source="a0")
    engine.punctuate("A", 10, source="a0")
    engine.poll(q)
    engine.push("A", columns([{**row, "ts": 6}]), source="a0")  # late: [0, 10) was emitted
    clock.advance(EVERY_S)
    got = [r for t in engine.poll(q) if isinstance(t, pa.Table) for r in t.to_pylist()]
    revised = [(r["window_start"], r["n"], r["revision"], r["final"]) for r in got if r["final"]]
    partial = [(r["window_start"], r["n"], r["revision"]) for r in got if not r["final"]]
    assert revised == [(0, 2, 1, True)]
    assert sorted(partial) == [(5, 2, 0), (10, 1, 0)]
