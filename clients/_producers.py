"""The producers: :class:`Producer` (blocking, thread-safe) and :class:`AsyncProducer` (asyncio).

Each is a thin shell over :class:`lowtide.clients._producer_core.ProducerCore`, which decides
everything (docs/design.md, "Producers": checks, batching, which call carries what, what an answer
means, what goes again, what the caller is told); a shell only opens Ingest calls, moves the
messages the core gives it, waits, and hands the core each call's answer. Invariant: a shell touches
its core only under its lock (the blocking shell's condition, the asyncio shell's lock).

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
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc

from lowtide.clients._producer_core import IngestCall, ProducerCore, Step
from lowtide.clients._wire import IngestResult, MessageBound

MAX_QUEUED_MESSAGES = 4  # messages built but not yet handed to gRPC before send() waits
Streams = Callable[[], list[dict[str, Any]]]
AsyncStreams = Callable[[], Awaitable[list[dict[str, Any]]]]
StreamsT = TypeVar("StreamsT", Streams, AsyncStreams)
Bound = Callable[[], MessageBound]
AsyncBound = Callable[[], Awaitable[MessageBound]]
BoundT = TypeVar("BoundT", Bound, AsyncBound)


class _Shell(ABC, Generic[StreamsT, BoundT]):
    """What both shells hold: the gRPC stub, their Ingest calls' timeout and the core."""

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
        streams: StreamsT | None = None,
        bound: BoundT | None = None,
    ) -> None:
        self._stub = stub
        self._timeout = timeout
        self._core = ProducerCore(target, stream, source, max_batch_rows, linger_ms / 1000, timeout)
        self._set_up(streams, bound)

    @abstractmethod
    def _set_up(self, streams: StreamsT | None, bound: BoundT | None) -> None:
        """The shell's own state; ``streams`` fetches the stream (``ListStreams``) and ``bound``
        the server's limit on a message (``Health``, once per client) to open it."""

    @property
    def result(self) -> IngestResult | None:
        """What the server applied from this producer's calls so far (None before any answer)."""
        return self._core.result


# -- blocking -------------------------------------------------------------------------------------
class Producer(_Shell[Streams, Bound]):
    """One source of one stream (see the module docstring). Thread-safe; a context manager:
    leaving the block flushes (the source stays open), leaving it on an exception cancels.

    The open call's request stream is a generator that gRPC runs on its own thread: it takes the
    core's messages, and sends lingering rows when they are due."""

    def _set_up(self, streams: Streams | None, bound: Bound | None) -> None:
        if streams is not None:
            self._core.open(streams(), bound() if bound is not None else None)
        self._cond = threading.Condition()  # guards the core; the request stream waits on it
        self._future: Any = None  # the open call's

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.cancel()
            return
        with self._cond:
            self._core.leave()
            self._run()

    def send(self, data: Any, batch_id: int | None = None) -> None:
        """Queue rows: a dict of columns, numpy arrays, a DataFrame, an Arrow table or one row.

        Rows that do not fit the stream raise ``SchemaMismatch`` here, and nothing of them is
        sent. With ``batch_id`` the rows go as one batch of their own that the server applies at
        most once per (stream, source, batch_id).
        """
        prepared = self._core.prepare(data, batch_id)  # checks a table outside the lock
        with self._cond:
            self._core.send(prepared, batch_id)
            self._run()

    def punctuate(self, value: int) -> None:
        """Promise: no further tuple of this source has a progressing value below ``value``.

        A value below this source's last punctuation raises ``RegressingPunctuation`` here."""
        with self._cond:
            self._core.punctuate(value)
            self._run()

    def flush(self) -> None:
        """Send the pending rows and end the call; returns once the server has acknowledged
        everything sent so far (raising what it rejected). The next send begins a new call."""
        with self._cond:
            self._core.flush()
            self._run()

    def close(self) -> IngestResult:
        """End this source (its punctuation becomes +inf); returns what the server applied over
        all this producer's calls."""
        with self._cond:
            self._core.close()
            self._run()
            return self._core.final_result()

    def cancel(self) -> None:
        """Abandon the producer: the call in flight is cancelled, what it carried may be lost."""
        with self._cond:
            self._core.cancel()
            if self._future is not None:
                self._future.cancel()
            self._cond.notify_all()

    # -- the calls ------------------------------------------------------------------------------
    def _run(self) -> None:
        """Do what the core asks until it lets the caller go; then raise its oldest rejection."""
        core = self._core
        while (step := core.step(MAX_QUEUED_MESSAGES)) is not Step.RETURN:
            if step is Step.OPEN:
                self._open()
                continue
            if core.wake():
                self._cond.notify_all()
            self._cond.wait()  # SEND: for room in the outbox; END: for the call's answer
        if core.wake():
            self._cond.notify_all()
        core.raise_pending()

    def _open(self) -> None:
        call = self._core.call
        assert call is not None  # Step.OPEN has begun it
        self._future = self._stub.Ingest.future(self._requests(call), timeout=self._timeout)
        self._future.add_done_callback(functools.partial(self._on_done, call))

    def _requests(self, call: IngestCall) -> Iterator[Any]:
        """The call's request stream, run by gRPC's thread."""
        core = self._core
        while True:
            with self._cond:
                while (entry := core.take(call)) is None:
                    if core.finished(call):
                        return
                    self._cond.wait(core.linger_delay())
                self._cond.notify_all()  # a caller may be waiting for room in the outbox
            yield entry.request

    def _on_done(self, call: IngestCall, future: Any) -> None:
        with self._cond:
            if future.cancelled():
                self._core.call_cancelled(call)
            elif (error := future.exception()) is not None:
                self._core.call_failed(call, error)
            else:
                self._core.call_answered(call, future.result())
            self._cond.notify_all()


