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
The log always holds at least one segment (its first is made with the state directory). A
segment that a newer one follows ends with a *seal*, a frame that is no record: the next segment
is made before the seal is written, so a log whose last segment ends sealed has lost the
segments after it.

Recovery tells apart (docs/design.md, "Durability"): a frame cut short or failing its CRC at the end
of the last segment, with no whole frame after it, is a write torn by a crash: it was never
acknowledged, and is cut off once recovery has succeeded (the start says how many bytes). A bad
frame anywhere else (a damaged length field included: the whole frames after it prove it), a gap
between segments, a missing directory or segment (a sealed last segment included), or a log with
fewer records than a checkpoint's manifest says it held (:class:`Extent`) is damage to acknowledged
records: the start stops naming the file, having changed nothing.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from lowtide.errors import ResourceExhausted, StartupFailure
from lowtide.server.files import fsync_directory, write_atomically

_FRAME = struct.Struct("<II")
_HEADER_LENGTH = struct.Struct("<I")
_HEADER_START = b'{"kind":'  # every JSON header's first bytes (encode puts "kind" first)
_SEAL = b'{"kind":"seal"'  # the header of a segment's seal (see the module docstring)
_REFUSED = b'{"kind":"refused"'  # the header of a RefusedRecord (found without reading the rest)
_FIRST = b'{"kind":"segment"'  # the header of the frame that opens a segment, naming its first record
END = "end"  # the file in the log's directory that says how far the log reached (see _EndMark)
_END_SLOT = struct.Struct("<QQQQI")  # generation, records, segment's first record, its bytes; CRC-32
_END_SLOTS = 2  # written in turn: a torn write spoils one, the other still says the end before it
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
class CreateStreamRecord(Record):
    kind: ClassVar[str] = "create_stream"
    name: str
    schema: dict[str, str]
    progressing: str
    punctuation: str
    sources: list[str]
    idle_timeout: float | None


@dataclass(frozen=True)
class DropStreamRecord(Record):
    kind: ClassVar[str] = "drop_stream"
    name: str


@dataclass(frozen=True)
class RegisterQueryRecord(Record):
    kind: ClassVar[str] = "register_query"
    sql: str
    name: str | None  # None: the door names it (q1, q2, ...), the same way at replay
    late: str
    allowed_lateness: str | int | None
    # What the query runs under, as configured when it was registered (None in the records of an
    # older lowtide: today's configuration): a restart with other settings replays it the same.
    windows_per_step: int | None = None
    flush_every: int | None = None
    flush_max_windows: int | None = None


@dataclass(frozen=True)
class DropQueryRecord(Record):
    kind: ClassVar[str] = "drop_query"
    name: str


@dataclass(frozen=True)
class FailQueryRecord(Record):
    """A query stopped by the server (over its state limit): a decision made on the wall clock,
    so it is recorded rather than made again at replay."""

    kind: ClassVar[str] = "fail_query"
    name: str
    status: str
    reason: str


@dataclass(frozen=True)
class BatchRecord(Record):
    kind: ClassVar[str] = "batch"
    stream: str
    source: str
    batch_id: int
    parts: tuple[bytes, ...] = field(repr=False)  # the Arrow IPC stream of each part, as received

    def blob(self) -> bytes:
        return b"".join(self.parts)


@dataclass(frozen=True)
class PunctuateRecord(Record):
    kind: ClassVar[str] = "punctuate"
    stream: str
    source: str
    value: int


@dataclass(frozen=True)
class CloseSourceRecord(Record):
    kind: ClassVar[str] = "close_source"
    stream: str
    source: str


@dataclass(frozen=True)
class TickRecord(Record):
    """Heartbeats or idle timeouts moved some stream, or EMIT EVERY timers came due, at ``now``:
    applying it runs the door's clock (``Door.tick``) there, live and at replay alike."""

    kind: ClassVar[str] = "tick"


@dataclass(frozen=True)
class RefusedRecord(Record):
    """Record ``seq`` failed when it applied (a change another record applied first, in the time
    between its check and its turn): it changes nothing live, nor at replay. Any other record
    that fails at replay is damage (see :mod:`lowtide.server.front`)."""

    kind: ClassVar[str] = "refused"
    seq: int
    reason: str


