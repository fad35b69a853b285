"""Python clients of a lowtide server: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both make the calls of :class:`lowtide.Engine` over gRPC (DESIGN.md §6) and give the same items:
a subscription yields ``pyarrow.Table`` result batches and :class:`lowtide.Punctuation` markers.
Every failure raises a :class:`lowtide.LowtideError` subclass - the very class the server raised
(``SchemaMismatch``, ``NotFound``, ...) or, for transport failures, ``ServerUnavailable``,
``DeadlineExceeded`` or ``ServerError`` - with the server's one-line reason.

A producer keeps one Ingest call open for its source and batches for the caller: sends are
coalesced into Arrow batches of up to ``max_batch_rows`` rows, held at most ``linger_ms``.
Punctuation and close go after the rows sent before them. The server answers an Ingest call only
when it ends, so a rejected batch surfaces on the producer's next call (``send``, ``punctuate``,
``flush``, ``close``) and ends the producer; what the server accepted before stays applied.
Leaving a producer's ``with`` block sends what is pending and ends the call without closing the
source (``close()`` does that: the source's punctuation becomes +inf); leaving it on an exception
cancels the call.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from lowtide.clients import _wire as wire
from lowtide.clients._batching import Batcher, prepare, punctuation_value
from lowtide.clients._wire import IngestResult, ServerError, translate
from lowtide.errors import InvalidArgument, LowtideError
from lowtide.handles import Item, Query
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.schema import to_arrow_table

T = TypeVar("T")
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # not in grpc-stubs
MAX_QUEUED_MESSAGES = 4  # batches built but not yet handed to gRPC before send() waits


class _ProducerState:
    """What both producers share: the batcher, the first failure, the final result."""

    def __init__(self, target: str, stream: str, source: str, linger_ms: float, max_batch_rows: int) -> None:
        self.target = target
        self.batcher = Batcher(stream, source, max_batch_rows, linger_ms / 1000)
        self.error: LowtideError | None = None
        self.result: IngestResult | None = None
        self.ending = False  # close/flush-and-end requested: no sends after this

    def check(self) -> None:
        if self.error is not None:
            raise self.error
        if self.ending:
            b = self.batcher
            raise InvalidArgument(f"the producer of source {b.source!r} on stream {b.stream!r} has ended")

    def fail(self, exc: Exception) -> LowtideError:
        if self.error is None:
            self.error = translate(exc, self.target)
        return self.error

    def build(self, make: Callable[..., list[Any]], *args: Any) -> list[Any]:
        """Messages from the batcher; a failure there (rows that form no batch) ends the producer."""
        try:
            return make(*args)
        except LowtideError as exc:
            raise self.fail(exc) from None


# -- blocking -------------------------------------------------------------------------------------
class Producer:
    """One source of one stream over one Ingest call (see the module docstring). Thread-safe."""

    def __init__(
        self,
        stub: Any,
        target: str,
        stream: str,
        source: str,
        linger_ms: float,
        max_batch_rows: int,
        timeout: float | None = None,
    ) -> None:
        self._state = _ProducerState(target, stream, source, linger_ms, max_batch_rows)
        self._cond = threading.Condition()  # guards everything below and the batcher
        self._outbox: deque[Any] = deque()
        self._call_done = False
        self._future = stub.Ingest.future(self._requests(), timeout=timeout)
        self._future.add_done_callback(self._on_done)

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self._finish(close_source=False)
        else:
            self._future.cancel()

    @property
    def result(self) -> IngestResult | None:
        """The server's account of this call, once it has ended."""
        return self._state.result

    def send(self, data: Any, batch_id: int | None = None) -> None:
        """Queue rows: a dict of columns, numpy arrays, a DataFrame, an Arrow table or one row.

        With ``batch_id`` the rows go as one batch of their own that the server applies at most
        once per (stream, source, batch_id).
        """
        prepared = prepare(data) if batch_id is None else to_arrow_table(data)
        with self._cond:
            self._state.check()
            batcher = self._state.batcher
            was_idle = batcher.pending_rows == 0
            if batch_id is None:
                due = self._state.build(batcher.add, prepared)
            else:
                due = self._state.build(batcher.add_batch, prepared, batch_id)
            self._enqueue(due)
            if was_idle and batcher.pending_rows:
                self._cond.notify_all()  # the sender thread now has a linger deadline

    def punctuate(self, value: int) -> None:
        """Promise: no further tuple of this source has a progressing value below ``value``."""
        checked = punctuation_value(value)
        with self._cond:
            self._state.check()
            self._enqueue(self._state.build(self._state.batcher.punctuation, checked))

    def flush(self) -> None:
        """Send the pending rows now; returns once every message is handed to gRPC."""
        with self._cond:
            self._state.check()
            self._enqueue(self._state.build(self._state.batcher.flush))
            while self._outbox and not self._call_done:
                self._cond.wait()
            self._state.check()

    def close(self) -> IngestResult:
        """End this source (its punctuation becomes +inf); returns what the server applied."""
        return self._finish(close_source=True)

    def _finish(self, close_source: bool) -> IngestResult:
        with self._cond:
            if self._state.result is not None:
                return self._state.result
            self._state.check()
            batcher = self._state.batcher
            self._enqueue(self._state.build(batcher.close if close_source else batcher.flush))
            self._state.ending = True
            self._cond.notify_all()
        try:
            response = self._future.result()
        except grpc.FutureCancelledError as exc:
            raise self._state.fail(ServerError("the Ingest call was cancelled", "CANCELLED")) from exc
        except grpc.RpcError as exc:
            raise self._state.fail(exc) from exc
        with self._cond:
            if self._state.error is not None:
                raise self._state.error
            self._state.result = wire.ingest_result(response)
            return self._state.result

    def _enqueue(self, messages: list[Any]) -> None:
        """Hand messages to the sender thread, waiting while MAX_QUEUED_MESSAGES are queued."""
        for message in messages:
            while len(self._outbox) >= MAX_QUEUED_MESSAGES and not self._call_done:
                self._cond.wait()
            self._state.check()
            if self._call_done:
                raise self._state.fail(ServerError("the server ended the Ingest call", "ABORTED"))
            self._outbox.append(message)
            self._cond.notify_all()  # the sender may be waiting for this very message

    def _requests(self) -> Iterator[Any]:
        """The call's request stream, run by gRPC's thread: the outbox, and lingering rows when due."""
        batcher = self._state.batcher
        while True:
            with self._cond:
                while not self._outbox:
                    if self._call_done or self._state.error is not None:
                        return
                    if self._state.ending:
                        return
                    if batcher.due():
                        try:
                            self._outbox.extend(batcher.flush())
                        except LowtideError as exc:
                            self._state.fail(exc)
                            self._cond.notify_all()
                            return
                        continue
                    wait = None if batcher.deadline is None else batcher.deadline - batcher.clock()
                    self._cond.wait(wait)
                message = self._outbox.popleft()
                self._cond.notify_all()
            yield message

    def _on_done(self, future: Any) -> None:
        with self._cond:
            self._call_done = True
            if not future.cancelled() and future.exception() is not None:
                self._state.fail(future.exception())
            self._cond.notify_all()