# -- asyncio --------------------------------------------------------------------------------------
class AsyncProducer(_Shell[AsyncStreams, AsyncBound]):
    """:class:`Producer` for asyncio: the same calls, awaited; lingering rows leave from a task.

    ``async with client.producer(...) as p`` opens it (fetching the stream) on entry; a producer
    made with ``p = client.producer(...)`` opens at its first awaited call, or at once with
    ``p = await client.producer(...)``.
    """

    def _set_up(self, streams: AsyncStreams | None, bound: AsyncBound | None) -> None:
        self._streams = streams  # fetched when the producer opens
        self._bound = bound
        self._lock = asyncio.Lock()  # one writer at a time: the caller or the linger task
        self._rpc: Any = None  # the open call's
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
            self._core.leave()
            await self._run()

    async def send(self, data: Any, batch_id: int | None = None) -> None:
        async with self._lock:
            await self._ensure_open()
            self._core.send(self._core.prepare(data, batch_id), batch_id)
            if self._core.linger_delay() is not None and (self._linger is None or self._linger.done()):
                self._linger = asyncio.get_running_loop().create_task(self._linger_loop())
            await self._run()

    async def punctuate(self, value: int) -> None:
        async with self._lock:
            await self._ensure_open()
            self._core.punctuate(value)
            await self._run()

    async def flush(self) -> None:
        async with self._lock:
            await self._ensure_open()
            self._core.flush()
            await self._run()

    async def close(self) -> IngestResult:
        async with self._lock:
            await self._ensure_open()
            self._core.close()
            await self._run()
            return self._core.final_result()

    def cancel(self) -> None:
        """Abandon the producer: the call in flight is cancelled, what it carried may be lost."""
        self._core.cancel()
        if self._linger is not None:
            self._linger.cancel()
        if self._rpc is not None:
            self._rpc.cancel()

    # -- the calls ------------------------------------------------------------------------------
    async def _ensure_open(self) -> None:
        if self._streams is not None:
            streams, self._streams = self._streams, None
            try:
                found = await streams()
                self._core.open(found, await self._bound() if self._bound is not None else None)
            except BaseException:
                self._streams = streams  # not opened: the next call tries again
                raise

    async def _run(self) -> None:
        """:meth:`_move`, then raise the core's oldest rejection."""
        await self._move()
        if self._core.ended and self._linger is not None:  # closed: nothing lingers any more
            self._linger.cancel()
        self._core.raise_pending()

    async def _move(self) -> None:
        """Do what the core asks until it lets the caller go: open calls, write each message,
        end calls and take their answers."""
        core = self._core
        if core.call is not None and self._rpc.done():  # the server ended it meanwhile: a rejection
            await self._answer(core.call)
        while (step := core.step(0)) is not Step.RETURN:
            call = core.call
            assert call is not None  # every step but RETURN concerns the open call
            if step is Step.OPEN:
                self._rpc = self._stub.Ingest(timeout=self._timeout)
                continue
            entry = core.take(call) if step is Step.SEND else None
            if entry is not None and await self._write(entry.request):
                continue
            await self._answer(call)  # END, or the call has ended early: its answer says why

    async def _write(self, request: Any) -> bool:
        """Whether the message was handed to the call (False: the call has ended)."""
        try:
            await self._rpc.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError):
            return False
        except asyncio.CancelledError:
            if not self._rpc_cancelled():
                raise  # this task is being cancelled
            return False
        return True

    async def _answer(self, call: IngestCall) -> None:
        """End the call's request stream and hand its answer to the core."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._rpc.done_writing()  # unless the call has ended already: its status says how
        try:
            response = await self._rpc
        except grpc.RpcError as exc:
            self._core.call_failed(call, exc)
        except asyncio.CancelledError:
            if not self._rpc_cancelled():
                raise  # this task is being cancelled
            self._core.call_cancelled(call)
        else:
            self._core.call_answered(call, response)

    def _rpc_cancelled(self) -> bool:
        """The call was cancelled (its channel closed, say), not the task awaiting it."""
        task = asyncio.current_task()
        return bool(self._rpc.cancelled()) and not (task is not None and task.cancelling())

    async def _linger_loop(self) -> None:
        while (delay := self._core.linger_delay()) is not None:
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            async with self._lock:
                self._core.linger()
                await self._move()  # a rejection waits for the caller's next call


__all__ = ["AsyncProducer", "Producer"]
