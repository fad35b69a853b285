"""A one-way channel between two processes: numpy columns through shared memory.

The payload of a message (the columns of a batch) is copied once into a shared-memory ring; a
small header (the message as its direction's :class:`~lowtide.server.messages.Codec` encodes it,
and the columns' names, dtypes, offsets) travels over a pipe. The reader copies the columns out
and advances the ring's read position, which it keeps in the ring's first 8 bytes.
A writer that finds the ring full waits for the reader: that is the backpressure that slows a
fast producer down instead of dropping or buffering without bound.

Layout of the shared segment: ``[read_position: uint64][pad to 64][ring bytes ...]``. Positions
only grow; ``position % capacity`` is the offset in the ring. A payload never wraps: when it does
not fit before the end, the writer skips to the start of the ring.
"""

from __future__ import annotations

import contextlib
import fcntl
import pickle as _pickle  # headers between our own processes, never from the network
import struct
import termios
import threading
import time
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from lowtide.server.messages import Codec

_HEADER = 64
_ALIGN = 64
Arrays = dict[str, npt.NDArray[Any]]
M = TypeVar("M")  # the messages of the channel's direction


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


class ChannelFull(Exception):
    """The ring has no room for the message now; retry after the reader catches up."""


class ChannelWriter(Generic[M]):
    def __init__(self, shm: shared_memory.SharedMemory, conn: Connection, codec: Codec[M]) -> None:
        self._shm = shm
        self._conn = conn
        self._codec = codec
        self._capacity = shm.size - _HEADER
        self._read = np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)
        self._write = 0
        self._pipe_capacity = _widen_pipe(conn.fileno())
        self._sending = threading.Lock()  # a worker's checkpoint thread sends too

    def fileno(self) -> int:
        return self._conn.fileno()

    def try_send(self, message: M, arrays: Arrays | None = None) -> None:
        """Send or raise :class:`ChannelFull` without blocking: neither the ring nor the pipe
        may be short of room (a writer blocked on a full pipe while its reader waits to send to
        it would deadlock both processes)."""
        layout: list[tuple[str, str, tuple[int, ...], int]] = []
        start = end = self._write
        sizes: list[int] = []
        if arrays:
            sizes = [_aligned(a.nbytes) for a in arrays.values()]
            total = sum(sizes)
            if total > self._capacity:
                raise ValueError(f"message of {total} bytes exceeds the channel's {self._capacity}")
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
        header = _pickle.dumps((self._codec.encode(message), layout, end), protocol=_pickle.HIGHEST_PROTOCOL)
        room = _pipe_room(self._conn.fileno(), self._pipe_capacity)
        if len(header) + 8 > room and len(header) + 8 <= self._pipe_capacity:
            raise ChannelFull()  # what does not fit an empty pipe can only be written blocking
        if arrays:
            ring = self._shm.buf
            for (_, array), (_, dtype, shape, at) in zip(arrays.items(), layout, strict=True):
                view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=ring, offset=_HEADER + at)
                view[...] = array
            self._write = end
        self._conn.send_bytes(header)

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
        self._codec = codec
        self._capacity = shm.size - _HEADER
        self._read = np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)

    def fileno(self) -> int:
        return self._conn.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._conn.poll(timeout)

    def recv(self) -> tuple[M, Arrays]:
        """The next message and its columns (copied out of the ring)."""
        encoded, layout, end = _pickle.loads(self._conn.recv_bytes())
        arrays: Arrays = {}
        for name, dtype, shape, offset in layout:
            view = np.ndarray(shape, dtype=np.dtype(dtype), buffer=self._shm.buf, offset=_HEADER + offset)
            arrays[name] = view.copy()
        if layout:
            self._read[0] = end  # the ring up to ``end`` may be written again
        return self._codec.decode(encoded), arrays


def create_segment(capacity: int) -> shared_memory.SharedMemory:
    shm = shared_memory.SharedMemory(create=True, size=_HEADER + capacity)
    np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)[0] = 0
    return shm


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
