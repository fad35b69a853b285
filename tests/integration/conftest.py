"""A real ``lowtide serve`` for the integration tests, on a free loopback port.

The server runs as a subprocess of the test session (``--port 0``: it picks a free port and
prints it on its ready line); at the end it gets SIGTERM and must drain and exit 0. Tests get the
``host:port`` string from the ``target`` fixture and make names of their own with ``fresh``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

READY = re.compile(r"^lowtide serving on (\S+):(\d+) with (\d+) workers; metrics on (\S+)$")
START_TIMEOUT = 120.0  # seconds: first start compiles numba kernels
STOP_TIMEOUT = 60.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: runs against a real lowtide server subprocess")


def lowtide_command() -> list[str]:
    """The installed ``lowtide`` script beside this interpreter, else ``python -m lowtide.clients.cli``."""
    script = Path(sys.executable).with_name("lowtide")
    if script.exists():
        return [str(script)]
    found = shutil.which("lowtide")
    return [found] if found else [sys.executable, "-m", "lowtide.clients.cli"]


@dataclass
class RunningServer:
    process: subprocess.Popen[str]
    target: str
    workers: int
    metrics: str
    log: Path

    def stderr_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start_server(*extra: str, workers: int = 2) -> RunningServer:
    """Start ``lowtide serve`` on 127.0.0.1:0 and wait for its ready line."""
    log = Path(tempfile.mkstemp(prefix="lowtide-server-", suffix=".log")[1])
    command = [
        *lowtide_command(),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--workers",
        str(workers),
        "--metrics-port",
        "0",
        *extra,
    ]
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    first: list[str] = []
    reader = threading.Thread(
        target=lambda: first.append(process.stdout.readline() if process.stdout else "")
    )
    reader.start()
    reader.join(START_TIMEOUT)
    line = first[0].strip() if first else ""
    match = READY.match(line)
    if match is None:
        process.kill()
        process.wait()
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"lowtide serve did not start (first line {line!r}); stderr:\n{tail}")
    host, port, count, metrics = match.groups()
    return RunningServer(process, f"{host}:{port}", int(count), metrics, log)


def stop_server(server: RunningServer) -> int:
    """SIGTERM, then wait for the drain; returns the exit code (killed: -9 after the timeout)."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    if server.process.stdout is not None:
        server.process.stdout.close()
    return server.process.returncode


@pytest.fixture(scope="session")
def lowtide_server() -> Iterator[RunningServer]:
    server = start_server()
    try:
        yield server
    finally:
        code = stop_server(server)
        tail = server.stderr_tail()
        server.log.unlink(missing_ok=True)
    assert code == 0, f"lowtide serve exited {code} on SIGTERM; stderr:\n{tail}"


@pytest.fixture
def target(lowtide_server: RunningServer) -> str:
    """``host:port`` of the session's server."""
    assert lowtide_server.process.poll() is None, f"the server died:\n{lowtide_server.stderr_tail()}"
    return lowtide_server.target


_names = itertools.count(1)


@pytest.fixture
def fresh() -> Callable[[str], str]:
    """Unique stream and query names (the server is shared by the whole session)."""
    return lambda prefix: f"{prefix}_{os.getpid()}_{next(_names)}"
