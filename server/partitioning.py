"""How a query's input splits across workers without changing its results.

Each operator declares its placement (:mod:`lowtide.operators.placement`); a query's partitioning
combines those of its plan's operators, read off its description before any is built
(:func:`~lowtide.query.build.placement_of`). It runs on one worker if any operator needs the whole
input. Otherwise each input is split by the keys of the keyed operators it reaches (the group-by
columns of a time-window aggregate, a partitioned tuple window's PA columns, a join side's
equality keys: matching tuples meet on one worker), or by row position if it reaches none. The
keys must be the stream's own columns: a keyed operator reached only through an operator that
makes new rows (a join feeding an aggregate) runs the query on one worker, and so do keyed
operators that disagree on an input's keys.

What runs at the front (:func:`at_front`): a worker's string pool mirrors the front's and gives
no code out, so the strings a query makes (DATE_FORMAT, SPLIT_INDEX) are made at the front, in
the query's last Project, after its workers' outputs meld. It lacks the text of the streams'
strings (it mirrors pinned ones: literals, computed strings), so the strings a query reads
(SPLIT_INDEX, COUNT_CHAR) are read there too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.errors import UnsupportedQuery
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import hash_rows
from lowtide.operators.placement import Placement, Split
from lowtide.query.ast import Expr
from lowtide.query.build import placement_of
from lowtide.query.computed import columns_in, string_call
from lowtide.query.description import AggregateNode, Node, NodeKind, PlanDescription, ProjectNode, SelectNode
from lowtide.query.expr import expr_text
from lowtide.query.functions import STRING_FUNCTIONS

Keys = tuple[str, ...]


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


def partitioning_of(description: PlanDescription) -> Partitioning:
    """The split of a query's inputs that every operator's placement allows."""
    single = Partitioning(single=True)
    placements = [placement_of(node.kind) for node in description.nodes]
    if any(p.split is Split.ONE_WORKER for p in placements):
        return single
    outputs: list[list[tuple[int, int]]] = [[] for _ in description.nodes]
    for i, node in enumerate(description.nodes):
        for port, source in enumerate(node.sources):
            outputs[source].append((i, port))
    reached: set[int] = set()
    keys: list[Keys] = []
    for entry in description.inputs:
        needed = _keys_needed(entry.node, 0, True, placements, outputs, reached)
        if needed is None or len(needed) > 1:
            return single
        keys.append(needed.pop() if needed else ())
    # An operator no input feeds through the graph reads what all of them fed (Paned-WID reads
    # its slices' state): every input must be split by its keys.
    for i, placement in enumerate(placements):
        unread = i not in reached and placement.split is Split.BY_KEYS
        if unread and any(k != placement.keys[0] for k in keys):
            return single
    return Partitioning(False, tuple(keys))


def _keys_needed(
    node: int,
    port: int,
    traced: bool,
    placements: list[Placement],
    outputs: list[list[tuple[int, int]]],
    reached: set[int],
) -> set[Keys] | None:
    """The keys that the operators from ``node`` (entered on ``port``) on need their input split
    by; None if one needs keys that are not the input's columns (``traced`` False: the rows
    reaching ``node`` were made by an operator on the way)."""
    placement = placements[node]
    reached.add(node)
    needed: set[Keys] = set()
    if placement.split is Split.BY_KEYS:
        if not traced:
            return None
        needed.add(placement.keys[port])
    for downstream, next_port in outputs[node]:
        more = _keys_needed(
            downstream, next_port, traced and placement.passes_rows, placements, outputs, reached
        )
        if more is None:
            return None
        needed |= more
    return needed


def at_front(description: PlanDescription) -> tuple[PlanDescription, ProjectNode | None]:
    """What a query's workers run, and the Project the front runs on their melded output (None:
    none: the workers run it all).

    A last Project that makes strings, or reads their text, runs at the front, with the pool that
    codes them and holds every text, exactly as the in-process engine runs it: it is computed row
    by row, so after the meld as before it. The workers' graph ends instead with a Project of the
    columns it reads, under their own names (the schema stays the query's: the front's Project
    makes it). Strings made or read anywhere else (WHERE, HAVING, an aggregate's argument or
    FILTER, SELECT DISTINCT) would be in a worker: `UnsupportedQuery`, naming the derived table
    that does it at the front (its results reach its readers as the front's codes)."""
    *rest, last = description.nodes
    kind = last.kind
    front = kind if isinstance(kind, ProjectNode) and any(string_call(e) for _, e in _exprs(kind)) else None
    for node in rest if front is not None else description.nodes:
        for place, expr in _places(node.kind):
            call = string_call(expr)
            if call is not None:
                made = expr_text(call)
                does = (
                    "make strings in a server worker, which cannot code them"
                    if call.name in STRING_FUNCTIONS
                    else "read strings in a server worker, which lacks their text"
                )
                raise UnsupportedQuery(
                    f"{made} in {place} would {does}: select it in a derived table, "
                    f"FROM (SELECT {made} AS x, ... FROM ...), and read x"
                )
    if front is None:
        return description, None
    scope = front.scope
    read = dict.fromkeys(
        column
        for _, written in front.columns
        for column in (
            [written]
            if isinstance(written, str)
            else [scope.resolve(c.name, c.qualifier).physical for c in columns_in(written)]
        )
    )
    shipped = Node(ProjectNode(tuple((c, c) for c in read), scope, ()), last.sources)
    return replace(description, nodes=(*rest, shipped)), front


def _exprs(kind: ProjectNode) -> Iterator[tuple[str, Expr]]:
    return ((name, expr) for name, expr in kind.columns if not isinstance(expr, str))


def _places(kind: NodeKind) -> Iterator[tuple[str, Expr]]:
    """The expressions an operator of ``kind`` computes in a worker, each with where the query
    wrote it."""
    if isinstance(kind, SelectNode):
        yield from (("WHERE", c) for c in kind.where.conjuncts)
    elif isinstance(kind, AggregateNode):
        if kind.where is not None:
            yield from (("WHERE", c) for c in kind.where.conjuncts)
        if kind.aggregate.having is not None:
            yield "HAVING", kind.aggregate.having.expr
    elif isinstance(kind, ProjectNode):
        # Before an aggregate it computes arguments and FILTERs; else it is a select list, one
        # that makes strings found here only when SELECT DISTINCT follows it (a last one runs at
        # the front).
        place = "an aggregate's argument or FILTER" if kind.keeps_input else "SELECT DISTINCT"
        yield from ((place, e) for _, e in _exprs(kind))


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
