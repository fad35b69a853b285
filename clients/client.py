"""Python clients of a lowtide server: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both make the calls of :class:`lowtide.Engine` over gRPC (docs/design.md, "Interfaces") and give the
same items: a subscription yields ``pyarrow.Table`` result batches and :class:`lowtide.Punctuation`
markers.
Every failure raises a :class:`lowtide.LowtideError` subclass - the very class the server raised
(``SchemaMismatch``, ``NotFound``, ...) or, for transport failures, ``ServerUnavailable``,
``DeadlineExceeded`` or ``ServerError`` - with the server's one-line reason. The gRPC error
behind it is its ``grpc_error``; it is raised ``from None``, so an uncaught one prints lowtide's
traceback alone.

A producer (:mod:`lowtide.clients._producers`) feeds one source of a stream over Ingest calls
and batches for the caller: sends are coalesced into Arrow batches of up to ``max_batch_rows``
rows, held at most ``linger_ms``, in messages below the server's ``max_message_bytes`` (asked once
per client, from Health); punctuation and close go after the rows sent before them.
Producer errors follow docs/design.md, "Producers":

* opening a producer fetches its stream (an unknown stream raises ``NotFound`` there); ``send``
  checks each batch or row against the stream's schema (missing or unknown columns, the
  progressing attribute and nulls in it, types that do not convert exactly) and ``punctuate``
  checks the value against the source's last punctuation (this producer's, or the server's when
  the producer opened): what fails raises at that call (``SchemaMismatch``,
  ``RegressingPunctuation``), nothing of it is sent, and the producer goes on;
* a rejection only the server can make (a late tuple under a query's ``error`` policy, a limit)
  is raised by the producer's next call (``send``, ``punctuate``, ``flush``, ``close``) as the
  class the server raised, naming the batch it concerns ("batch 3 (rows 200..299 of send #4) was
  rejected: ..."). What came before it stays applied; the messages after it are sent again on a
  new call, so later sends go through, each applied once. The call that raises it has done its
  own work first.
* ``flush()`` returns once the server has acknowledged everything sent before it (it ends the
  current call; the next send begins another) and raises any rejection there; ``close()`` ends the
  source (its punctuation becomes +inf) and returns what the server applied over all the
  producer's calls. Leaving a producer's ``with`` block flushes without closing the source;
  leaving it on an exception cancels the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from lowtide.clients import _wire as wire
from lowtide.clients._security import RootCertificates, aio_channel, sync_channel
from lowtide.clients._wire import MessageBound, translate
from lowtide.handles import Query
from lowtide.lazy import loader
from lowtide.proto import lowtide_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    import pyarrow as pa

    from lowtide.clients._producers import AsyncProducer, Producer
    from lowtide.handles import Item

T = TypeVar("T")
# Producers and Arrow load on first use (PEP 562): a control call (the ``lowtide`` command's
# listings, registrations) needs neither.
__getattr__ = loader(
    __name__,
    {
        "Item": "lowtide.handles",
        "AsyncProducer": "lowtide.clients._producers",
        "Producer": "lowtide.clients._producers",
    },
    globals(),
)
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # not in grpc-stubs


# -- blocking -------------------------------------------------------------------------------------
class Subscription:
    """The items of a query, as they come: iterate it; ``cancel()`` or ``with`` ends it.

    Iteration stops after the end-of-stream punctuation (value ``END_OF_STREAM``: the query's
    output has ended), which it yields last; the call is closed then.
    """

    def __init__(
        self, stub: Any, target: str, query: str, from_oldest: bool, from_offset: int | None = None
    ) -> None:
        self._target = target
        self._cancelled = False
        self._call = stub.Subscribe(wire.subscribe_request(query, from_oldest, from_offset))
        self.offset: int | None = None  # the output offset of the last item yielded

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Item:
        if self._cancelled:
            raise StopIteration
        response = self._next_message()
        offset, item = wire.subscribe_item(response)
        rest = []
        while response.more:  # a wide table, in slices under the message limit
            response = self._next_message()
            rest.append(wire.subscribe_item(response)[1])
        item = wire.whole_table(item, rest)
        self.offset = offset  # once whole: a call cut between slices resumes at this item
        if wire.ends_stream(item):
            self.cancel()  # a server that keeps the call open after the end is not waited for
        return item

    def _next_message(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            if self._cancelled:
                raise StopIteration from None
            raise translate(exc, self._target) from None

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
    ``root_certificates`` (PEM bytes, or a PEM file's path) connects over TLS, trusting those
    roots; ``token`` is sent as ``authorization: Bearer <token>`` on every call, producers' and
    subscriptions' included (docs/design.md, "Security").
    """

    def __init__(
        self,
        target: str,
        timeout: float | None = None,
        root_certificates: RootCertificates | None = None,
        token: str | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = sync_channel(target, root_certificates, token)
        self._stub: Any = pb_grpc.LowtideStub(self._channel)
        self._bound: MessageBound | None = None  # the server's limit on a message, once asked

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _message_bound(self) -> MessageBound:
        """What a message of a producer or a Stage call carries: under the server's
        max_message_bytes, asked once (Health)."""
        if self._bound is None:
            self._bound = MessageBound(self.health()["max_message_bytes"])
        return self._bound

    def _run(self, call: wire.Call[T]) -> T:
        try:
            response = getattr(self._stub, call.method)(call.request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise call.failed(translate(exc, self.target, self.timeout)) from None
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
        """Each stream: name, schema, progressing, punctuation, sources (declared and seen),
        declared, low_watermark, counts, source_punctuation."""
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
        """Each query: name, sql, late, columns, schema, results, late_tuples, low_watermark,
        time_unit, oldest_offset and next_offset (the output offsets a subscription can start at:
        the oldest retained, and the one the next item gets), readers, status (``running``,
        ``recovering`` while its workers are restored, ``aborted`` for good until it is dropped)
        and status_reason (why it is recovering or aborted, in one line; empty while running)."""
        return self._run(wire.list_queries())

    def list_workers(self) -> list[dict[str, Any]]:
        """Each worker: index, node (the address of its machine: ``localhost`` for the server's own,
        a Ray node's IP address with ``--ray``), pid, restarts, queries (the names of those with
        operators on it), state_bytes (their window state there, as of its last statistics) and
        status (``running``; ``placing`` while it is started again, ``pending`` while a Ray worker
        waits out a back-off before its next placement attempt)."""
        return self._run(wire.list_workers())

    def health(self) -> dict[str, Any]:
        """``{"status": "SERVING", "workers": n, "version": ..., "max_message_bytes": n}``: the
        largest message the server takes (0 from a server that does not say); producers and
        ``stage`` cut their messages below it."""
        return self._run(wire.health())

    def commit_offset(self, query: str, reader: str, offset: int) -> None:
        """Tell the server that ``reader`` has processed every item of ``query`` below ``offset``
        (its output offsets): ``list_queries()`` shows it under ``readers``, the metrics show
        the lag ``lowtide_reader_lag_items``. Never lowered; kept in memory only."""
        self._run(wire.commit_offset(query, reader, offset))

    # -- staged batches: one batch written by many tasks (Spark's format("lowtide") writer) ----
    def stage(
        self,
        stream: str,
        batch_id: int,
        part: str,
        table: pa.Table | Iterable[pa.Table],
        source: str = "default",
        max_part_rows: int = 250_000,
    ) -> dict[str, Any]:
        """Stage ``table`` (or tables made while the call runs: sent as they come) as part
        ``part`` of batch ``batch_id`` (1 or more) of ``source``: checked like a batch sent, not
        applied. Staged again, a part replaces what it held. Its messages carry at most
        ``max_part_rows`` rows each, below the server's ``max_message_bytes``: a row larger than
        that raises ``ResourceExhausted``, and nothing is staged.
        ``{"tuples": n, "duplicate": bool}``; duplicate: the batch was applied before, nothing
        was staged."""
        bound = self._message_bound()
        return self._run(wire.stage(stream, source, batch_id, part, table, max_part_rows, bound))

    def commit_staged(
        self,
        stream: str,
        batch_id: int,
        parts: Sequence[str],
        source: str = "default",
        punctuation: int | None = None,
    ) -> dict[str, Any]:
        """Apply the staged ``parts`` as one batch under ``batch_id`` (a batch applied before is
        acknowledged and skipped), drop the other parts staged for it, then raise the source's
        punctuation to ``punctuation`` if it is higher. ``{"tuples", "duplicate",
        "low_watermark"}``. NotFound names a part that is not staged (never, aborted, expired)."""
        return self._run(wire.commit_staged(stream, source, batch_id, parts, punctuation))

    def abort_staged(self, stream: str, batch_id: int, source: str = "default") -> int:
        """Drop every part staged for the batch; how many there were."""
        return self._run(wire.abort_staged(stream, source, batch_id))

    def producer(
        self,
        stream: str,
        source: str = "default",
        linger_ms: float = 5,
        max_batch_rows: int = 100_000,
        timeout: float | None = None,
    ) -> Producer:
        """A producer for one source of ``stream`` (a context manager). It fetches the stream's
        schema now (``NotFound`` for an unknown stream); ``timeout`` (seconds) bounds each of its
        Ingest calls, which otherwise run unbounded."""
        from lowtide.clients._producers import Producer  # loads Arrow: not at import (control calls)

        return Producer(
            self._stub,
            self.target,
            stream,
            source,
            linger_ms,
            max_batch_rows,
            timeout,
            streams=self.list_streams,
            bound=self._message_bound,
        )

    def subscribe(self, query: str, from_oldest: bool = True, from_offset: int | None = None) -> Subscription:
        """Result tables and punctuation of ``query`` (or ``"<query>.late"``).

        From the oldest item the server retains (``retained_items``, default 1024, within
        ``retained_bytes``, 256 MiB), so results emitted before the call are not missed;
        ``from_oldest=False``: only what comes from now on. ``from_offset=n``: from output offset
        ``n`` on (``Subscription.offset`` is the offset of the last item yielded: resume at
        ``offset + 1`` after a disconnect or a server restart); ``OutOfRange`` when ``n`` is no
        longer retained. A subscription more than ``max_subscriber_bytes`` behind, or whose next
        message would take what the server is sending to all subscribers past
        ``max_subscriber_bytes_total``, raises ``ResourceExhausted`` naming the offset to resume
        from (``offset + 1``: a table cut between its slices comes again). Iteration ends after the
        end-of-stream punctuation; from now or past it, on a query that has ended, at once.
        """
        return Subscription(self._stub, self.target, query, from_oldest, from_offset)


# -- asyncio --------------------------------------------------------------------------------------
class AsyncSubscription:
    """:class:`Subscription` for asyncio: ``async for item in ...``; it stops after the
    end-of-stream punctuation too."""

    def __init__(
        self, stub: Any, target: str, query: str, from_oldest: bool, from_offset: int | None = None
    ) -> None:
        self._target = target
        self._cancelled = False
        self._call = stub.Subscribe(wire.subscribe_request(query, from_oldest, from_offset))
        self.offset: int | None = None  # the output offset of the last item yielded

    def __aiter__(self) -> AsyncIterator[Item]:
        return self

    async def __anext__(self) -> Item:
        if self._cancelled:
            raise StopAsyncIteration
        response = await self._next_message()
        offset, item = wire.subscribe_item(response)
        rest = []
        while response.more:  # a wide table, in slices under the message limit
            response = await self._next_message()
            rest.append(wire.subscribe_item(response)[1])
        item = wire.whole_table(item, rest)
        self.offset = offset  # once whole: a call cut between slices resumes at this item
        if wire.ends_stream(item):
            self.cancel()
        return item

    async def _next_message(self) -> Any:
        try:
            response = await self._call.read()
        except grpc.RpcError as exc:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise translate(exc, self._target) from None
        except asyncio.CancelledError:
            if self._cancelled:
                raise StopAsyncIteration from None
            raise
        if response is _EOF:
            raise StopAsyncIteration
        return response

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncClient:
    """:class:`Client` for asyncio (grpc.aio): the same methods, awaited; ``async with``."""

    def __init__(
        self,
        target: str,
        timeout: float | None = None,
        root_certificates: RootCertificates | None = None,
        token: str | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = aio_channel(target, root_certificates, token)
        self._stub: Any = pb_grpc.LowtideStub(self._channel)
        self._bound: MessageBound | None = None  # the server's limit on a message, once asked

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def _message_bound(self) -> MessageBound:
        if self._bound is None:
            self._bound = MessageBound((await self.health())["max_message_bytes"])
        return self._bound

    async def _run(self, call: wire.Call[T]) -> T:
        try:
            response = await getattr(self._stub, call.method)(call.request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise call.failed(translate(exc, self.target, self.timeout)) from None
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

    async def list_workers(self) -> list[dict[str, Any]]:
        return await self._run(wire.list_workers())

    async def health(self) -> dict[str, Any]:
        return await self._run(wire.health())

    async def commit_offset(self, query: str, reader: str, offset: int) -> None:
        await self._run(wire.commit_offset(query, reader, offset))

    async def stage(
        self,
        stream: str,
        batch_id: int,
        part: str,
        table: pa.Table | Iterable[pa.Table],
        source: str = "default",
        max_part_rows: int = 250_000,
    ) -> dict[str, Any]:
        bound = await self._message_bound()
        return await self._run(wire.stage(stream, source, batch_id, part, table, max_part_rows, bound))

    async def commit_staged(
        self,
        stream: str,
        batch_id: int,
        parts: Sequence[str],
        source: str = "default",
        punctuation: int | None = None,
    ) -> dict[str, Any]:
        return await self._run(wire.commit_staged(stream, source, batch_id, parts, punctuation))

    async def abort_staged(self, stream: str, batch_id: int, source: str = "default") -> int:
        return await self._run(wire.abort_staged(stream, source, batch_id))

    def producer(
        self,
        stream: str,
        source: str = "default",
        linger_ms: float = 5,
        max_batch_rows: int = 100_000,
        timeout: float | None = None,
    ) -> AsyncProducer:
        """``async with client.producer(...) as p`` (or ``p = await client.producer(...)``) fetches
        the stream's schema at once; a producer used without either does at its first call."""
        from lowtide.clients._producers import AsyncProducer  # loads Arrow: not at import

        return AsyncProducer(
            self._stub,
            self.target,
            stream,
            source,
            linger_ms,
            max_batch_rows,
            timeout,
            streams=self.list_streams,
            bound=self._message_bound,
        )

    def subscribe(
        self, query: str, from_oldest: bool = True, from_offset: int | None = None
    ) -> AsyncSubscription:
        return AsyncSubscription(self._stub, self.target, query, from_oldest, from_offset)


__all__ = ["AsyncClient", "AsyncProducer", "AsyncSubscription", "Client", "Item", "Producer", "Subscription"]
