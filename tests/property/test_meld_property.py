"""Meld (UNION and the stream's own sources): results and progress of several inputs.

(g) output punctuation is the monotone minimum of the inputs, never repeated; a declared source
that never punctuated holds the stream back; an idle source stops holding it back after the
timeout and, when it speaks again, its tuples below the progress are late.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from harness import check_query, columns, counts_behind, extents, late_rows, make_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window, assert_rows_equal, evaluate
from strategies import (
    Close,
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

from lowtide import NO_PROGRESS, ManualClock, Punctuation
from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.meld import Meld

pytestmark = pytest.mark.property


class Collect(Operator):
    def __init__(self) -> None:
        super().__init__()
        self.items: list[Any] = []

    def process(self, batch: Batch, port: int = 0) -> None:
        self.items.append(batch.n)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.items.append(punctuation)


@settings(max_examples=examples(500), deadline=None)
@given(
    inputs=st.integers(1, 3),
    steps=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["t", "u"]), st.integers(0, 6)), max_size=30),
)
def test_meld_punctuation_is_the_monotone_min_without_repeats(inputs: int, steps: Any) -> None:
    meld, out = Meld(inputs), Collect()
    meld.connect(out)
    bounds = {a: [NO_PROGRESS] * inputs for a in "tu"}
    last = {a: NO_PROGRESS for a in "tu"}
    for port, attribute, step in steps:
        port %= inputs
        value = max(bounds[attribute][port], -10) + step  # never regressing on one port
        bounds[attribute][port] = value
        before = len(out.items)
        meld.punctuate(Punctuation(value, attribute), port)
        meld.process(Batch({"t": [0]}, 1), port)
        emitted = [p for p in out.items[before:] if isinstance(p, Punctuation)]
        low = min(bounds[attribute])
        if low > last[attribute]:
            assert emitted == [Punctuation(low, attribute)]
            last[attribute] = low
        else:
            assert emitted == []
        assert out.items[-1] == 1  # tuples pass through at once


@settings(max_examples=examples(200), deadline=None)
@given(spec=specs(any_window), sources=stream_sources(3), data=st.data())
def test_union_of_three_streams_equals_reference(spec: Spec, sources: Any, data: Any) -> None:
    check_query(spec, sources, data, max_size=15)


@settings(max_examples=examples(100), deadline=None)
@given(spec=specs(time_windows, having=False), data=st.data())
def test_declared_source_that_never_punctuates_holds_the_stream_back(spec: Spec, data: Any) -> None:
    sources = {"A": ("a0", "silent"), "B": ("b0",)}
    engine = make_engine(sources)
    q = engine.register_query(sql_of(spec, ["A", "B"]))
    streams = {s: data.draw(tuples(max_size=15)) for s in "AB"}
    for event in data.draw(deliveries(streams, {"A": ("a0",), "B": ("b0",)})):
        if isinstance(event, Push):
            engine.push(event.stream, columns(event.rows), source=event.source)
        elif isinstance(event, Punct):
            engine.punctuate(event.stream, event.value, source=event.source)
        else:
            engine.close_source(event.stream, event.source)
        assert engine.poll(q) == []  # no rows, no punctuation: "silent" still holds A back
    assert {s["name"]: s["low_watermark"] for s in engine.list_streams()}["A"] == NO_PROGRESS
    engine.close_source("A", "silent")
    rows = [r for t in engine.poll(q) if isinstance(t, pa.Table) for r in t.to_pylist()]
    assert_rows_equal(rows, evaluate(spec, streams["A"] + streams["B"]), spec)


@settings(max_examples=examples(100), deadline=None)
@given(
    window=time_windows,
    early=tuples(max_size=15),
    rejoin=tuples(max_size=8),
    data=st.data(),
)
def test_idle_source_stops_holding_back_and_its_behind_tuples_count_where_open(
    window: Window, early: Any, rejoin: Any, data: Any
) -> None:
    spec = Spec(window, ("k1",), (Agg("count*", None, "n"), Agg("sum", "v", "s")))
    clock = ManualClock(0.0)
    engine = make_engine({"A": ("a", "idle")}, clock=clock, idle_timeout=5)
    q = engine.register_query(sql_of(spec, ["A"]))
    a_punct = NO_PROGRESS
    for event in data.draw(deliveries({"A": early}, {"A": ("a",)})):
        if isinstance(event, Close):
            continue  # "a" stays open, and keeps speaking
        clock.advance(data.draw(st.sampled_from([0.0, 1.0, 2.5])))
        if isinstance(event, Push):
            engine.push("A", columns(event.rows), source="a")
        else:
            engine.punctuate("A", event.value, source="a")
            a_punct = event.value
        published = engine.list_streams()[0]["low_watermark"]
        assert published == (NO_PROGRESS if clock.now() < 5 else a_punct)
    while clock.now() < 5 or a_punct == NO_PROGRESS:  # "idle" times out, "a" heard within the timeout
        clock.advance(2.5)
        a_punct = max(a_punct, *(r["ts"] + 1 for r in early), 0)
        engine.punctuate("A", a_punct, source="a")
    progress = a_punct
    items = engine.poll(q)
    assert engine.list_streams()[0]["low_watermark"] == progress
    engine.push("A", columns(rejoin), source="idle")  # speaks again: rejoins the minimum
    engine.close_source("A", "idle")
    engine.close_source("A", "a")
    behind = [r for r in rejoin if r["ts"] < progress]
    items += engine.poll(q)
    rows = [r for t in items if isinstance(t, pa.Table) for r in t.to_pylist()]
    if counts_behind(sql_of(spec, ["A"]), {"A": ("a", "idle")}):
        # Behind punctuation, the rejoining tuples still count in the windows not yet emitted
        # (docs/design.md, "Punctuation and lateness").
        expected = evaluate(
            spec, early + rejoin, counts_in=lambda i, start, end: i < len(early) or end > progress
        )
        missed = [r for r in rejoin if any(end <= progress for _, end in extents(spec, r))]
    else:
        expected = evaluate(spec, early + [r for r in rejoin if r["ts"] >= progress])
        missed = behind
    assert_rows_equal(rows, expected, spec)
    late = late_rows(engine, q)
    assert sorted(r["ts"] for r in late) == sorted(r["ts"] for r in missed)
    assert engine.stats()["streams"]["A"]["behind"] == len(behind)
