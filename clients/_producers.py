"""The producers: :class:`Producer` (blocking, thread-safe) and :class:`AsyncProducer` (asyncio).

Both run the bookkeeping of :mod:`lowtide.clients._producing` over Ingest calls (DESIGN §10):

* opening one fetches its stream (``ListStreams``): an unknown stream raises ``NotFound``;
* ``send`` and ``punctuate`` check what the client can know (the schema, the source's last
  punctuation) and raise at once, with nothing sent;
* a rejection only the server can make (a late tuple under a query's ``error`` policy, a limit)
  is raised by the producer's next call, names the batch, punctuation or close it concerns, and
  leaves the producer usable: the messages after the rejected one go again on a new call;
* ``flush()`` returns once the server has acknowledged everything sent before it (the call ends;
  the next send begins another); ``close()`` ends the source and returns what the server applied
  over all the producer's calls.

A call that raises a rejection of an earlier batch has done its own work first (its rows are
queued, its punctuation sent): only the earlier batch was refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterator
from types import TracebackType
from typing import Any

import grpc

from lowtide.clients._batching import Outgoing
from lowtide.clients._producing import CallLog, ProducerCore
from lowtide.clients._wire import IngestResult
from lowtide.errors import ServerError

MAX_QUEUED_MESSAGES = 4  # messages built but not yet handed to gRPC before send() waits
Streams = Callable[[], list[dict[str, Any]]]
AsyncStreams = Callable[[], Awaitable[list[dict[str, Any]]]]


def _result(core: ProducerCore) -> IngestResult:
    result = core.result
    if result is None:  # not reached: close() waits for an answer
        raise ServerError("the server has not answered the producer's Ingest call", "UNKNOWN")
    return result


# -- blocking -------------------------------------------------------------------------------------
class _Call:
    """One Ingest call of a blocking producer: its messages, and those gRPC has yet to take."""

    def __init__(self, header: Outgoing, entries: list[Outgoing]) -> None:
        self.log = CallLog()
        self.outbox: deque[Any] = deque()
        for entry in (header, *entries):
            self.log.add(entry)
            self.outbox.append(entry.request)
        self.ending = False  # no more messages: the request stream ends once the outbox is empty
        self.done = False
        self.future: Any = None


class Producer:
    """One source of one stream (see the module docstring). Thread-safe; a context manager:
    leaving the block flushes (the source stays open), leaving it on an exception cancels."""

    def __init__(
        self,
        stub: Any,
        target: str,
        stream: str,
        source: str,
        linger_ms: float,
        max_batch_rows: int,
        timeout: float | None = None,
        *,
        streams: Streams | None = None,
    ) -> None:
        self._stub = stub
        self._timeout = timeout
        self._core = ProducerCore(target, stream, source, max_batch_rows, linger_ms / 1000)
        if streams is not None:
            self._core.open(streams())
        self._cond = threading.Condition()  # guards everything below and the core
        self._call: _Call | None = None

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.cancel()
            return
        with self._cond:
            if not self._core.ended:
                self._settle()
                self._push(self._core.flush())
                self._drain()
            self._core.raise_pending()

    @property
    def result(self) -> IngestResult | None:
        """What the server applied from this producer's calls so far (None before any answer)."""
        return self._core.result

    def send(self, data: Any, batch_id: int | None = None) -> None:
        """Queue rows: a dict of columns, numpy arrays, a DataFrame, an Arrow table or one row.

        Rows that do not fit the stream raise ``SchemaMismatch`` here, and nothing of them is
        sent. With ``batch_id`` the rows go as one batch of their own that the server applies at
        most once per (stream, source, batch_id).
        """
        self._core.usable()
        prepared = self._core.prepare(data, batch_id)  # checks a table outside the lock
        with self._cond:
            if self._call is not None and self._call.done:
                self._settle()
            was_idle = self._core.batcher.pending_rows == 0
            due = self._core.send(prepared, batch_id)
            if due:
                self._push(due)
            if was_idle or self._call is None:
                self._watch_linger()  # rows now pending, or left pending by a call that ended
            if self._core.pending:
                self._core.raise_pending()

    def punctuate(self, value: int) -> None:
        """Promise: no further tuple of this source has a progressing value below ``value``.

        A value below this source's last punctuation raises ``RegressingPunctuation`` here."""
        with self._cond:
            self._settle()
            self._push(self._core.punctuate(value))
            self._core.raise_pending()

    def flush(self) -> None:
        """Send the pending rows and end the call; returns once the server has acknowledged
        everything sent so far (raising what it rejected). The next send begins a new call."""
        with self._cond:
            self._core.usable()
            self._settle()
            self._push(self._core.flush())
            self._drain()
            self._core.raise_pending()

    def close(self) -> IngestResult:
        """End this source (its punctuation becomes +inf); returns what the server applied over
        all this producer's calls."""
        with self._cond:
            if not self._core.closed:
                self._settle()
                self._push(self._core.close())
                self._drain()
                self._core.ended = self._core.closed
            self._core.raise_pending()
            return _result(self._core)

    def cancel(self) -> None:
        """Abandon the producer: the call in flight is cancelled, what it carried may be lost."""
        with self._cond:
            self._core.ended = True
            call = self._call
            if call is not None:
                call.ending = True
                call.future.cancel()
                self._cond.notify_all()

    # -- the calls ------------------------------------------------------------------------------
    def _push(self, entries: list[Outgoing]) -> None:
        """Hand messages to the current call (opening one), waiting while MAX_QUEUED_MESSAGES wait
        for gRPC; a call that has grown to its bound is ended (and answered) at a unit's end."""
        for entry in entries:
            while True:
                self._settle()
                call = self._call
                if call is None:
                    self._open([entry])
                    break
                if call.done:
                    continue
                if call.ending or len(call.outbox) >= MAX_QUEUED_MESSAGES:
                    self._cond.wait()
                    continue
                call.log.add(entry)
                call.outbox.append(entry.request)
                self._cond.notify_all()  # the sender may be waiting for this very message
                break
            if self._call is not None and self._call.log.full():
                self._drain()

    def _open(self, entries: list[Outgoing]) -> None:
        call = _Call(self._core.batcher.header(), entries)
        self._call = call
        call.future = self._stub.Ingest.future(self._requests(call), timeout=self._timeout)
        call.future.add_done_callback(functools.partial(self._on_done, call))

    def _watch_linger(self) -> None:
        """Lingering rows leave from the call's request thread: make sure there is a call."""
        if self._core.batcher.pending_rows:
            if self._call is None:
                self._open([])
            self._cond.notify_all()  # the request thread now has a linger deadline

    def _settle(self) -> None:
        """Take the answer of a call that has ended: its result, or its rejection (kept for the
        caller to raise) and the messages after the rejected one, sent again on a new call."""
        while self._call is not None and self._call.done:
            call, self._call = self._call, None
            if call.future.cancelled():
                if self._core.ended:  # cancel(): what the call carried is abandoned
                    return
                exc: Exception | None = ServerError("the Ingest call was cancelled", "CANCELLED")
            else:
                exc = call.future.exception()
            if exc is None:
                self._core.succeeded(call.log, call.future.result())
                continue
            resend = self._core.failed(call.log, exc)
            if resend:
                self._open(resend)

    def _drain(self) -> None:
        """End the current call and wait for the server's answer (and for those of the calls
        that send again what followed a rejection)."""
        while True:
            self._settle()
            call = self._call
            if call is None:
                return
            call.ending = True
            self._cond.notify_all()
            while not call.done:
                self._cond.wait()

    def _requests(self, call: _Call) -> Iterator[Any]:
        """The call's request stream, run by gRPC's thread: the outbox, and lingering rows when due."""
        batcher = self._core.batcher
        while True:
            with self._cond:
                while not call.outbox:
                    if call.done or call.ending:
                        return
                    if call is self._call and batcher.due():
                        for entry in self._core.flush():
                            call.log.add(entry)
                            call.outbox.append(entry.request)
                        continue
                    wait = None if batcher.deadline is None else max(0.0, batcher.deadline - batcher.clock())
                    self._cond.wait(wait)
                request = call.outbox.popleft()
                self._cond.notify_all()
            yield request

    def _on_done(self, call: _Call, future: Any) -> None:
        with self._cond:
            call.done = True
            self._cond.notify_all()


