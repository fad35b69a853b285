"""The group table against a dict: the same dense ids in first-seen order, through direct
lookup, its re-basing, the guard's switch to hashing, and compaction."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from lowtide.operators.group_table import DENSE_SPAN, GroupTable

pytestmark = pytest.mark.property

near = st.integers(-50, 50)
far = st.sampled_from([DENSE_SPAN, -DENSE_SPAN, 2**62, -(2**63)])
batches = st.lists(st.lists(st.one_of(near, near, near, far), max_size=30), min_size=1, max_size=8)


@settings(max_examples=examples(300), deadline=None)
@given(batches=batches, width=st.sampled_from([1, 1, 2]), data=st.data())
def test_ids_equal_a_dict(batches: list[list[int]], width: int, data: Any) -> None:
    table = GroupTable(width)
    model: dict[tuple[int, ...], int] = {}
    for values in batches:
        keys = np.array([[v + j for j in range(width)] for v in values], dtype=np.int64).reshape(-1, width)
        got = table.ids(keys).tolist()
        want = [model.setdefault(tuple(row), len(model)) for row in keys.tolist()]
        assert got == want
        assert table.keys.tolist() == [list(k) for k in model]
        if model and data.draw(st.booleans(), label="compact"):
            keep = np.array(data.draw(st.lists(st.booleans(), min_size=len(model), max_size=len(model))))
            remap = table.compact(keep)
            kept = [k for k, g in model.items() if keep[g]]
            assert remap.tolist() == [kept.index(k) if keep[g] else -1 for k, g in model.items()]
            model = {k: i for i, k in enumerate(kept)}
    tally(f"width {width}, ended {'dense' if table.dense else 'hashed'}")
