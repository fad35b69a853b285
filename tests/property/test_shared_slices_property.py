"""Slices shared across queries change nothing a query sees (stream slicing, as in Traub et al.,
"Efficient Window Aggregation with General Stream Slicing" (EDBT 2019), section 4).

Several sliding-window queries on one stream, registered at different points of a delivery (and
one maybe dropped midway), run in an engine that shares slices and in one that gives every query
slices of its own (``Engine(share_slices=False)``; a lone Paned-WID query is checked against the
brute-force reference in test_windows_property). The unshared engine must build no slices that
two queries read, and the sharing one must share wherever the planner would (so the comparison is
never of sharing with sharing). After every call each query must have emitted
the same rows and the same punctuation in both: a query registered later counts only the tuples
that arrived after it, whatever the queries before it have seen, and its windows come out when
punctuation covers them, not before, not later.

With punctuation running ahead of some tuples, each query sharing the slices counts a tuple
behind punctuation in its own windows not yet emitted and nowhere else, and its late stream holds
exactly the tuples that missed one of its own emitted windows
(docs/design.md, "Punctuation and lateness").
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from harness import (
    Model,
    Observed,
    behind_expectation,
    check_emission,
    columns,
    counts_behind,
    ident,
    late_rows,
    make_engine,
    polled,
)
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window, assert_rows_equal
from strategies import (
    AGGREGATES,
    COMBINABLE,
    HOLISTIC,
    SCHEMA,
    Close,
    Event,
    Punct,
    Push,
    deliveries,
    sql_of,
    stream_sources,
    tuples,
)

from lowtide import END_OF_STREAM, Engine
from lowtide.operators.windows import Sliding, pane_of

pytestmark = pytest.mark.property

windows = st.builds(
    lambda s, k, extra: Window("sliding", s, s * k + extra),
    st.sampled_from([1, 2, 4]),
    st.integers(4, 12),
    st.integers(0, 2),
)
# Holistic calls on their own half the time: the query reads the slices' value logs alone.
aggregates = st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3) | st.lists(
    st.sampled_from([a for a in AGGREGATES if a.func in HOLISTIC]), min_size=1, max_size=2
)


def _apply(engine: Engine, event: Event) -> None:
    if isinstance(event, Push):
        engine.push(event.stream, columns(event.rows), source=event.source)
    elif isinstance(event, Punct):
        engine.punctuate(event.stream, event.value, source=event.source)
    elif isinstance(event, Close):
        engine.close_source(event.stream, event.source)


# The first query keeps slices (a holistic one alone runs AdaptWID); later ones may read them.
query_sets = st.builds(
    lambda first, later: [first, *later],
    st.tuples(windows, st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=3)),
    st.lists(st.tuples(windows, aggregates), min_size=1, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    group_by=st.sampled_from([(), ("k1",), ("k2", "k1")]),
    queries=query_sets,
    sources=stream_sources(1),
    data=st.data(),
)
def test_shared_slices_equal_own_slices(group_by: Any, queries: Any, sources: Any, data: Any) -> None:
    rows = data.draw(tuples(max_size=40), label="tuples")
    events = data.draw(deliveries({"A": rows}, sources), label="events")
    specs = [
        Spec(window, group_by, tuple(Agg(a.func, a.column, f"a{i}", a.param) for i, a in enumerate(aggs)))
        for window, aggs in queries
    ]
    starts = [0, *sorted(data.draw(st.integers(0, len(events)), label="start") for _ in specs[1:])]
    drop_at = data.draw(st.none() | st.integers(0, len(events)), label="drop query 0 at")
    shared, own = Engine(), Engine(share_slices=False)
    for engine in (shared, own):
        engine.create_stream("A", SCHEMA, progressing="ts", sources=list(sources["A"]))
    live: list[int] = []
    for call in range(len(events) + 1):
        for i, start in enumerate(starts):
            if start == call:
                for engine in (shared, own):
                    engine.register_query(sql_of(specs[i], ["A"]), name=f"q{i}")
                live.append(i)
        if drop_at == call and 0 in live:
            for engine in (shared, own):
                engine.drop_query("q0")
            live.remove(0)
        if call < len(events):
            for engine in (shared, own):
                _apply(engine, events[call])
        for i in live:
            got, got_punctuation = polled(shared, f"q{i}")
            want, want_punctuation = polled(own, f"q{i}")
            assert got_punctuation == want_punctuation, (i, call)
            assert_rows_equal(got, want, specs[i])
    # Unshared: every Paned-WID query reads slices of its own, which no other query reads.
    own_readers = [own.runner.plan(f"q{i}").reader for i in live]
    assert all(own.share_of(f"q{i}") is None for i in live)
    assert all(len(r.slices.readers) == 1 for r in own_readers if r is not None)
    assert 0 not in live or own_readers[live.index(0)] is not None  # Paned-WID, not another operator
    # Shared: a later query whose panes the first query's slices tile reads those slices (they
    # are the first fed alike: every query here has the same stream, no WHERE, the same GROUP
    # BY, late="drop", and overlaps at least 4 times).
    readers = [shared.runner.plan(f"q{i}").reader for i in live]
    if 0 in live:
        first = readers[live.index(0)]
        assert first is not None
        width = first.slices.width
        for i, reader in zip(live, readers, strict=True):
            if i and pane_of(Sliding(specs[i].window.range, specs[i].window.slide, "ts")).range % width == 0:
                assert reader is not None and reader.slices is first.slices, i
                assert shared.share_of(f"q{i}") == shared.share_of("q0"), i
    sharing = len({id(r.slices) for r in readers if r is not None}) < len(readers)
    later_generation = any(r is not None and r.generation > 0 for r in readers)
    tally(f"slices shared: {sharing}, a reader in a later generation: {later_generation}")
    holistic = any(r is not None and r.summaries and r.slices.readers[0] is not r for r in readers)
    tally(f"a holistic query merging per-slice summaries of shared slices: {holistic}")


@settings(max_examples=150, deadline=None)
@given(
    group_by=st.sampled_from([(), ("k1",), ("k2", "k1")]),
    queries=query_sets,
    sources=stream_sources(1),
    data=st.data(),
)
def test_behind_tuples_count_per_query_in_shared_slices(
    group_by: Any, queries: Any, sources: Any, data: Any
) -> None:
    """Punctuation runs ahead of some tuples (docs/design.md, "Punctuation and lateness"): each
    query reading the shared slices counts a tuple behind it in its own windows not yet emitted, and
    only a tuple that missed one of its own emitted windows is in its late stream, once; its rows
    equal the reference over the tuples that arrived after it was registered."""
    rows = data.draw(tuples(max_size=40), label="tuples")
    events = data.draw(deliveries({"A": rows}, sources, honest=False), label="events")
    specs = [
        Spec(window, group_by, tuple(Agg(a.func, a.column, f"a{i}", a.param) for i, a in enumerate(aggs)))
        for window, aggs in queries
    ]
    starts = [0, *sorted(data.draw(st.integers(0, len(events) - 1), label="start") for _ in specs[1:])]
    drop_at = data.draw(st.none() | st.integers(1, len(events)), label="drop query 0 at")
    engine = make_engine(sources)
    model = Model(sources)
    obs = {i: Observed() for i in range(len(specs))}
    counts: dict[int, bool] = {}
    behind = 0
    for call, event in enumerate(events):
        for i in (i for i, start in enumerate(starts) if start == call):
            sql = sql_of(specs[i], ["A"])
            engine.register_query(sql, name=f"q{i}")
            counts[i] = engine.runner.plan(f"q{i}").reader is not None or counts_behind(sql, sources)
        if call == drop_at:  # the query whose Input feeds the slices: the others read on
            engine.drop_query("q0")
            del counts[0]
        _apply(engine, event)
        if isinstance(event, Push):
            progress = model.progress["A"]
            behind += sum(row["ts"] < progress for row in event.rows)
            for i in counts:
                obs[i].arrivals += [(row, progress) for row in event.rows]
                obs[i].arrival_query_progress += [progress] * len(event.rows)
        elif isinstance(event, Punct):
            model.raise_to("A", event.source, event.value)
        elif isinstance(event, Close):
            model.raise_to("A", event.source, END_OF_STREAM)
        for i in counts:
            got, punctuation = polled(engine, f"q{i}")
            obs[i].rows += got
            obs[i].row_call += [len(obs[i].progress)] * len(got)
            obs[i].kinds += ["row"] * len(got) + ["punct"] * len(punctuation)
            obs[i].punct_call += [len(obs[i].progress)] * len(punctuation)
            obs[i].punctuation += punctuation
            obs[i].progress.append(model.progress["A"])
            obs[i].seen.append({})
    stats = engine.stats()["queries"]
    for i in counts:
        spec = specs[i]
        expected, late = behind_expectation(spec, obs[i], counts[i])
        assert_rows_equal(obs[i].rows, expected, spec)
        check_emission(obs[i], spec, expected)
        got_late = late_rows(engine, f"q{i}")
        assert Counter(map(ident, got_late)) == Counter(map(ident, late)), i
        assert stats[f"q{i}"]["late"] == len(late)
    readers = [engine.runner.plan(f"q{i}").reader for i in counts]
    shared = len({id(r.slices) for r in readers if r is not None}) < len(readers)
    tally(f"slices shared: {shared}, tuples behind punctuation: {min(behind // 5 * 5, 15)}+")
    tally(f"query 0 dropped: {0 not in counts}")