# -- asyncio --------------------------------------------------------------------------------------
class _AioCall:
    def __init__(self, rpc: Any, header: Outgoing) -> None:
        self.rpc = rpc
        self.log = CallLog()
        self.log.add(header)


class AsyncProducer:
    """:class:`Producer` for asyncio: the same calls, awaited; lingering rows leave from a task.

    ``async with client.producer(...) as p`` opens it (fetching the stream) on entry; a producer
    made with ``p = client.producer(...)`` opens at its first awaited call, or at once with
    ``p = await client.producer(...)``.
    """

    def __init__(
        self,
        stub: Any,
        target: str,
        stream: str,
        source: str,
        linger_ms: float,
        max_batch_rows: int,
        timeout: float | None = None,
        *,
        streams: AsyncStreams | None = None,
    ) -> None:
        self._stub = stub
        self._timeout = timeout
        self._core = ProducerCore(target, stream, source, max_batch_rows, linger_ms / 1000)
        self._streams = streams
        self._lock = asyncio.Lock()  # one writer at a time: the caller or the linger task
        self._call: _AioCall | None = None
        self._linger: asyncio.Task[None] | None = None

    def __await__(self) -> Generator[Any, None, AsyncProducer]:
        return self._open_now().__await__()

    async def _open_now(self) -> AsyncProducer:
        async with self._lock:
            await self._ensure_open()
        return self

    async def __aenter__(self) -> AsyncProducer:
        return await self._open_now()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.cancel()
            return
        async with self._lock:
            if not self._core.ended:
                await self._ensure_open()
                await self._settle()
                await self._transmit(self._core.flush())
                await self._drain()
            self._core.raise_pending()

    @property
    def result(self) -> IngestResult | None:
        return self._core.result

    async def send(self, data: Any, batch_id: int | None = None) -> None:
        async with self._lock:
            await self._ensure_open()
            prepared = self._core.prepare(data, batch_id)
            await self._settle()
            await self._transmit(self._core.send(prepared, batch_id))
            batcher = self._core.batcher
            if batcher.pending_rows and (self._linger is None or self._linger.done()):
                self._linger = asyncio.get_running_loop().create_task(self._linger_loop())
            self._core.raise_pending()

    async def punctuate(self, value: int) -> None:
        async with self._lock:
            await self._ensure_open()
            await self._settle()
            await self._transmit(self._core.punctuate(value))
            self._core.raise_pending()

    async def flush(self) -> None:
        async with self._lock:
            await self._ensure_open()
            self._core.usable()
            await self._settle()
            await self._transmit(self._core.flush())
            await self._drain()
            self._core.raise_pending()

    async def close(self) -> IngestResult:
        async with self._lock:
            await self._ensure_open()
            if not self._core.closed:
                await self._settle()
                await self._transmit(self._core.close())
                await self._drain()
                self._core.ended = self._core.closed
                if self._core.ended and self._linger is not None:
                    self._linger.cancel()
            self._core.raise_pending()
            return _result(self._core)

    def cancel(self) -> None:
        """Abandon the producer: the call in flight is cancelled, what it carried may be lost."""
        self._core.ended = True
        if self._linger is not None:
            self._linger.cancel()
        if self._call is not None:
            self._call.rpc.cancel()
            self._call = None

    # -- the calls ------------------------------------------------------------------------------
    async def _ensure_open(self) -> None:
        if self._streams is not None:
            streams, self._streams = self._streams, None
            try:
                self._core.open(await streams())
            except BaseException:
                self._streams = streams  # not opened: the next call tries again
                raise

    async def _transmit(self, entries: list[Outgoing]) -> None:
        """Write messages to the current call (opening one); on a failed call, keep its
        rejection and write what followed it again on a new call."""
        queue = deque(entries)
        while queue:
            entry = queue.popleft()
            call = self._call
            if call is None:
                call = self._call = _AioCall(
                    self._stub.Ingest(timeout=self._timeout), self._core.batcher.header()
                )
                call.log.add(entry)
                written = await _write(call, call.log.entries[0]) and await _write(call, entry)
            else:
                call.log.add(entry)
                written = await _write(call, entry)
            if not written or call.log.full():
                queue.extendleft(reversed(await self._end()))

    async def _end(self) -> list[Outgoing]:
        """End the current call and take its answer; returns what to send again after a rejection."""
        call, self._call = self._call, None
        if call is None:
            return []
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await call.rpc.done_writing()  # unless the call has ended already: its status says how
        try:
            response = await call.rpc
        except grpc.RpcError as exc:
            return self._core.failed(call.log, exc)
        except asyncio.CancelledError:
            if not _cancelled_call(call):
                raise  # this task is being cancelled
            return self._core.failed(call.log, ServerError("the Ingest call was cancelled", "CANCELLED"))
        self._core.succeeded(call.log, response)
        return []

    async def _settle(self) -> None:
        """A call the server has ended meanwhile (a rejection): take its answer now."""
        if self._call is not None and self._call.rpc.done():
            await self._transmit(await self._end())

    async def _drain(self) -> None:
        while self._call is not None:
            await self._transmit(await self._end())

    async def _linger_loop(self) -> None:
        batcher = self._core.batcher
        while batcher.deadline is not None:
            delay = batcher.deadline - batcher.clock()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            async with self._lock:
                if batcher.due() and not self._core.ended:
                    await self._transmit(self._core.flush())  # a rejection waits for the next call


async def _write(call: _AioCall, entry: Outgoing) -> bool:
    """Whether the message was handed to the call (False: the call has ended)."""
    try:
        await call.rpc.write(entry.request)
    except (grpc.RpcError, asyncio.InvalidStateError):
        return False
    except asyncio.CancelledError:
        if not _cancelled_call(call):
            raise  # this task is being cancelled
        return False
    return True


def _cancelled_call(call: _AioCall) -> bool:
    """The call was cancelled (its channel closed, say), not the task awaiting it."""
    task = asyncio.current_task()
    return bool(call.rpc.cancelled()) and not (task is not None and task.cancelling())


__all__ = ["AsyncProducer", "Producer"]
