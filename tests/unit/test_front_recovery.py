"""A worker's restore that fails once the server serves (a recovery from a worker's death) stops
the server, naming the worker and the error: going on would leave that worker without its state
and lose results unseen. At the start the same failure is the start's to report (it stops,
naming the file, once every worker answered). With ``--ray`` this is what a state directory not
every node reaches comes to."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lowtide.server import messages as msg
from lowtide.server.config import ServerConfig
from lowtide.server.front import Front


def front(state_dir: Path) -> Front:
    return Front(ServerConfig(workers=1, state_dir=str(state_dir), metrics_port=-1))


def test_a_restore_failing_while_serving_stops_the_server(tmp_path: Path) -> None:
    serving = front(tmp_path)
    serving.serving = True
    serving._on_message(0, msg.RestoredMessage(1, "FileNotFoundError: worker-0.state"), {})
    assert serving.stopping.is_set() and serving.exit_code == 1
    assert serving.gave_up == "cannot restore worker 0 from the checkpoint: FileNotFoundError: worker-0.state"


def test_a_restore_failing_at_the_start_is_left_to_the_start(tmp_path: Path) -> None:
    starting = front(tmp_path)
    starting._on_message(0, msg.RestoredMessage(0, "FileNotFoundError: worker-0.state"), {})
    assert not starting.stopping.is_set()
    assert starting.checkpoints is not None
    assert starting.checkpoints.restore_errors == ["worker 0: FileNotFoundError: worker-0.state"]


def test_what_a_worker_sends_after_its_barrier_waits_for_the_output_side(tmp_path: Path) -> None:
    """A checkpoint's output side is the output of the records before its log position: what a
    worker made of later records reaches the melds and hubs only once that side is taken (else
    a restore replays it and a subscriber gets it twice); an abandoned checkpoint lets it through."""

    async def run() -> None:
        serving = Front(ServerConfig(workers=2, state_dir=str(tmp_path), metrics_port=-1))
        checkpoints = serving.checkpoints
        assert checkpoints is not None
        for abandoned in (False, True):
            checkpoints.workers = _Silent()  # type: ignore[assignment]  # the barriers go nowhere
            checkpoints.begin()
            pending = checkpoints.pending
            assert pending is not None
            # worker 0 passed it
            serving._on_message(0, msg.CheckpointedMessage(pending.token, 0.0, None), {})
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            serving._syncs[7] = ({0}, done)
            serving._on_message(0, msg.SyncedMessage(7), {})  # what worker 0 did after its barrier
            assert not done.done() and pending.output is None
            if abandoned:
                checkpoints.abandon()
            else:
                serving._on_message(1, msg.CheckpointedMessage(pending.token, 0.0, None), {})
                assert pending.output is not None
            assert done.done()  # handed on in order once the side is taken, or the checkpoint gone
            checkpoints.abandon()

    asyncio.run(run())


class _Silent:
    size = 2

    def post(self, worker: int, message: object, arrays: object = None) -> None:
        pass
