"""Joins of query results, written as Flink SQL users write them (two windowed derived tables
joined ON their window bounds, keys and other result columns), against a nested-loop join of
brute-force window results, under random order, batch splits and punctuation: no predicate on a
result column is lost or misread (a join of query results on window_start once gave no rows)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from lowtide import Engine

pytestmark = pytest.mark.property

Tup = tuple[int, int, int]  # ts, k, v

PREDICATES = {  # the extra ON condition, and the reference's test of (a, b) result rows
    "none": ("", lambda a, b: True),
    "a.n >= b.m": (" AND A.n >= B.m", lambda a, b: a["n"] >= b["m"]),
    "a.s = b.s": (" AND A.s = B.s", lambda a, b: a["s"] == b["s"]),
    "a.s <= b.s": (" AND A.s <= B.s", lambda a, b: a["s"] <= b["s"]),
    "a.n + 1 > b.m": (" AND A.n + 1 > B.m", lambda a, b: a["n"] + 1 > b["m"]),
}


def _windows(ts: int, slide: int, size: int) -> list[int]:
    """Starts s (multiples of slide) of the windows [s, s + size) that hold ts."""
    return [s for s in range((ts - size) // slide * slide, ts + 1, slide) if s <= ts < s + size]


def _results(tuples: list[Tup], slide: int, size: int, agg: str) -> list[dict[str, int]]:
    groups: dict[tuple[int, int], list[int]] = {}
    for ts, k, v in tuples:
        for s in _windows(ts, slide, size):
            groups.setdefault((s, k), []).append(v)
    value = len if agg == "n" else max
    return [{"k": k, agg: value(vs), "s": s, "e": s + size} for (s, k), vs in groups.items()]


def _sql(size_a: int, slide_b: int, size_b: int, join: str, extra: str) -> str:
    a = (
        "SELECT k, count(*) AS n, window_start AS s, window_end AS e "
        f"FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '{size_a}' MILLISECOND)) "
        "GROUP BY k, window_start, window_end"
    )
    b = (
        "SELECT k, max(v) AS m, window_start AS s, window_end AS e "
        f"FROM TABLE(HOP(TABLE S, DESCRIPTOR(ts), INTERVAL '{slide_b}' MILLISECOND, "
        f"INTERVAL '{size_b}' MILLISECOND)) GROUP BY k, window_start, window_end"
    )
    on = "A.k = B.k AND A.e = B.e" if join == "window" else "A.k = B.k AND A.e BETWEEN B.e - 4 AND B.e + 2"
    return f"SELECT A.k, A.n, B.m, A.s, B.e FROM ({a}) A JOIN ({b}) AS B ON {on}{extra}"


@settings(max_examples=examples(150), deadline=None)
@given(
    tuples=st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 2), st.integers(0, 5)), min_size=1, max_size=60
    ),
    shape=st.sampled_from([(4, 2, 4), (4, 2, 6), (6, 3, 6), (2, 2, 4)]),
    join=st.sampled_from(["window", "interval"]),
    predicate=st.sampled_from(sorted(PREDICATES)),
    delay=st.integers(0, 12),
    batch=st.integers(1, 9),
    order=st.randoms(use_true_random=False),
)
def test_a_join_of_query_results_is_its_nested_loop_join(
    tuples: list[Tup],
    shape: tuple[int, int, int],
    join: str,
    predicate: str,
    delay: int,
    batch: int,
    order: Any,
) -> None:
    size_a, slide_b, size_b = shape
    extra, holds = PREDICATES[predicate]
    engine = Engine()
    engine.create_stream("S", {"k": "int64", "v": "int64", "ts": "int64"})
    engine.register_query(_sql(size_a, slide_b, size_b, join, extra), name="j")
    # Arrival: each tuple up to `delay` after its time; punctuation never passes one still to come.
    arrivals = sorted(tuples, key=lambda t: (t[0] + order.randint(0, delay), order.random()))
    rows: list[dict[str, int]] = []
    for at in range(0, len(arrivals), batch):
        chunk = arrivals[at : at + batch]
        engine.push(
            "S",
            pa.table({"ts": [t[0] for t in chunk], "k": [t[1] for t in chunk], "v": [t[2] for t in chunk]}),
        )
        later = arrivals[at + batch :]
        if later:
            engine.punctuate("S", min(t[0] for t in later))
        rows += [r for item in engine.poll("j") if isinstance(item, pa.Table) for r in item.to_pylist()]
    engine.close_source("S")
    rows += [r for item in engine.poll("j") if isinstance(item, pa.Table) for r in item.to_pylist()]
    got = Counter((r["k"], r["n"], r["m"], r["s"], r["e"]) for r in rows)
    a_rows = _results(tuples, size_a, size_a, "n")
    b_rows = _results(tuples, slide_b, size_b, "m")
    if join == "window":
        pairs = [(a, b) for a in a_rows for b in b_rows if a["k"] == b["k"] and a["e"] == b["e"]]
    else:
        pairs = [
            (a, b) for a in a_rows for b in b_rows if a["k"] == b["k"] and b["e"] - 4 <= a["e"] <= b["e"] + 2
        ]
    expected = Counter((a["k"], a["n"], b["m"], a["s"], b["e"]) for a, b in pairs if holds(a, b))
    assert got == expected
