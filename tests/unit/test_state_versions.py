"""Saved forms under versions (lowtide.snapshot.Versioned): checkpoints written by earlier builds
restore exactly or are refused in one line, never misread.

The checkpoints of tests/data/checkpoints/ hold every operator kind mid-stream
(tests/checkpoint_fixture.py): ``v1`` as this build writes it, ``v0`` as lowtide wrote it before
state versions (fields under attribute names). Each, restored at the cut into queries planned
again, goes on as the uninterrupted run does, item for item. The same checkpoint with one
operator's version changed, or read by a build whose class is a version ahead, is refused with
``checkpoint of <operator> has state version N, this build reads M``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from checkpoint import Rig
from checkpoint_fixture import CUT, DATA, EVENTS, FILE, QUERIES, rig, write

import lowtide.operators
from lowtide.errors import CorruptState
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.base import Operator
from lowtide.operators.group_table import GroupTable
from lowtide.operators.wid_aggregate import WIDAggregate
from lowtide.snapshot import ARRAY, INT, Field, State, Stateful, as_dict, as_list, declare, pack, unpack

Log = dict[str, list[tuple[int, Any]]]


def run(checkpoint: bytes | None) -> tuple[Log, Rig]:
    """Every query's items, with the call each came out of; with ``checkpoint``, the rig is
    replaced at the cut by one restored from it (the door carried over, as a worker's front does)."""
    current = rig()
    log: Log = {r.name: [] for r in QUERIES}
    for call, event in enumerate(EVENTS):
        if call == CUT and checkpoint is not None:
            current = current.restored(checkpoint)
        current.apply(event)
        for name, items in current.drain().items():
            log[name] += [(call, item) for item in items]
    return log, current


def saved(version: str) -> bytes:
    return (DATA / version / FILE).read_bytes()


def operator_state(checkpoint: State, query: str, label: str) -> dict[str, State]:
    """The saved form of the operator ``label`` of ``query``'s plan in ``checkpoint``."""
    plans = as_dict(as_dict(checkpoint, "checkpoint")["plans"], "plans")
    for part in as_list(as_dict(plans[query], query)["operators"], query):
        found = as_dict(part, query)
        if found["operator"] == label:
            return as_dict(found["state"], label)
    raise AssertionError(f"{query} saved no {label}")


@pytest.fixture(scope="module")
def whole() -> Log:
    return run(None)[0]


@pytest.mark.parametrize("version", ["v1", "v0"])
def test_a_committed_checkpoint_restores_and_goes_on_exactly(version: str, whole: Log) -> None:
    restored, after = run(saved(version))
    rows = 0
    for name, items in whole.items():
        want = [item for call, item in items if call >= CUT]
        assert [item for call, item in restored[name] if call >= CUT] == want, f"{name} after the cut"
        rows += sum(len(item[2]) for item in want if item[0] in ("rows", "late"))
    assert rows > 100  # results came after the cut: the restored state was read, not skipped
    operators = {
        cls.label
        for module in pkgutil.iter_modules(lowtide.operators.__path__)
        for _, cls in inspect.getmembers(importlib.import_module(f"lowtide.operators.{module.name}"))
        if inspect.isclass(cls) and issubclass(cls, Operator) and not inspect.isabstract(cls)
    }
    assert operators <= {op.label for q in after.queries.values() for op in q.plan.operators}


def test_an_operator_saved_under_another_version_is_refused() -> None:
    checkpoint = unpack(saved("v1"))
    operator_state(checkpoint, "tumble", "WID Aggregate")["version"] = 2
    current = rig()
    for event in EVENTS[:CUT]:
        current.apply(event)
    with pytest.raises(CorruptState) as refused:
        current.restored(pack(checkpoint))
    assert str(refused.value) == "checkpoint of WID Aggregate has state version 2, this build reads 1"


@pytest.mark.parametrize(
    ("cls", "version", "reason"),
    [
        (
            GroupTable,
            "v1",
            "checkpoint of WID Aggregate.state.groups has state version 1, this build reads 2",
        ),
        (WIDAggregate, "v0", "checkpoint of WID Aggregate has state version 0, this build reads 2"),
    ],
)
def test_a_build_a_version_ahead_refuses_older_states(
    cls: type, version: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class at version 2 without a migration from the saved version: refused, whether the
    saved form is its own (WID Aggregate) or a helper's inside it (its group table)."""
    current = rig()
    for event in EVENTS[:CUT]:
        current.apply(event)
    monkeypatch.setattr(cls, "VERSION", 2)
    with pytest.raises(CorruptState) as refused:
        current.restored(saved(version))
    assert str(refused.value) == reason


def test_a_damaged_field_is_refused_naming_operator_and_field() -> None:
    checkpoint = unpack(saved("v1"))
    fields = as_dict(operator_state(checkpoint, "adapt", "AdaptWID Aggregate")["fields"], "adapt")
    fields["mode"] = "eager"
    current = rig()
    with pytest.raises(CorruptState) as refused:
        current.restored(pack(checkpoint))
    assert str(refused.value) == "state of AdaptWID Aggregate.mode is a str, not an array"
    assert AdaptWIDAggregate.STATE["mode"].attribute == "_mode"


class _Counter(Stateful):
    VERSION = 1
    STATE: ClassVar[Any] = declare(seen=INT.at("_seen"), marks=ARRAY)

    def __init__(self) -> None:
        self._seen = 0
        self.marks = np.zeros(0, np.int64)


class _Renamed(Stateful):
    """_Counter with its private attribute renamed: the same saved form."""

    VERSION = 1
    STATE: ClassVar[Any] = declare(seen=INT.at("_count"), marks=ARRAY)

    def __init__(self) -> None:
        self._count = 0
        self.marks = np.zeros(0, np.int64)


def test_the_saved_form_names_fields_not_attributes() -> None:
    counter = _Counter()
    counter._seen, counter.marks = 7, np.arange(3)
    state = as_dict(counter.snapshot(), "counter")
    assert state.keys() == {"version", "fields"} and state["version"] == 1
    assert as_dict(state["fields"], "counter").keys() == {"seen", "marks"}
    renamed = _Renamed()
    renamed.restore(unpack(pack(state)))
    assert renamed._count == 7 and renamed.marks.tolist() == [0, 1, 2]
    old = _Renamed()  # saved before versions: under the attribute's name of then
    old.restore({"_seen": 5, "marks": np.arange(2)})
    assert old._count == 5


def test_a_declaration_names_public_fields_under_a_version() -> None:
    with pytest.raises(ValueError, match=r"state field '_seen': a saved name is public"):
        declare(_seen=INT)
    with pytest.raises(TypeError, match="declares STATE without the VERSION"):
        type("Unversioned", (Stateful,), {"STATE": declare(seen=INT)})
    assert isinstance(WIDAggregate.STATE["next_landmark"], Field)


def layout(state: State) -> Any:
    """The shape of a saved form: field names, array dtypes and dimensions (values left out)."""
    if isinstance(state, dict):
        return {name: layout(value) for name, value in state.items()}
    if isinstance(state, list):
        return sorted({repr(layout(item)) for item in state})
    if isinstance(state, np.ndarray):
        return f"array {state.dtype.str} {state.ndim}-d"
    return "scalar"


def test_this_build_saves_the_committed_layout(tmp_path: Path) -> None:
    """This build's checkpoint of the fixture has the fields and arrays of the committed v1: a
    saved form that changes fails here until its class's VERSION is bumped and a checkpoint of
    the new version is written (tests/checkpoint_fixture.py)."""
    written = unpack(write(tmp_path).read_bytes())
    assert layout(written) == layout(unpack(saved("v1")))
