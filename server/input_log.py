"""The input log of ``--state-dir``: every change the server accepts, in the order it applied them.

Each accepted call (a stream or query created or dropped, a batch with its id, a punctuation, a
source closed, a heartbeat, idle timeout or EMIT EVERY timer that came due) becomes a
:class:`Record`, appended here *before* it is applied and acknowledged. Replaying the records
in order through the same code reproduces the server's state and every query's output item for
item: the door is deterministic given the records, and each record carries the wall-clock time
it was applied at.

Invariant: a record acknowledged to a client is in the log (written to the OS; with
``fsync = "always"`` also on the disk) and is applied exactly once per life of the server, at its
position. A record that failed to apply (a late tuple under ``late='error'``, say) fails the same
way at replay: it is kept, and changes nothing either time.

Layout: ``D/log/<first sequence number>.seg`` files of frames ``[length u32][crc32 u32][payload]``,
payload ``[header length u32][JSON header][blob]`` (the blob is the Arrow IPC stream of a batch).
A frame cut short or failing its CRC at the end of the last segment is a write torn by a crash:
it was never acknowledged, and recovery drops it. Anywhere else it is damage, and recovery stops
naming the file.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from lowtide.errors import ResourceExhausted, StartupFailure
from lowtide.server.files import fsync_directory

_FRAME = struct.Struct("<II")
_HEADER_LENGTH = struct.Struct("<I")
SEGMENT_BYTES = 64 << 20  # a new segment starts past this size: old ones go whole
FSYNC_POLICIES = ("no", "always", "everysec")
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


@dataclass(frozen=True)
class Record:
    """One accepted change. ``now``: the wall-clock time the door applied it at (seconds)."""

    kind: ClassVar[str] = ""
    now: float

    def blob(self) -> bytes:
        return b""


@dataclass(frozen=True)
class CreateStream(Record):
    kind: ClassVar[str] = "create_stream"
    name: str
    schema: dict[str, str]
    progressing: str
    punctuation: str
    sources: list[str]
    idle_timeout: float | None


@dataclass(frozen=True)
class DropStream(Record):
    kind: ClassVar[str] = "drop_stream"
    name: str


@dataclass(frozen=True)
class RegisterQuery(Record):
    kind: ClassVar[str] = "register_query"
    sql: str
    name: str | None  # None: the engine names it (q1, q2, ...), the same way at replay
    late: str
    allowed_lateness: str | int | None


@dataclass(frozen=True)
class DropQuery(Record):
    kind: ClassVar[str] = "drop_query"
    name: str


@dataclass(frozen=True)
class FailQuery(Record):
    """A query stopped by the server (over its state limit): a decision made on the wall clock,
    so it is recorded rather than made again at replay."""

    kind: ClassVar[str] = "fail_query"
    name: str
    status: str
    reason: str


@dataclass(frozen=True)
class Batch(Record):
    kind: ClassVar[str] = "batch"
    stream: str
    source: str
    batch_id: int
    parts: tuple[bytes, ...] = field(repr=False)  # the Arrow IPC stream of each part, as received

    def blob(self) -> bytes:
        return b"".join(self.parts)


@dataclass(frozen=True)
class Punctuate(Record):
    kind: ClassVar[str] = "punctuate"
    stream: str
    source: str
    value: int


@dataclass(frozen=True)
class CloseSource(Record):
    kind: ClassVar[str] = "close_source"
    stream: str
    source: str


@dataclass(frozen=True)
class Tick(Record):
    """Heartbeats or idle timeouts moved some stream, or EMIT EVERY timers came due, at ``now``:
    applying it runs the engine's clock (``Engine.tick``) there, live and at replay alike."""

    kind: ClassVar[str] = "tick"


_KINDS: dict[str, type[Record]] = {
    k.kind: k
    for k in (
        CreateStream,
        DropStream,
        RegisterQuery,
        DropQuery,
        FailQuery,
        Batch,
        Punctuate,
        CloseSource,
        Tick,
    )
}


def encode(record: Record) -> bytes:
    fields = asdict(record)
    if isinstance(record, Batch):
        fields["parts"] = [len(part) for part in record.parts]
    header = json.dumps({"kind": record.kind, **fields}, separators=(",", ":")).encode()
    return _HEADER_LENGTH.pack(len(header)) + header + record.blob()


def decode(payload: bytes) -> Record:
    (length,) = _HEADER_LENGTH.unpack_from(payload)
    fields = json.loads(payload[4 : 4 + length])
    kind = _KINDS[fields.pop("kind")]
    if kind is Batch:
        at, parts = 4 + length, []
        for size in fields["parts"]:
            parts.append(payload[at : at + size])
            at += size
        fields["parts"] = tuple(parts)
    return kind(**fields)


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


class Damaged(StartupFailure):
    """A log or checkpoint file that cannot be read as written."""


