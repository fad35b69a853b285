"""A one-way channel between two processes: numpy columns through shared memory.

The payload of a message (the columns of a batch) is copied once into a shared-memory ring; a
small header (the message as its direction's :class:`~lowtide.server.messages.Codec` encodes it,
and the columns' names, dtypes, offsets) travels over a pipe. The reader copies the columns out
and advances the ring's read position, which it keeps in the ring's first 8 bytes.
A writer that finds the ring full waits for the reader: that is the backpressure that slows a
fast producer down instead of dropping or buffering without bound.

Layout of the shared segment: ``[read_position: uint64][pad to 64][ring bytes ...]``. Positions
only grow; ``position % capacity`` is the offset in the ring. A payload never wraps: when it does
not fit before the end, the writer skips to the start of the ring. Columns larger than the whole
ring travel inside the header instead (rare: a result wider than the ring).

On the pipe a header is one *frame*: ``[magic: u32][sequence: u32][length: u64][bytes]``. The
reader assembles frames from whatever the pipe yields, so a message is read whole or not at all
however the writes were split; a non-blocking reader (the front's, under the event loop) keeps a
partial frame until the rest arrives. A frame whose magic or sequence number is not the next one
means the two ends are out of step: :class:`ChannelBroken`, which the front treats as the
worker's failure (it respawns and recovers it), never as a message to skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle as _pickle  # headers between our own processes, never from the network
import struct
import termios
import threading
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from lowtide.server.messages import Codec

_HEADER = 64
_ALIGN = 64
_FRAME = struct.Struct("<IIQ")  # magic, sequence number (mod 2**32), length of the pickled header
_MAGIC = 0x4C544648  # "LTFH"
_READ_CHUNK = 1 << 20
Arrays = dict[str, npt.NDArray[Any]]
M = TypeVar("M")  # the messages of the channel's direction
_INLINE = -1  # a layout offset: the column travels in the header, not in the ring


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


class ChannelFull(Exception):
    """The ring or the pipe has no room for the message now; retry after the reader catches up."""


class ChannelBroken(Exception):
    """The two ends of the channel are out of step (a frame is not the one expected)."""


class ChannelWriter(Generic[M]):
    """Writes frames to the pipe. On a blocking pipe (a worker's) a send returns once its frame is
    written whole; on a non-blocking one (the front's) what the pipe does not take now stays
    pending and goes first at the next :meth:`flush` or send: a frame is never interleaved."""

    def __init__(self, shm: shared_memory.SharedMemory, conn: Connection, codec: Codec[M]) -> None:
        self._shm = shm
        self._conn = conn
        self._fd = conn.fileno()
        self._codec = codec
        self._capacity = shm.size - _HEADER
        self._read = np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)
        self._write = 0
        self._sequence = 0
        self._pending = memoryview(b"")
        self._pipe_capacity = _widen_pipe(self._fd)
        self._sending = threading.Lock()  # a worker's checkpoint thread sends too

    def fileno(self) -> int:
        return self._fd

    @property
    def pending(self) -> bool:
        """Part of a frame is still waiting for room in the pipe."""
        return len(self._pending) > 0

    def flush(self) -> bool:
        """Write what is pending, as far as the pipe takes it now; True once nothing is."""
        while self._pending:
            try:
                written = os.write(self._fd, self._pending)
            except BlockingIOError:
                return False
            self._pending = self._pending[written:]
        return True

    def try_send(self, message: M, arrays: Arrays | None = None) -> None:
        """Send or raise :class:`ChannelFull` without blocking: neither the ring nor the pipe
        may be short of room (a writer blocked on a full pipe while its reader waits to send to
        it would deadlock both processes)."""
        if not self.flush():
            raise ChannelFull()
        layout: list[tuple[str, str, tuple[int, ...], int]] = []
        inline: Arrays = {}
        start = end = self._write
        if arrays:
            sizes = [_aligned(a.nbytes) for a in arrays.values()]
            total = sum(sizes)
            if total > self._capacity:  # can never fit the ring: the columns ride in the header
                inline = arrays
                layout = [(name, a.dtype.str, a.shape, _INLINE) for name, a in arrays.items()]
            else:
                offset = start % self._capacity
                if offset + total > self._capacity:  # do not wrap a payload: skip to the ring's start
                    start += self._capacity - offset
                    offset = 0
                if start + total - int(self._read[0]) > self._capacity:
                    raise ChannelFull()
                for (name, array), size in zip(arrays.items(), sizes, strict=True):
                    layout.append((name, array.dtype.str, array.shape, offset))
                    offset += size
                end = start + total
        header = _pickle.dumps(
            (self._codec.encode(message), layout, end, inline), protocol=_pickle.HIGHEST_PROTOCOL
        )
        frame_bytes = _FRAME.size + len(header)
        if frame_bytes > _pipe_room(self._fd, self._pipe_capacity) and frame_bytes <= self._pipe_capacity:
            raise ChannelFull()  # wait for room rather than leave a small frame half written
        if arrays and not inline:
            ring = self._shm.buf
            for (_, array), (_, dtype, shape, at) in zip(arrays.items(), layout, strict=True):
                view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=ring, offset=_HEADER + at)
                view[...] = array
            self._write = end
        self._pending = memoryview(_FRAME.pack(_MAGIC, self._sequence, len(header)) + header)
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        self.flush()

    def send(self, message: M, arrays: Arrays | None = None, timeout: float | None = None) -> None:
        """Send, waiting while the ring is full (for processes without an event loop; safe from
        several threads of one)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 1e-5
        while True:
            try:
                with self._sending:
                    self.try_send(message, arrays)
                return
            except ChannelFull:
                if deadline is not None and time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)

    def close(self) -> None:
        self._conn.close()


class ChannelReader(Generic[M]):
    def __init__(self, shm: shared_memory.SharedMemory, conn: Connection, codec: Codec[M]) -> None:
        self._shm = shm
        self._conn = conn
        self._fd = conn.fileno()
        self._codec = codec
        self._capacity = shm.size - _HEADER
        self._read = np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)
        self._sequence = 0
        self._buffer = bytearray()
        self._at = 0  # where the next frame begins in the buffer (consumed bytes go at a refill)

    def fileno(self) -> int:
        return self._fd

    def recv(self) -> tuple[M, Arrays]:
        """The next message and its columns, waiting for it (a blocking pipe: a worker's)."""
        while (frame := self._next_frame()) is None:
            if not self._fill():
                raise EOFError
        return self._decode(frame)

    def receive(self) -> Iterator[tuple[M, Arrays]]:
        """Every message whose frame is whole now, without waiting (a non-blocking pipe: the
        front's); a partial frame stays buffered. Raises EOFError once the writer is gone and
        every frame it wrote whole was yielded (a frame its death cut short is no message)."""
        ended = False
        with contextlib.suppress(BlockingIOError):
            while not ended:
                ended = not self._fill()
        while (frame := self._next_frame()) is not None:
            yield self._decode(frame)
        if ended:
            raise EOFError

    def _fill(self) -> bool:
        """Append what one read of the pipe gives; False at its end (the writer closed it)."""
        data = os.read(self._fd, _READ_CHUNK)
        if self._at:  # drop what was consumed once per read, not once per frame
            del self._buffer[: self._at]
            self._at = 0
        self._buffer += data
        return bool(data)

    def _next_frame(self) -> bytes | None:
        at = self._at
        if len(self._buffer) - at < _FRAME.size:
            return None
        magic, sequence, length = _FRAME.unpack_from(self._buffer, at)
        if magic != _MAGIC or sequence != self._sequence:
            raise ChannelBroken(
                f"frame {sequence:#x} (magic {magic:#x}) where frame {self._sequence:#x} was due"
            )
        end = at + _FRAME.size + length
        if len(self._buffer) < end:
            return None
        frame = bytes(self._buffer[at + _FRAME.size : end])
        self._at = end
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        return frame

    def _decode(self, frame: bytes) -> tuple[M, Arrays]:
        try:
            encoded, layout, end, inline = _pickle.loads(frame)
            message = self._codec.decode(encoded)
        except Exception as exc:  # a frame of the right length but not a header of ours
            raise ChannelBroken(f"undecodable frame: {type(exc).__name__}: {exc}") from exc
        arrays: Arrays = {}
        in_ring = False
        for name, dtype, shape, offset in layout:
            if offset == _INLINE:
                arrays[name] = inline[name]
                continue
            view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=self._shm.buf, offset=_HEADER + offset)
            arrays[name] = view.copy()
            in_ring = True
        if in_ring:
            self._read[0] = end  # the ring up to ``end`` may be written again
        return message, arrays