_KINDS: dict[str, type[Record]] = {
    k.kind: k
    for k in (
        CreateStreamRecord,
        DropStreamRecord,
        RegisterQueryRecord,
        DropQueryRecord,
        FailQueryRecord,
        BatchRecord,
        PunctuateRecord,
        CloseSourceRecord,
        TickRecord,
        RefusedRecord,
    )
}


def encode(record: Record) -> bytes:
    fields = asdict(record)
    if isinstance(record, BatchRecord):
        fields["parts"] = [len(part) for part in record.parts]
    header = json.dumps({"kind": record.kind, **fields}, separators=(",", ":")).encode()
    return _HEADER_LENGTH.pack(len(header)) + header + record.blob()


def decode(payload: bytes) -> Record:
    (length,) = _HEADER_LENGTH.unpack_from(payload)
    fields = json.loads(payload[4 : 4 + length])
    kind = _KINDS[fields.pop("kind")]
    if kind is BatchRecord:
        at, parts = 4 + length, []
        for size in fields["parts"]:
            parts.append(payload[at : at + size])
            at += size
        fields["parts"] = tuple(parts)
    return kind(**fields)


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def seal(next_segment: str) -> bytes:
    """The frame that ends a segment a newer one follows: not a record, it is not numbered."""
    header = json.dumps({"kind": "seal", "next": next_segment}, separators=(",", ":")).encode()
    return frame(_HEADER_LENGTH.pack(len(header)) + header)


def _is_seal(data: bytes, at: int) -> bool:
    """Whether the whole frame at ``at`` is a seal."""
    return data.startswith(_SEAL, at + _FRAME.size + _HEADER_LENGTH.size)


def segment_opening(first: int) -> bytes:
    """The frame that begins the segment whose first record is ``first``: not a record, it is not
    numbered. A segment renamed, or its name's digits damaged, no longer matches it."""
    header = json.dumps({"kind": "segment", "first": first}, separators=(",", ":")).encode()
    return frame(_HEADER_LENGTH.pack(len(header)) + header)


def _opened_at(data: bytes, end: int) -> int | None:
    """The first record named by the whole frame ``data[:end]`` if it opens a segment, else None."""
    lead = _FRAME.size + _HEADER_LENGTH.size
    if not data.startswith(_FIRST, lead):
        return None
    try:
        return int(json.loads(data[lead:end])["first"])
    except (ValueError, KeyError, TypeError):
        return None


class Damaged(StartupFailure):
    """A log or checkpoint file that cannot be read as written."""


@dataclass(frozen=True)
class Extent:
    """How far the input log reached when a checkpoint's manifest was written (the log is fsynced
    first, so all of it was on disk): a log found shorter has lost acknowledged records."""

    records: int  # records 0 .. records - 1 were in the log
    segment: str  # the segment it ended in ("": a manifest of an older lowtide did not say)
    bytes: int  # that segment's size then
    manifest: Path  # the file that says so


@dataclass(frozen=True)
class TornTail:
    """The bytes after the last whole frame of the last segment: a write a crash tore, or, on the
    operator's word (``--truncate-log-tail``), damaged records that are given up."""

    path: Path
    at: int  # where the torn frame begins
    size: int  # the segment's size, torn frame included
    lost: int = 0  # acknowledged records given up (0: a torn write, never acknowledged)

    @property
    def dropped(self) -> int:
        return self.size - self.at


@dataclass(frozen=True)
class EndMark:
    """How far the log reached when it last wrote ``D/log/end``: the records written and acknowledged
    up to then (with ``fsync = "always"``, those on the disk). The log's own bytes cannot vouch
    for their length (a segment cut at a record boundary reads as a log that ended there), so a
    log found shorter than this has lost acknowledged records."""

    records: int
    segment: str
    bytes: int
    path: Path


