"""The window-operator contract (lowtide.operators.window_operator), one case per operator.

* ``late_mask``: each window operator, planned, answers which tuples behind punctuation it can no
  longer count exactly as the late rule the door compiles from the query's description (Shared
  Slices: the OR of their readers' rules; OA-Join: ``late_mask(side, ts, bounds)`` as its rule):
  both ask one window logic, so this checks the wiring (the judge's window, the WHERE); the logic
  itself is checked against the windows' definitions in tests/property/test_window_logic_property.py;
* ``emit_partials``: with tuples in open windows, it emits their rows with ``final = false``, above
  (or at) the punctuation it emitted, and changes no state (its snapshot is the same before and after, but
  for the count of rows out).

A new window operator fails here until it has a case.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import numpy as np
import pytest
from harness import Recorder

import lowtide.operators
from lowtide.batch import Batch
from lowtide.clock import ManualClock
from lowtide.engine import Engine
from lowtide.operators.base import Operator
from lowtide.operators.oa_join import OAJoin
from lowtide.operators.shared_slices import SharedSlices
from lowtide.operators.window_operator import WindowOperator
from lowtide.punctuation.model import END_OF_STREAM
from lowtide.query.late_rules import late_rule
from lowtide.query.plan import Plan
from lowtide.snapshot import pack

SCHEMA = {"k": "int64", "v": "int64", "ts": "int64"}
# label -> a query that plans to it (EMIT EVERY: its partial rows are observable)
EMIT = "EMIT EVERY 1s"
CASES = {
    "WID Aggregate": f"SELECT k, count(*) AS n [RANGE 10, SLIDE 5, WA ts, {EMIT}] FROM A GROUP BY k",
    "WID Aggregate (landmark)": (
        f"SELECT k, sum(v) AS s [RANGE ALL, SLIDE 4, WA ts, {EMIT}] FROM A GROUP BY k"
    ),
    "WID Aggregate (rows)": "SELECT count(*) AS n [RANGE 5 ROWS, SLIDE 2 ROWS, WA row-num] FROM A",
    "Fused WID Aggregate": (
        f"SELECT k, count(*) AS n [RANGE 10, SLIDE 5, WA ts, {EMIT}] FROM A WHERE v > 0 GROUP BY k"
    ),
    "AdaptWID Aggregate": f"SELECT k, median(v) AS m [RANGE 10, SLIDE 2, WA ts, {EMIT}] FROM A GROUP BY k",
    "Paned-WID Aggregate": f"SELECT k, sum(v) AS s [RANGE 12, SLIDE 2, WA ts, {EMIT}] FROM A GROUP BY k",
    "Session Aggregate": f"SELECT k, count(*) AS n [SESSION 3, WA ts, {EMIT}] FROM A GROUP BY k",
}
# Two readers of slices of 4: the second's windows end more often, it has late tuples of its own.
READERS = (
    "SELECT k, sum(v) AS s [RANGE 36, SLIDE 8, WA ts] FROM A GROUP BY k",
    "SELECT k, count(*) AS n [RANGE 16, SLIDE 4, WA ts] FROM A GROUP BY k",
)
JOIN = "SELECT A.k, B.v FROM A [RANGE 3, WA ts], B [RANGE 5, WA ts] WHERE A.k = B.k"
UNTIL_JOIN = "SELECT A.k, B.v FROM A, B WHERE A.k = B.k AND B.ts BETWEEN A.ts - 2 AND A.v + 20"


def started(*sqls: str) -> tuple[Engine, list[Plan]]:
    engine = Engine(ManualClock())
    engine.create_stream("A", SCHEMA)
    engine.create_stream("B", SCHEMA)
    plans = []
    for i, sql in enumerate(sqls):
        engine.register_query(sql, f"q{i}")
        plans.append(engine.runner.plan(f"q{i}"))
    return engine, plans


def operator(plan: Plan, kind: type[Operator]) -> Any:
    return next(op for op in plan.operators if isinstance(op, kind))


def labelled(plan: Plan, label: str) -> WindowOperator:
    op = next(op for op in plan.operators if op.label == label.split(" (")[0])
    assert isinstance(op, WindowOperator)
    return op


def batches() -> list[Batch]:
    rng = np.random.default_rng(3)
    out = []
    for _ in range(20):
        n = int(rng.integers(1, 12))
        ts = rng.integers(-5, 60, n).astype(np.int64)
        cols = {
            "k": rng.integers(0, 3, n).astype(np.int64),
            "v": rng.integers(1, 9, n).astype(np.int64),
            "ts": ts,
        }
        out.append(Batch(cols, n))
    return out


def state_of(op: Operator) -> bytes:
    """Its state but the count of rows out, which partial rows add to."""
    state = op.snapshot()
    assert isinstance(state, dict) and isinstance(state["fields"], dict)
    return pack({name: part for name, part in state["fields"].items() if name != "tuples_out"})


PUNCTUATIONS = [-(2**62), -1, 0, 1, 4, 5, 9, 10, 11, 23, 24, 59, END_OF_STREAM]


@pytest.mark.parametrize("label", list(CASES))
def test_late_mask_is_the_rule_the_door_compiles(label: str) -> None:
    engine, (plan,) = started(CASES[label])
    op = labelled(plan, label)
    (about,) = plan.description.inputs
    assert about.judge is not None
    rule = late_rule(about.judge, engine.pool)
    for batch in batches():  # every v > 0: the fused WHERE keeps them all
        for p in PUNCTUATIONS:
            assert rule(batch, {"A": p}).tolist() == op.late_mask(batch, p).tolist()


def test_shared_slices_answer_for_all_their_readers() -> None:
    engine, plans = started(*READERS)
    slices = operator(plans[0], SharedSlices)
    assert len(slices.readers) == 2 and plans[1].joins_share
    rules = [late_rule(p.description.inputs[0].judge, engine.pool) for p in plans]  # type: ignore[arg-type]
    second_only = 0  # tuples late for the second reader alone: the OR is not the first's rule
    for batch in batches():
        for p in PUNCTUATIONS:
            first, second = rules[0](batch, {"A": p}), rules[1](batch, {"A": p})
            assert slices.late_mask(batch, p).tolist() == (first | second).tolist()
            second_only += int((second & ~first).sum())
    assert second_only


@pytest.mark.parametrize("sql", [JOIN, UNTIL_JOIN])
def test_oa_join_late_mask_is_the_rule_the_door_compiles(sql: str) -> None:
    engine, (plan,) = started(sql)
    join = operator(plan, OAJoin)
    for side, about in enumerate(plan.description.inputs):
        assert about.judge is not None
        rule = late_rule(about.judge, engine.pool)
        for batch in batches():
            for b0 in PUNCTUATIONS[1:-1]:
                for b1 in (0, 7, 30):
                    expected = join.late_mask(side, batch.columns["ts"], (b0, b1))
                    assert rule(batch, {"A": b0, "B": b1}).tolist() == expected.tolist()


@pytest.mark.parametrize("label", [label for label in CASES if "rows" not in label])
def test_emit_partials_emits_open_windows_and_changes_nothing(label: str) -> None:
    engine, (plan,) = started(CASES[label])
    op = labelled(plan, label)
    engine.push("A", {"k": [0, 1, 0, 2, 1], "v": [1, 2, 3, 4, 5], "ts": [3, 7, 12, 14, 21]})
    engine.punctuate("A", 12)
    engine.poll("q0")
    seen = Recorder()
    op.connect(seen)
    before = state_of(op)
    op.emit_partials()
    assert state_of(op) == before
    rows = [item for item in seen.items if isinstance(item, Batch)]
    assert rows and not seen.punctuations()
    for batch in rows:
        assert not np.asarray(batch.columns["final"]).any()
        assert (np.asarray(batch.columns["window_end"]) >= op.progress_out.get("window_end", -(2**63))).all()


def test_slices_have_no_partial_rows_of_their_own() -> None:
    _, (plan,) = started(CASES["Paned-WID Aggregate"])
    slices = operator(plan, SharedSlices)
    seen = Recorder()
    slices.connect(seen)
    slices.emit_partials()
    assert seen.items == []


def test_every_window_operator_has_a_case() -> None:
    """A new window operator fails here until it has a case above."""
    found = set()
    for module in pkgutil.iter_modules(lowtide.operators.__path__):
        for _, cls in inspect.getmembers(
            importlib.import_module(f"lowtide.operators.{module.name}"), inspect.isclass
        ):
            if issubclass(cls, WindowOperator) and not inspect.isabstract(cls):
                found.add(cls.label)
    covered = {label.split(" (")[0] for label in CASES} | {SharedSlices.label}
    assert found == covered
