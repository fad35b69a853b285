"""Tuples far apart in event time in one batch: every window kind counts them as the reference
does, with state that follows the number of windows, not the distance between them.

A batch holding both ends of the domain used to make the aggregates allocate an array over every
window id between its tuples (exabytes: the query failed with MemoryError); ids billions apart
are now addressed by rank (``operators/window_ids.py: window_rows``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from reference import Agg, Spec, Window, assert_rows_equal, evaluate

from lowtide import Engine
from lowtide.punctuation.model import TIME_END, TIME_MIN

SCHEMA = {"k": "int64", "v": "int64", "ts": "int64"}
# Three clusters, each a few windows wide, 2^62 apart; a fourth 10^9 after the second.
TS = [
    *(TIME_MIN + d for d in (0, 1, 9, 10, 25, 3)),
    *(d for d in (-7, 0, 4, 11, 11, 30)),
    *(10**9 + d for d in (2, 5, 17)),
    *(TIME_END - d for d in (1, 2, 10, 11, 30, 1)),
]
COUNT = Agg("count*", None, "n")
SUM = Agg("sum", "v", "s")
MEDIAN = Agg("median", "v", "m")

CASES = [
    ("[RANGE 10, WA ts]", Window("sliding", 10, 10), (COUNT, SUM), {}),  # tumbling WID
    ("[RANGE 10, SLIDE 3, WA ts]", Window("sliding", 3, 10), (COUNT, SUM), {}),  # WID
    ("[RANGE 12, SLIDE 3, WA ts]", Window("sliding", 3, 12), (COUNT, SUM), {}),  # Paned-WID
    ("[RANGE 12, SLIDE 3, WA ts]", Window("sliding", 3, 12), (COUNT, MEDIAN), {}),  # holistic
    ("[RANGE 10, SLIDE 3, WA ts]", Window("sliding", 3, 10), (MEDIAN,), {}),  # AdaptWID
    ("[RANGE 10, SLIDE 3, WA ts]", Window("sliding", 3, 10), (COUNT, SUM), {"late": "update"}),
    ("[SESSION 5, WA ts]", Window("session", 0, gap=5), (COUNT, SUM), {}),
]


def sql_of(window: str, aggs: tuple[Agg, ...]) -> str:
    items = ", ".join(
        f"{'count(*)' if a.func == 'count*' else f'{a.func}({a.column})'} AS {a.name}" for a in aggs
    )
    return f"SELECT k, {items} {window} FROM S GROUP BY k"


def table(ts: list[int]) -> dict[str, Any]:
    return {"k": [i % 3 for i in range(len(ts))], "v": [i * 7 % 11 for i in range(len(ts))], "ts": ts}


def rows(items: list[Any]) -> list[dict[str, Any]]:
    return [r for item in items if isinstance(item, pa.Table) for r in item.to_pylist()]


@pytest.mark.parametrize(("window", "spec_window", "aggs", "options"), CASES)
def test_one_batch_from_end_to_end_of_the_domain(
    window: str, spec_window: Window, aggs: tuple[Agg, ...], options: dict[str, Any]
) -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=["a"])
    q = engine.register_query(sql_of(window, aggs), name="q", **options)
    engine.push("S", table(TS), source="a")
    engine.punctuate("S", 0, source="a")  # the first cluster's windows complete on their own
    engine.close_source("S", "a")
    data = table(TS)
    tuples = [{name: values[i] for name, values in data.items()} for i in range(len(TS))]
    spec = Spec(spec_window, group_by=("k",), aggs=aggs)
    assert_rows_equal(rows(engine.poll(q)), evaluate(spec, tuples), spec)


def test_slices_shared_by_queries_far_apart() -> None:
    """Two sliding queries sharing slices (one stream, one slide), fed one far-apart batch."""
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=["a"])
    windows = {"short": ("[RANGE 6, SLIDE 3, WA ts]", 6), "long": ("[RANGE 12, SLIDE 3, WA ts]", 12)}
    for name, (window, _) in windows.items():
        engine.register_query(sql_of(window, (COUNT, SUM)), name=name)
    engine.push("S", table(TS), source="a")
    engine.close_source("S", "a")
    data = table(TS)
    tuples = [{name: values[i] for name, values in data.items()} for i in range(len(TS))]
    for name, (_, range_) in windows.items():
        spec = Spec(Window("sliding", 3, range_), group_by=("k",), aggs=(COUNT, SUM))
        assert_rows_equal(rows(engine.poll(name)), evaluate(spec, tuples), spec)


def test_adapt_wid_far_apart_across_batches() -> None:
    """AdaptWID (median) buffers tuples across batches: its windows far apart too."""
    engine = Engine()
    engine.create_stream("S", SCHEMA, sources=["a"])
    q = engine.register_query(sql_of("[RANGE 10, SLIDE 3, WA ts]", (MEDIAN,)), name="q")
    batches = [TS[:6], TS[6:15], TS[15:]]
    for part in batches:
        engine.push("S", table(part), source="a")
    engine.close_source("S", "a")
    tuples = [
        {"k": k, "v": v, "ts": t} for part in batches for k, v, t in zip(*table(part).values(), strict=True)
    ]
    spec = Spec(Window("sliding", 3, 10), group_by=("k",), aggs=(MEDIAN,))
    assert_rows_equal(rows(engine.poll(q)), evaluate(spec, tuples), spec)