class _EndFile:
    """``D/log/end``: two slots written in turn, each ``[generation][records][segment's first record]
    [its bytes][CRC-32]``; the whole slot with the highest generation counts. Mapped into memory:
    a slot is written with a copy, not a system call (it reaches the file as the log's pages
    do: a ``kill -9`` loses neither; :meth:`sync` puts it on the disk)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        found = read_end(path)
        self._generation = found[1] if found is not None else 0
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _END_SLOTS * _END_SLOT.size:
                os.ftruncate(fd, _END_SLOTS * _END_SLOT.size)  # zeros: slots no CRC matches
            self._map = mmap.mmap(fd, _END_SLOTS * _END_SLOT.size)
        finally:
            os.close(fd)

    def write(self, records: int, segment_first: int, size: int) -> None:
        self._generation += 1
        at = (self._generation % _END_SLOTS) * _END_SLOT.size
        self._map[at : at + _END_SLOT.size] = _end_slot(self._generation, records, segment_first, size)

    def sync(self) -> None:
        self._map.flush()

    def close(self) -> None:
        self._map.close()


def _end_slot(generation: int, records: int, segment_first: int, size: int) -> bytes:
    body = _END_SLOT.pack(generation, records, segment_first, size, 0)[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def read_end(path: Path) -> tuple[EndMark, int] | None:
    """The end ``path`` records and its generation; None if there is no such file (a log of an
    older lowtide). Both slots damaged: :class:`Damaged`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    best: tuple[EndMark, int] | None = None
    for slot in range(_END_SLOTS):
        chunk = data[slot * _END_SLOT.size : (slot + 1) * _END_SLOT.size]
        if len(chunk) < _END_SLOT.size:
            continue
        generation, records, first, size, crc = _END_SLOT.unpack(chunk)
        if zlib.crc32(chunk[:-4]) != crc or generation % _END_SLOTS != slot:
            continue
        if best is None or generation > best[1]:
            best = EndMark(records, segment_name(first), size, path), generation
    if best is None and data:
        raise Damaged(f"{path}, which says how far the input log reached, is damaged")
    return best


def segment_name(first: int) -> str:
    return f"{first:020d}.seg"


