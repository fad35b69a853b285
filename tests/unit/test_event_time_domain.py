"""The domain of a progressing attribute (issue 21, item 3): tuples carry values in
``[-2^62, 2^62)`` and sources punctuate within ``[-2^62, 2^62]``; the door refuses anything
else with a one-line reason, every window at the domain's edges is counted as the reference
counts it, and no output punctuation reaches the end-of-stream value before every source closed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import Agg, Spec, Window, assert_rows_equal, evaluate

from lowtide import END_OF_STREAM, Engine, InvalidArgument, Punctuation, SchemaMismatch, UnsupportedQuery
from lowtide.punctuation.model import MAX_DERIVED_DEPTH, MAX_EXTENT, TIME_END, TIME_MIN

SCHEMA = {"k": "int64", "v": "int64", "ts": "int64"}
DOMAIN = "[-2^62, 2^62)"
COUNT = "SELECT k, count(*) AS n, sum(v) AS s {window} FROM S GROUP BY k"
AGGS = (Agg("count*", None, "n"), Agg("sum", "v", "s"))


def rows_of(ts: list[int]) -> dict[str, Any]:
    return {"k": [i % 2 for i in range(len(ts))], "v": list(range(1, len(ts) + 1)), "ts": ts}


def tuples_of(ts: list[int]) -> list[dict[str, Any]]:
    columns = rows_of(ts)
    return [{name: values[i] for name, values in columns.items()} for i in range(len(ts))]


def split(items: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    rows = [r for item in items if isinstance(item, pa.Table) for r in item.to_pylist()]
    return rows, [item.value for item in items if isinstance(item, Punctuation)]


# -- the door ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-(2**63), -(2**62) - 1, 2**62, 2**63 - 7, 2**63 - 1])
def test_a_value_outside_the_domain_is_refused_whole_and_nothing_changes(bad: int) -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=["a"])
    q = engine.register_query(COUNT.format(window="[RANGE 10, WA ts]"), name="q")
    engine.push("S", rows_of([1, 2, 13]), source="a")
    with pytest.raises(SchemaMismatch) as refused:
        engine.push("S", rows_of([5, bad, 7]), source="a")
    reason = str(refused.value)
    assert "\n" not in reason and "'ts'" in reason and str(bad) in reason and "row 1" in reason, reason
    assert DOMAIN in reason, reason
    assert engine.stats()["streams"]["S"]["ingested"] == 3
    engine.close_source("S", "a")
    rows, _ = split(engine.poll(q))
    assert sorted((r["window_start"], r["k"], r["n"]) for r in rows) == [(0, 0, 1), (0, 1, 1), (10, 0, 1)]


@pytest.mark.parametrize(
    ("unit", "value", "accepted"),
    [
        ("ns", 2**62 - 1, True),
        ("ns", 2**62, False),
        ("ns", -(2**62) - 1, False),
        ("ms", 2**63 - 7, False),
        ("s", -(2**62), True),
    ],
)
def test_timestamp_columns_have_the_same_domain_in_their_unit(unit: str, value: int, accepted: bool) -> None:
    engine = Engine()
    engine.create_stream("S", {"ts": f"timestamp[{unit}]"})
    data = {"ts": pa.array([value], pa.timestamp(unit))}
    if accepted:
        engine.push("S", data)
    else:
        with pytest.raises(SchemaMismatch, match=r"column 'ts' has .* outside the domain"):
            engine.push("S", data)
    assert engine.stats()["streams"]["S"]["ingested"] == int(accepted)


@pytest.mark.parametrize("bad", [2**63 - 2, 2**63 - 1, 2**62 + 1, -(2**62) - 1, -(2**63)])
def test_a_punctuation_outside_the_domain_is_refused(bad: int) -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=["a"])
    with pytest.raises(InvalidArgument) as refused:
        engine.punctuate("S", bad, source="a")
    reason = str(refused.value)
    assert "\n" not in reason and str(bad) in reason and "[-2^62, 2^62]" in reason, reason
    assert "close the source" in reason, reason
    assert engine.low_watermark("S") == -(2**63)
    engine.punctuate("S", TIME_MIN, source="a")
    engine.punctuate("S", TIME_END, source="a")  # the top of the domain: every value is behind it
    assert engine.low_watermark("S") == TIME_END


def test_generated_punctuation_stays_within_the_domain() -> None:
    """A bounded slack (or a heartbeat's skew) may take the generated value past an end: it is
    held at the end, which promises the same."""
    engine = Engine()
    engine.create_stream("S", SCHEMA, punctuation="bounded:-4611686018427387904")  # slack -2^62
    engine.push("S", rows_of([TIME_END - 1]))
    assert engine.low_watermark("S") == TIME_END


# -- durations and depth ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "window",
    [
        f"[RANGE {MAX_EXTENT + 1}, WA ts]",
        f"[RANGE 10, SLIDE {MAX_EXTENT + 1}, WA ts]",
        f"[RANGE ALL, SLIDE {MAX_EXTENT + 1}, WA ts]",
        f"[SESSION {MAX_EXTENT + 1}, WA ts]",
    ],
)
def test_a_window_longer_than_the_maximum_extent_is_refused(window: str) -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    with pytest.raises(UnsupportedQuery, match=r"up to 2\^58"):
        engine.register_query(COUNT.format(window=window))
    engine.register_query(COUNT.format(window=f"[RANGE {MAX_EXTENT}, WA ts]"))


def test_a_join_range_or_lateness_longer_than_the_maximum_extent_is_refused() -> None:
    engine = Engine()
    for name in ("S", "A", "B"):
        engine.create_stream(name, SCHEMA)
    with pytest.raises(UnsupportedQuery, match=r"up to 2\^58"):
        engine.register_query(
            f"SELECT A.v AS a, B.v AS b FROM A [RANGE {MAX_EXTENT + 1}, WA ts], B [RANGE 1, WA ts] "
            "WHERE A.k = B.k"
        )
    with pytest.raises(UnsupportedQuery, match=r"allowed lateness .* up to 2\^58"):
        engine.register_query(
            COUNT.format(window="[RANGE 10, WA ts]"), late="update", allowed_lateness=MAX_EXTENT + 1
        )


def test_queries_read_query_results_at_most_max_depth_levels_deep() -> None:
    """Each level's window_end may pass its input's values by a window: the depth is bounded."""
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    source = "S"
    for level in range(MAX_DERIVED_DEPTH + 1):
        attribute = "ts" if level == 0 else "window_end"
        sql = f"SELECT count(*) AS n [RANGE {MAX_EXTENT}, WA {attribute}] FROM {source}"
        engine.register_query(sql, name=f"q{level}")
        source = f"q{level}"
    with pytest.raises(UnsupportedQuery, match=rf"9 levels deep, at most {MAX_DERIVED_DEPTH}"):
        engine.register_query(f"SELECT count(*) AS n [RANGE 1, WA window_end] FROM {source}", name="deep")


# -- windows at the edges of the domain -------------------------------------------------------------
LOW = [TIME_MIN, TIME_MIN + 1, TIME_MIN + 9, TIME_MIN + 10, TIME_MIN + 25, TIME_MIN + 3]
HIGH = [TIME_END - 1, TIME_END - 2, TIME_END - 10, TIME_END - 11, TIME_END - 30, TIME_END - 1]
BOTH = LOW + HIGH  # only with windows long enough that the reference walks few of them
BIG = MAX_EXTENT

EDGE_CASES = [
    ("[RANGE 10, WA ts]", Window("sliding", 10, 10), LOW),
    ("[RANGE 10, WA ts]", Window("sliding", 10, 10), HIGH),
    ("[RANGE 10, SLIDE 3, WA ts]", Window("sliding", 3, 10), LOW),  # WID
    ("[RANGE 10, SLIDE 3, WA ts]", Window("sliding", 3, 10), HIGH),
    ("[RANGE 12, SLIDE 3, WA ts]", Window("sliding", 3, 12), HIGH),  # Paned-WID
    (f"[RANGE {BIG}, SLIDE {BIG // 4}, WA ts]", Window("sliding", BIG // 4, BIG), BOTH),
    (f"[RANGE {BIG}, WA ts]", Window("sliding", BIG, BIG), BOTH),
    ("[RANGE ALL, SLIDE 7, WA ts]", Window("landmark", 7), LOW),  # punctuated to TIME_MIN + 40 only
    ("[RANGE ALL, SLIDE 7, WA ts]", Window("landmark", 7), HIGH),
    (f"[RANGE ALL, SLIDE {BIG}, WA ts]", Window("landmark", BIG), BOTH),
    ("[SESSION 5, WA ts]", Window("session", 0, gap=5), BOTH),
    (f"[SESSION {BIG}, WA ts]", Window("session", 0, gap=BIG), BOTH),
]


def run_to_the_top(
    sql: str, ts: list[int], top: int = TIME_END, **options: Any
) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """Push ``ts`` from source a, punctuate both sources up to ``top`` (the top of the domain:
    everything is behind it) while b stays open, then close both: (result rows, output
    punctuation while b was open, after it closed)."""
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=["a", "b"])
    q = engine.register_query(sql, name="q", **options)
    engine.push("S", rows_of(ts), source="a")
    engine.punctuate("S", top, source="a")
    engine.punctuate("S", top - 1, source="b")
    open_rows, open_punctuation = split(engine.poll(q))
    engine.punctuate("S", top, source="b")
    rows, more = split(engine.poll(q))
    engine.close_source("S", "a")
    engine.close_source("S", "b")
    last_rows, closed = split(engine.poll(q))
    return open_rows + rows + last_rows, open_punctuation + more, closed


@pytest.mark.parametrize(("window", "spec_window", "ts"), EDGE_CASES)
def test_edge_values_count_in_their_windows(window: str, spec_window: Window, ts: list[int]) -> None:
    # A landmark emits every slide up to punctuation: a short slide is punctuated near its values.
    top = TIME_MIN + 40 if spec_window.kind == "landmark" and ts is LOW else TIME_END
    rows, while_open, at_close = run_to_the_top(COUNT.format(window=window), ts, top)
    spec = Spec(spec_window, group_by=("k",), aggs=AGGS)
    assert_rows_equal(rows, evaluate(spec, tuples_of(ts), progress=top), spec)
    assert while_open and max(while_open) < END_OF_STREAM, while_open
    assert at_close == [END_OF_STREAM]


@pytest.mark.parametrize(
    ("sql", "options"),
    [
        (COUNT.format(window="[RANGE 10, SLIDE 3, WA ts]"), {"late": "update", "allowed_lateness": BIG}),
        (COUNT.format(window="[SESSION 5, WA ts]"), {"late": "update", "allowed_lateness": BIG}),
        ("SELECT k, median(v) AS m [RANGE 10, SLIDE 3, WA ts] FROM S GROUP BY k", {}),  # AdaptWID
        (COUNT.format(window="[RANGE 10, SLIDE 2, WA ts]").replace("GROUP BY", "WHERE v > 0 GROUP BY"), {}),
    ],
)
def test_no_output_punctuation_reaches_the_end_while_a_source_is_open(sql: str, options: Any) -> None:
    rows, while_open, at_close = run_to_the_top(sql, HIGH, **options)
    assert while_open and max(while_open) < END_OF_STREAM, while_open
    assert at_close == [END_OF_STREAM]
    assert rows


def test_a_join_at_the_edges_meets_what_the_band_says() -> None:
    engine = Engine()
    for name in ("A", "B"):
        engine.create_stream(name, SCHEMA, sources=["a", "b"])
    q = engine.register_query(
        f"SELECT A.v AS x, B.v AS y, A.ts AS ta, B.ts AS tb FROM A [RANGE 5, WA ts], B [RANGE {BIG}, WA ts] "
        "WHERE A.k = B.k",
        name="q",
    )
    left, right = BOTH, [t + d for t in BOTH for d in (-3, 0, 4) if TIME_MIN <= t + d < TIME_END]
    engine.push("A", rows_of(left), source="a")
    engine.push("B", rows_of(right), source="a")
    for name in ("A", "B"):
        engine.punctuate(name, TIME_END, source="a")
        engine.punctuate(name, TIME_END, source="b")
    rows, while_open = split(engine.poll(q))
    for name in ("A", "B"):
        engine.close_source(name, "a")
        engine.close_source(name, "b")
    more, at_close = split(engine.poll(q))
    assert while_open and max(while_open) < END_OF_STREAM, while_open
    assert at_close and at_close[-1] == END_OF_STREAM
    a, b = rows_of(left), rows_of(right)
    want = sorted(
        (a["v"][i], b["v"][j])
        for i, s in enumerate(left)
        for j, t in enumerate(right)
        if a["k"][i] == b["k"][j] and s - BIG <= t <= s + 5
    )
    assert sorted((r["x"], r["y"]) for r in rows + more) == want


@given(
    ts=st.lists(st.integers(TIME_MIN, TIME_END - 1), min_size=1, max_size=12),
    pane=st.integers(BIG // 64, BIG // 8),
    panes=st.tuples(st.integers(1, 8), st.integers(1, 8)),
)
def test_extreme_values_with_long_windows_against_the_reference(
    ts: list[int], pane: int, panes: tuple[int, int]
) -> None:
    """Any values of the domain, windows up to the longest: counted as the reference counts them.
    (RANGE and SLIDE share a long pane: the reference walks every window of the domain.)"""
    range_, slide = pane * panes[0], pane * panes[1]
    rows, while_open, at_close = run_to_the_top(
        COUNT.format(window=f"[RANGE {range_}, SLIDE {slide}, WA ts]"), ts
    )
    spec = Spec(Window("sliding", slide, range_), group_by=("k",), aggs=AGGS)
    assert_rows_equal(rows, evaluate(spec, tuples_of(ts)), spec)
    assert all(p < END_OF_STREAM for p in while_open) and at_close == [END_OF_STREAM]


def test_numpy_values_at_the_edges_pass_the_door() -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    engine.push(
        "S", {"k": np.zeros(2, np.int64), "v": np.ones(2, np.int64), "ts": np.array([TIME_MIN, TIME_END - 1])}
    )
    assert engine.stats()["streams"]["S"]["ingested"] == 2
