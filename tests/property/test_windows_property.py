"""Window semantics against the brute-force reference, under any delivery of the data.

(a) results equal the reference for sliding, tumbling, landmark and tuple windows (PA too);
(b) whatever the arrival order, batch split, interleaving and punctuation placement;
(c)-(f) each window row once at revision 0, never before and always once punctuation covers it,
output punctuation strictly rising and ending at end of stream.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from harness import check_delivery, check_query, columns, key_of, make_engine, run
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window, assert_rows_equal, canonical, evaluate
from strategies import (
    COMBINABLE,
    Close,
    Punct,
    Push,
    any_window,
    deliveries,
    examples,
    landmark_windows,
    overlapping_windows,
    row_windows,
    specs,
    sql_of,
    stream_sources,
    time_windows,
    tuples,
)

from lowtide import END_OF_STREAM, Punctuation
from lowtide.operators import paned_wid

pytestmark = pytest.mark.property


@settings(max_examples=examples(400), deadline=None)
@given(
    spec=specs(any_window),
    sources=stream_sources(1),
    tumbling_form=st.integers(0, 2),
    declared=st.booleans(),
    data=st.data(),
)
def test_every_window_equals_reference(
    spec: Spec, sources: Any, tumbling_form: int, declared: bool, data: Any
) -> None:
    check_query(spec, sources, data, tumbling_form, declared=declared)


@pytest.mark.parametrize("partition", [(), ("k1",)])
@pytest.mark.parametrize(
    ("slide", "before", "after", "late"),
    [(2, 1, 1, 0), (3, 2, 1, 0), (2, 1, 2, 1)],
    ids=["issue-23", "first-draw", "in-a-window"],
)
def test_a_tuple_after_the_end_is_late_only_in_a_window(
    partition: tuple[str, ...], slide: int, before: int, after: int, late: int
) -> None:
    """Issue 23's flaky example: ``[RANGE 1 rows, SLIDE n rows]``, two undeclared sources, the
    second speaking only after the first closed (the stream has ended). Its tuples are still
    numbered in arrival order (row-num); one numbered between two windows belongs to none, so
    it is late for none (docs/design.md, "Punctuation and lateness"); one numbered in a window is
    late: that window can no longer be emitted."""
    spec = Spec(Window("rows", slide, 1, "row-num", partition), (), (Agg("count*", None, "n"),))
    row = {"k1": "a", "k2": 0, "v": 0, "f": None, "b": False, "ts": 0}
    events = [
        *[Push("A", "a0", (row,))] * before,
        Close("A", "a0"),
        *[Push("A", "a1", (row,))] * after,
        Close("A", "a1"),
    ]
    obs = check_delivery(spec, {"A": ("a0", "a1")}, events, declared=False)
    assert obs.stats["queries"]["q"]["late"] == late
    assert len(obs.rows) == 1  # the window [0, 1) of the first tuple


@settings(max_examples=examples(200), deadline=None)
@given(
    spec=specs(overlapping_windows, aggs=st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=4)),
    sources=stream_sources(2),
    data=st.data(),
)
def test_paned_wid_equals_reference(spec: Spec, sources: Any, data: Any) -> None:
    """Heavily overlapping windows run as Paned-WID: each tuple in one pane, windows combined
    (by a running window or prefix sums, in chunks of a few windows when many close at once)."""
    chunk = paned_wid.EMIT_CHUNK
    paned_wid.EMIT_CHUNK = data.draw(st.sampled_from([1, 3, chunk]), label="windows emitted together")
    try:
        obs = check_query(spec, sources, data, max_size=40)
    finally:
        paned_wid.EMIT_CHUNK = chunk
    assert "Paned-WID Aggregate" in obs.plan


@settings(max_examples=examples(150), deadline=None)
@given(spec=specs(landmark_windows), sources=stream_sources(2), data=st.data())
def test_landmark_equals_reference(spec: Spec, sources: Any, data: Any) -> None:
    check_query(spec, sources, data)


@settings(max_examples=examples(200), deadline=None)
@given(spec=specs(row_windows), sources=stream_sources(2), data=st.data())
def test_tuple_windows_equal_reference(spec: Spec, sources: Any, data: Any) -> None:
    check_query(spec, sources, data)


@settings(max_examples=examples(150), deadline=None)
@given(
    window=time_windows,
    group_by=st.sampled_from([(), ("k1",), ("k2", "k1")]),
    sources=stream_sources(2),
    data=st.data(),
)
def test_results_do_not_depend_on_delivery(window: Any, group_by: Any, sources: Any, data: Any) -> None:
    spec = Spec(window, group_by, (Agg("count*", None, "n"), Agg("sum", "v", "s"), Agg("median", "f", "m")))
    streams = {s: data.draw(tuples(max_size=25)) for s in sources}
    sql = sql_of(spec, list(sources))
    results = []
    for _ in range(2):
        obs = run(spec, sql, sources, data.draw(deliveries(streams, sources)))
        results.append({key_of(r, spec): r for r in obs.rows})
    assert results[0].keys() == results[1].keys()
    assert canonical(results[0].values(), spec.keys) == canonical(results[1].values(), spec.keys)


@settings(max_examples=examples(100), deadline=None)
@given(spec=specs(any_window), sources=stream_sources(1), data=st.data())
def test_far_apart_timestamps_equal_reference(spec: Spec, sources: Any, data: Any) -> None:
    k = 100_000  # windows far apart: the aggregate's sparse path over window ids
    w = spec.window
    if w.kind != "rows":
        w = Window(w.kind, w.slide * k, w.range * k if w.range else None)
    check_query(Spec(w, spec.group_by, spec.aggs, spec.having), sources, data, scale=k)


@settings(max_examples=examples(60), deadline=None)
@given(first=time_windows, second=time_windows, sources=stream_sources(1), data=st.data())
def test_a_query_over_a_query_equals_reference_over_reference(
    first: Window, second: Window, sources: Any, data: Any
) -> None:
    """A query's result is a stream (progressing on window_end) that later queries read by name."""
    inner = Spec(first, ("k1",), (Agg("count*", None, "n"),))
    outer = Spec(
        Window("sliding", second.slide, second.range, "window_end"), ("k1",), (Agg("sum", "n", "total"),)
    )
    rows = data.draw(tuples(max_size=25))
    engine = make_engine(sources)
    engine.register_query(sql_of(inner, ["A"]), name="q1")
    q2 = engine.register_query(sql_of(outer, ["q1"]).replace("WA ts", "WA window_end"), name="q2")
    for event in data.draw(deliveries({"A": rows}, sources)):
        if isinstance(event, Push):
            engine.push("A", columns(event.rows), source=event.source)
        elif isinstance(event, Punct):
            engine.punctuate("A", event.value, source=event.source)
        else:
            engine.close_source("A", event.source)
    items = engine.poll(q2)
    assert items[-1] == Punctuation(END_OF_STREAM, "window_end")
    got = [r for t in items if isinstance(t, pa.Table) for r in t.to_pylist()]
    assert_rows_equal(got, evaluate(outer, evaluate(inner, rows)), outer)
