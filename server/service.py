"""The front's gRPC servicer: control calls, ingestion and subscriptions come here.

Each call decodes its request, checks it against the door and submits the change to the
:class:`~lowtide.server.front.Front`. Every call ends with a status, never with an exception out
of a handler: a lowtide error maps to its status (its class in the ``lowtide-error`` trailing
metadata), a message that does not parse to INVALID_ARGUMENT, anything else to INTERNAL with a
one-line reason (:func:`translated`).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
import pyarrow as pa

from lowtide import __version__, errors
from lowtide.errors import InvalidArgument, LowtideError, NotFound, ResourceExhausted
from lowtide.handles import Item
from lowtide.ipc import read_ipc
from lowtide.names import shown, unknown
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.punctuation.model import Punctuation
from lowtide.server import input_log as records
from lowtide.server import staged_calls
from lowtide.server.batches import PartialBatch, admitted_bytes
from lowtide.server.front import Front
from lowtide.server.hub import Closed
from lowtide.server.scopes import committer
from lowtide.server.server_door import ServerDoor

Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])
log = logging.getLogger("lowtide.server")
_INTEGER = re.compile(r"-?[0-9]{1,19}")  # int() of longer digit strings is slow, or refused


def _columns(schema: dict[str, str]) -> list[pb.Column]:
    return [pb.Column(name=name, type=kind) for name, kind in schema.items()]


def _read_arrow(data: bytes, max_rows: int | None = None) -> pa.Table:
    """A received Arrow IPC stream, checked and validated in full (:func:`lowtide.ipc.read_ipc`):
    ``SchemaMismatch`` when malformed, ``ResourceExhausted`` past ``max_rows``."""
    return read_ipc(data, max_rows)


def _arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


_MESSAGE_HEADROOM = 4096  # of max_message_bytes, for a response's fields around its Arrow bytes


_SLICE_BYTES = 4 << 20  # what a message of a result table aims at (max_message_bytes if less)


def _messages(offset: int, item: Item, max_bytes: int) -> Iterator[pb.SubscribeResponse]:
    """The messages of one item, each made when the one before has been sent: a table over
    ``_SLICE_BYTES`` as slices of consecutive rows, each but the last marked ``more``, each
    under ``max_bytes`` (a message over gRPC's limit would end the subscription; a single row
    over it goes alone: gRPC then refuses it, naming the limit). Only the slice at hand is
    serialized, from the item as the hub keeps it: a reader that stops holds one small message,
    not a serialized copy of the table (with its copies in protobuf and gRPC, about three)."""
    if isinstance(item, Punctuation):
        yield pb.SubscribeResponse(
            punctuation=pb.Punctuation(value=item.value, attribute=item.attribute), offset=offset
        )
        return
    aim = min(max_bytes, _SLICE_BYTES)
    todo = [item]  # slices still to send, the next one last
    while todo:
        table = todo.pop()
        if table.nbytes <= aim or table.num_rows <= 1:  # likely one message: try it
            data = _arrow_bytes(table)
            if len(data) <= max_bytes or table.num_rows <= 1:
                response = pb.SubscribeResponse(arrow=data, offset=offset, more=bool(todo))
                del data  # the message has its own copy
                yield response
                del response  # sent: not alive while the next slice is made
                continue
            del data
        # Rows for half the aim (headroom for the IPC framing), and at most half the rows.
        rows = max(1, min(table.num_rows // 2, table.num_rows * aim // (2 * max(1, table.nbytes))))
        todo.extend(table.slice(at, rows) for at in reversed(range(0, table.num_rows, rows)))


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], exc: LowtideError, extra: tuple[tuple[str, str], ...] = ()
) -> None:
    await context.abort(
        grpc.StatusCode[exc.status],
        str(exc),
        trailing_metadata=(("lowtide-error", type(exc).__name__), *extra),
    )


def _forget_locals(exc: BaseException, ended: Callable[..., Any]) -> None:
    """Clear the frame of ``ended`` that ``exc`` has just come out of (it is done: only the frame
    that caught ``exc`` is above it). The abort that follows chains to ``exc`` in a reference
    cycle with grpc's handler, which would keep that frame's locals (the parts a refused batch
    received, the slice a cut subscriber was making) alive until a garbage collection."""
    below = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    if below is not None and below.tb_frame.f_code is ended.__code__:
        below.tb_frame.clear()


class _Undecodable:
    """A request message that does not parse (bad UTF-8 in a string field, a truncated field):
    gRPC would answer UNKNOWN before any handler ran; it reaches the handler as this instead,
    which answers INVALID_ARGUMENT."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decoder(message: Any) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except Exception as exc:  # protobuf's DecodeError, whatever its parser raises
            detail = str(exc).rsplit(": ", 1)[-1]  # after "Error parsing message with type '...'"
            return _Undecodable(f"malformed {message.DESCRIPTOR.name} message: {detail}")

    return decode


