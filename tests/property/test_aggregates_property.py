"""Every aggregate against the reference, in every kind of window, with GROUP BY and HAVING.

count(*), count(x), sum, min, max, avg, var, stddev (sample), median, quantile (linear),
count_distinct (exact) and heavy_hitters (most frequent first, then by value), over int, float
(with nulls) and string columns; floats compared with a relative tolerance of 1e-9.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from harness import check_query, columns, make_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window
from strategies import AGGREGATES, any_window, examples, specs, stream_sources

pytestmark = pytest.mark.property

ALL = st.just(AGGREGATES)
VAR_STDDEV = st.just([Agg("var", "f", ""), Agg("stddev", "v", ""), Agg("min", "f", ""), Agg("max", "v", "")])


@settings(max_examples=examples(300), deadline=None)
@given(spec=specs(any_window, aggs=ALL), sources=stream_sources(1), data=st.data())
def test_all_aggregates_equal_reference(spec: Spec, sources: Any, data: Any) -> None:
    check_query(spec, sources, data)


@settings(max_examples=examples(100), deadline=None)
@given(spec=specs(any_window, aggs=VAR_STDDEV, having=False), sources=stream_sources(2), data=st.data())
def test_moments_and_extremes_over_a_union(spec: Spec, sources: Any, data: Any) -> None:
    check_query(spec, sources, data)


@settings(max_examples=examples(100), deadline=None)
@given(
    spec=specs(
        st.just(Window("sliding", 4, 8)), aggs=st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3)
    ),
    data=st.data(),
)
def test_having_filters_rows(spec: Spec, data: Any) -> None:
    check_query(
        Spec(spec.window, spec.group_by, spec.aggs, (Agg("count*", None, "_h"), ">", 2)), {"A": ("a0",)}, data
    )


def test_result_columns_are_named_by_expression_text_and_typed() -> None:
    engine = make_engine({"A": ("s",)})
    texts = [
        "count(*)",
        "count(f)",
        "sum(v)",
        "sum(f)",
        "min(v)",
        "max(f)",
        "avg(v)",
        "var(v)",
        "stddev(f)",
        "median(v)",
        "quantile(f, 0.9)",
        "count_distinct(k1)",
        "heavy_hitters(k1, 0.5)",
        "heavy_hitters(v, 0.5)",
    ]
    q = engine.register_query(
        f"SELECT k1, k2, {', '.join(texts)} [RANGE 10, SLIDE 5, WA ts] FROM A GROUP BY k1, k2"
    )
    rows = [{"k1": "x", "k2": 1, "v": v, "f": None, "b": True, "ts": t} for v, t in ((3, 1), (4, 2), (3, 7))]
    engine.push("A", columns(rows), source="s")
    engine.close_source("A", "s")
    tables = [t for t in engine.poll(q) if isinstance(t, pa.Table)]
    schema = tables[0].schema
    types = {
        "window_start": pa.int64(),
        "window_end": pa.int64(),
        "k1": pa.string(),
        "k2": pa.int32(),
        "count(*)": pa.int64(),
        "count(f)": pa.int64(),
        "sum(v)": pa.int64(),
        "sum(f)": pa.float64(),
        "min(v)": pa.int32(),
        "max(f)": pa.float64(),
        "avg(v)": pa.float64(),
        "var(v)": pa.float64(),
        "stddev(f)": pa.float64(),
        "median(v)": pa.float64(),
        "quantile(f, 0.9)": pa.float64(),
        "count_distinct(k1)": pa.int64(),
        "heavy_hitters(k1, 0.5)": pa.list_(pa.string()),
        "heavy_hitters(v, 0.5)": pa.list_(pa.int32()),
        "revision": pa.int64(),
    }
    assert schema.names == list(types)
    assert [schema.field(n).type for n in types] == list(types.values())
    first = pa.concat_tables(tables).to_pylist()[1]  # window [0, 10): v = 3, 4, 3; f all null
    assert first["window_start"] == 0 and first["count(*)"] == 3 and first["count(f)"] == 0
    assert first["sum(f)"] is None and first["max(f)"] is None and first["stddev(f)"] is None
    assert (
        math.isclose(first["var(v)"], 1 / 3, rel_tol=1e-9)
        and first["median(v)"] == 3.0
        and first["heavy_hitters(v, 0.5)"] == [3]
    )
