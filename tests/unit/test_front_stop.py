"""The front's stop drains: it waits until every worker has processed what it was sent, so that
their results reach the subscribers before the subscriptions end. A worker that has not answered
within the drain's timeout is not waited for, and one line on stderr says which and what is lost
(docs/design.md, "Runners" and "Durability")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lowtide.server import messages as msg
from lowtide.server.config import ServerConfig
from lowtide.server.front import Front


class _Workers:
    """Two workers that take everything at once; those in ``answering`` answer each Sync, the others
    never do (a worker stalled)."""

    size = 2

    def __init__(self, front: Front, answering: set[int]) -> None:
        self.front = front
        self.answering = answering

    def broadcast(self, message: msg.ToWorker) -> None:
        if isinstance(message, msg.SyncMessage):
            for worker in sorted(self.answering):
                self.front._on_message(worker, msg.SyncedMessage(message.token), {})

    async def idle(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def stop(answering: set[int], state_dir: Path | None = None) -> None:
    async def run() -> None:
        front = Front(ServerConfig(workers=2, metrics_port=-1, state_dir=str(state_dir or "")))
        front.workers = _Workers(front, answering)  # type: ignore[assignment]
        await front.stop(drain_timeout=0.05)
        assert not front._syncs  # the sync given up on is forgotten

    asyncio.run(run())


@pytest.mark.parametrize("durable", [False, True])
def test_a_drain_that_times_out_says_which_workers_and_what_is_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], durable: bool
) -> None:
    stop({0}, tmp_path if durable else None)
    after = (
        "the next start from --state-dir makes them from the input log"
        if durable
        else "they are lost (no --state-dir)"
    )
    assert capsys.readouterr().err.splitlines() == [
        "lowtide: stopping without a full drain: worker 1 did not answer within 0.05 s; results of "
        f"the input not processed yet reach no subscriber: {after}"
    ]
    stop(set())
    assert "workers 0, 1 did not answer within 0.05 s" in capsys.readouterr().err


def test_a_drain_every_worker_answers_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    stop({0, 1})
    assert capsys.readouterr().err == ""
