"""A worker's checkpoint file is written by a forked child: the state as it was at the fork,
whatever the worker does next, and a report the front can trust (size and CRC-32, or why not)."""

from __future__ import annotations

import os
import signal
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lowtide.server.snapshot_writer import Written, write_in_child
from lowtide.snapshot import State, as_array, as_dict, unpack


def written(state_of: Callable[[], State], path: Path) -> tuple[Written, float]:
    ended = threading.Event()
    reports: list[Written] = []

    def done(report: Written) -> None:
        reports.append(report)
        ended.set()

    pause = write_in_child(state_of, path, done)
    assert ended.wait(60)
    return reports[0], pause


def test_the_file_holds_the_state_at_the_fork(tmp_path: Path) -> None:
    live = np.arange(1_000_000, dtype=np.int64)
    ended = threading.Event()
    reports: list[Written] = []
    path = tmp_path / "worker-0.state"

    def done(report: Written) -> None:
        reports.append(report)
        ended.set()

    write_in_child(lambda: {"cells": live.copy()}, path, done)
    live[:] = -1  # the worker goes on at once
    assert ended.wait(60)
    data = path.read_bytes()
    assert reports == [Written(len(data), zlib.crc32(data), None)]
    saved = as_array(as_dict(unpack(data), "state")["cells"], "cells", np.int64, 1)
    assert np.array_equal(saved, np.arange(1_000_000, dtype=np.int64))


def test_a_failing_snapshot_is_reported_not_raised(tmp_path: Path) -> None:
    def broken() -> State:
        raise MemoryError("no room for the copy")

    report, _ = written(broken, tmp_path / "worker-0.state")
    assert report == Written(error="MemoryError: no room for the copy")
    assert not (tmp_path / "worker-0.state").exists()


def test_a_writer_killed_midway_is_reported(tmp_path: Path) -> None:
    def killed() -> State:
        os.kill(os.getpid(), signal.SIGKILL)
        return {}

    report, _ = written(killed, tmp_path / "worker-0.state")
    assert report.error is not None and "without a report" in report.error
