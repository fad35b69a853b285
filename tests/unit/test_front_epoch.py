"""The front judges a batch once, as it is logged: the door's judgement (a CheckedBatch) travels
through the journal to the application and is taken again only if the door's epoch moved in
between. Under ``fsync = "always"`` every batch waits for a group commit with the changes logged
before it, and applies after them: only those that move what the judgement reads (progress, the
catalog) have it taken again. Parts admitted before a change to the catalog are admitted again
from their bytes.

The workers are left out (a transport that answers syncs and drops the rest): the door, the
journal and the log are the server's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest

from lowtide.batch import Batch
from lowtide.door import DEFAULT_SOURCE, Door
from lowtide.errors import LateTuple, SchemaMismatch
from lowtide.server import input_log as records
from lowtide.server import messages as msg
from lowtide.server.config import ServerConfig
from lowtide.server.front import Front

SCHEMA = {"k": "string", "ts": "int64"}
STRICT = "SELECT k, count(*) AS n [RANGE 10, SLIDE 10, WA ts] FROM S GROUP BY k"
T = TypeVar("T")


class Answering:
    """Workers that hold nothing: every sync is answered at once, everything else dropped."""

    size = 1

    def __init__(self, front: Front) -> None:
        self.front = front

    def post(self, worker: int, message: Any, arrays: Any = None) -> None:
        pass

    def broadcast(self, message: Any) -> None:
        if isinstance(message, msg.SyncMessage):
            synced = msg.SyncedMessage(message.token)
            asyncio.get_running_loop().call_soon(self.front._on_message, 0, synced, {})

    async def wait_for_room(self) -> None:
        pass


def serving(tmp_path: Path, run: Callable[[Front], Awaitable[T]]) -> T:
    """``run`` on a front of ``fsync = "always"`` over a new state directory, recovered."""

    async def main() -> T:
        config = ServerConfig(workers=1, state_dir=str(tmp_path / "state"), fsync="always", metrics_port=-1)
        front = Front(config)
        front.workers = front.door.runner.workers = Answering(front)  # type: ignore[assignment]
        try:
            await front.recover()
            create = records.CreateStreamRecord(time.time(), "S", SCHEMA, "ts", "explicit", [], None)
            await front.submit(create)
            await front.submit(records.RegisterQueryRecord(time.time(), STRICT, "q", "error", None))
            return await run(front)
        finally:
            assert front.state is not None
            front.state.close()  # while the loop runs: the fsync thread's last call lands on it

    return asyncio.run(main())


def arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def rows(ts: list[int]) -> pa.Table:
    return pa.table({"k": [f"k{t}" for t in ts], "ts": pa.array(ts, pa.int64())})


def batch(front: Front, ts: list[int], source: str, batch_id: int = 0) -> Awaitable[int]:
    """One batch as Ingest submits it: admitted as it arrives, then judged and logged whole."""
    table = rows(ts)
    admitted = [front.door.admit("S", table)]
    return front.submit_batch("S", source, batch_id, [arrow(table)], admitted, front.door.epoch)


def count_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often any door judges a batch, from now on."""
    calls = [0]
    check_batch = Door.check_batch

    def counted(
        self: Door[Any], stream: str, parts: Any, source: str = DEFAULT_SOURCE, before: Any = None
    ) -> Any:
        calls[0] += 1
        return check_batch(self, stream, parts, source, before)

    monkeypatch.setattr(Door, "check_batch", counted)
    return calls


def logged_batches(front: Front) -> int:
    assert front.state is not None
    return sum(isinstance(r, records.BatchRecord) for _, r in front.state.log.records(0))


def test_batches_waiting_for_one_group_commit_are_judged_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four producers' batches are judged, logged, then applied together once an fsync covers
    them: each applies as judged (applying the others moved no progress)."""

    async def run(front: Front) -> tuple[list[int], int]:
        calls = count_checks(monkeypatch)
        applied = await asyncio.gather(*(batch(front, [1, 2], f"p{i}", batch_id=1) for i in range(4)))
        return applied, calls[0]

    applied, checks = serving(tmp_path, run)
    assert applied == [2, 2, 2, 2]
    assert checks == 4  # one a batch


def test_punctuation_logged_before_a_batch_applies_first_and_the_batch_is_judged_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch is judged on time (the punctuation logged before it waits for its fsync), but
    applies after that punctuation: judged again, its tuples are late for the strict query, and
    it is refused (as it is at replay)."""

    async def run(front: Front) -> tuple[list[Any], int, int]:
        calls = count_checks(monkeypatch)
        punctuate = front.submit(records.PunctuateRecord(time.time(), "S", "p", 40))
        outcome = await asyncio.gather(punctuate, batch(front, [12], "p"), return_exceptions=True)
        return outcome, calls[0], front.door.low_watermark("S")

    outcome, checks, low = serving(tmp_path, run)
    assert outcome[0] is None and isinstance(outcome[1], LateTuple), outcome
    assert (checks, low) == (2, 40)


def test_parts_admitted_before_their_stream_was_made_again_are_admitted_again(tmp_path: Path) -> None:
    """A batch's parts were admitted against stream S, which was then dropped and created again
    with another schema: the batch is admitted again from its bytes, refused, and not logged."""

    async def run(front: Front) -> tuple[Exception | None, int]:
        table = rows([5])
        admitted: list[Batch] = [front.door.admit("S", table)]
        epoch = front.door.epoch
        await front.submit(records.DropQueryRecord(time.time(), "q"))
        await front.submit(records.DropStreamRecord(time.time(), "S"))
        schema = {**SCHEMA, "v": "int64"}
        await front.submit(records.CreateStreamRecord(time.time(), "S", schema, "ts", "explicit", [], None))
        try:
            await front.submit_batch("S", "p", 0, [arrow(table)], admitted, epoch)
        except SchemaMismatch as exc:
            return exc, logged_batches(front)
        return None, logged_batches(front)

    refused, logged = serving(tmp_path, run)
    assert refused is not None and "v" in str(refused), refused
    assert logged == 0
