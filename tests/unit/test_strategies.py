"""Aggregation as a table of strategies: each query runs as the first strategy that applies, the
one ``explain`` shows, every strategy of the table is some query's choice, and the build registry
beside the operators builds each (the planner's table and the registry name the same ones)."""

from __future__ import annotations

import pytest

from lowtide.operators.build_registry import BUILDERS
from lowtide.punctuation.policies import LatePolicy
from lowtide.query import parse_query
from lowtide.query.build import BuildContext, build
from lowtide.query.describe import describe
from lowtide.query.description import AggregateNode, PlanOptions
from lowtide.query.sharing import ShareIndex
from lowtide.query.strategies import STRATEGIES
from lowtide.schema import Schema
from lowtide.strings import StringPool

SCHEMA = Schema.of({"k": "string", "v": "int64", "ts": "int64"}, "ts")
# sql, late policy, the strategy chosen, the operator it builds
CASES = [
    (
        "SELECT count(*) AS n [RANGE 6, RATTR ts, SLIDE 2 rows, SATTR row-num] FROM A",
        "drop",
        "slide-by-tuple",
        "Slide-by-tuple Aggregate",
    ),
    ("SELECT k, count(*) AS n [SESSION 5, WA ts] FROM A GROUP BY k", "drop", "session", "Session Aggregate"),
    (
        "SELECT k, sum(v) AS s [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k",
        "drop",
        "paned",
        "Paned-WID Aggregate",
    ),
    ("SELECT k, sum(v) AS s [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k", "update", "wid", "WID Aggregate"),
    (
        "SELECT k, median(v) AS m [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k",
        "drop",
        "adaptive",
        "AdaptWID Aggregate",
    ),
    (
        "SELECT k, count(*) AS n [RANGE 10, SLIDE 5, WA ts] FROM A WHERE v > 1 GROUP BY k",
        "drop",
        "fused",
        "Fused WID Aggregate",
    ),
    ("SELECT count(*) AS n [RANGE 10, SLIDE 5, WA ts] FROM A", "drop", "wid", "WID Aggregate"),
    ("SELECT median(v) AS m [RANGE 10, WA ts] FROM A WHERE v > 1", "drop", "wid", "WID Aggregate"),
]


@pytest.mark.parametrize(("sql", "late", "chosen", "label"), CASES)
def test_the_first_strategy_that_applies_runs_the_aggregation(
    sql: str, late: str, chosen: str, label: str
) -> None:
    options = PlanOptions(LatePolicy.parse(late))
    description = describe(parse_query(sql), lambda name: SCHEMA, options, ShareIndex())
    (node,) = [n.kind for n in description.nodes if isinstance(n.kind, AggregateNode)]
    assert node.strategy == chosen
    plan = build(description, BuildContext(StringPool(), lambda b, f: None))
    assert label in {op.label for op in plan.operators}


def test_every_strategy_is_some_querys_choice() -> None:
    assert {s.name for s in STRATEGIES} == {chosen for _, _, chosen, _ in CASES}


def test_every_strategy_has_a_builder_and_every_builder_a_strategy() -> None:
    names = [s.name for s in STRATEGIES]
    assert len(set(names)) == len(names)  # a name is one strategy
    assert set(names) == BUILDERS.keys()


@pytest.mark.parametrize(("overlap", "chosen"), [(1, "paned"), (6, "paned"), (7, "wid")])
def test_paned_min_overlap_decides_paned_wid(overlap: int, chosen: str) -> None:
    sql = "SELECT k, sum(v) AS s [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k"  # windows overlap 6 times
    options = PlanOptions(paned_min_overlap=overlap)
    description = describe(parse_query(sql), lambda name: SCHEMA, options, ShareIndex())
    (node,) = [n.kind for n in description.nodes if isinstance(n.kind, AggregateNode)]
    assert node.strategy == chosen


def test_unshared_slices_are_no_share() -> None:
    """Without share_slices a Paned-WID query starts no share and joins none, even one that fits."""
    sql = "SELECT k, sum(v) AS s [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k"
    first = describe(parse_query(sql), lambda name: SCHEMA, PlanOptions(), ShareIndex())
    assert first.share is not None
    shared = ShareIndex()
    shared.enter(first.share)
    again = describe(parse_query(sql), lambda name: SCHEMA, PlanOptions(), shared)
    assert again.share is not None and again.share.joins
    own = describe(parse_query(sql), lambda name: SCHEMA, PlanOptions(share_slices=False), shared)
    assert own.share is None
    (node,) = [n.kind for n in own.nodes if isinstance(n.kind, AggregateNode)]
    assert node.strategy == "paned"  # slices of its own
    with pytest.raises(ValueError, match="paned_min_overlap"):
        PlanOptions(paned_min_overlap=0)
