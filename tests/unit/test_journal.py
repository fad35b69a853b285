"""A change checked, logged, and then failing as it applies (another change applied first, in the
time between its check and its turn) is followed in the log by a ``RefusedRecord`` naming it, on disk
before anything after it is acknowledged: replay passes over it, and any other record that fails
at replay is damage (tests/integration/test_durability.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lowtide.errors import AlreadyExists
from lowtide.server.input_log import DropQueryRecord, Record, RefusedRecord
from lowtide.server.journal import Journal, StateDirectory


def applying(failing: set[str]) -> tuple[list[str], Any]:
    applied: list[str] = []

    def apply(record: Record, prepared: Any) -> str:
        assert isinstance(record, DropQueryRecord)
        if record.name in failing:
            raise AlreadyExists(f"query {record.name!r} already exists")
        applied.append(record.name)
        return record.name

    return applied, apply


@pytest.mark.parametrize("fsync", ["no", "always"])
def test_a_change_failing_as_it_applies_is_refused_in_the_log(tmp_path: Path, fsync: str) -> None:
    state = StateDirectory(str(tmp_path / "state"), fsync)
    state.log.segment_bytes = 1  # a new segment before every record that may begin one
    list(state.log.replay())
    state.log.recovered()
    applied, apply = applying({"b"})
    journal = Journal(apply, state.log)

    async def submit_all() -> list[Any]:
        changes = [journal.submit(DropQueryRecord(float(i), name)) for i, name in enumerate("abc")]
        outcomes = await asyncio.gather(*changes, return_exceptions=True)
        state.close()  # while the loop runs: the fsync thread's last call lands on it
        return outcomes

    outcomes = asyncio.run(submit_all())
    assert outcomes[0] == "a" and outcomes[2] == "c"
    assert isinstance(outcomes[1], AlreadyExists)
    assert applied == ["a", "c"] and journal.refused == {1}
    again = StateDirectory(str(tmp_path / "state"), fsync)
    logged = list(again.log.replay())
    assert [(seq, type(r).__name__) for seq, r in logged[:2]] == [
        (0, "DropQueryRecord"),
        (1, "DropQueryRecord"),
    ]
    refusals = [r for _, r in logged if isinstance(r, RefusedRecord)]
    assert [(r.seq, r.reason) for r in refusals] == [(1, "query 'b' already exists")]
    assert again.log.refused == {1}  # what a start passes over, found as its segment is read
    # ... because a RefusedRecord is in the segment of the record it names.
    (holding,) = [
        p for p in (tmp_path / "state" / "log").glob("*.seg") if b"already exists" in p.read_bytes()
    ]
    assert b'"name":"b"' in holding.read_bytes()
