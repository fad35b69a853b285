"""The fused kernel (Select + Bucket + WID Aggregate in one loop) filters exactly like a WHERE.

A query with a WHERE, run fused, must emit after every call what the same query without the
WHERE emits when it is sent only the tuples the WHERE keeps (that query is checked against the
brute-force reference in test_windows_property). Arrival order, batch split, punctuation
placement and far-apart timestamps (the kernel's unfused path) are drawn.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import columns, polled
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window, assert_rows_equal
from strategies import SCHEMA, Close, Punct, Push, deliveries, examples, sql_of, stream_sources, tuples

from lowtide import Engine

pytestmark = pytest.mark.property

windows = st.one_of(
    st.integers(1, 6).map(lambda r: Window("sliding", r, r)),
    st.builds(lambda s, k: Window("sliding", s, s * k), st.integers(1, 4), st.integers(2, 3)),
)
aggregates = st.lists(
    st.sampled_from([Agg("count*", None, ""), Agg("count", "v", ""), Agg("sum", "v", "")]), min_size=1
)


@settings(max_examples=examples(150), deadline=None)
@given(
    window=windows,
    group_by=st.sampled_from([("k2",), ("k1",)]),
    aggs=aggregates,
    threshold=st.integers(-5, 25),
    spread=st.sampled_from([1, 1, 1000]),
    sources=stream_sources(1),
    data=st.data(),
)
def test_fused_where_equals_filtering_before(
    window: Window, group_by: Any, aggs: Any, threshold: int, spread: int, sources: Any, data: Any
) -> None:
    spec = Spec(window, group_by, tuple(Agg(a.func, a.column, f"a{i}") for i, a in enumerate(aggs)))
    rows = [{**r, "ts": r["ts"] * spread} for r in data.draw(tuples(max_size=40), label="tuples")]
    events = data.draw(deliveries({"A": rows}, sources), label="events")
    plain = sql_of(spec, ["A"])
    where = f"WHERE v > {threshold} AND k2 != 3"
    filtered = plain.replace(" GROUP BY", f" {where} GROUP BY")
    fused, reference = Engine(), Engine()
    for engine in (fused, reference):
        engine.create_stream("A", SCHEMA, progressing="ts", sources=list(sources["A"]))
    assert "Fused Select + Bucket" in fused.explain(filtered)
    fused.register_query(filtered, name="q")
    reference.register_query(plain, name="q")
    for event in events:
        if isinstance(event, Push):
            fused.push("A", columns(event.rows), source=event.source)
            kept = [r for r in event.rows if r["v"] is not None and r["v"] > threshold and r["k2"] != 3]
            reference.push("A", columns(kept), source=event.source)
        elif isinstance(event, Punct):
            for engine in (fused, reference):
                engine.punctuate("A", event.value, source=event.source)
        elif isinstance(event, Close):
            for engine in (fused, reference):
                engine.close_source("A", event.source)
        got, got_punctuation = polled(fused, "q")
        want, want_punctuation = polled(reference, "q")
        assert got_punctuation == want_punctuation
        assert_rows_equal(got, want, spec)
    tally(f"spread {spread}")
