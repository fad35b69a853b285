"""Select runs a WHERE's conjuncts in measured order and keeps exactly the rows of their AND."""

from __future__ import annotations

from typing import Any

import numpy as np
from harness import Recorder
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.batch import Batch
from lowtide.operators.select import RERANK, Select

THRESHOLDS = st.lists(st.integers(-5, 25), min_size=1, max_size=3)


def conjunct(column: str, threshold: int) -> tuple[Any, str]:
    return (lambda cols: cols[column] > threshold), f"{column} > {threshold}"


@settings(max_examples=200, deadline=None)
@given(
    thresholds=THRESHOLDS,
    batches=st.lists(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=30), max_size=40),
)
def test_rows_are_those_of_the_and_in_arrival_order(thresholds: list[int], batches: list[Any]) -> None:
    columns = ["a", "b", "a"]
    select = Select([conjunct(columns[i], t) for i, t in enumerate(thresholds)])
    sink = Recorder()
    select.connect(sink)
    want = []
    for rows in batches:
        a = np.array([r[0] for r in rows], dtype=np.int64)
        b = np.array([r[1] for r in rows], dtype=np.int64)
        select.process(Batch({"a": a, "b": b}, len(rows)))
        keep = np.ones(len(rows), dtype=bool)
        for i, t in enumerate(thresholds):
            keep &= (a if columns[i] == "a" else b) > t
        want += list(zip(a[keep].tolist(), b[keep].tolist(), strict=True))
    assert sink.rows("a", "b") == want


def test_the_more_selective_conjunct_moves_first() -> None:
    rng = np.random.default_rng(5)
    select = Select([conjunct("a", -1), conjunct("b", 98)])  # a > -1 keeps all, b > 98 keeps 1%
    select.connect(Recorder())
    assert "a > -1 AND b > 98" in select.describe()
    for _ in range(RERANK):
        n = 10_000
        select.process(Batch({"a": rng.integers(0, 100, n), "b": rng.integers(0, 100, n)}, n))
    assert select.describe().startswith("Select b > 98 AND a > -1")
