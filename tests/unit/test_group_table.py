"""The group table's direct lookup pays for itself (issue 30, item 7): a few keys spread wide take
what their groups take, not a 512 KiB index each; keys dense enough keep direct lookup. The ids
themselves are the property test's (tests/property/test_group_table_property.py)."""

from __future__ import annotations

import numpy as np

from lowtide.operators.group_table import DENSE_SPAN, GroupTable

KIB = 1024


def column(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, np.int64).reshape(-1, 1)


def test_a_few_keys_spread_wide_take_what_their_groups_take() -> None:
    ports = GroupTable(1)  # a thousand ports out of 65,536, in a thousand rows
    ids = ports.ids(column(np.arange(1000) * 65))
    assert ids.tolist() == list(range(1000))
    assert not ports.dense and ports.nbytes() < 64 * KIB, ports.nbytes()
    few = GroupTable(1)  # many rows, two keys far apart: found sparse once inserted
    assert few.ids(column(np.repeat([0, DENSE_SPAN - 10], 50_000)))[[0, -1]].tolist() == [0, 1]
    assert not few.dense and few.nbytes() < 64 * KIB, few.nbytes()


def test_keys_dense_enough_keep_direct_lookup() -> None:
    table = GroupTable(1)
    table.ids(column(np.arange(0, 40_000, 4)))  # 10,000 groups over 40,000: 8 slots a group
    assert table.dense
    small = GroupTable(1)
    small.ids(column([3, 900, 2000]))  # however few the groups, a small index is free
    assert small.dense and small.nbytes() < 64 * KIB
