"""How a query's input splits across workers without changing its results.

A query runs on every worker when its state splits by a key: the group-by columns of a time-window
aggregate (and of a partitioned tuple window, its PA columns) or the equality keys of a join (each
side hashed on its own key columns, so matching tuples meet on one worker). Stateless queries split
by row position. Everything whose result depends on the whole stream runs on one worker: tuple
windows (arrival order), slide-by-tuple and landmark windows (the first tuple, ranks), aggregates
without groups, joins without keys, DISTINCT, and a join feeding an aggregate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.dupelim import DupElim
from lowtide.operators.group_table import hash_rows
from lowtide.operators.oa_join import OAJoin
from lowtide.operators.slide_by_tuple import SlideByTupleAggregate
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.operators.windows import Rows, Sliding
from lowtide.query.planner import Plan


@dataclass(frozen=True)
class Partitioning:
    """``keys[i]``: the key columns of input ``i``; ``()`` splits by row; ``single``: one worker."""

    single: bool
    keys: tuple[tuple[str, ...], ...] = ()

    def describe(self, workers: int) -> str:
        if self.single or workers == 1:
            return "runs on 1 worker"
        by = "; ".join(", ".join(k) if k else "row position" for k in self.keys)
        return f"split across {workers} workers by {by}"


def _side(op: Operator, port: int) -> tuple[OAJoin, int] | None:
    """The join (and its input port) that a path from ``op`` reaches first."""
    if isinstance(op, OAJoin):
        return op, port
    for downstream, next_port in op.outputs:
        found = _side(downstream, next_port)
        if found is not None:
            return found
    return None


def partitioning_of(plan: Plan) -> Partitioning:
    ops = plan.operators
    single = Partitioning(single=True)
    if any(isinstance(op, SlideByTupleAggregate | DupElim) for op in ops):
        return single
    joins = [op for op in ops if isinstance(op, OAJoin)]
    aggregates = [op for op in ops if isinstance(op, WIDAggregate | AdaptWIDAggregate)]
    if joins and aggregates:
        return single
    if aggregates:
        agg = aggregates[0]
        window = agg.window
        if isinstance(window, Rows) and window.partition:
            key = window.partition
        elif isinstance(window, Sliding) and agg.group_columns:
            key = agg.group_columns
        else:
            return single
        return Partitioning(False, tuple(key for _ in plan.inputs))
    if joins:
        sides = joins[0].sides
        if not sides[0].keys:
            return single
        keys = []
        for _, op in plan.inputs:
            found = _side(op, 0)
            assert found is not None
            keys.append(sides[found[1]].keys)
        return Partitioning(False, tuple(keys))
    return Partitioning(False, tuple(() for _ in plan.inputs))


def split(batch: Batch, key: tuple[str, ...], workers: int) -> list[npt.NDArray[np.int64]]:
    """Row indices of ``batch`` for each worker: by a hash of ``key``, or by position."""
    if not key:
        owner = np.arange(batch.n, dtype=np.uint64) % np.uint64(workers)
    else:
        owner = hash_rows(key_matrix(batch, key)) % np.uint64(workers)
    order, bounds = _by_owner(owner, workers)
    return [order[bounds[w] : bounds[w + 1]] for w in range(workers)]


@nb.njit(cache=True, nogil=True)
def _by_owner(
    owner: npt.NDArray[np.uint64], workers: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """A counting sort of row numbers by owner: rows of worker w are ``order[bounds[w]:bounds[w+1]]``,
    in row order. One pass to count, one to place: O(n + workers)."""
    bounds = np.zeros(workers + 1, np.int64)
    for i in range(owner.shape[0]):
        bounds[np.int64(owner[i]) + 1] += 1
    for w in range(workers):
        bounds[w + 1] += bounds[w]
    fill = bounds[:-1].copy()
    order = np.empty(owner.shape[0], np.int64)
    for i in range(owner.shape[0]):
        at = np.int64(owner[i])
        order[fill[at]] = i
        fill[at] += 1
    return order, bounds