def _decoded(request: Any) -> Any:
    """``request`` as it is; InvalidArgument for one that did not parse."""
    if isinstance(request, _Undecodable):
        raise InvalidArgument(request.reason)
    return request


def add_service(service: Service, server: grpc.aio.Server) -> None:
    """What the generated ``add_LowtideServicer_to_server`` does, with request decoders that let
    a malformed message reach its handler (see :class:`_Undecodable`)."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    described = pb.DESCRIPTOR.services_by_name["Lowtide"]
    handlers = {}
    for method in described.methods:
        make = kinds[(method.client_streaming, method.server_streaming)]
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = make(
            getattr(service, method.name), _decoder(request), response.SerializeToString
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(described.full_name, handlers),))
    server.add_registered_method_handlers(described.full_name, handlers)  # type: ignore[attr-defined]


class _Tally:
    """One Ingest call so far: the index of the message at hand (0-based) and what was applied.

    A rejection stops the call at that message, whole: the messages before it were applied, the
    ones after it were not read. Its trailing metadata says which (``lowtide-message``) and what
    the call applied before it (``lowtide-applied``: tuples,batches,duplicates), so a producer can
    name the batch and resend what follows it.
    """

    def __init__(self) -> None:
        self.message = -1
        self.tuples = self.batches = self.duplicates = 0
        self.receiving: PartialBatch | None = None  # the last batch begun: what it holds goes at the end

    async def count(self, requests: AsyncIterator[pb.IngestRequest]) -> AsyncIterator[pb.IngestRequest]:
        async for request in requests:
            self.message += 1
            _decoded(request)
            yield request

    def metadata(self) -> tuple[tuple[str, str], ...]:
        applied = f"{self.tuples},{self.batches},{self.duplicates}"
        return (("lowtide-message", str(max(self.message, 0))), ("lowtide-applied", applied))


async def _abort_unexpected(context: grpc.aio.ServicerContext[Any, Any], exc: Exception, call: str) -> None:
    """The safety net under every call: an exception no lowtide check raised on purpose ends the
    call with a status and a one-line reason, never the process. Its traceback goes to the log.

    RecursionError (something nested too deeply) is the request's fault: INVALID_ARGUMENT;
    MemoryError: RESOURCE_EXHAUSTED; anything else is a bug of ours: INTERNAL, ``internal error:
    <class>: <first line>``.
    """
    lines = str(exc).strip().splitlines()
    first = type(exc).__name__ + (f": {lines[0]}" if lines else "")
    log.error("%s failed: %s", call, first, exc_info=exc)
    if isinstance(exc, RecursionError):
        await _abort(context, InvalidArgument("the request nests too deeply"))
    elif isinstance(exc, MemoryError):
        await _abort(context, ResourceExhausted(f"out of memory serving {call}"))
    else:
        reason = " ".join(f"internal error: {first}".split())
        await context.abort(grpc.StatusCode.INTERNAL, reason[: errors.MAX_REASON])


def translated(handler: Handler) -> Handler:
    """Map lowtide errors to their gRPC status; the exception's class travels in metadata. Any
    other exception becomes a status too (:func:`_abort_unexpected`)."""

    @functools.wraps(handler)
    async def wrapper(self: Service, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await handler(self, _decoded(request), context)
        except grpc.aio.AbortError:
            raise  # a status already set (context.abort raises this)
        except LowtideError as exc:
            await _abort(context, exc)
        except Exception as exc:
            await _abort_unexpected(context, exc, handler.__name__)

    return wrapper  # type: ignore[return-value]


class Service(pb_grpc.LowtideServicer):
    def __init__(self, front: Front) -> None:
        self.front = front

    @property
    def door(self) -> ServerDoor:
        return self.front.door  # a new one after a recovery

    @translated
    async def CreateStream(self, request: pb.CreateStreamRequest, context: Any) -> pb.CreateStreamResponse:
        schema: dict[str, str] = {}
        for column in request.schema:
            if column.name in schema:
                raise InvalidArgument(f"column {shown(column.name)} appears more than once in the schema")
            schema[column.name] = column.type
        record = records.CreateStreamRecord(
            time.time(),
            request.name,
            schema,
            progressing=request.progressing or "ts",
            punctuation=request.punctuation or "explicit",
            sources=list(request.sources),
            idle_timeout=request.idle_timeout_s or None,
        )
        self.door.check_stream(
            record.name, schema, record.progressing, record.punctuation, record.sources, record.idle_timeout
        )
        await self.front.submit(record)
        return pb.CreateStreamResponse()

    @translated
    async def DropStream(self, request: pb.DropStreamRequest, context: Any) -> pb.DropStreamResponse:
        self.door.check_drop_stream(request.name)  # nothing that cannot apply is logged
        await self.front.submit(records.DropStreamRecord(time.time(), request.name))
        return pb.DropStreamResponse()

    @translated
    async def ListStreams(self, request: pb.ListStreamsRequest, context: Any) -> pb.ListStreamsResponse:
        streams = self.door.stats()["streams"]
        return pb.ListStreamsResponse(
            streams=[
                pb.StreamInfo(
                    name=s["name"],
                    schema=_columns(s["schema"]),
                    progressing=s["progressing"],
                    punctuation=s["punctuation"],
                    sources=s["sources"],
                    low_watermark=s["low_watermark"],
                    tuples_ingested=streams[s["name"]]["ingested"],
                    late_tuples=streams[s["name"]]["late"],
                    source_punctuation=s["source_punctuation"],
                    declared_sources=s["declared"],
                )
                for s in self.door.list_streams()
            ]
        )

    @translated
    async def RegisterQuery(self, request: pb.RegisterQueryRequest, context: Any) -> pb.RegisterQueryResponse:
        text = request.allowed_lateness  # a number of units, else a duration: the planner checks both
        lateness: str | int | None = int(text) if _INTEGER.fullmatch(text) else (text or None)
        record = self.front.query_record(request.sql, request.name or None, request.late or "drop", lateness)
        self.door.check_query(record.sql, record.name, record.late, record.allowed_lateness)
        name = await self.front.submit(record)
        running = self.door.query(name)
        return pb.RegisterQueryResponse(
            name=name,
            columns=[pb.Column(name=n, type=t.name) for n, t in running.description.schema],
            plan=self.door.plan_of(name),
        )

    @translated
    async def ExplainQuery(self, request: pb.ExplainQueryRequest, context: Any) -> pb.ExplainQueryResponse:
        return pb.ExplainQueryResponse(plan=self.door.explain(request.sql))

    @translated
    async def DropQuery(self, request: pb.DropQueryRequest, context: Any) -> pb.DropQueryResponse:
        self.door.check_drop_query(request.name)
        await self.front.submit(records.DropQueryRecord(time.time(), request.name))
        return pb.DropQueryResponse()

    @translated
    async def ListQueries(self, request: pb.ListQueriesRequest, context: Any) -> pb.ListQueriesResponse:
        infos = []
        statuses = self.front.query_statuses()
        for q in self.door.list_queries():
            remote = self.door.remotes()[q["name"]]
            hub = self.front.hubs[q["name"]]
            status, reason = statuses[q["name"]]
            infos.append(
                pb.QueryInfo(
                    name=q["name"],
                    sql=q["sql"],
                    late=q["late"],
                    columns=[pb.Column(name=n, type=t.name) for n, t in remote.query.description.schema],
                    results=q["results"],
                    late_tuples=q["late_tuples"],
                    low_watermark=remote.meld.low_watermark,
                    time_unit=q["time_unit"],
                    oldest_offset=hub.retained_from,
                    next_offset=hub.next_offset,
                    readers=hub.readers,
                    status=status,
                    status_reason=reason,
                )
            )
        return pb.ListQueriesResponse(queries=infos)

    @translated
    async def ListWorkers(self, request: pb.ListWorkersRequest, context: Any) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(
            workers=[
                pb.WorkerInfo(
                    index=index,
                    node=place.node,
                    pid=place.pid,
                    restarts=place.restarts,
                    status=place.status,
                    queries=[
                        pb.WorkerQuery(name=name, state_bytes=state)
                        for name, state in self.door.hosted(index).items()
                    ],
                )
                for index, place in enumerate(self.front.workers.places())
            ]
        )

    @translated
    async def Ingest(
        self, request_iterator: AsyncIterator[pb.IngestRequest], context: Any
    ) -> pb.IngestResponse:
        tally = _Tally()
        try:
            return await self._ingest(tally.count(request_iterator), tally)
        except LowtideError as exc:  # names the message it stopped at (see _Tally)
            _forget_locals(exc, Service._ingest)
            await _abort(context, exc, tally.metadata())
            raise  # not reached: abort raises
        finally:  # however the call ends (refused, cancelled, the client gone): nothing is held
            if tally.receiving is not None:
                self.front.pending.release(tally.receiving)
                tally.receiving = None  # this frame may outlive the call (see _forget_locals)

    async def _ingest(
        self, request_iterator: AsyncIterator[pb.IngestRequest], tally: _Tally
    ) -> pb.IngestResponse:
        front = self.front  # its door is read at each use: a recovery replaces it
        stream = source = ""
        partial: PartialBatch | None = None  # a multi-part batch until its last part arrives
        async for request in request_iterator:
            if not stream:
                stream, source = request.stream, request.source or "default"
                if not stream:
                    raise NotFound("the first Ingest message must name the stream")
                front.door.low_watermark(stream)  # NotFound for an unknown stream, before any data
            item = request.WhichOneof("item")
            if item == "arrow":
                batch_id, parts = request.batch_id, max(1, request.batch_parts)
                if partial is None:
                    duplicate = bool(batch_id) and batch_id in front.applied_batches(stream, source)
                    partial = PartialBatch(batch_id, parts, duplicate, front.door.epoch)
                    tally.receiving = partial
                partial.check(batch_id, parts)
                # Each part is checked and coded on arrival, while the client sends the next.
                if partial.duplicate:
                    admitted = None
                else:
                    arrow = request.arrow  # read once: each read of the field is another copy
                    if parts > 1:  # its parts wait for the last one: charged before decoding
                        front.pending.hold(partial, len(arrow))
                    table = _read_arrow(arrow, front.door.limits.max_batch_rows)
                    admitted = front.door.admit(stream, table, validated=True)
                    partial.payloads.append(arrow)
                    if parts > 1:
                        front.pending.hold(partial, admitted_bytes(admitted, arrow))
                if not partial.take(admitted):
                    continue
                whole, partial = partial, None
                applied = front.applied_batches(stream, source)
                # Checked again at the end: another call may have applied the same id meanwhile.
                if whole.duplicate or (whole.batch_id and whole.batch_id in applied):
                    front.pending.release(whole)
                    tally.duplicates += 1
                    continue
                batch = (whole.batch_id, whole.payloads, whole.admitted, whole.epoch)
                rows = await front.submit_batch(stream, source, *batch)
                front.pending.release(whole)  # applied: the front holds its parts no more
                if rows == 0 and whole.batch_id:  # applied meanwhile, by another call
                    tally.duplicates += 1
                    continue
                front.metrics.ingest_batch(stream, rows, time.perf_counter() - whole.began)
                tally.tuples += rows
                tally.batches += 1
                await front.workers.wait_for_room()
            elif partial is not None:
                raise InvalidArgument(partial.cut_short())
            elif item == "punctuation":
                front.door.check_punctuation(stream, request.punctuation, source)
                await front.submit(records.PunctuateRecord(time.time(), stream, source, request.punctuation))
            elif item == "close":
                front.door.check_close(stream, source)
                await front.submit(records.CloseSourceRecord(time.time(), stream, source))
        if partial is not None:
            raise InvalidArgument(partial.cut_short())
        low = front.door.low_watermark(stream) if stream else 0
        return pb.IngestResponse(
            tuples=tally.tuples, batches=tally.batches, duplicates=tally.duplicates, low_watermark=low
        )

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: Any
    ) -> AsyncIterator[pb.SubscribeResponse]:
        """Every failure ends the call with a status, as :func:`translated` does for the others."""
        try:
            async for response in self._subscribe(_decoded(request), context):
                yield response
        except grpc.aio.AbortError:
            raise
        except LowtideError as exc:
            _forget_locals(exc, Service._subscribe)
            await _abort(context, exc)
        except Exception as exc:
            await _abort_unexpected(context, exc, "Subscribe")

    async def _subscribe(
        self, request: pb.SubscribeRequest, context: Any
    ) -> AsyncIterator[pb.SubscribeResponse]:
        hub = self.front.hubs.get(request.query)
        if hub is None:
            await _abort(context, unknown("query", request.query, self.front.hubs))
            return
        from_offset = request.from_offset if request.HasField("from_offset") else None
        if from_offset is not None and from_offset < 0:
            raise InvalidArgument(f"from_offset must be 0 or more, got {from_offset}")
        subscription = hub.subscribe(request.from_oldest, from_offset)
        limit = self.front.config.max_message_bytes - _MESSAGE_HEADROOM
        sending = self.front.sending
        try:
            while True:
                entry = await subscription.next()
                if isinstance(entry, Closed):
                    if entry.status is not None:
                        # A limit passed (state, backlog) names its class like every other error.
                        kind = ResourceExhausted.__name__ if entry.status == ResourceExhausted.status else ""
                        metadata = (("lowtide-error", kind),) if kind else ()
                        code = grpc.StatusCode[entry.status]
                        await context.abort(code, entry.reason, trailing_metadata=metadata)
                    return
                # The item is the hub's own (retained, or charged to this subscription as the
                # item in flight); while a slow reader parks the send, the one message being sent
                # is all this subscription adds, and the server-wide total bounds those.
                offset, item = entry
                del entry
                for response in _messages(offset, item, limit):
                    size = response.ByteSize()
                    if not sending.take(size):
                        raise sending.cut(offset)  # this one ends: those already sending go on
                    try:
                        yield response
                    finally:
                        sending.give(size)
                    del response
                del item
        finally:
            hub.unsubscribe(subscription)

    @translated
    async def CommitOffset(self, request: pb.CommitOffsetRequest, context: Any) -> pb.CommitOffsetResponse:
        hub = self.front.hubs.get(request.query)
        if hub is None:
            raise unknown("query", request.query, self.front.hubs)
        hub.commit_reader(request.reader, request.offset, committer.get())
        return pb.CommitOffsetResponse()

    @translated
    async def Stage(self, request_iterator: AsyncIterator[pb.StageRequest], context: Any) -> pb.StageResponse:
        return await staged_calls.stage(self.front, request_iterator, _decoded)

    @translated
    async def CommitStaged(self, request: pb.CommitStagedRequest, context: Any) -> pb.CommitStagedResponse:
        return await staged_calls.commit_staged(self.front, request)

    @translated
    async def AbortStaged(self, request: pb.AbortStagedRequest, context: Any) -> pb.AbortStagedResponse:
        return staged_calls.abort_staged(self.front, request)

    @translated
    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        return pb.HealthResponse(
            status="SERVING",
            workers=self.front.workers.size,
            version=__version__,
            max_message_bytes=self.front.config.max_message_bytes,
        )
