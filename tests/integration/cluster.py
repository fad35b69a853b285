"""A ``--state-dir`` server that tests kill again and again, and what they check it with.

:class:`Cluster` keeps one port and one state directory across restarts, so clients reconnect
to the same address; :func:`retrying` redoes a client's work through the failures a crash
causes; :func:`rows` counts result rows, the multiset the in-process engine is compared with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from server_harness import Server, free_port, start_server

from lowtide.clients import Client
from lowtide.errors import LowtideError


class Cluster:
    """The server of the moment, on one port and one state directory; restarted after kills.
    ``options``: more of ``lowtide serve``'s (``--ray ADDRESS``: its workers are Ray actors)."""

    def __init__(self, state_dir: Path, checkpoint_interval_s: float, options: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.config = {
            "state_dir": str(state_dir),
            "retained_items": 100_000,
            "checkpoint_interval_s": checkpoint_interval_s,
        }
        self.target = f"127.0.0.1:{self.port}"
        self.options = options
        self.server: Server | None = start_server(*options, config=self.config, port=self.port)
        self.kills: list[str] = []

    def kill(self, what: str, restart: bool = True) -> None:
        """SIGKILL a ``worker`` (the server respawns it), the ``front`` or ``everything``; the
        last two are started again unless ``restart`` is false."""
        server = self.server
        assert server is not None
        workers = self.worker_pids()
        victims = {"worker": workers[-1:], "front": [server.pid], "everything": [server.pid, *workers]}[what]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):  # an actor Ray ended with its front
                os.kill(pid, signal.SIGKILL)
        self.kills.append(what)
        if what != "worker":
            server.process.wait(30)
            server.exit_code = 0  # killed on purpose
            self.server = start_server(*self.options, config=self.config, port=self.port) if restart else None

    def worker_pids(self) -> list[int]:
        """The workers' processes: the server's children, oldest first, or with ``--ray`` the
        actors' (on this machine's nodes) by worker index, as ``lowtide workers`` lists them."""
        assert self.server is not None
        if "--ray" not in self.options:
            return self.server.worker_pids()
        with Client(self.target, timeout=30) as client:
            return [w["pid"] for w in client.list_workers()]

    def start(self) -> None:
        self.server = start_server(*self.options, config=self.config, port=self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def retrying(work: Callable[[], None], deadline: float) -> None:
    """``work()`` again after any failure a crash can cause, until it completes."""
    while True:
        try:
            work()
            return
        except (LowtideError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def rows(items: list[Any]) -> Counter[tuple[Any, ...]]:
    """The result rows among ``items``, counted."""
    found: Counter[tuple[Any, ...]] = Counter()
    for item in items:
        if isinstance(item, pa.Table):
            found.update(tuple(row.values()) for row in item.to_pylist())
    return found
