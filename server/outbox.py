"""What waits for one worker: the :class:`Outbox` both transports keep per worker, and the half of
the :class:`~lowtide.server.transport.WorkerTransport` protocol they share over it
(:class:`Outboxes`: posting, backpressure, idleness).

The front posts messages to a worker without ever blocking; they wait in the worker's outbox until
the transport's pump takes them as a call (:meth:`Outbox.take`: one message a frame of the local
channel, many a call to a Ray actor), and the call stays on its way until the transport says it
is answered (:meth:`Outbox.answered`: its frame is whole in the pipe, or the actor replied).

Invariant: messages are taken in the order they were posted, and calls are answered in the order
they were taken; ``queued_bytes`` is the size of the columns of every message posted and not yet
answered, waiting or on its way. Past ``max_queued_bytes`` on any worker, ingestion waits
(:meth:`Outboxes.wait_for_room`): a producer faster than the workers is slowed down by gRPC flow
control, never dropped. An outbox is idle when nothing waits and nothing is on its way; whoever
waits for that (:meth:`Outbox.idle`, :meth:`Outboxes.idle`), for room, or for a call to be due
(the pump) waits on an event set as it changes, never by polling. A closed outbox (its worker
gone, or the pool stopping) drops what it held and takes nothing more: it is idle, with room.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from lowtide.server import messages as msg
from lowtide.server.transport import Arrays

Outgoing = tuple[msg.ToWorker, Arrays | None]


def _nbytes(arrays: Arrays | None) -> int:
    return sum(a.nbytes for a in arrays.values()) if arrays else 0


class Outbox:
    """One worker's messages: waiting (in order), then on their way in calls until answered."""

    def __init__(self, max_queued_bytes: int) -> None:
        self.max_queued_bytes = max_queued_bytes
        self.messages: deque[Outgoing] = deque()  # waiting, oldest first
        self.waiting_bytes = 0  # their columns
        self.calls: deque[int] = deque()  # the columns of each call on its way, oldest first
        self.closed = False
        self._wake = asyncio.Event()  # for the pump: a message posted, or a call answered
        self._room = asyncio.Event()  # set when it falls to max_queued_bytes or below
        self._idle = asyncio.Event()  # set when nothing waits and nothing is on its way

    @property
    def on_way(self) -> int:
        """Calls taken and not answered."""
        return len(self.calls)

    @property
    def queued_bytes(self) -> int:
        return self.waiting_bytes + sum(self.calls)

    @property
    def full(self) -> bool:
        return self.queued_bytes > self.max_queued_bytes

    @property
    def busy(self) -> bool:
        return bool(self.messages or self.calls)

    def post(self, message: msg.ToWorker, arrays: Arrays | None = None) -> None:
        """Queue a message after those posted before; never blocks. A closed outbox drops it."""
        if self.closed:
            return
        self.messages.append((message, arrays))
        self.waiting_bytes += _nbytes(arrays)
        self._wake.set()

    async def wait_for(self, due: Callable[[], bool]) -> None:
        """Wait until ``due()`` (the pump's condition to take a call), asked again after each post
        and each answer."""
        while not due():
            self._wake.clear()
            await self._wake.wait()

    def take(self, call_bytes: int = 0) -> list[Outgoing]:
        """The next call: the oldest message, and more after it while the call's columns stay
        below ``call_bytes``. Its columns count as queued until it is answered."""
        call: list[Outgoing] = []
        nbytes = 0
        while self.messages and (not call or nbytes < call_bytes):
            message, arrays = self.messages.popleft()
            nbytes += _nbytes(arrays)
            call.append((message, arrays))
        self.waiting_bytes -= nbytes
        self.calls.append(nbytes)
        return call

    def answered(self) -> None:
        """The oldest call on its way has reached the worker (never after :meth:`close`)."""
        self.calls.popleft()
        if not self.full:
            self._room.set()
        if not self.busy:
            self._idle.set()
        self._wake.set()

    def close(self) -> None:
        """Drop what waits and what is on its way (the worker is gone); take nothing more."""
        self.closed = True
        self.messages.clear()
        self.calls.clear()
        self.waiting_bytes = 0
        self._room.set()
        self._idle.set()

    async def room(self) -> None:
        """Wait while more than ``max_queued_bytes`` of columns are queued."""
        while self.full:
            self._room.clear()
            await self._room.wait()

    async def idle(self) -> None:
        """Wait until nothing waits and nothing is on its way."""
        while self.busy:
            self._idle.clear()
            await self._idle.wait()


class HasOutbox(Protocol):
    outbox: Outbox


class Outboxes:
    """The protocol's posting half, which both transports inherit: worker ``i``'s outbox is
    ``handles[i].outbox``. A worker started again has a new handle, so every wait reads
    ``handles`` again after each wake."""

    size: int
    handles: Sequence[HasOutbox]

    def post(self, worker: int, message: msg.ToWorker, arrays: Arrays | None = None) -> None:
        """Queue a message for a worker, after those posted before; never blocks. A worker gone
        takes nothing."""
        self.handles[worker].outbox.post(message, arrays)

    def broadcast(self, message: msg.ToWorker) -> None:
        for w in range(self.size):
            self.post(w, message)

    async def wait_for_room(self) -> None:
        """Wait while any worker's outbox is full: the backpressure ingestion awaits."""
        while (full := next((h.outbox for h in self.handles if h.outbox.full), None)) is not None:
            await full.room()

    async def idle(self) -> None:
        """Wait until every worker's outbox is idle at once: all posted has reached its worker."""
        while (busy := next((h.outbox for h in self.handles if h.outbox.busy), None)) is not None:
            await busy.idle()


__all__ = ["HasOutbox", "Outbox", "Outboxes", "Outgoing"]
