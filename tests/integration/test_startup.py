"""``lowtide serve`` either starts alone on its ports or fails at once, in one line, exit 1.

A port another process holds is an error for the gRPC port and the metrics port alike (never a
second server sharing the port through ``SO_REUSEPORT``); so are settings the server cannot honour.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_harness import lowtide_command

from lowtide import __version__
from lowtide.clients import Client

pytestmark = pytest.mark.integration


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [*lowtide_command(), "serve", "--host", "127.0.0.1", "--workers", "1", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""  # no ready line
    return lines[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port with a listener of this test's own on 127.0.0.1."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def test_a_second_server_on_a_port_in_use_fails_and_the_first_keeps_serving(target: str) -> None:
    port = target.rsplit(":", 1)[1]
    with Client(target, timeout=10) as client:
        before = client.list_streams()
        line = one_line_failure(serve("--port", port, "--metrics-port", "-1"))
        assert line == f"lowtide: cannot serve gRPC on 127.0.0.1:{port}: address already in use"
        for _ in range(5):  # every call reaches the one server there is
            assert client.list_streams() == before


def test_a_metrics_port_in_use_fails_in_one_line(held_port: int) -> None:
    line = one_line_failure(serve("--port", "0", "--metrics-port", str(held_port)))
    assert line == f"lowtide: cannot serve metrics on 127.0.0.1:{held_port}: address already in use"


def test_a_grpc_port_held_by_another_program_fails(held_port: int) -> None:
    line = one_line_failure(serve("--port", str(held_port), "--metrics-port", "-1"))
    assert line == f"lowtide: cannot serve gRPC on 127.0.0.1:{held_port}: address already in use"


def test_settings_the_server_cannot_honour_fail_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not lowtide's")
    line = one_line_failure(serve("--port", "0", "--state-dir", str(tmp_path)))
    assert line == f"lowtide: --state-dir {tmp_path} is not empty and holds no lowtide state"
    bad_fsync = serve("--port", "0", "--config", str(_config(tmp_path)))
    assert "fsync must be one of" in one_line_failure(bad_fsync)
    assert "out of range" in one_line_failure(serve("--port", "70000"))
    assert "cannot serve gRPC on nohost.invalid:0" in one_line_failure(
        subprocess.run(
            [*lowtide_command(), "serve", "--host", "nohost.invalid", "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    )


def test_version() -> None:
    done = subprocess.run([*lowtide_command(), "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"lowtide {__version__}")


def _config(directory: Path) -> Path:
    path = directory / "fsync.toml"
    path.write_text('fsync = "sometimes"\n')
    return path