class Subscription:
    """The items of a query, as they come: iterate it; ``cancel()`` or ``with`` ends it."""

    def __init__(self, stub: Any, target: str, query: str, from_oldest: bool) -> None:
        self._target = target
        self._cancelled = False
        self._call = stub.Subscribe(wire.subscribe_request(query, from_oldest))

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Item:
        try:
            response = next(self._call)
        except grpc.RpcError as exc:
            if self._cancelled:
                raise StopIteration from None
            raise translate(exc, self._target) from exc
        return wire.subscribe_item(response)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class Client:
    """A blocking client of the lowtide server at ``target`` (``host:port``).

    ``timeout`` (seconds) bounds each control call; producers and subscriptions run unbounded.
    """

    def __init__(self, target: str, timeout: float | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target, options=wire.CHANNEL_OPTIONS)
        self._stub: Any = pb_grpc.LowtideStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _run(self, call: wire.Call[T]) -> T:
        try:
            response = getattr(self._stub, call.method)(call.request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise translate(exc, self.target) from exc
        return call.parse(response)

    def create_stream(
        self,
        name: str,
        schema: Mapping[str, str],
        progressing: str = "ts",
        punctuation: str = "explicit",
        sources: Sequence[str] | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        """Create a stream; ``schema`` maps column names to types, ``idle_timeout`` is in seconds."""
        self._run(wire.create_stream(name, schema, progressing, punctuation, sources, idle_timeout))

    def drop_stream(self, name: str) -> None:
        self._run(wire.drop_stream(name))

    def list_streams(self) -> list[dict[str, Any]]:
        """Each stream: name, schema, progressing, punctuation, sources, low_watermark, counts."""
        return self._run(wire.list_streams())

    def register_query(
        self, sql: str, name: str | None = None, late: str = "drop", allowed_lateness: str | int | None = None
    ) -> Query:
        """Register a query; returns its name (a ``str`` carrying ``.sql``) to subscribe to."""
        return self._run(wire.register_query(sql, name, late, allowed_lateness))

    def explain(self, sql: str) -> str:
        """The operator graph the query would run, one operator a line."""
        return self._run(wire.explain(sql))

    def drop_query(self, name: str) -> None:
        self._run(wire.drop_query(name))

    def list_queries(self) -> list[dict[str, Any]]:
        """Each query: name, sql, late, columns, schema, results, late_tuples, low_watermark."""
        return self._run(wire.list_queries())

    def health(self) -> dict[str, Any]:
        """``{"status": "SERVING", "workers": n, "version": ...}``."""
        return self._run(wire.health())

    def producer(
        self,
        stream: str,
        source: str = "default",
        linger_ms: float = 5,
        max_batch_rows: int = 100_000,
        timeout: float | None = None,
    ) -> Producer:
        """A producer for one source of ``stream`` (a context manager); ``timeout`` (seconds)
        bounds its whole Ingest call, which otherwise runs unbounded."""
        return Producer(self._stub, self.target, stream, source, linger_ms, max_batch_rows, timeout)

    def subscribe(self, query: str, from_oldest: bool = False) -> Subscription:
        """Result tables and punctuation of ``query`` (or ``"<query>.late"``), from now or the oldest."""
        return Subscription(self._stub, self.target, query, from_oldest)


# -- asyncio --------------------------------------------------------------------------------------
class AsyncProducer:
    """:class:`Producer` for asyncio: the same calls, awaited; lingering rows leave from a task."""

    def __init__(
        self,
        stub: Any,
        target: str,
        stream: str,
        source: str,
        linger_ms: float,
        max_batch_rows: int,
        timeout: float | None = None,
    ) -> None:
        self._stub = stub
        self._timeout = timeout
        self._state = _ProducerState(target, stream, source, linger_ms, max_batch_rows)
        self._lock = asyncio.Lock()  # one writer at a time: the caller or the linger task
        self._call: Any = None
        self._linger: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            await self._finish(close_source=False)
        else:
            self._abort()

    @property
    def result(self) -> IngestResult | None:
        return self._state.result

    async def send(self, data: Any, batch_id: int | None = None) -> None:
        prepared = prepare(data) if batch_id is None else to_arrow_table(data)
        async with self._lock:
            self._state.check()
            batcher = self._state.batcher
            if batch_id is None:
                due = self._state.build(batcher.add, prepared)
            else:
                due = self._state.build(batcher.add_batch, prepared, batch_id)
            await self._write(due)
            if batcher.pending_rows and (self._linger is None or self._linger.done()):
                self._linger = asyncio.get_running_loop().create_task(self._linger_loop())

    async def punctuate(self, value: int) -> None:
        checked = punctuation_value(value)
        async with self._lock:
            self._state.check()
            await self._write(self._state.build(self._state.batcher.punctuation, checked))

    async def flush(self) -> None:
        async with self._lock:
            self._state.check()
            await self._write(self._state.build(self._state.batcher.flush))

    async def close(self) -> IngestResult:
        return await self._finish(close_source=True)

    async def _finish(self, close_source: bool) -> IngestResult:
        async with self._lock:
            if self._state.result is not None:
                return self._state.result
            self._state.check()
            batcher = self._state.batcher
            await self._write(self._state.build(batcher.close if close_source else batcher.flush))
            self._state.ending = True
            if self._linger is not None:
                self._linger.cancel()
            call = self._open()
            try:
                await call.done_writing()
                response = await call
            except grpc.RpcError as exc:
                raise self._state.fail(exc) from exc
            self._state.result = wire.ingest_result(response)
            return self._state.result

    def _open(self) -> Any:
        if self._call is None:
            self._call = self._stub.Ingest(timeout=self._timeout)
        return self._call

    async def _write(self, messages: list[Any]) -> None:
        call = self._open()
        for message in messages:
            try:
                await call.write(message)
            except grpc.RpcError as exc:
                raise self._state.fail(exc) from exc
            except asyncio.InvalidStateError as exc:  # the call has ended: its status says why
                try:
                    await call
                except grpc.RpcError as status:
                    raise self._state.fail(status) from exc
                raise self._state.fail(ServerError("the server ended the Ingest call", "ABORTED")) from exc

    async def _linger_loop(self) -> None:
        batcher = self._state.batcher
        while batcher.deadline is not None:
            delay = batcher.deadline - batcher.clock()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            async with self._lock:
                if batcher.due() and self._state.error is None:
                    try:
                        await self._write(self._state.build(batcher.flush))
                    except LowtideError:
                        return  # kept in the state: the caller's next call raises it

    def _abort(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
        if self._call is not None:
            self._call.cancel()


class AsyncSubscription:
    """:class:`Subscription` for asyncio: ``async for item in ...``."""

    def __init__(self, stub: Any, target: str, query: str, from_oldest: bool) -> None:
        self._target = target
        self._cancelled = False
        self._call = stub.Subscribe(wire.subscribe_request(query, from_oldest))

    def __aiter__(self) -> AsyncIterator[Item]:
        return self

    async def __anext__(self) -> Item:
        try:
            response = await self._call.read()
        except grpc.RpcError as exc:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise translate(exc, self._target) from exc
        except asyncio.CancelledError:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise
        if response is _EOF:
            raise StopAsyncIteration
        return wire.subscribe_item(response)

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncClient:
    """:class:`Client` for asyncio (grpc.aio): the same methods, awaited; ``async with``."""

    def __init__(self, target: str, timeout: float | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(target, options=wire.CHANNEL_OPTIONS)
        self._stub: Any = pb_grpc.LowtideStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def _run(self, call: wire.Call[T]) -> T:
        try:
            response = await getattr(self._stub, call.method)(call.request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise translate(exc, self.target) from exc
        return call.parse(response)

    async def create_stream(
        self,
        name: str,
        schema: Mapping[str, str],
        progressing: str = "ts",
        punctuation: str = "explicit",
        sources: Sequence[str] | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        await self._run(wire.create_stream(name, schema, progressing, punctuation, sources, idle_timeout))

    async def drop_stream(self, name: str) -> None:
        await self._run(wire.drop_stream(name))

    async def list_streams(self) -> list[dict[str, Any]]:
        return await self._run(wire.list_streams())

    async def register_query(
        self, sql: str, name: str | None = None, late: str = "drop", allowed_lateness: str | int | None = None
    ) -> Query:
        return await self._run(wire.register_query(sql, name, late, allowed_lateness))

    async def explain(self, sql: str) -> str:
        return await self._run(wire.explain(sql))

    async def drop_query(self, name: str) -> None:
        await self._run(wire.drop_query(name))

    async def list_queries(self) -> list[dict[str, Any]]:
        return await self._run(wire.list_queries())

    async def health(self) -> dict[str, Any]:
        return await self._run(wire.health())

    def producer(
        self,
        stream: str,
        source: str = "default",
        linger_ms: float = 5,
        max_batch_rows: int = 100_000,
        timeout: float | None = None,
    ) -> AsyncProducer:
        return AsyncProducer(self._stub, self.target, stream, source, linger_ms, max_batch_rows, timeout)

    def subscribe(self, query: str, from_oldest: bool = False) -> AsyncSubscription:
        return AsyncSubscription(self._stub, self.target, query, from_oldest)


__all__ = ["AsyncClient", "AsyncProducer", "AsyncSubscription", "Client", "Item", "Producer", "Subscription"]
