"""How queries split across workers: the server combines each operator's own placement, read off
the query's description before anything is built."""

from __future__ import annotations

import pytest
from planning import Context, plan_query

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.placement import ONE_WORKER
from lowtide.punctuation.model import Punctuation
from lowtide.punctuation.policies import LatePolicy
from lowtide.query import parse_query
from lowtide.query.build import placement_of
from lowtide.query.plan import Plan
from lowtide.schema import Schema
from lowtide.server.partitioning import Partitioning, partitioning_of
from lowtide.strings import StringPool

SCHEMA = Schema.of({"k1": "string", "k2": "int64", "v": "int64", "f": "float64", "ts": "int64"}, "ts")
SINGLE = Partitioning(single=True)


def by(*keys: tuple[str, ...]) -> Partitioning:
    return Partitioning(False, keys)


# sql, the operator it must plan to, how it splits
CASES = [
    ("SELECT k1, count(*) AS n [RANGE 10, WA ts] FROM A GROUP BY k1", "WID Aggregate", by(("k1",))),
    (
        "SELECT k2, sum(v) AS s [RANGE 10, SLIDE 5, WA ts] FROM A UNION B GROUP BY k2",
        "WID Aggregate",
        by(("k2",), ("k2",)),
    ),
    (
        "SELECT k1, count(*) AS n [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k1",
        "Paned-WID Aggregate",
        by(("k1",)),
    ),
    ("SELECT count(*) AS n [RANGE 12, SLIDE 2, WA ts] FROM A", "Paned-WID Aggregate", SINGLE),
    (
        "SELECT k2, count(*) AS n [RANGE 10, SLIDE 5, WA ts] FROM A WHERE v > 1 GROUP BY k2",
        "Fused WID Aggregate",
        by(("k2",)),
    ),
    (
        "SELECT k1, k2, median(v) AS m [RANGE 10, SLIDE 5, WA ts] FROM A GROUP BY k1, k2",
        "AdaptWID Aggregate",
        by(("k1", "k2")),
    ),
    (
        "SELECT k1, count(*) AS n [RANGE 5 ROWS, SLIDE 2 ROWS, WA row-num, PA k1] FROM A",
        "WID Aggregate",
        by(("k1",)),
    ),
    ("SELECT count(*) AS n [RANGE 5 ROWS, SLIDE 2 ROWS, WA row-num] FROM A", "WID Aggregate", SINGLE),
    ("SELECT k1, count(*) AS n [RANGE ALL, SLIDE 4, WA ts] FROM A GROUP BY k1", "WID Aggregate", SINGLE),
    ("SELECT sum(v) AS s [RANGE 10, WA ts] FROM A", "WID Aggregate", SINGLE),
    (
        "SELECT k1, count(*) AS n [RANGE 6, RATTR ts, SLIDE 2 rows, SATTR row-num] FROM A GROUP BY k1",
        "Slide-by-tuple Aggregate",
        SINGLE,
    ),
    (
        "SELECT A.k1, B.v FROM A [RANGE 3, WA ts], B [RANGE 4, WA ts] WHERE A.k2 = B.k2 AND A.v > 3",
        "OA-Join",
        by(("k2",), ("k2",)),
    ),
    (
        "SELECT A.k2, B.f FROM A, B [RANGE TUMBLING 5, WA ts] WHERE A.k1 = B.k1",
        "OA-Join",
        by(("k1",), ("k1",)),
    ),
    ("SELECT A.k1, B.v FROM A [RANGE 3, WA ts], B [RANGE 4, WA ts] WHERE A.v < B.v", "OA-Join", SINGLE),
    (
        "SELECT A.k1, count(*) AS n [RANGE 4, WA A.ts] FROM A [RANGE 3, WA ts], B [RANGE 3, WA ts] "
        "WHERE A.k1 = B.k1 GROUP BY A.k1",
        "WID Aggregate",
        SINGLE,  # the aggregate's key is a column of the join's rows, not of a stream's
    ),
    ("SELECT k1, v + 1 AS w, ts FROM A UNION B WHERE v > 2", "Project", by((), ())),
    ("SELECT DISTINCT k1, ts FROM A", "DupElim", SINGLE),
    (
        "SELECT *, RANK() OVER (PARTITION BY window_end, k2 ORDER BY v) AS r [RANGE 5, WA ts] FROM A",
        "Window Top-N",
        by(("k2",)),  # a window's rows of one k2 meet: its window is computed from ts
    ),
    (
        "SELECT *, RANK() OVER (PARTITION BY window_start ORDER BY v) AS r [RANGE 5, WA ts] FROM A",
        "Window Top-N",
        SINGLE,
    ),
]


def plan(sql: str) -> Plan:
    ctx = Context(lambda name: SCHEMA, StringPool(), LatePolicy.DROP, None, lambda batch, fields: None)
    return plan_query(parse_query(sql), ctx)


@pytest.mark.parametrize(("sql", "label", "want"), CASES)
def test_queries_split_as_their_operators_declare(sql: str, label: str, want: Partitioning) -> None:
    planned = plan(sql)
    assert label in {op.label for op in planned.operators}
    assert partitioning_of(planned.description) == want


@pytest.mark.parametrize(("sql", "label", "want"), CASES)
def test_each_node_is_placed_as_its_operator(sql: str, label: str, want: Partitioning) -> None:
    planned = plan(sql)
    described = [placement_of(node.kind) for node in planned.description.nodes]
    assert described == [op.placement() for op in planned.operators]


class _Undeclared(Operator):
    """A new operator that says nothing of its placement."""

    label = "Undeclared"

    def process(self, batch: Batch, port: int = 0) -> None:
        self.emit(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.emit_punctuation(punctuation)


def test_an_operator_that_declares_nothing_is_never_split() -> None:
    assert _Undeclared().placement() == ONE_WORKER
