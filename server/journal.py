"""The one order in which the server applies accepted changes, and the state directory it keeps.

Every change (see :mod:`lowtide.server.input_log`) goes through :meth:`Journal.submit`: appended
to the input log, then applied, in log order, then acknowledged. With ``fsync = "always"`` a
change is applied only once an fsync covers it (one fsync for every change waiting: group
commit); otherwise at once, after its ``write`` reached the OS. Without ``--state-dir`` there is no
log and changes apply directly, through the same code.

Invariant: the order of application equals the order in the log, so replaying the log at start
rebuilds the same streams, queries, windows and output offsets. A change is checked before it is
logged; one that fails as it applies all the same (another change applied first, between its check
and its turn) is followed in the log by a :class:`~lowtide.server.input_log.RefusedRecord` naming
it, so replay tells that failure from damage. What a change was made ready with before it was
logged (:data:`Prepared`) travels with it to its application, which redoes it if the door's
:class:`~lowtide.door.Epoch` moved since.

The state directory: ``D/lowtide-state.json`` (what wrote it, and the format), ``D/lock`` (one
server at a time), ``D/log/`` (the input log), ``D/checkpoints/``. Opening it changes nothing in
an existing one: recovery reads first, and changes files only once it has succeeded.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide import __version__
from lowtide.door import CheckedBatch
from lowtide.errors import StartupFailure
from lowtide.server.files import write_atomically
from lowtide.server.input_log import END, InputLog, Record, RefusedRecord, segment_name, segment_opening

FORMAT = 1  # of the state directory; a server refuses one written in another format


@dataclass(frozen=True)
class RestoredQuery:
    """A :class:`~lowtide.server.input_log.RegisterQueryRecord` applied again to restore a
    checkpoint: the query reads the slices it read when saved (``share``, a
    :func:`~lowtide.query.sharing.slices_key`)."""

    share: str


# What a record is made ready with, by kind: a batch as the door judged it (a BatchRecord's: it
# applies as judged in the same epoch only, see lowtide.door.Epoch), a query restored with its
# slices (a RegisterQueryRecord's, at a checkpoint's restore). Other kinds take none.
Prepared = CheckedBatch | RestoredQuery
Apply = Callable[[Record, Prepared | None], Any]


class StateDirectory:
    """An opened, locked state directory."""

    def __init__(self, path: str, fsync: str, truncate_tail: bool = False) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not (self.path / "lowtide-state.json").exists() and not _new(self.path):
                # Refused before the lock is made: a directory that is not ours stays as it was.
                raise StartupFailure(f"--state-dir {self.path} is not empty and holds no lowtide state")
            self._lock = os.open(self.path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StartupFailure(f"cannot use --state-dir {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StartupFailure(f"--state-dir {path} is in use by another lowtide server") from None
        self._check_format()
        self.log = InputLog(self.path / "log", fsync, truncate_tail=truncate_tail)

    def _check_format(self) -> None:
        marker = self.path / "lowtide-state.json"
        if marker.exists():
            try:
                found = json.loads(marker.read_text())
                form = int(found["format"])
            except (OSError, ValueError, KeyError, TypeError):
                raise StartupFailure(f"{marker} is damaged: not a lowtide state directory marker") from None
            if form != FORMAT:
                raise StartupFailure(
                    f"{self.path} holds state of format {form} (written by lowtide "
                    f"{found.get('version', '?')}); this lowtide {__version__} reads format {FORMAT}"
                )
            return
        # New (checked before the lock was made). The log first, the marker last: a directory with
        # the marker holds a log.
        InputLog.create(self.path / "log")
        write_atomically(marker, json.dumps({"format": FORMAT, "version": __version__}).encode() + b"\n")

    def close(self) -> None:
        self.log.close()
        os.close(self._lock)


def _new(path: Path) -> bool:
    """Whether ``path`` holds no state: nothing but the lock, or what a first start a crash
    interrupted leaves (the lock and a log of one empty segment, perhaps its end file, without
    the marker)."""
    found = {p.name for p in path.iterdir()} - {"lock"}
    if not found:
        return True
    log = path / "log"
    if found != {"log"} or not log.is_dir():
        return False
    names = {p.name for p in log.iterdir()}
    if segment_name(0) not in names or not names <= {segment_name(0), END, f"{END}.tmp"}:
        return False
    return (log / segment_name(0)).read_bytes() in (b"", segment_opening(0))


class Journal:
    """Log, then apply, in one order (see the module docstring)."""

    def __init__(self, apply: Apply, log: InputLog | None = None) -> None:
        self.apply = apply
        self.log = log
        self.applied_through = -1  # the number of the last logged record applied
        self.refused: set[int] = set()  # logged records that failed as they applied (see RefusedRecord)
        self._waiting: deque[tuple[int, Record, Prepared | None, asyncio.Future[Any]]] = deque()

    async def submit(self, record: Record, prepared: Prepared | None = None) -> Any:
        """Log ``record`` and apply it (``apply(record, prepared)``); its result or its error.

        A full disk raises ``ResourceExhausted`` with nothing applied.
        """
        if self.log is None:
            return self.apply(record, prepared)
        # Not into a new segment while a change logged before may still fail: its RefusedRecord must
        # come in the segment that holds it (replay reads a segment's refusals before its records).
        seq = self.log.append(record, may_rotate=not self._waiting)
        if self.log.fsync != "always":
            self.applied_through = seq
            try:
                return self.apply(record, prepared)
            except Exception as exc:
                self.refuse(exc, seq)
                raise
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((seq, record, prepared, future))
        self.log.when_durable(seq, self._durable)
        return await future

    def _durable(self, through: int) -> None:
        while self._waiting and self._waiting[0][0] <= through:
            seq, record, prepared, future = self._waiting.popleft()
            self.applied_through = seq
            try:
                result = self.apply(record, prepared)
            except Exception as exc:  # the submitter gets it, as without fsync
                self.refuse(exc, seq)
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(result)

    def refuse(self, exc: Exception, seq: int) -> None:
        """Record ``seq`` failed as it applied, after it was logged (its check passed, then another
        record applied first changed the verdict): say so in the log, on disk before anything
        after it is acknowledged, so that replay knows its failure from damage."""
        assert self.log is not None
        self.refused.add(seq)
        self.log.append(RefusedRecord(time.time(), seq, str(exc) or type(exc).__name__), may_rotate=False)
        if self.log.fsync == "always":
            self.log.sync_now()
