"""Staged batches: one batch written by many tasks, applied when its committer says so.

Spark's ``format("lowtide")`` writer: every task stages its partition's rows as a *part* of the
batch ``(stream, source, batch_id)``; the driver's commit applies the parts it names as one batch
under that id (once: a batch applied before is acknowledged and skipped), or aborts them.

Invariant: a part acknowledged to its task is kept until its batch commits or aborts, or until
``staging_timeout_s`` after it was staged. With ``--state-dir`` it is a file of ``D/staging/``,
written whole (and fsynced under ``fsync = "always"``) before the acknowledgement, so a restart
of the server keeps it. A commit logs the batch in the input log before its parts' files go: a
crash between the two finds the files at start, their batch applied, and removes them.

A part's file: one frame as the input log writes them (length, CRC-32, payload); the payload is a
JSON header (stream, source, batch id, part, when staged, each message's size) and the Arrow IPC
streams the task sent, as sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.errors import InvalidArgument, NotFound, ResourceExhausted
from lowtide.server.files import fsync_directory
from lowtide.server.input_log import frame

log = logging.getLogger("lowtide.server")

BatchKey = tuple[str, str, int]  # (stream, source, batch_id)
MAX_PART_NAME = 256  # bytes of a part's name
_FRAME = struct.Struct("<II")
_HEADER_LENGTH = struct.Struct("<I")


def check_part_name(name: str) -> None:
    if not name or len(name.encode()) > MAX_PART_NAME or "\x00" in name:
        raise InvalidArgument(f"a staged part needs a name of 1 to {MAX_PART_NAME} bytes without NUL")


@dataclass
class KeptPart:
    """A staged part as the server keeps it: in memory (``payloads``) or in its file (``path``)."""

    size: int  # its Arrow bytes
    staged_at: float  # wall-clock seconds
    payloads: tuple[bytes, ...] | None
    path: Path | None


class StagingArea:
    """The parts staged so far, per batch, within ``max_bytes``; kept in ``directory`` if any."""

    def __init__(self, directory: Path | None, fsync: bool, timeout_s: float, max_bytes: int) -> None:
        self.directory = directory
        self.fsync = fsync
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.batches: dict[BatchKey, dict[str, KeptPart]] = {}
        self.bytes = 0  # of every part staged, and of those being received
        self.expired = 0  # parts dropped after staging_timeout_s, since the start
        self._writes = itertools.count()  # each write its own temporary file

    # -- staging ----------------------------------------------------------------------------------
    def reserve(self, size: int) -> None:
        """Room for ``size`` more bytes (a message being received), or ResourceExhausted."""
        if self.bytes + size > self.max_bytes:
            raise ResourceExhausted(
                f"staging {size} more bytes would pass max_staged_bytes ({self.max_bytes}): "
                f"{self.bytes} bytes are staged; commit or abort staged batches first"
            )
        self.bytes += size

    def release(self, size: int) -> None:
        self.bytes -= size

    async def stage(self, key: BatchKey, name: str, payloads: list[bytes]) -> None:
        """Keep the part (its bytes already reserved), replacing one staged before under ``name``.

        A call cancelled meanwhile keeps nothing: its file is written under a name of its own
        (a ``.tmp``) and renamed here, on the event loop, only if the call is still running."""
        size = sum(len(p) for p in payloads)
        part = KeptPart(size, time.time(), tuple(payloads), None)
        if self.directory is not None:
            path = self.directory / _file_name(key, name)
            temporary = path.with_name(f"{path.name}.{next(self._writes)}.tmp")
            data = frame(_encode(key, name, part.staged_at, payloads))
            write = asyncio.get_running_loop().run_in_executor(None, _write, temporary, data, self.fsync)
            try:
                await asyncio.shield(write)  # the thread runs on when the call is cancelled
                os.replace(temporary, path)
                if self.fsync:
                    fsync_directory(path.parent)
            except asyncio.CancelledError:
                write.add_done_callback(lambda done: _remove(temporary, done))
                raise
            except OSError as exc:
                _remove(temporary)
                reason = exc.strerror or str(exc)
                raise ResourceExhausted(f"cannot stage the part in {path.parent}: {reason}") from None
            part = KeptPart(size, part.staged_at, None, path)
        self._forget(key, name)
        self.batches.setdefault(key, {})[name] = part

    def _forget(self, key: BatchKey, name: str) -> KeptPart | None:
        part = self.batches.get(key, {}).pop(name, None)
        if part is not None:
            self.bytes -= part.size
            if not self.batches[key]:
                del self.batches[key]
        return part

    # -- committing and aborting --------------------------------------------------------------
    def payloads(self, key: BatchKey, names: list[str]) -> list[bytes]:
        """The Arrow IPC streams of the named parts, in that order; NotFound naming a
        part not staged (never sent, aborted, or expired)."""
        staged = self.batches.get(key, {})
        missing = [name for name in names if name not in staged]
        if missing:
            stream, source, batch_id = key
            raise NotFound(
                f"batch {batch_id} of stream {stream!r} source {source!r} has no staged part "
                f"{missing[0]!r} ({len(staged)} staged): it was never staged, was aborted, or was "
                f"dropped after staging_timeout_s ({self.timeout_s:g} s); nothing of the batch was applied"
            )
        found: list[bytes] = []
        for name in names:
            part = staged[name]
            if part.payloads is not None:
                found.extend(part.payloads)
            else:
                assert part.path is not None
                found.extend(_read(part.path)[1])
        return found

    def discard(self, key: BatchKey) -> int:
        """Drop every part of the batch (committed, aborted, expired); how many there were."""
        parts = self.batches.get(key, {})
        names = list(parts)
        for name in names:
            part = self._forget(key, name)
            if part is not None and part.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    part.path.unlink()
        return len(names)

    def expire(self, now: float) -> int:
        """Drop the parts staged more than ``timeout_s`` ago; how many."""
        dropped = 0
        for key in list(self.batches):
            for name, part in list(self.batches[key].items()):
                if now - part.staged_at > self.timeout_s:
                    self._forget(key, name)
                    if part.path is not None:
                        with contextlib.suppress(FileNotFoundError):
                            part.path.unlink()
                    dropped += 1
        self.expired += dropped
        return dropped

    # -- at start ----------------------------------------------------------------------------------
    def load(self, applied: Callable[[BatchKey], bool]) -> tuple[int, int]:
        """The parts a server before this one staged in ``directory`` (made if missing): kept,
        except those of a batch ``applied`` (committed, then the server stopped before their
        files went) and files that cannot be read (a task that stages again finds them missing: nothing was
        applied). Returns how many parts were kept and dropped."""
        assert self.directory is not None
        self.directory.mkdir(exist_ok=True)
        kept = dropped = 0
        for path in sorted(self.directory.iterdir()):
            if path.suffix != ".part":  # a ".tmp" a crash left behind: never acknowledged
                path.unlink()
                continue
            try:
                header, payloads = _read(path)
                key: BatchKey = (str(header["stream"]), str(header["source"]), int(header["batch_id"]))
                name, staged_at = str(header["part"]), float(header["staged_at"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("lowtide: dropped staged part %s: %s", path, exc)
                path.unlink()
                dropped += 1
                continue
            if applied(key):
                path.unlink()
                continue
            size = sum(len(p) for p in payloads)
            self.batches.setdefault(key, {})[name] = KeptPart(size, staged_at, None, path)
            self.bytes += size
            kept += 1
        return kept, dropped

    @property
    def parts(self) -> int:
        return sum(len(parts) for parts in self.batches.values())


def _file_name(key: BatchKey, name: str) -> str:
    stream, source, batch_id = key
    digest = hashlib.sha256("\x00".join((stream, source, name)).encode()).hexdigest()[:32]
    return f"{batch_id:020d}-{digest}.part"


def _encode(key: BatchKey, name: str, staged_at: float, payloads: list[bytes]) -> bytes:
    stream, source, batch_id = key
    header = json.dumps(
        {
            "stream": stream,
            "source": source,
            "batch_id": batch_id,
            "part": name,
            "staged_at": staged_at,
            "sizes": [len(p) for p in payloads],
        },
        separators=(",", ":"),
    ).encode()
    return _HEADER_LENGTH.pack(len(header)) + header + b"".join(payloads)


def _read(path: Path) -> tuple[dict[str, Any], list[bytes]]:
    """A part's file: its header and its Arrow IPC streams; ValueError if it is not whole."""
    data = path.read_bytes()
    if len(data) < _FRAME.size + _HEADER_LENGTH.size:
        raise ValueError("cut short")
    length, crc = _FRAME.unpack_from(data)
    payload = memoryview(data)[_FRAME.size :]
    if length != len(payload) or zlib.crc32(payload) != crc:
        raise ValueError("its length or CRC does not match its bytes")
    (header_length,) = _HEADER_LENGTH.unpack_from(payload)
    header = json.loads(bytes(payload[_HEADER_LENGTH.size : _HEADER_LENGTH.size + header_length]))
    at = _HEADER_LENGTH.size + header_length
    payloads = []
    for size in header["sizes"]:
        payloads.append(bytes(payload[at : at + int(size)]))
        at += int(size)
    return header, payloads


def _write(temporary: Path, data: bytes, fsync: bool) -> None:
    """``temporary`` (a ``.tmp``, renamed to the part's file once whole: a crash before leaves it,
    dropped at the next start) holds ``data``. Without ``fsync`` it survives a crash of the
    process, not of the machine."""
    with temporary.open("wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def _remove(temporary: Path, write: asyncio.Future[None] | None = None) -> None:
    """A part's temporary file that will not be renamed: removed (once ``write`` is over, what
    it raised is moot)."""
    if write is not None and not write.cancelled():
        write.exception()
    with contextlib.suppress(OSError):
        temporary.unlink()


__all__ = ["BatchKey", "StagingArea", "check_part_name"]
