"""A worker's restore that fails once the server serves (a recovery from a worker's death) stops
the server, naming the worker and the error: going on would leave that worker without its state
and lose results unseen. At the start the same failure is the start's to report (it stops,
naming the file, once every worker answered). With ``--ray`` this is what a state directory not
every node reaches comes to."""

from __future__ import annotations

from pathlib import Path

from lowtide.server import messages as msg
from lowtide.server.config import ServerConfig
from lowtide.server.front import Front


def front(state_dir: Path) -> Front:
    return Front(ServerConfig(workers=1, state_dir=str(state_dir), metrics_port=-1))


def test_a_restore_failing_while_serving_stops_the_server(tmp_path: Path) -> None:
    serving = front(tmp_path)
    serving.serving = True
    serving._on_message(0, msg.Restored(1, "FileNotFoundError: worker-0.state"), {})
    assert serving.stopping.is_set() and serving.exit_code == 1
    assert serving.gave_up == "cannot restore worker 0 from the checkpoint: FileNotFoundError: worker-0.state"


def test_a_restore_failing_at_the_start_is_left_to_the_start(tmp_path: Path) -> None:
    starting = front(tmp_path)
    starting._on_message(0, msg.Restored(0, "FileNotFoundError: worker-0.state"), {})
    assert not starting.stopping.is_set()
    assert starting.checkpoints is not None
    assert starting.checkpoints.restore_errors == ["worker 0: FileNotFoundError: worker-0.state"]
