"""A worker's checkpoint without stopping the worker: fork, and let the child write the state.

The child sees the worker's memory as it was at the fork (copy on write), which is the state at
the checkpoint's barrier, so the worker goes on with its next message at once: its pause is the
fork (copying page tables, not the state), however large the state. The child snapshots, packs
and writes the file, then reports its size and CRC-32 on a pipe; a thread of the worker waits
for it and hands the report on (the front's manifest needs both, and reading a large file back
would hold up the front). The child runs at nice 10, so on a busy machine the live work comes
first, and dies with the worker (``PR_SET_PDEATHSIG``), so no writer outlives a worker the front
has replaced.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from lowtide.server.files import write_parts_atomically
from lowtide.snapshot import State, pack_parts

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork


@dataclass(frozen=True)
class Written:
    """What the child reports: the file's size and CRC-32, or why it could not write it."""

    size: int = 0
    crc32: int = 0
    error: str | None = None


def write_in_child(state_of: Callable[[], State], path: Path, done: Callable[[Written], None]) -> float:
    """Fork; the child writes ``state_of()`` to ``path``; ``done`` runs on a thread of this
    process once the child has ended. Returns how long this process stopped (seconds)."""
    began = time.perf_counter()
    reader, writer = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        _child(state_of, path, writer, parent)
    os.close(writer)
    pause = time.perf_counter() - began
    threading.Thread(target=_await, args=(pid, reader, done), name="checkpoint-writer", daemon=True).start()
    return pause


def _child(state_of: Callable[[], State], path: Path, report_to: int, parent: int) -> NoReturn:
    code = 1
    report: dict[str, object]
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the worker died before the line above
            os._exit(1)
        os.nice(10)  # the live work (front, workers) comes first on a busy machine
        size, crc = write_parts_atomically(path, pack_parts(state_of()))
        report, code = {"size": size, "crc32": crc}, 0
    except BaseException as exc:  # MemoryError, a full disk: the front abandons the checkpoint
        report = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        os.write(report_to, json.dumps(report).encode())
    finally:
        os._exit(code)  # never the parent's atexit handlers, shared memory or channels


def _await(pid: int, report_from: int, done: Callable[[Written], None]) -> None:
    with os.fdopen(report_from, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    try:
        report = json.loads(data)
        written = Written(int(report.get("size", 0)), int(report.get("crc32", 0)), report.get("error"))
    except ValueError:
        written = Written(error=f"the checkpoint writer ended (wait status {status}) without a report")
    done(written)