def _segments(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.glob("*.seg"):
        try:
            found.append((int(path.stem), path))
        except ValueError:
            raise Damaged(f"unexpected file in the input log: {path}") from None
    return sorted(found)


def _frames(path: Path, last: bool) -> Iterator[tuple[int, bytes]]:
    """``(end offset, payload)`` of each whole frame; ``last``: the last segment, opened at start,
    whose torn tail is cut off (anywhere else a bad frame is damage)."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        whole = len(data) - at >= _FRAME.size
        length, crc = _FRAME.unpack_from(data, at) if whole else (0, 0)
        end = at + _FRAME.size + length
        payload = data[at + _FRAME.size : end]
        if whole and end <= len(data) and zlib.crc32(payload) == crc:
            at = end
            yield at, payload
            continue
        # Only the last frame of the last segment can be torn by a crash (each frame is one
        # write, appended): anything else is damage to records that were acknowledged.
        if not last or end < len(data):
            raise Damaged(f"the input log is damaged at byte {at} of {path}")
        with path.open("r+b") as f:  # never acknowledged: drop it so appends follow whole frames
            f.truncate(at)
        return


class InputLog:
    """Appends records (numbered from 0 over the life of the state directory) and reads them back."""

    def __init__(self, directory: Path, fsync: str = "no") -> None:
        if fsync not in FSYNC_POLICIES:
            raise StartupFailure(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.directory = directory
        self.fsync = fsync
        directory.mkdir(parents=True, exist_ok=True)
        self.next_seq = 0  # the number the next record gets
        self.bytes_written = 0  # since this process opened the log
        self._fd = -1
        self._segment_start = 0
        self._segment_bytes = 0
        self._synced = threading.Condition()
        self._written_seq = -1  # highest seq written to the OS
        self._durable_seq = -1  # highest seq known on disk (fsync "always")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[int], None] | None = None
        self._syncer: threading.Thread | None = None
        self._stopping = False

    # -- reading ------------------------------------------------------------------------------
    def replay(self, start: int = 0) -> Iterator[tuple[int, Record]]:
        """At start: every whole record numbered ``start`` or later, in order; a torn last record
        is cut off, and the log is left ready to append after the last whole one."""
        return self._read(start, opening=True)

    def records(self, start: int) -> Iterator[tuple[int, Record]]:
        """While the log is open for appends: the records from ``start`` on, changing nothing."""
        return self._read(start, opening=False)

    def _read(self, start: int, opening: bool) -> Iterator[tuple[int, Record]]:
        segments = _segments(self.directory)
        seq = segments[0][0] if segments else start
        if segments and seq > start:
            raise Damaged(f"the input log starts at record {seq}, but recovery needs it from {start}")
        for index, (first, path) in enumerate(segments):
            if first != seq:
                raise Damaged(f"the input log misses records {seq} to {first - 1} before {path}")
            last = index == len(segments) - 1
            for _end, payload in _frames(path, last and opening):
                if seq >= start:
                    try:
                        record = decode(payload)
                    except (ValueError, KeyError, TypeError, struct.error) as exc:
                        raise Damaged(f"unreadable record {seq} in {path}: {exc}") from None
                    yield seq, record
                seq += 1
            if last and opening:
                self._segment_start = first
                self._segment_bytes = path.stat().st_size
        if opening:
            self.next_seq = max(seq, start)
            self._written_seq = self._durable_seq = self.next_seq - 1

    # -- writing ------------------------------------------------------------------------------
    def append(self, record: Record) -> int:
        """Write ``record`` to the OS (one ``write``) and return its number.

        A full disk raises :class:`ResourceExhausted` and leaves the log as it was.
        """
        data = frame(encode(record))
        if self._fd < 0 or self._segment_bytes >= SEGMENT_BYTES:
            self._open_segment()
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            os.ftruncate(self._fd, self._segment_bytes)  # a partial frame must not stay behind
            os.lseek(self._fd, self._segment_bytes, os.SEEK_SET)
            if exc.errno in _DISK_FULL:
                raise ResourceExhausted(
                    f"the state directory is full: {exc.strerror}; nothing was applied"
                ) from None
            raise ResourceExhausted(f"cannot write the input log: {exc.strerror or exc}") from None
        seq = self.next_seq
        self.next_seq += 1
        self._segment_bytes += len(data)
        self.bytes_written += len(data)
        with self._synced:
            self._written_seq = seq
            self._synced.notify()
        return seq

    def _open_segment(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)  # a segment is complete on disk before the next begins
            os.close(self._fd)
            self._segment_bytes = 0
            self._segment_start = self.next_seq
        path = self.directory / f"{self._segment_start:020d}.seg"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fsync_directory(self.directory)

    def when_durable(self, seq: int, callback: Callable[[int], None]) -> None:
        """Call ``callback(highest durable seq)`` on the event loop once record ``seq`` survives a
        power loss (``fsync = "always"``): one fsync covers every record written before it."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._syncer = threading.Thread(target=self._sync_loop, name="lowtide-fsync", daemon=True)
            self._syncer.start()
        self._callback = callback
        with self._synced:
            self._synced.notify()

    def _sync_loop(self) -> None:
        assert self._loop is not None
        while True:
            with self._synced:
                while not self._stopping and self._written_seq <= self._durable_seq:
                    self._synced.wait()
                if self._stopping:
                    return
                target, fd = self._written_seq, self._fd
            try:
                os.fsync(fd)
            except OSError:
                continue  # rotated meanwhile: the closed segment was synced, the next round covers it
            self._durable_seq = max(self._durable_seq, target)
            if self._callback is not None:
                self._loop.call_soon_threadsafe(self._callback, self._durable_seq)

    def sync_every_second(self) -> None:
        """``fsync = "everysec"``: called by the server's ticker once a second."""
        if self.fsync == "everysec" and self._fd >= 0:
            os.fsync(self._fd)

    def truncate_before(self, seq: int) -> None:
        """Remove the segments whose records all come before ``seq`` (a checkpoint covers them)."""
        segments = _segments(self.directory)
        for (_first, path), (next_first, _) in itertools.pairwise(segments):
            if next_first <= seq:
                path.unlink()

    def close(self) -> None:
        with self._synced:
            self._stopping = True
            self._synced.notify()
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