def _segments(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.glob("*.seg"):
        try:
            found.append((int(path.stem), path))
        except ValueError:
            raise Damaged(f"unexpected file in the input log: {path}") from None
    return sorted(found)


def _frame_end(data: bytes, at: int) -> int:
    """The end of the frame at ``at`` if it is whole (within ``data``, its CRC right), else -1."""
    if len(data) - at < _FRAME.size:
        return -1
    length, crc = _FRAME.unpack_from(data, at)
    end = at + _FRAME.size + length
    if length < _HEADER_LENGTH.size or end > len(data):
        return -1
    return end if zlib.crc32(memoryview(data)[at + _FRAME.size : end]) == crc else -1


def _next_frame(data: bytes, at: int) -> int:
    """Where the first whole frame beginning after ``at`` begins, or -1. Every payload begins with
    its header's length and the JSON header, which begins with :data:`_HEADER_START`: a frame
    can begin only that far before where those bytes occur, so the search is one pass."""
    lead = _FRAME.size + _HEADER_LENGTH.size
    found = data.find(_HEADER_START, at + 1 + lead)
    while found >= 0:
        if _frame_end(data, found - lead) >= 0:
            return found - lead
        found = data.find(_HEADER_START, found + 1)
    return -1


def _refusals(data: bytes) -> set[int]:
    """The records the :class:`RefusedRecord` records among the whole frames of ``data`` name, found by
    their header's first bytes (no other record is decoded)."""
    lead = _FRAME.size + _HEADER_LENGTH.size
    found: set[int] = set()
    at = data.find(_REFUSED, lead)
    while at >= 0:
        end = _frame_end(data, at - lead)
        if end >= 0:
            try:
                record = decode(data[at - lead + _FRAME.size : end])
            except (ValueError, KeyError, TypeError, struct.error):
                record = None  # unreadable: the replay names it
            if isinstance(record, RefusedRecord):
                found.add(record.seq)
        at = data.find(_REFUSED, at + 1)
    return found


def _whole_length(data: bytes, at: int) -> bool:
    """Whether the frame at ``at`` has all the bytes its length field declares (a valid one)."""
    if len(data) - at < _FRAME.size:
        return False
    length = int(_FRAME.unpack_from(data, at)[0])
    return length >= _HEADER_LENGTH.size and at + _FRAME.size + length <= len(data)


def _frames_from(data: bytes, at: int) -> int:
    """How many whole frames that are records there are from the whole frame at ``at`` on."""
    count = 0
    while at >= 0:
        count += not _is_seal(data, at)
        end = _frame_end(data, at)
        at = end if _frame_end(data, end) >= 0 else _next_frame(data, end)
    return count


def _check_tail(path: Path, data: bytes, at: int, last: bool, repair: bool, vouched: bool) -> TornTail:
    """The bytes of ``path`` from ``at`` on are not a whole frame: a torn write, or damage.

    Only the last frame of the last segment can be torn (each frame is one write, appended), and
    then no whole frame follows it, and it ends before its declared length, unless ``D/log/end``
    does not vouch for it (not ``vouched``: a power loss may leave a frame's length on disk and
    not all its bytes). A frame the end vouches for, its declared bytes all there but failing the
    CRC, was written whole and acknowledged: damage, as is a bad frame that whole frames follow
    (a length field with a flipped bit, say). Damage raises :class:`Damaged`, unless ``repair``
    (the operator's ``--truncate-log-tail``) gives up the last segment's records from ``at`` on."""
    hint = " (lowtide serve --truncate-log-tail drops it and what follows, on your word)"
    if not last:
        raise Damaged(f"the input log is damaged at byte {at} of {path}")
    after = _next_frame(data, at)
    if after < 0 and not (vouched and _whole_length(data, at)):
        return TornTail(path, at, len(data))
    lost = 1 + (_frames_from(data, after) if after >= 0 else 0)
    if repair:
        return TornTail(path, at, len(data), lost)
    if after >= 0:
        raise Damaged(
            f"the input log is damaged at byte {at} of {path}: whole records follow it from byte "
            f"{after}{hint}"
        )
    raise Damaged(
        f"the last record of {path}, at byte {at}, fails its CRC: it was written whole, so it was "
        f"acknowledged and damaged since, not torn by a crash{hint}"
    )


class InputLog:
    """Appends records (numbered from 0 over the life of the state directory) and reads them back.

    Opening it is :meth:`replay`, which changes nothing, then :meth:`recovered` once the server
    has recovered: only then is a torn tail cut off and appending begins.
    """

    def __init__(
        self,
        directory: Path,
        fsync: str = "no",
        segment_bytes: int = SEGMENT_BYTES,
        truncate_tail: bool = False,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise StartupFailure(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
        self.directory = directory
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.truncate_tail = truncate_tail  # the operator gives up a damaged or cut tail (see _check_tail)
        self.next_seq = 0  # the number the next record gets
        self.bytes_written = 0  # since this process opened the log
        self._fd = -1
        self._segment_start = 0
        self._segment_bytes = 0
        self._torn: TornTail | None = None
        # The records a RefusedRecord names, in the segments read so far: one is in the segment of
        # the record it names (see append), so a segment's are known before its records are read.
        self.refused: set[int] = set()
        self._end: _EndFile | None = None
        self._shortfall = (
            0  # records the end file vouches for that are gone (given up on the operator's word)
        )
        self._synced = threading.Condition()
        self._written_seq = -1  # highest seq written to the OS
        self._durable_seq = -1  # highest seq known on disk (fsync "always")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[int], None] | None = None
        self._syncer: threading.Thread | None = None
        self._stopping = False
        self._written_end = (0, 0, 0)  # what _mark_end records once the fsync of _written_seq is done

    @staticmethod
    def create(directory: Path) -> None:
        """A new, empty log: its directory, its first segment (a log always holds one, so an
        empty directory is a log whose segments were deleted) and its end (a log whose segments
        open with their first record's number always has one, so it cannot be deleted unseen)."""
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / segment_name(0), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(fd, segment_opening(0))
            os.fsync(fd)
        finally:
            os.close(fd)
        first = _end_slot(1, 0, 0, len(segment_opening(0)))  # generation 1: the second slot
        write_atomically(directory / END, bytes(_END_SLOT.size) + first)

    # -- reading ------------------------------------------------------------------------------
    def replay(self, start: int = 0, extent: Extent | None = None) -> Iterator[tuple[int, Record]]:
        """At start: every whole record numbered ``start`` or later, in order, changing nothing.

        Raises :class:`Damaged`, naming the file, for a log that misses records (a gap between
        segments, records before ``start``, fewer records than ``extent`` or ``D/log/end`` say it
        held), a segment whose name is not its first record's, or a bad frame anywhere but a torn
        last one. A torn last frame is only noted: see :meth:`recovered`. With ``truncate_tail``
        damage within the last segment, and a log cut short of its end, are noted too, as given up.
        """
        return self._read(start, extent, opening=True)

    def records(self, start: int) -> Iterator[tuple[int, Record]]:
        """While the log is open for appends: the records from ``start`` on, changing nothing."""
        return self._read(start, None, opening=False)

    def _read(self, start: int, extent: Extent | None, opening: bool) -> Iterator[tuple[int, Record]]:
        if not self.directory.is_dir():
            raise Damaged(f"the input log {self.directory} is missing")
        segments = _segments(self.directory)
        if not segments:
            raise Damaged(f"the input log {self.directory} holds no segment (a log always holds one)")
        end_mark = self._read_end() if opening else None
        opened = False  # a segment opens with its first record's number: this lowtide wrote the log
        seq, path = segments[0]
        if seq > start:
            why = (
                f"the checkpoint restored covers only the records before {start}"
                if start
                else "no whole checkpoint covers the records before it"
            )
            raise Damaged(f"the input log begins at record {seq} in {path}, but {why}")
        for index, (first, path) in enumerate(segments):
            data = path.read_bytes()
            self.refused |= _refusals(data)
            at = 0  # where the whole frames end
            if (end := _frame_end(data, 0)) >= 0 and (named := _opened_at(data, end)) is not None:
                opened = True
                if named != first:
                    raise Damaged(
                        f"{path} holds the records from {named} on: its name says {first} "
                        "(renamed, or its name damaged)"
                    )
                at = end
            if first != seq:
                raise Damaged(f"the input log misses records {seq} to {first - 1} before {path}")
            last = opening and index == len(segments) - 1
            sealed = False
            while (end := _frame_end(data, at)) >= 0:
                sealed = _is_seal(data, at)
                if sealed:
                    at = end
                    continue
                if seq >= start:
                    try:
                        record = decode(data[at + _FRAME.size : end])
                    except (ValueError, KeyError, TypeError, struct.error) as exc:
                        raise Damaged(f"unreadable record {seq} in {path}: {exc}") from None
                    yield seq, record
                seq += 1
                at = end
            if at < len(data):
                vouched = end_mark is None or seq < end_mark.records  # an older lowtide's log: no end
                self._torn = _check_tail(path, data, at, last and not sealed, self.truncate_tail, vouched)
            if sealed and index == len(segments) - 1:
                raise Damaged(f"the input log misses the segment(s) after {path}, which ends sealed")
            if last:
                self._segment_start = first
                self._segment_bytes = at
        if not opening:
            return
        hint = "; lowtide serve --truncate-log-tail gives them up, on your word"
        if extent is not None and seq < extent.records and not (self.truncate_tail and seq >= start):
            then = ""
            if extent.segment:
                then = f", through byte {extent.bytes} of {self.directory / extent.segment}"
            raise Damaged(
                f"the input log ends at record {seq} in {path}, but {extent.manifest} was written when "
                f"it held {extent.records} records{then}: a segment is missing or cut short"
                + (hint if seq >= start else "")
            )
        if opened and end_mark is None and not self.truncate_tail:  # written with the first segment
            missing = self.directory / END
            raise Damaged(f"{missing}, which says how far the input log reached, is missing{hint}")
        if end_mark is not None and seq < end_mark.records:
            if not self.truncate_tail:
                raise Damaged(
                    f"the input log ends at record {seq} in {path}, but {end_mark.path} says "
                    f"{end_mark.records} records were written, through byte {end_mark.bytes} of "
                    f"{end_mark.segment}: {end_mark.records - seq} acknowledged records are missing{hint}"
                )
            self._shortfall = end_mark.records - seq
        self.next_seq = seq
        self._written_seq = self._durable_seq = seq - 1

    def _read_end(self) -> EndMark | None:
        try:
            found = read_end(self.directory / END)
        except Damaged:
            if self.truncate_tail:
                return None  # written again once recovered
            raise
        return found[0] if found is not None else None

    def segment_of(self, seq: int) -> Path:
        """The segment that holds record ``seq``."""
        firsts = [(first, path) for first, path in _segments(self.directory) if first <= seq]
        return firsts[-1][1] if firsts else self.directory

    def recovered(self) -> TornTail | None:
        """The server has recovered: cut off the torn last frame, if any (never acknowledged, and
        appends must follow whole frames), and open the last segment for appends. Returns what was
        cut off, with the acknowledged records given up on the operator's word."""
        torn, self._torn = self._torn, None
        path = self.directory / segment_name(self._segment_start)
        if torn is not None:
            os.truncate(path, torn.at)
        if self._shortfall:
            size = torn.size if torn is not None else self._segment_bytes
            at = torn.at if torn is not None else self._segment_bytes
            torn = TornTail(path, at, size, max(self._shortfall, torn.lost if torn is not None else 0))
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.fsync(self._fd)
        if (self.directory / END).exists() and self.truncate_tail:
            (self.directory / END).unlink()  # damaged, or vouching for what was given up
        self._end = _EndFile(self.directory / END)
        self._mark_end()
        self._end.sync()
        fsync_directory(self.directory)
        return torn

    def _mark_end(self) -> None:
        """Record in ``D/log/end`` that the log reaches its present end."""
        assert self._end is not None
        self._end.write(self.next_seq, self._segment_start, self._segment_bytes)

    # -- writing ------------------------------------------------------------------------------
    def append(self, record: Record, may_rotate: bool = True) -> int:
        """Write ``record`` to the OS (one ``write``) and return its number. Not ``may_rotate``:
        in the current segment whatever its size (a :class:`RefusedRecord` stays with the record it
        names, and so do records logged while one may still fail: see the journal).

        A full disk raises :class:`ResourceExhausted` and leaves the log as it was.
        """
        assert self._fd >= 0, "append before recovered()"
        data = frame(encode(record))
        full = self._segment_bytes >= self.segment_bytes and self.next_seq > self._segment_start
        # (a segment holds a record at least)
        if full and may_rotate and not isinstance(record, RefusedRecord):
            self._next_segment()
        self._write(data)
        seq = self.next_seq
        self.next_seq += 1
        if self.fsync != "always":  # written to the OS, acknowledged: the end vouches for it
            self._mark_end()
        with self._synced:
            self._written_seq = seq
            self._written_end = (self.next_seq, self._segment_start, self._segment_bytes)
            self._synced.notify()
        return seq

    def sync_now(self) -> None:
        """Make everything written so far durable, here and now (a rare record, :class:`RefusedRecord`,
        that must not wait for the next group commit)."""
        os.fsync(self._fd)

    def _write(self, data: bytes) -> None:
        """Append one frame to the current segment (one ``write``); a full disk raises
        :class:`ResourceExhausted` and leaves the segment as it was."""
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
        self._segment_bytes += len(data)
        self.bytes_written += len(data)

    def _next_segment(self) -> None:
        """Begin the next segment: made (and in its directory, its opening frame in it) before the
        current one is sealed, so a crash between the two leaves an unsealed segment and a new one
        holding at most its opening, not a seal whose next segment is missing."""
        name = segment_name(self.next_seq)
        head = segment_opening(self.next_seq)
        try:
            # Truncated: a try a full disk stopped may have left part of its opening behind.
            fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        except OSError as exc:
            raise ResourceExhausted(
                f"cannot begin a segment of the input log: {exc.strerror or exc}"
            ) from None
        try:
            if os.write(fd, head) != len(head):
                raise OSError(errno.ENOSPC, "short write")
            fsync_directory(self.directory)
            self._write(seal(name))
            os.fsync(self._fd)  # a segment is complete on disk before the next begins
        except OSError as exc:
            os.close(fd)
            raise ResourceExhausted(
                f"cannot begin a segment of the input log: {exc.strerror or exc}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        self._segment_bytes = len(head)
        self._segment_start = self.next_seq

    def sync_extent(self) -> tuple[int, str, int]:
        """Make everything written so far durable; how far the log reaches: its records, the
        segment it ends in and that segment's size (a checkpoint's manifest records them, see
        :class:`Extent`)."""
        os.fsync(self._fd)
        return self.next_seq, segment_name(self._segment_start), self._segment_bytes

    def when_durable(self, seq: int, callback: Callable[[int], None]) -> None:
        """Call ``callback(highest durable seq)`` on the event loop once record ``seq`` survives a
        power loss (``fsync = "always"``): one fsync covers every record written before it."""
        self._callback = callback  # before the thread starts: its first fsync calls it
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._syncer = threading.Thread(target=self._sync_loop, name="lowtide-fsync", daemon=True)
            self._syncer.start()
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
                target, fd, end = self._written_seq, self._fd, self._written_end
            try:
                os.fsync(fd)
            except OSError:
                continue  # rotated meanwhile: the closed segment was synced, the next round covers it
            if self._end is not None and target > self._durable_seq:  # on disk: the end vouches for it
                self._end.write(*end)
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
        if self._end is not None:
            if self._syncer is not None:
                self._syncer.join()  # it may be writing the end
            self._mark_end()
            self._end.close()
            self._end = None
