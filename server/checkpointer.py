"""When the server checkpoints, and the checkpoint in progress (see :mod:`lowtide.server.checkpoint`).

A checkpoint begins when ``checkpoint_interval_s`` has passed or the log has grown by
``checkpoint_log_bytes`` since the last one (and something was logged since). At most one is in
progress; a worker that dies, or a query registered meanwhile, abandons it (the next one starts
over). Once it is written, the checkpoints before the last two and the log they alone need go.
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowtide.operators.state import State, pack
from lowtide.server.checkpoint import Checkpoint, CheckpointStore, worker_file
from lowtide.server.front_state import Message, door_state, output_state

if TYPE_CHECKING:
    from lowtide.server.front import Front


@dataclass
class _Pending:
    token: int  # tells its workers' answers from those of an abandoned one
    seq: int
    door: State
    directory: Path
    waiting: set[int]
    began: float
    channel: list[Message] = field(default_factory=list)


class Checkpointer:
    def __init__(self, front: Front) -> None:
        assert front.state is not None
        self.front = front
        self.log = front.state.log
        self.store = CheckpointStore(front.state.path / "checkpoints")
        self.interval = front.config.checkpoint_interval_s
        self.log_bytes = front.config.checkpoint_log_bytes
        self.pending: _Pending | None = None
        self.restore_errors: list[str] = []
        self.taken = 0
        self.last_seconds = 0.0  # from barrier to manifest, of the last one taken
        self.last_bytes = 0  # on disk, of the last one taken
        self._last = time.monotonic()
        self._log_mark = 0
        self._covered = 0  # the log position of the last one taken
        self._tokens = itertools.count()

    def load(self) -> Checkpoint | None:
        checkpoint = self.store.load(self.front.workers.size)
        if checkpoint is not None:
            self._covered = checkpoint.seq
        return checkpoint

    def maybe_begin(self) -> None:
        if self.pending is not None or self.interval <= 0:
            return
        grown = self.log.bytes_written - self._log_mark
        due = time.monotonic() - self._last >= self.interval or grown >= self.log_bytes
        if due and self.front.journal.applied_through + 1 > self._covered:
            self.begin()

    def begin(self) -> None:
        """Save the door at the current log position and send every worker its barrier."""
        front = self.front
        seq = front.journal.applied_through + 1
        directory = self.store.begin(seq)
        pending = _Pending(
            next(self._tokens),
            seq,
            door_state(front, seq),
            directory,
            set(range(front.workers.size)),
            time.monotonic(),
        )
        self.pending = pending
        front.engine.recording = pending.channel
        for worker in range(front.workers.size):
            front.workers.post(worker, ("checkpoint", pending.token, str(directory / worker_file(worker))))

    def answered(self, worker: int, kind: str, token: Any, error: str | None) -> None:
        if kind == "restored":
            if error is not None:
                self.restore_errors.append(f"worker {worker}: {error}")
            return
        pending = self.pending
        if pending is None or token != pending.token:
            return  # an abandoned one
        if error is not None:
            print(f"lowtide: checkpoint {pending.seq} failed on worker {worker}: {error}", file=sys.stderr)
            self.abandon()
            return
        pending.waiting.discard(worker)
        if not pending.waiting:
            self._complete(pending)

    def _complete(self, pending: _Pending) -> None:
        front = self.front
        front.engine.recording = None
        self.pending = None
        output = output_state(front, pending.channel)
        try:
            self.store.commit(pending.seq, pack({"door": pending.door, "output": output}), front.workers.size)
        except OSError as exc:  # a full disk: the log still holds everything
            print(f"lowtide: checkpoint {pending.seq} not written: {exc.strerror or exc}", file=sys.stderr)
            self.store.abandon(pending.seq)
            return
        oldest = self.store.prune(keep=2)
        if oldest is not None:
            self.log.truncate_before(oldest)
        self.taken += 1
        self.last_seconds = time.monotonic() - pending.began
        self.last_bytes = sum(p.stat().st_size for p in pending.directory.iterdir())
        self._last = time.monotonic()
        self._log_mark = self.log.bytes_written
        self._covered = pending.seq

    def abandon(self) -> None:
        pending = self.pending
        if pending is not None:
            self.pending = None
            self.front.engine.recording = None
            self.store.abandon(pending.seq)
