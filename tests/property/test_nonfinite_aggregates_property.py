"""Aggregates of float columns holding +inf, -inf and NaN give numpy's answers (docs/choices.md).

The oracle is numpy over each group's values, NaN and null removed (lowtide skips them, as SQL
skips nulls): ``np.sum``, ``np.mean``, ``np.min``/``np.max``, ``np.var``/``np.std`` with ddof 1,
``np.median``, ``np.quantile`` (linear), ``np.unique`` for count_distinct and heavy_hitters. A NaN
answer is null in a result row. Where lowtide deliberately differs: sum, min and max of no value
are null (numpy: 0, an error), and ``quantile`` takes the limit where numpy's own interpolation
makes NaN of an infinity it does not need to (numpy issues #12282, #21091) - as ``np.median``
does, so ``quantile(x, 0.5)`` is ``median(x)``.

Windows of every operator (the statistics show which ran): WID (sliding, tumbling, landmark, row
windows with PA too), Paned-WID (overlapping; combinable aggregates, and holistic ones reading the
slices another query keeps), AdaptWID (overlapping, holistic), Session.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest
from harness import columns, make_engine, max_finite, polled, run
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Row, Spec, Window, assert_rows_equal, evaluate
from strategies import (
    Close,
    Punct,
    Push,
    agg_sql,
    any_window,
    deliveries,
    examples,
    overlapping_windows,
    rows,
    session_windows,
    specs,
    sql_of,
    stream_sources,
)

pytestmark = pytest.mark.property

F64 = npt.NDArray[np.float64]
inf, nan = math.inf, math.nan

# Few distinct values, so that windows are often all-infinite, single-valued or tied.
nonfinite = st.one_of(
    st.sampled_from([inf, -inf, nan, None, 0.0, -0.0]), st.integers(-8, 8).map(lambda k: k / 4)
)
FLOAT_AGGREGATES = [
    Agg("count", "f", ""),
    Agg("sum", "f", ""),
    Agg("avg", "f", ""),
    Agg("min", "f", ""),
    Agg("max", "f", ""),
    Agg("var", "f", ""),
    Agg("stddev", "f", ""),
    Agg("median", "f", ""),
    *(Agg("quantile", "f", "", q) for q in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)),
    Agg("count_distinct", "f", ""),
    Agg("heavy_hitters", "f", "", 0.25),
]
HOLISTIC_AGGREGATES = [a for a in FLOAT_AGGREGATES if a.func in ("median", "quantile", "count_distinct")]
COMBINABLE_AGGREGATES = FLOAT_AGGREGATES[:7]
# Combinable ones alone half the time: overlapping windows then run Paned-WID, not AdaptWID.
float_aggregates = st.lists(st.sampled_from(FLOAT_AGGREGATES), min_size=1, max_size=5) | st.lists(
    st.sampled_from(COMBINABLE_AGGREGATES), min_size=1, max_size=4
)


def numpy_quantile(x: F64, q: float) -> float:
    """``np.quantile(x, q)`` (linear: ``h = q (n - 1)``, between the order statistics at
    ``floor(h)`` and the next, weighted by the fraction of ``h``). Where an infinite one weighs
    in, numpy's arithmetic (``inf - inf``, ``0 * inf``) gives NaN even when the limit exists:
    the answer is then that infinity, NaN only when both signs weigh in, as ``np.median``."""
    s = np.sort(x)
    h = q * (s.size - 1)
    lo = math.floor(h)
    if h == lo:
        return float(s[lo])  # the order statistic itself; the next one has no weight
    a, b = float(s[lo]), float(s[lo + 1])
    if math.isfinite(a) and math.isfinite(b):
        return float(np.quantile(x, q))
    signs = {math.copysign(1.0, v) for v in (a, b) if math.isinf(v)}
    return nan if len(signs) == 2 else inf * signs.pop()


def heavy_hitters(x: F64, phi: float) -> list[float]:
    values, counts = np.unique(x, return_counts=True)
    keep = counts >= phi * x.size
    values, counts = values[keep], counts[keep]
    return [float(v) for v in values[np.lexsort((values, -counts))]]


def numpy_value(agg: Agg, tuples: Sequence[Row]) -> Any:
    """``agg`` over ``tuples`` by numpy alone; NaN answers as None (null)."""
    if agg.func == "count*":
        return len(tuples)
    assert agg.column == "f"
    raw = np.array([nan if t["f"] is None else t["f"] for t in tuples], np.float64)
    x = raw[~np.isnan(raw)]  # NaN is the null of a float column: skipped
    if x.size == 0 and agg.func in ("sum", "min", "max"):
        return None  # SQL: no value, no sum (numpy: 0.0 and an error)
    with np.errstate(all="ignore"):  # inf - inf and friends are answers here, not accidents
        value: Any = {
            "count": lambda: x.size,
            "sum": lambda: np.sum(x),
            "avg": lambda: np.mean(x) if x.size else nan,
            "min": lambda: np.min(x),
            "max": lambda: np.max(x),
            "var": lambda: np.var(x, ddof=1) if x.size > 1 else nan,
            "stddev": lambda: np.std(x, ddof=1) if x.size > 1 else nan,
            "median": lambda: np.median(x) if x.size else nan,
            "quantile": lambda: numpy_quantile(x, float(agg.param or 0.0)) if x.size else nan,
            "count_distinct": lambda: np.unique(x).size,
            "heavy_hitters": lambda: heavy_hitters(x, float(agg.param or 0.0)),
        }[agg.func]()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return None if math.isnan(value) else float(value)
    return value


def operator_of(plan: str) -> str:
    """The aggregate operator of a plan (Engine.plan_of), as it names it (WID, Paned-WID, ...)."""
    lines = plan.splitlines()
    return next(line.split(". ", 1)[1].split(" Aggregate")[0] for line in lines if " Aggregate" in line)


@st.composite
def float_rows(draw: Any, n: int) -> list[Row]:
    return [{**draw(rows()), "f": draw(nonfinite)} for _ in range(n)]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a NaN made on purpose warns nobody
@settings(max_examples=examples(300), deadline=None)
@given(
    spec=specs(
        st.one_of(any_window, overlapping_windows, session_windows), aggs=float_aggregates, having=False
    ),
    sources=stream_sources(1),
    data=st.data(),
)
def test_float_aggregates_follow_numpy(spec: Spec, sources: Any, data: Any) -> None:
    tuples = data.draw(st.integers(0, 25).flatmap(float_rows), label="tuples")
    events = data.draw(deliveries({"A": tuples}, sources), label="events")
    obs = run(spec, sql_of(spec, ["A"]), sources, events, partition=spec.window.partition)
    tally(f"{operator_of(obs.plan)} over {spec.window.kind} windows")
    assert all(row["ts"] >= p for row, p in obs.arrivals)  # honest punctuation: every tuple counts
    arrived = [row for row, _ in obs.arrivals]
    expected = evaluate(spec, arrived, progress=max_finite(obs.progress), aggregate_of=numpy_value)
    assert_rows_equal(obs.rows, expected, spec)


@settings(max_examples=examples(100), deadline=None)
@given(
    window=overlapping_windows,
    group_by=st.sampled_from([(), ("k1",), ("k2", "k1")]),
    aggs=st.lists(st.sampled_from(HOLISTIC_AGGREGATES), min_size=1, max_size=3),
    data=st.data(),
)
def test_holistic_aggregates_over_shared_slices_follow_numpy(
    window: Window, group_by: tuple[str, ...], aggs: list[Agg], data: Any
) -> None:
    """A holistic query reading the slices a count(*) query keeps: Paned-WID merges the slices'
    value logs (alone it would run AdaptWID)."""
    tuples = data.draw(st.integers(0, 30).flatmap(float_rows), label="tuples")
    events = data.draw(deliveries({"A": tuples}, {"A": ("a0",)}), label="events")
    spec = Spec(window, group_by, tuple(Agg(a.func, a.column, f"a{i}", a.param) for i, a in enumerate(aggs)))
    engine = make_engine({"A": ("a0",)})
    engine.register_query(sql_of(Spec(window, group_by, (Agg("count*", None, "n"),)), ["A"]), name="keeper")
    engine.register_query(sql_of(spec, ["A"]), name="q")
    reader = engine.runner.plan("q").reader
    assert reader is not None and reader.summaries == ("f",)
    got: list[Row] = []
    for event in events:
        if isinstance(event, Push):
            engine.push("A", columns(event.rows), source=event.source)
        elif isinstance(event, Punct):
            engine.punctuate("A", event.value, source=event.source)
        elif isinstance(event, Close):
            engine.close_source("A", event.source)
        got += polled(engine, "q")[0]
    assert_rows_equal(got, evaluate(spec, tuples, aggregate_of=numpy_value), spec)


def _agg(func: str, param: float | None = None) -> Agg:
    return Agg(func, "f", "x", param)


@pytest.mark.parametrize(
    ("agg", "values", "want"),
    [
        # issue 30 item 8: each was null
        (_agg("median"), [1.0, 2.0, inf], 2.0),
        (_agg("quantile", 1.0), [1.0, 2.0, 3.0, inf], inf),
        (_agg("median"), [inf], inf),
        # the middle pair averaged, as np.median does
        (_agg("median"), [1.0, inf], inf),
        (_agg("median"), [-inf, 1.0, 2.0, 3.0], 1.5),
        (_agg("median"), [-inf, inf], None),
        (_agg("quantile", 0.5), [inf, inf], inf),
        (_agg("quantile", 0.0), [-inf, -inf, 4.0], -inf),
        (_agg("quantile", 0.25), [-inf, 1.0, 2.0], -inf),
        (_agg("quantile", 0.75), [1.0, 2.0, 3.0, inf], inf),
        (_agg("quantile", 0.25), [1.0, 2.0, 3.0, inf], 1.75),
        (_agg("median"), [nan, 2.0, None, inf, nan, 1.0], 2.0),  # NaN is null: skipped
        (_agg("count_distinct"), [inf, -inf, inf, nan, 0.0, -0.0], 3),
        (_agg("heavy_hitters", 0.5), [inf, 1.0, inf, nan], [inf]),
        (_agg("sum"), [inf, 1.0, -inf], None),
        (_agg("avg"), [inf, 1.0], inf),
        (_agg("min"), [inf, inf], inf),
        (_agg("var"), [inf, 1.0], None),
    ],
)
def test_infinities_in_one_window(agg: Agg, values: list[float | None], want: Any) -> None:
    engine = make_engine({"A": ("s",)})
    q = engine.register_query(f"SELECT {agg_sql(agg)} AS x [RANGE TUMBLING 10, WA ts] FROM A", name="q")
    tuples = [{"k1": "a", "k2": 0, "v": 0, "f": f, "b": True, "ts": 1} for f in values]
    engine.push("A", columns(tuples), source="s")
    engine.close_source("A", "s")
    tables = [t for t in engine.poll(q) if isinstance(t, pa.Table)]
    assert [row["x"] for t in tables for row in t.to_pylist()] == [want]
    assert numpy_value(agg, tuples) == want  # the oracle of the properties agrees
