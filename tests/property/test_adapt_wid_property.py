"""AdaptWID Aggregate against the brute-force reference and against WID Aggregate.

Random tuples with skewed groups (one heavy group, a tail of light ones) arrive in any order and
batch split through Bucket; punctuation is honest and placed anywhere (at the edge too). Windows
are tumbling or sliding (RANGE not always a multiple of SLIDE); aggregates include holistic ones;
thresholds are drawn low so that groups go lazy -> eager, eager -> lazy, and back while partials
of a group in transition are still open - or left to Cond. 6.9. Checked: every result equals the
reference; after every punctuation AdaptWID has emitted exactly what WID has; each window row
is emitted once, never before punctuation covers it; output punctuation rises and ends the
stream; and the counters show that the drawn cases do switch both ways.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from harness import Recorder
from hypothesis import event, given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window, assert_rows_equal, evaluate
from strategies import examples

from lowtide.batch import Batch
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.bucket import Bucket
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.operators.windows import Sliding
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.schema import ColumnType

pytestmark = pytest.mark.property

INT, FLOAT = ColumnType("int64"), ColumnType("float64")
TYPES = {"v": INT, "f": FLOAT}
FUNCS = {
    "count*": AggFunc.COUNT_STAR,
    "count": AggFunc.COUNT,
    "sum": AggFunc.SUM,
    "min": AggFunc.MIN,
    "max": AggFunc.MAX,
    "avg": AggFunc.AVG,
    "var": AggFunc.VAR,
    "stddev": AggFunc.STDDEV,
    "median": AggFunc.MEDIAN,
    "quantile": AggFunc.QUANTILE,
    "count_distinct": AggFunc.COUNT_DISTINCT,
    "heavy_hitters": AggFunc.HEAVY_HITTERS,
}
AGGS = [
    Agg("count", "f", ""),
    Agg("sum", "v", ""),
    Agg("sum", "f", ""),
    Agg("min", "v", ""),
    Agg("max", "f", ""),
    Agg("avg", "f", ""),
    Agg("var", "v", ""),
    Agg("stddev", "f", ""),
    Agg("median", "v", ""),
    Agg("quantile", "f", "", 0.25),
    Agg("count_distinct", "v", ""),
    Agg("heavy_hitters", "v", "", 0.3),
]
HAVING = (Agg("count*", None, "n"), ">", 1)
# (high, low): lazy -> eager above high, eager -> lazy below low; None: Cond. 6.9.
THRESHOLDS = [(0.5, 0.0), (0.5, 2.0), (1.0, 1.0), (1.0, 3.0), (2.0, 1.0), (3.0, 2.0), (None, None)]


def call_of(agg: Agg) -> AggregateCall:
    kind = TYPES.get(agg.column) if agg.column else None
    return AggregateCall(FUNCS[agg.func], agg.column, kind, agg.param, agg.name)


@st.composite
def scenario(draw: st.DrawFn) -> dict[str, Any]:
    slide = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["tumbling", "sliding", "sliding"]))
    size = slide if kind == "tumbling" else draw(st.integers(1, 12))
    n = draw(st.integers(0, 60))
    heavy = draw(st.floats(0.0, 0.9))
    rows = []
    for _ in range(n):
        light = draw(st.integers(1, 9))
        rows.append(
            {
                "k": 0 if draw(st.floats(0, 1)) < heavy else light,  # one dense group, a sparse tail
                "v": draw(st.integers(-5, 20)),
                "f": draw(st.one_of(st.none(), st.integers(-40, 80).map(lambda x: x / 4))),
                "ts": draw(st.integers(0, 40)),
            }
        )
    order = draw(st.sampled_from(["sorted", "band", "shuffled"]))
    if order == "shuffled":
        rows = draw(st.permutations(rows))
    else:
        band = draw(st.integers(1, 8)) if order == "band" else 0
        jitter = [draw(st.integers(0, band)) for _ in rows]
        rows = [r for _, r in sorted(zip(jitter, rows, strict=True), key=lambda p: p[1]["ts"] + p[0])]
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=10)))
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    # Honest punctuation after each batch: at most the smallest ts still to come.
    punct, low = [], -1
    for i in range(len(batches)):
        rest = [r["ts"] for b in batches[i + 1 :] for r in b]
        top = min(rest) if rest else 50
        low = draw(st.one_of(st.just(max(low, top)), st.integers(low, max(low, top))))
        punct.append(low)
    aggs = draw(st.lists(st.sampled_from(AGGS), max_size=3))
    named = (Agg("count*", None, "n"), *(Agg(a.func, a.column, f"a{i}", a.param) for i, a in enumerate(aggs)))
    return {
        "spec": Spec(Window("sliding", slide, size), ("k",), named, HAVING if draw(st.booleans()) else None),
        "batches": batches,
        "punct": punct,
        "thresholds": draw(st.sampled_from(THRESHOLDS)),
    }


def build(spec: Spec, adaptive: bool, thresholds: tuple[float | None, float | None]) -> Any:
    window = Sliding(spec.window.range or 0, spec.window.slide, "ts")
    calls = tuple(call_of(a) for a in spec.aggs)
    columns = ("window_start", "window_end", "k", *(a.name for a in spec.aggs), "revision")
    having = (lambda cols: np.asarray(cols["n"]) > 1) if spec.having else None
    agg: Any
    if adaptive:
        high, low = thresholds
        agg = AdaptWIDAggregate(window, ("k",), (INT,), calls, columns, having, high=high, low=low)
    else:
        agg = WIDAggregate(window, ("k",), (INT,), calls, columns, having)
    bucket, sink = Bucket(window), Recorder()
    bucket.connect(agg).connect(sink)
    return bucket, agg, sink, columns


def to_batch(rows: list[dict[str, Any]]) -> Batch:
    columns = {
        "k": np.array([r["k"] for r in rows], np.int64),
        "v": np.array([r["v"] for r in rows], np.int64),
        "f": np.array([math.nan if r["f"] is None else r["f"] for r in rows], np.float64),
        "ts": np.array([r["ts"] for r in rows], np.int64),
    }
    return Batch(columns, len(rows))


def as_rows(sink: Recorder, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for values in sink.rows(*columns):
        row = dict(zip(columns, values, strict=True))
        for name, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                row[name] = None  # the reference's null
        out.append(row)
    return out


def run_both(case: dict[str, Any]) -> tuple[AdaptWIDAggregate, list[dict[str, Any]]]:
    """Feed both operators; check emission step by step; return AdaptWID and all its rows."""
    spec = case["spec"]
    b1, adapt, s1, columns = build(spec, True, case["thresholds"])
    b2, _, s2, _ = build(spec, False, (None, None))
    rows: list[dict[str, Any]] = []
    out_punct: list[int] = []
    bound = None
    steps = [*zip(case["batches"], case["punct"], strict=True), ([], END_OF_STREAM)]
    for batch_rows, p in steps:
        for bucket in (b1, b2):
            if batch_rows:
                bucket.process(to_batch(batch_rows))
            bucket.punctuate(Punctuation(p, "ts"))
        got, want = as_rows(s1, columns), as_rows(s2, columns)
        assert_rows_equal(got, want, spec)  # AdaptWID emits what WID emits, when WID does
        for item in s1.items:
            if isinstance(item, Punctuation):
                assert item.attribute == "window_end"
                out_punct.append(item.value)
                bound = item.value
            else:
                for row in as_rows_of(item, columns):
                    assert row["window_end"] <= p, f"window {row['window_start']} out before punctuation {p}"
                    assert bound is None or row["window_end"] >= bound, "a row below the output punctuation"
                    assert row["revision"] == 0
        rows += got
        s1.clear()
        s2.clear()
    assert all(a < b for a, b in itertools.pairwise(out_punct))
    assert out_punct and out_punct[-1] == END_OF_STREAM
    return adapt, rows


def as_rows_of(batch: Batch, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    sink = Recorder()
    sink.process(batch)
    return as_rows(sink, columns)


@settings(max_examples=examples(250), deadline=None)
@given(case=scenario())
def test_adapt_wid_equals_reference_and_wid(case: dict[str, Any]) -> None:
    adapt, rows = run_both(case)
    spec = case["spec"]
    every = [r for b in case["batches"] for r in b]
    assert_rows_equal(rows, evaluate(spec, every), spec)  # once each: duplicates fail here
    event(f"lazy -> eager: {adapt.to_eager > 0}")
    event(f"eager -> lazy: {adapt.to_lazy > 0}")
    event(f"result of a group in transition: {adapt.combined > 0}")
    # Nothing is left once the stream ended.
    assert adapt.buffer.n == 0 and not adapt._row_of and adapt.eager_groups() == 0


def transitions_case() -> dict[str, Any]:
    """Group 0 dense then sparse then dense again, sliding windows: every kind of switch."""
    rows = []
    for t in range(0, 12):
        rows += [{"k": 0, "v": t, "f": t / 4, "ts": t}] * 3 + [{"k": 1 + t % 4, "v": -t, "f": None, "ts": t}]
    rows += [{"k": 0, "v": 7, "f": 1.5, "ts": t} for t in range(12, 40, 5)]
    rows += [{"k": 0, "v": 1, "f": 0.25, "ts": t} for t in range(40, 46) for _ in range(4)]
    # A batch per time unit, each followed by punctuation at the next time.
    times = sorted({r["ts"] for r in rows})
    batches = [[r for r in rows if r["ts"] == t] for t in times]
    punct = [*times[1:], 50]
    aggs = (Agg("count*", None, "n"), Agg("sum", "v", "a0"), Agg("median", "v", "a1"), Agg("var", "f", "a2"))
    return {
        "spec": Spec(Window("sliding", 2, 6), ("k",), aggs),
        "batches": batches,
        "punct": punct,
        "thresholds": (2.0, 2.0),
    }


def test_groups_switch_both_ways_and_combine_exactly() -> None:
    case = transitions_case()
    adapt, rows = run_both(case)
    assert adapt.to_eager >= 2 and adapt.to_lazy >= 1 and adapt.combined >= 1
    every = [r for b in case["batches"] for r in b]
    assert_rows_equal(rows, evaluate(case["spec"], every), case["spec"])


@pytest.mark.parametrize("holistic", [False, True])
def test_lazy_groups_hold_no_cells_and_sparse_groups_cost_less(holistic: bool) -> None:
    """Many one-tuple groups over a 10-window slide: AdaptWID keeps them lazy, in B only."""
    rng = np.random.default_rng(3)
    n = 20_000
    ts = np.sort(rng.integers(0, 200, n))
    k = np.where(rng.random(n) < 0.1, rng.integers(0, 5, n), 1000 + np.arange(n))
    calls = (AggregateCall(AggFunc.COUNT_STAR, None, None, None, "n"),)
    if holistic:
        calls += (AggregateCall(AggFunc.MEDIAN, "v", INT, None, "m"),)
    columns = ("window_start", "window_end", "k", *(c.output for c in calls), "revision")
    window = Sliding(10, 1, "ts")
    peaks, outputs = [], []
    for operator in (WIDAggregate, AdaptWIDAggregate):
        bucket, agg, sink = Bucket(window), operator(window, ("k",), (INT,), calls, columns), Recorder()
        bucket.connect(agg).connect(sink)
        peak = 0
        for lo in range(0, n, 1000):
            part = slice(lo, lo + 1000)
            bucket.process(Batch({"k": k[part], "v": k[part] % 7, "ts": ts[part]}, ts[part].shape[0]))
            bucket.punctuate(Punctuation(int(ts[min(lo + 1000, n - 1)]), "ts"))
            peak = max(peak, agg.state_bytes())
            if isinstance(agg, AdaptWIDAggregate):
                assert agg.cells.shape[1] <= 64  # columns for the few dense groups only
        bucket.punctuate(Punctuation(END_OF_STREAM, "ts"))
        peaks.append(peak)
        outputs.append(sorted(sink.rows(*columns)))
    assert outputs[0] == outputs[1]
    assert peaks[1] < 0.5 * peaks[0], peaks
