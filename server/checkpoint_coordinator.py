"""When the server checkpoints, and the checkpoint in progress (see
:mod:`lowtide.server.checkpoint_store`): Flink's checkpoint coordinator.

A checkpoint begins when ``checkpoint_interval_s`` has passed or the log has grown by
``checkpoint_log_bytes`` since the last one (and something was logged since). At most one is in
progress; a worker that dies, a query registered or a stream dropped meanwhile abandons it (the
next one starts over). Once it is written, the checkpoints before the last two and the log they alone need go.
It sees the front only as its collaborators: the parts a snapshot holds
(:class:`~lowtide.server.front_snapshot.FrontParts`), the workers, the journal's position, the
state directory, the configuration and the metrics.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lowtide.server import messages as msg
from lowtide.server.checkpoint_store import CheckpointStore, LoadedCheckpoint, worker_file
from lowtide.server.config import ServerConfig
from lowtide.server.front_snapshot import FrontParts, door_state, output_state
from lowtide.server.journal import Journal, StateDirectory
from lowtide.server.metrics import ServerMetrics
from lowtide.server.server_door import Recorded
from lowtide.snapshot import State, pack_parts


class Workers(Protocol):
    """The worker pool as a checkpoint uses it: how many, and a message to one."""

    size: int

    def post(self, worker: int, message: msg.ToWorker, arrays: dict[str, Any] | None = None) -> None: ...


@dataclass
class _Pending:
    token: int  # tells its workers' answers from those of an abandoned one
    seq: int
    door: State
    directory: Path
    waiting: set[int]  # workers the barrier has not passed yet
    began: float
    channel: list[Recorded] = field(default_factory=list)
    pinned: list[int] = field(default_factory=list)  # the codes computed strings pinned meanwhile
    pauses: list[float] = field(default_factory=list)
    output: State | None = None  # taken when the barrier has passed every worker
    written: dict[int, tuple[int, int]] = field(default_factory=dict)  # worker -> size, CRC-32


class CheckpointCoordinator:
    def __init__(
        self,
        front: FrontParts,
        workers: Workers,
        journal: Journal,
        state: StateDirectory,
        config: ServerConfig,
        metrics: ServerMetrics,
        deliver: Callable[[int, Any, Any], None],
    ) -> None:
        """``deliver``: the front's handling of a worker's message (outputs, stats, a sync),
        which :meth:`holds` defers while a barrier is part way through the workers."""
        self.front = front
        self.workers = workers
        self.journal = journal
        self.metrics = metrics
        self.log = state.log
        self.store = CheckpointStore(state.path / "checkpoints")
        self.interval = config.checkpoint_interval_s
        self.log_bytes = config.checkpoint_log_bytes
        self.pending: _Pending | None = None
        self.restore_errors: list[str] = []
        self._last = time.monotonic()
        self._log_mark = 0
        self._covered = 0  # the log position of the last one taken
        self._tokens = itertools.count()
        # What workers sent after passing the barrier under way, while others have not: held
        # until the output side is taken, then handed to ``deliver`` in order.
        self._held: list[tuple[int, Any, Any]] = []
        self.deliver = deliver

    def load(self) -> LoadedCheckpoint | None:
        checkpoint = self.store.load(self.workers.size)
        if checkpoint is not None:
            self._covered = checkpoint.seq
        return checkpoint

    def maybe_begin(self) -> None:
        if self.pending is not None or self.interval <= 0:
            return
        grown = self.log.bytes_written - self._log_mark
        due = time.monotonic() - self._last >= self.interval or grown >= self.log_bytes
        if due and self.journal.applied_through + 1 > self._covered:
            self.begin()

    def begin(self) -> None:
        """Save the door at the current log position and send every worker its barrier."""
        seq = self.journal.applied_through + 1
        directory = self.store.begin(seq)
        pending = _Pending(
            next(self._tokens),
            seq,
            door_state(self.front, seq),
            directory,
            set(range(self.workers.size)),
            time.monotonic(),
        )
        self.pending = pending
        # What result streams send to workers meanwhile goes with the output side; so do the
        # codes of the strings the records before the barrier still make at the front (its last
        # Projects), as their results come back.
        self.front.door.record(pending.channel, pending.pinned)
        for worker in range(self.workers.size):
            self.workers.post(
                worker, msg.CheckpointMessage(pending.token, str(directory / worker_file(worker)))
            )

    def holds(self, worker: int, message: Any, arrays: Any) -> bool:
        """Keep ``worker``'s message for later if the barrier under way has passed it but not
        every worker: the output side a checkpoint saves is the output of the records before its
        log position, so nothing a worker made of what followed its barrier may reach the melds
        and hubs before that side is taken (a restore would replay it and emit it twice)."""
        pending = self.pending
        if pending is None or pending.output is not None or worker in pending.waiting:
            return False
        self._held.append((worker, message, arrays))
        return True

    def _release(self) -> None:
        held, self._held = self._held, []
        for worker, message, arrays in held:
            self.deliver(worker, message, arrays)

    def answered(
        self, worker: int, answer: msg.CheckpointedMessage | msg.PersistedMessage | msg.RestoredMessage
    ) -> None:
        if isinstance(answer, msg.RestoredMessage):
            if answer.error is not None:
                self.restore_errors.append(f"worker {worker}: {answer.error}")
            return
        pending = self.pending
        if pending is None or answer.token != pending.token:
            return  # an abandoned one
        if answer.error is not None:
            why = f"failed on worker {worker}: {answer.error}"
            print(f"lowtide: checkpoint {pending.seq} {why}", file=sys.stderr)
            self.abandon()
            return
        if isinstance(answer, msg.CheckpointedMessage):
            pending.pauses.append(answer.pause_s)
            pending.waiting.discard(worker)
            if not pending.waiting:
                # Every worker is past the barrier and the melds have released exactly the
                # output of the records before it: the output side, as of the barrier.
                self.front.door.record(None, None)
                pending.output = output_state(self.front, pending.channel, pending.pinned)
                self._release()
        else:
            pending.written[worker] = (answer.size, answer.crc32)
        if pending.output is not None and len(pending.written) == self.workers.size:
            self._complete(pending, pending.output)

    def _complete(self, pending: _Pending, output: State) -> None:
        self.pending = None
        written = [pending.written[w] for w in range(self.workers.size)]
        try:
            front_parts = pack_parts({"door": pending.door, "output": output})
            size = self.store.commit(pending.seq, front_parts, written, self.log.sync_extent())
        except OSError as exc:  # a full disk: the log still holds everything
            print(f"lowtide: checkpoint {pending.seq} not written: {exc.strerror or exc}", file=sys.stderr)
            self.store.abandon(pending.seq)
            return
        oldest = self.store.prune(keep=2)
        if oldest is not None:
            self.log.truncate_before(oldest)
        seconds = time.monotonic() - pending.began
        self.metrics.checkpoint_taken(seconds, size, pending.pauses)
        print(
            f"lowtide: checkpoint at change {pending.seq}: {size} bytes in {seconds:.3f} s, "
            f"workers paused {max(pending.pauses):.3f} s at most",
            file=sys.stderr,
        )
        self._last = time.monotonic()
        self._log_mark = self.log.bytes_written
        self._covered = pending.seq

    def abandon(self) -> None:
        pending = self.pending
        if pending is not None:
            self.pending = None
            self.front.door.record(None, None)
            self.store.abandon(pending.seq)
            self._release()
