"""Slide-by-tuple Aggregate against a brute force written straight from Eq. 5.13-5.18.

Random tuples (small ``ra`` range, duplicates, 1-3 groups) arrive in random order and batches;
punctuation is honest (never above the smallest ``ra`` still to come). The brute force fixes the
windows from the whole arrival sequence (row-num) or the (ra, arrival) ranks (rank(ra)), then
evaluates every extent. Each window must be emitted exactly once, after punctuation passes it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from harness import Recorder
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.slide_by_tuple import SlideByTupleAggregate
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.schema import ColumnType

pytestmark = pytest.mark.property

INT = ColumnType("int64")
FLOAT = ColumnType("float64")
CALLS = (
    AggregateCall(AggFunc.COUNT_STAR, None, None, None, "count(*)"),
    AggregateCall(AggFunc.SUM, "v", INT, None, "sum(v)"),
    AggregateCall(AggFunc.MAX, "v", INT, None, "max(v)"),
    AggregateCall(AggFunc.MEDIAN, "v", INT, None, "median(v)"),
    AggregateCall(AggFunc.MIN, "x", FLOAT, None, "min(x)"),
    AggregateCall(AggFunc.VAR, "x", FLOAT, None, "var(x)"),
)
NAMES = tuple(call.output for call in CALLS)


def brute(
    tuples: list[tuple[int, int, int, float]], r: int, n: int, by_rank: bool, grouped: bool
) -> dict[Any, Any]:
    """{(w, group): (count, sum, max, median, min(x), var(x))} from the definitions."""
    if by_rank:
        ranked = sorted(range(len(tuples)), key=lambda i: (tuples[i][0], i))
        wins = {tuples[i][0] for k, i in enumerate(ranked, 1) if k % n == 0}
    else:
        wins = {t[0] for k, t in enumerate(tuples, 1) if k % n == 0}
    out: dict[Any, Any] = {}
    for w in wins:
        extent = [t for t in tuples if w - r < t[0] <= w]
        for g in sorted({t[1] if grouped else 0 for t in extent}):
            rows = [t for t in extent if not grouped or t[1] == g]
            v = [t[2] for t in rows]
            x = [t[3] for t in rows if not math.isnan(t[3])]
            var = float(np.var(x, ddof=1)) if len(x) >= 2 else math.nan
            out[(w, g)] = (len(v), sum(v), max(v), float(np.median(v)), min(x) if x else math.nan, var)
    return out


@st.composite
def scenario(draw: st.DrawFn) -> dict[str, Any]:
    size = draw(st.integers(0, 40))
    ras = draw(st.lists(st.integers(0, 30), min_size=size, max_size=size))
    groups = draw(st.integers(1, 3))
    gs = draw(st.lists(st.integers(0, groups - 1), min_size=size, max_size=size))
    vs = draw(st.lists(st.integers(-5, 20), min_size=size, max_size=size))
    xs = draw(st.lists(st.sampled_from([math.nan, -1.5, 0.0, 2.25, 7.0]), min_size=size, max_size=size))
    tuples = list(zip(ras, gs, vs, xs, strict=True))
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=8)))
    return {
        "tuples": tuples,
        "cuts": cuts,
        "r": draw(st.integers(1, 10)),
        "n": draw(st.integers(1, 4)),
        "by_rank": draw(st.booleans()),
        "grouped": draw(st.booleans()),
        "punct": draw(st.lists(st.integers(0, 8), min_size=len(cuts) + 1, max_size=len(cuts) + 1)),
        "end": draw(st.booleans()),
    }


def close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return bool(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))


@settings(max_examples=examples(150), deadline=None)
@given(scenario())
def test_matches_brute_force(sc: dict[str, Any]) -> None:
    tuples, r, n, by_rank, grouped = sc["tuples"], sc["r"], sc["n"], sc["by_rank"], sc["grouped"]
    group_columns = ("g",) if grouped else ()
    columns = ("window_start", "window_end", *group_columns, *NAMES, "revision")
    op = SlideByTupleAggregate(r, "ts", n, by_rank, group_columns, (INT,) * grouped, CALLS, columns)
    sink = Recorder()
    op.connect(sink)
    bounds = [0, *sc["cuts"], len(tuples)]
    last_p = -(10**9)
    sent: list[int] = []
    emitted_under: list[tuple[int, Batch]] = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        part = tuples[a:b]
        if part:
            op.process(
                Batch(
                    {
                        "ts": np.array([t[0] for t in part], np.int64),
                        "g": np.array([t[1] for t in part], np.int64),
                        "v": np.array([t[2] for t in part], np.int64),
                        "x": np.array([t[3] for t in part], np.float64),
                    },
                    len(part),
                )
            )
        assert len(sink.items) == len(emitted_under) + len(sent), "output only at punctuation"
        rest = [t[0] for t in tuples[b:]]
        limit = min(rest) if rest else 40
        p = min(limit, last_p + sc["punct"][i]) if last_p > -(10**9) else min(limit, sc["punct"][i])
        before = len(sink.items)
        op.punctuate(Punctuation(p, "ts"))
        if p > last_p:
            sent.append(p)
            last_p = p
        emitted_under += [(last_p, item) for item in sink.items[before:] if isinstance(item, Batch)]
        op.punctuate(Punctuation(p - 1, "ts"))  # regressing: ignored
        op.punctuate(Punctuation(p + 100, "other"))  # another attribute: ignored
    if sc["end"]:
        before = len(sink.items)
        op.punctuate(Punctuation(END_OF_STREAM, "ts"))
        sent.append(END_OF_STREAM)
        emitted_under += [(END_OF_STREAM, item) for item in sink.items[before:] if isinstance(item, Batch)]
    expected = brute(tuples, r, n, by_rank, grouped)
    if not sc["end"]:
        expected = {key: row for key, row in expected.items() if key[0] < last_p}
    got: dict[Any, Any] = {}
    for p, batch in emitted_under:
        assert list(batch.columns) == list(columns)
        ends = batch["window_end"].tolist()
        assert ends == sorted(ends)  # by window, then group id (first-seen order, as in WID Aggregate)
        for j in range(batch.n):
            w = int(batch["window_end"][j]) - 1
            assert w < p
            assert int(batch["window_start"][j]) == w - r + 1
            assert int(batch["revision"][j]) == 0
            key = (w, int(batch["g"][j]) if grouped else 0)
            assert key not in got, "window emitted twice"
            got[key] = tuple(batch[name][j].item() for name in NAMES)
    assert set(got) == set(expected)
    for key, row in expected.items():
        assert all(close(a, b) for a, b in zip(got[key], row, strict=True)), (key, got[key], row)
    puncts = [item.value for item in sink.items if isinstance(item, Punctuation)]
    assert puncts == sent
    assert all(item.attribute == "window_end" for item in sink.items if isinstance(item, Punctuation))
    if sc["end"]:
        assert op.open_windows() == 0
