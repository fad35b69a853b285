"""The server's exactly-once bookkeeping: applied batch ids kept as runs, batches in parts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.batch import Batch
from lowtide.errors import InvalidArgument
from lowtide.server.batches import AppliedBatches, PartialBatch


@given(st.lists(st.integers(min_value=1, max_value=60), max_size=80))
def test_applied_ids_are_exactly_the_ids_added(ids: list[int]) -> None:
    applied = AppliedBatches()
    for batch_id in ids:
        applied.add(batch_id)
    assert [i for i in range(0, 62) if i in applied] == sorted(set(ids))
    gaps = sum(1 for i in set(ids) if i - 1 not in set(ids))  # runs of consecutive ids
    assert applied.runs == gaps


def test_ids_that_count_up_stay_one_run() -> None:
    applied = AppliedBatches()
    for batch_id in range(58, 100_058):  # a restarted Spark job need not start at 1
        applied.add(batch_id)
    applied.add(1_000)  # a replay of an old batch changes nothing
    assert applied.runs == 1
    assert 57 not in applied and 58 in applied and 100_057 in applied and 100_058 not in applied


def test_a_batch_in_parts_is_whole_only_after_its_last_part() -> None:
    part = Batch({"ts": np.array([1])}, 1)
    partial = PartialBatch(7, 3, duplicate=False)
    for last in (False, False, True):
        partial.check(7, 3)
        assert partial.take(part) is last
    assert len(partial.admitted) == 3


def test_parts_of_another_batch_cut_the_first_short() -> None:
    partial = PartialBatch(7, 3, duplicate=False)
    partial.check(7, 3)
    partial.take(Batch({"ts": np.array([1])}, 1))
    with pytest.raises(InvalidArgument, match=r"batch 7 ended after 1 of its 3 parts; nothing of it"):
        partial.check(8, 3)
    with pytest.raises(InvalidArgument, match=r"batch 7 ended after 1 of its 3 parts"):
        partial.check(7, 2)


def test_parts_need_an_id() -> None:
    with pytest.raises(InvalidArgument, match="needs a batch_id"):
        PartialBatch(0, 2, duplicate=False)