def create_segment(capacity: int) -> shared_memory.SharedMemory:
    """A ring of ``capacity`` bytes, named after this process (see :func:`remove_stale_segments`)."""
    name = f"{SEGMENT_PREFIX}{os.getpid()}_{os.urandom(6).hex()}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=_HEADER + capacity)
    np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)[0] = 0
    return shm


SEGMENT_PREFIX = "lowtide_"
_SHM_DIR = "/dev/shm"


def remove_stale_segments() -> list[str]:
    """Unlink the rings of servers that are gone (killed before they could remove their own):
    a segment is named after the process that created it, and is stale once that process is."""
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return []  # no /dev/shm to look in: nothing this can find
    removed = []
    for name in names:
        owner = _owner(name)
        if owner is None or _alive(owner):
            continue
        with contextlib.suppress(FileNotFoundError):  # another start removed it first
            os.unlink(os.path.join(_SHM_DIR, name))
            removed.append(name)
    return removed


def _owner(name: str) -> int | None:
    if not name.startswith(SEGMENT_PREFIX):
        return None
    pid, _, _ = name[len(SEGMENT_PREFIX) :].partition("_")
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive, and not ours to judge
    return True


def _widen_pipe(fd: int) -> int:
    """Give the pipe up to 1 MiB (the unprivileged maximum): headers rarely have to wait."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except OSError:
        return 1 << 16


def _pipe_room(fd: int, capacity: int) -> int:
    """Bytes a write to the pipe (of ``capacity`` bytes) can take now without blocking."""
    try:
        unread = int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
        return capacity - unread
    except OSError:
        return 1 << 30  # not a pipe we can measure: write as before
