"""The front process: gRPC (grpc.aio on uvloop) in front of the engine's door and its workers.

Control calls, ingestion and subscriptions all come here. Batches pass the door (schema, string
codes, sources, progress, late detection) of a :class:`~lowtide.door.Door` and go
to the workers; worker output comes back, is melded per query and waits in a :class:`Hub` for
subscribers. ``serve`` runs until SIGTERM or SIGINT, then drains: in-flight batches reach the
workers, their results reach the subscribers, subscriptions end cleanly, the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
import pyarrow as pa
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lowtide import __version__, errors
from lowtide.door import CheckedBatch, Door, Limits
from lowtide.errors import (
    InvalidArgument,
    LowtideError,
    NotFound,
    ResourceExhausted,
    StartupFailure,
)
from lowtide.ipc import read_ipc
from lowtide.names import shown, unknown
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.state import as_dict
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.punctuation.model import Punctuation
from lowtide.server import auth
from lowtide.server import input_log as records
from lowtide.server import messages as msg
from lowtide.server.batches import AppliedBatches, PartialBatch
from lowtide.server.checkpoint import Checkpoint
from lowtide.server.checkpointer import Checkpointer
from lowtide.server.config import ServerConfig
from lowtide.server.front_state import restore_catalog, restore_output
from lowtide.server.hub import Closed, Entry, Hub
from lowtide.server.input_log import Record, TornTail
from lowtide.server.journal import Journal, StateDirectory
from lowtide.server.local_workers import LocalWorkers
from lowtide.server.metrics import ServerMetrics
from lowtide.server.ports import ensure_free
from lowtide.server.process_runner import ProcessRunner
from lowtide.strings import StringPool
from lowtide.testing import ManualClock

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


def _subscribe_response(entry: Entry) -> pb.SubscribeResponse | Closed:
    if isinstance(entry, Closed):
        return entry
    offset, item = entry
    if isinstance(item, Punctuation):
        return pb.SubscribeResponse(
            punctuation=pb.Punctuation(value=item.value, attribute=item.attribute), offset=offset
        )
    return pb.SubscribeResponse(arrow=_arrow_bytes(item), offset=offset)


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], exc: LowtideError, extra: tuple[tuple[str, str], ...] = ()
) -> None:
    await context.abort(
        grpc.StatusCode[exc.status],
        str(exc),
        trailing_metadata=(("lowtide-error", type(exc).__name__), *extra),
    )


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


class Front:
    """The engine's door, the worker pool, the hubs and the metrics of one server."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = ServerMetrics()
        self.workers = LocalWorkers(config.workers, self._on_message, self._on_death, self._give_up)
        self.stopping = asyncio.Event()  # SIGTERM, SIGINT, or workers that cannot start
        self.exit_code = 0
        # The door's clock reads the time each change was applied at (the input log records it),
        # so replay runs heartbeats and idle timeouts exactly as they ran.
        self.clock = ManualClock(time.time())
        self.engine = self._new_engine()
        self.hubs: dict[str, Hub] = {}
        self.applied: dict[tuple[str, str], AppliedBatches] = {}  # exactly-once ids per source
        self.state = StateDirectory(config.state_dir, config.fsync) if config.state_dir else None
        self.journal = Journal(self.apply, self.state.log if self.state else None)
        # The catalog as created: what a checkpoint re-creates before it restores the state.
        self.catalog_streams: dict[str, records.CreateStream] = {}
        self.catalog_queries: dict[str, records.RegisterQuery] = {}
        self.generation = 0  # recoveries so far: work begun against an older engine is redone
        self.checkpoints = Checkpointer(self) if self.state is not None else None
        self._resetting: set[int] = set()  # workers whose messages are moot until they reset
        self._recovered = asyncio.Event()  # clear while recoveries are due or running
        self._recoveries_due = 1 if self.state is not None else 0  # the start's own, see recover()
        if not self._recoveries_due:
            self._recovered.set()
        self._recovery = asyncio.Lock()  # one at a time: a worker may die during another's
        self._syncs: dict[int, tuple[set[int], asyncio.Future[None]]] = {}  # token -> workers owing
        self._tokens = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        # Scrapes run on the exposition's thread: they read a copy the event loop refreshes.
        self._snapshot: dict[str, Any] = {"streams": {}, "queries": {}}

    def _new_engine(self) -> Door[ProcessRunner]:
        config = self.config
        limits = Limits(
            config.max_streams,
            config.max_queries,
            config.max_batch_rows,
            max_windows_per_tuple=config.max_windows_per_tuple,
            max_windows_per_step=config.max_windows_per_step,
            max_strings=config.max_strings,
            max_string_bytes=config.max_string_bytes,
        )
        flush = SlowFlush(config.flush_every, config.flush_max_windows) if config.flush_every else None
        pool = StringPool(mirrored=True)  # the workers' pools mirror it (ProcessRunner.sync_strings)
        runner = ProcessRunner(self.workers, pool, flush, limits.windows)
        runner.on_released = self.metrics.punctuation_to_result
        # The hubs number every item of a late side stream, and recovery replays them to the same
        # offsets; a drain follows each worker message, so what would collapse depends on timing.
        return Door(runner, pool, self.clock, limits, flush, collapses_late_markers=False)

    async def start(self) -> None:
        self.workers.start()
        self.metrics.set_snapshot(lambda: self._snapshot)
        self._tasks.append(asyncio.get_running_loop().create_task(self._ticker()))

    # -- changes: applied in the journal's order, live and at replay ---------------------------
    async def submit(self, record: Record, prepared: Any = None, generation: int | None = None) -> Any:
        """Log and apply ``record``; ``prepared`` (what was made ready for it by the engine of
        ``generation``) is dropped if a recovery has replaced that engine since."""
        await self._recovered.wait()  # a worker's death is being recovered from: changes wait
        if generation is not None and generation != self.generation:
            prepared = None  # strings coded by a pool that is gone: applied from its bytes
        return await self.journal.submit(record, prepared)

    def apply(self, record: Record, prepared: Any = None) -> Any:
        """Apply one change at the time it was made (see :mod:`lowtide.server.journal`)."""
        self.clock.set(record.now)
        engine = self.engine
        match record:
            case records.CreateStream():
                engine.create_stream(
                    record.name,
                    record.schema,
                    progressing=record.progressing,
                    punctuation=record.punctuation,
                    sources=record.sources,
                    idle_timeout=record.idle_timeout,
                )
                self.catalog_streams[record.name] = record
            case records.DropStream():
                self.drop_stream(record.name)
                del self.catalog_streams[record.name]
            case records.RegisterQuery():  # prepared: the slices it read, when restoring
                name = self.register(record.sql, record.name, record.late, record.allowed_lateness, prepared)
                self.catalog_queries[name] = dataclasses.replace(record, name=name)
                return name
            case records.DropQuery():
                self.drop(record.name)
                del self.catalog_queries[record.name]
            case records.FailQuery():
                remote = engine.runner.queries.get(record.name)
                if remote is not None and not remote.failed:
                    engine.runner.fail(remote, record.reason, record.status)
                    self._close_failed(record.name, record.status, record.reason)
            case records.Batch():
                return self._apply_batch(record, prepared)
            case records.Punctuate():
                engine.punctuate(record.stream, record.value, record.source)
            case records.CloseSource():
                engine.close_source(record.stream, record.source)
            case records.Tick():
                engine.tick()
        return None

    def _apply_batch(self, record: records.Batch, prepared: tuple[int, CheckedBatch] | None) -> int:
        """Apply a batch once per id; returns its rows (0 for a replay of an applied id).
        ``prepared``: the batch as the door checked it when accepted, and the string pool's
        releases when its parts were admitted."""
        applied = self.applied_batches(record.stream, record.source)
        if record.batch_id and record.batch_id in applied:
            return 0
        checked = prepared[1] if prepared is not None else None
        if prepared is not None and prepared[0] != self.engine.pool.releases:
            checked = None  # a dropped stream's codes were freed since: they may name others now
        if checked is None:  # at replay: admitted as it was when accepted (no string limit)
            limit = self.engine.limits.max_batch_rows
            parts = [
                self.engine.admit(record.stream, read_ipc(part, limit), validated=True, limited=False)
                for part in record.parts
            ]
        else:
            parts = checked.parts
        self.engine.push_admitted(record.stream, checked or parts, record.source)
        if record.batch_id:
            applied.add(record.batch_id)
        return sum(batch.n for batch in parts)

    async def recover(self) -> tuple[int, TornTail | None]:
        """At start: restore the newest checkpoint of ``--state-dir`` and replay the log after it;
        returns how many logged changes were replayed and the torn last record cut off.

        Nothing in the state directory changes until every worker has restored and the whole
        log is read (a damaged file raises :class:`StartupFailure` naming it); changes, ticks and
        checkpoints wait until then."""
        assert self.state is not None and self.checkpoints is not None
        async with self._recovery:
            checkpoint = self.checkpoints.load()
            start = 0
            if checkpoint is not None:
                start = self._restore(checkpoint, live_hubs=False)
            replayed = await self._replay(self.state.log.replay(start, self.checkpoints.store.extent()))
            await self.sync()
            if self.checkpoints.restore_errors:
                raise StartupFailure(f"cannot restore the checkpoint: {self.checkpoints.restore_errors[0]}")
            # Recovered: now, and only now, the state directory may change.
            torn = self.state.log.recovered()
            self.checkpoints.store.remove_interrupted()
        self._recoveries_due -= 1
        if not self._recoveries_due:
            self._recovered.set()
        return replayed, torn

    async def _replay(self, logged: Iterable[tuple[int, Record]]) -> int:
        replayed = 0
        for seq, record in logged:
            # A record that failed when it was accepted fails the same way now, changing nothing.
            with contextlib.suppress(LowtideError):
                self.apply(record)
            self.journal.applied_through = max(self.journal.applied_through, seq)
            replayed += 1
            await self.workers.wait_for_room()
        return replayed

    def _restore(self, checkpoint: Checkpoint, live_hubs: bool) -> int:
        """Put the front and every worker where ``checkpoint`` was taken; returns its log position.
        New hubs take the offsets and items it retained; live ones skip what comes again."""
        front_state = as_dict(checkpoint.front, "front state")
        restore_catalog(self, front_state["door"])
        messages = restore_output(self, front_state["output"], live_hubs)
        self.engine.runner.sync_strings()
        for worker in range(self.workers.size):
            self.workers.post(worker, msg.Restore(self.generation, str(checkpoint.worker_path(worker))))
        for worker, record, arrays in messages:
            self.workers.post(worker, msg.from_record(record), arrays)
        return checkpoint.seq

    async def _recover_from_death(self, worker: int) -> None:
        """A worker died: every worker starts over from the last checkpoint plus the log, while
        changes wait; subscribers see no gap and no duplicate (the hubs skip what comes again)."""
        assert self.state is not None and self.checkpoints is not None
        await self._recovery.acquire()
        try:
            self.checkpoints.abandon()
            self.generation += 1
            self._resetting = set(range(self.workers.size))
            for w in range(self.workers.size):
                self.workers.post(w, msg.Reset(self.generation))
            self.engine = self._new_engine()
            self.applied = {}
            self.catalog_streams, self.catalog_queries = {}, {}
            for hub in self.hubs.values():  # the subscribers stay; what comes again is skipped
                hub.remade = hub.next_offset
            checkpoint = self.checkpoints.load()
            start = 0
            if checkpoint is not None:
                start = self._restore(checkpoint, live_hubs=True)
            self.journal.forget_prepared()  # coded against the old pool: applied from their bytes
            through = self.journal.applied_through
            await self._replay((seq, r) for seq, r in self.state.log.records(start) if seq <= through)
        finally:
            self._recovery.release()
            self._recoveries_due -= 1
            if not self._recoveries_due:
                self._recovered.set()
        self.metrics.worker_restarted(worker)

    # -- queries and their output -------------------------------------------------------------
    def register(
        self,
        sql: str,
        name: str | None,
        late: str,
        allowed_lateness: str | int | None,
        restored_share: str | None = None,
    ) -> str:
        if self.checkpoints is not None:
            self.checkpoints.abandon()  # its cut would hold a query its workers never saw
        query = self.engine.register_query(sql, name, late, allowed_lateness, restored_share)
        for key in (query.name, f"{query.name}.late"):  # a recovery keeps the live hubs
            self.hubs.setdefault(
                key,
                Hub(self.config.retained_items, self.config.retained_bytes, self.config.max_subscriber_bytes),
            )
        return query.name

    def drop(self, name: str) -> None:
        self.engine.drop_query(name)
        for key in (name, f"{name}.late"):
            hub = self.hubs.pop(key, None)
            if hub is not None:
                hub.close()

    def applied_batches(self, stream: str, source: str) -> AppliedBatches:
        return self.applied.setdefault((stream, source), AppliedBatches())

    def drop_stream(self, name: str) -> None:
        self.engine.drop_stream(name)
        for key in [k for k in self.applied if k[0] == name]:
            del self.applied[key]

    def _publish(self, name: str) -> None:
        for key in (name, f"{name}.late"):
            hub = self.hubs.get(key)
            if hub is not None:
                items = self.engine.drain(key)
                if items:
                    hub.publish(items)
        remote = self.engine.runner.queries.get(name)
        if remote is not None and remote.failed:
            self._close_failed(name, remote.status, remote.failed)

    def _close_failed(self, name: str, status: str, reason: str) -> None:
        for key in (name, f"{name}.late"):
            hub = self.hubs.get(key)
            if hub is not None:
                hub.close(status, reason)

    def _on_message(self, worker: int, message: msg.ToFront, arrays: dict[str, Any]) -> None:
        if worker in self._resetting:  # sent before the reset: about a world that is gone
            if isinstance(message, msg.ResetDone) and message.generation == self.generation:
                self._resetting.discard(worker)
            return
        match message:
            case msg.ResetDone():
                pass  # a recovery already over: nothing waits for it
            case msg.Checkpointed() | msg.Persisted() | msg.Restored():
                if self.checkpoints is not None:
                    self.checkpoints.answered(worker, message)
            case msg.Synced():
                self._synced(message.token, worker)
            case _:
                name = self.engine.runner.on_worker_message(worker, message, arrays)
                if name is not None:
                    self._publish(name)
                if isinstance(message, msg.Failed):  # the queries sharing its slices failed with it
                    for remote in self.engine.runner.queries.values():
                        if remote.failed:
                            self._close_failed(remote.name, remote.status, remote.failed)

    def _synced(self, token: int, worker: int) -> None:
        """``worker`` has processed everything posted to it before the sync of ``token``."""
        waiting = self._syncs.get(token)
        if waiting is not None:
            owing, future = waiting
            owing.discard(worker)
            if not owing:
                del self._syncs[token]
                if not future.done():
                    future.set_result(None)

    def _on_death(self, worker: int) -> None:
        # What was posted to it died with it (a recovery posts it again): no sync waits for it.
        for token in list(self._syncs):
            self._synced(token, worker)
        if self.state is not None:  # the log and the last checkpoint hold everything it had
            self._recovered.clear()  # changes wait from now on
            self._recoveries_due += 1
            self._tasks.append(asyncio.get_running_loop().create_task(self._recover_from_death(worker)))
            return
        self.metrics.worker_restarted(worker)
        for name in self.engine.runner.worker_died(worker):
            self._close_failed(name, "ABORTED", self.engine.runner.queries[name].failed or "worker died")

    def _give_up(self, reason: str) -> None:
        """A worker cannot be kept running (see :mod:`lowtide.server.local_workers`): the server stops."""
        if not self.stopping.is_set():
            print(f"lowtide: {reason}; stopping", file=sys.stderr)
            self.exit_code = 1
            self.stopping.set()

    async def sync(self) -> None:
        """Wait until every worker has processed everything posted to it so far (or died)."""
        token = next(self._tokens)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncs[token] = (set(range(self.workers.size)), future)
        self.workers.broadcast(msg.Sync(token))
        await asyncio.wait_for(future, timeout=60)

    async def _ticker(self) -> None:
        """Heartbeats, idle sources and EMIT EVERY timers every 20 ms (a logged Tick when any is
        due); worker statistics and state limits every second."""
        last_stats = 0.0
        while True:
            await asyncio.sleep(0.02)
            wall = time.time()
            try:
                if self.engine.tick_due(wall):
                    await self.submit(records.Tick(wall))
                now = time.monotonic()
                if now - last_stats >= 1.0:
                    last_stats = now
                    self.engine.runner.request_stats()
                    await self._enforce_state_limit()
                    if self.state is not None:
                        self.state.log.sync_every_second()
                    if self.checkpoints is not None and self._recovered.is_set():
                        self.checkpoints.maybe_begin()
                    self._snapshot = self.snapshot()
            except LowtideError as exc:  # a full disk: the next round tries again
                log.warning("lowtide: %s", exc)

    async def _enforce_state_limit(self) -> None:
        limit = self.config.max_query_state_bytes
        for name, remote in list(self.engine.runner.queries.items()):
            if not remote.failed and self.engine.state_bytes(name) > limit:
                reason = f"query {name!r} holds {self.engine.state_bytes(name)} bytes of state, over {limit}"
                await self.submit(records.FailQuery(time.time(), name, "RESOURCE_EXHAUSTED", reason))

    def snapshot(self) -> dict[str, Any]:
        stats = self.engine.stats()
        runner = self.engine.runner
        queries: dict[str, Any] = {}
        for name, remote in runner.queries.items():
            queries[name] = {
                "low_watermark": remote.meld.low_watermark,
                "late": self.engine.query(name).late_dropped,
                "open_windows": runner.open_windows(name),
                "state_bytes": runner.state_bytes(name),
                "operators": [(i, *counts) for i, counts in enumerate(runner.operators(name))],
            }
        inputs = {s["name"] for s in self.engine.list_streams()}  # not the queries' result streams
        streams = {name: value for name, value in stats["streams"].items() if name in inputs}
        strings = {"front": len(self.engine.pool)}
        strings.update((f"worker {w}", n) for w, n in sorted(runner.worker_strings.items()))
        return {"streams": streams, "queries": queries, "strings": strings}

    async def stop(self) -> None:
        """Drain: what the workers hold reaches the hubs, then every subscription ends cleanly."""
        for task in self._tasks:
            task.cancel()
        try:
            if not self.exit_code:  # workers that cannot start hold nothing to drain
                await self.workers.idle()
                await self.sync()
        except TimeoutError:
            pass
        for hub in self.hubs.values():
            hub.close()
        await self.workers.stop()
        self.metrics.close()
        if self.state is not None:
            self.state.close()


class Service(pb_grpc.LowtideServicer):
    def __init__(self, front: Front) -> None:
        self.front = front

    @property
    def engine(self) -> Door[ProcessRunner]:
        return self.front.engine  # a new one after a recovery

    @translated
    async def CreateStream(self, request: pb.CreateStreamRequest, context: Any) -> pb.CreateStreamResponse:
        schema: dict[str, str] = {}
        for column in request.schema:
            if column.name in schema:
                raise InvalidArgument(f"column {shown(column.name)} appears more than once in the schema")
            schema[column.name] = column.type
        record = records.CreateStream(
            time.time(),
            request.name,
            schema,
            progressing=request.progressing or "ts",
            punctuation=request.punctuation or "explicit",
            sources=list(request.sources),
            idle_timeout=request.idle_timeout_s or None,
        )
        self.engine.check_stream(
            record.name, schema, record.progressing, record.punctuation, record.sources, record.idle_timeout
        )
        await self.front.submit(record)
        return pb.CreateStreamResponse()

    @translated
    async def DropStream(self, request: pb.DropStreamRequest, context: Any) -> pb.DropStreamResponse:
        self.engine.check_drop_stream(request.name)  # nothing that cannot apply is logged
        await self.front.submit(records.DropStream(time.time(), request.name))
        return pb.DropStreamResponse()

    @translated
    async def ListStreams(self, request: pb.ListStreamsRequest, context: Any) -> pb.ListStreamsResponse:
        streams = self.engine.stats()["streams"]
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
                for s in self.engine.list_streams()
            ]
        )

    @translated
    async def RegisterQuery(self, request: pb.RegisterQueryRequest, context: Any) -> pb.RegisterQueryResponse:
        text = request.allowed_lateness  # a number of units, else a duration: the planner checks both
        lateness: str | int | None = int(text) if _INTEGER.fullmatch(text) else (text or None)
        record = records.RegisterQuery(
            time.time(), request.sql, request.name or None, request.late or "drop", lateness
        )
        self.engine.check_query(record.sql, record.name, record.late, record.allowed_lateness)
        name = await self.front.submit(record)
        running = self.engine.query(name)
        return pb.RegisterQueryResponse(
            name=name,
            columns=[pb.Column(name=n, type=t.name) for n, t in running.plan.schema],
            plan=running.plan.explain(),
        )

    @translated
    async def ExplainQuery(self, request: pb.ExplainQueryRequest, context: Any) -> pb.ExplainQueryResponse:
        return pb.ExplainQueryResponse(plan=self.engine.explain(request.sql))

    @translated
    async def DropQuery(self, request: pb.DropQueryRequest, context: Any) -> pb.DropQueryResponse:
        self.engine.check_drop_query(request.name)
        await self.front.submit(records.DropQuery(time.time(), request.name))
        return pb.DropQueryResponse()

    @translated
    async def ListQueries(self, request: pb.ListQueriesRequest, context: Any) -> pb.ListQueriesResponse:
        infos = []
        for q in self.engine.list_queries():
            remote = self.engine.runner.queries[q["name"]]
            infos.append(
                pb.QueryInfo(
                    name=q["name"],
                    sql=q["sql"],
                    late=q["late"],
                    columns=[pb.Column(name=n, type=t.name) for n, t in remote.query.plan.schema],
                    results=q["results"],
                    late_tuples=q["late_tuples"],
                    low_watermark=remote.meld.low_watermark,
                    time_unit=q["time_unit"],
                )
            )
        return pb.ListQueriesResponse(queries=infos)

    @translated
    async def Ingest(
        self, request_iterator: AsyncIterator[pb.IngestRequest], context: Any
    ) -> pb.IngestResponse:
        tally = _Tally()
        try:
            return await self._ingest(tally.count(request_iterator), tally)
        except LowtideError as exc:  # names the message it stopped at (see _Tally)
            await _abort(context, exc, tally.metadata())
            raise  # not reached: abort raises

    async def _ingest(
        self, request_iterator: AsyncIterator[pb.IngestRequest], tally: _Tally
    ) -> pb.IngestResponse:
        front = self.front  # its engine is read at each use: a recovery replaces it
        stream = source = ""
        partial: PartialBatch | None = None  # a multi-part batch until its last part arrives
        async for request in request_iterator:
            if not stream:
                stream, source = request.stream, request.source or "default"
                if not stream:
                    raise NotFound("the first Ingest message must name the stream")
                front.engine.low_watermark(stream)  # NotFound for an unknown stream, before any data
            item = request.WhichOneof("item")
            if item == "arrow":
                batch_id, parts = request.batch_id, max(1, request.batch_parts)
                if partial is None:
                    duplicate = bool(batch_id) and batch_id in front.applied_batches(stream, source)
                    releases = front.engine.pool.releases
                    partial = PartialBatch(batch_id, parts, duplicate, front.generation, releases)
                partial.check(batch_id, parts)
                # Each part is checked and coded on arrival, while the client sends the next.
                if partial.duplicate:
                    admitted = None
                else:
                    table = _read_arrow(request.arrow, front.engine.limits.max_batch_rows)
                    admitted = front.engine.admit(stream, table, validated=True)
                    partial.payloads.append(request.arrow)
                if not partial.take(admitted):
                    continue
                whole, partial = partial, None
                applied = front.applied_batches(stream, source)
                # Checked again at the end: another call may have applied the same id meanwhile.
                if whole.duplicate or (whole.batch_id and whole.batch_id in applied):
                    tally.duplicates += 1
                    continue
                # Nothing is logged that cannot apply; the judgement travels to the application.
                checked = None
                if whole.coded_by(front.generation, front.engine.pool.releases):  # else when applied
                    checked = front.engine.check_batch(stream, whole.admitted, source)
                record = records.Batch(time.time(), stream, source, whole.batch_id, tuple(whole.payloads))
                prepared = (whole.releases, checked) if checked is not None else None
                rows = await front.submit(record, prepared, whole.generation)
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
                front.engine.check_punctuation(stream, request.punctuation, source)
                await front.submit(records.Punctuate(time.time(), stream, source, request.punctuation))
            elif item == "close":
                front.engine.check_close(stream, source)
                await front.submit(records.CloseSource(time.time(), stream, source))
        if partial is not None:
            raise InvalidArgument(partial.cut_short())
        low = front.engine.low_watermark(stream) if stream else 0
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
        try:
            while True:
                # The table stays out of this frame: while a slow reader parks the send, only the
                # serialized message is held here (the hub charges it as the item in flight).
                response = _subscribe_response(await subscription.next())
                if isinstance(response, Closed):
                    if response.status is not None:
                        # A limit passed (state, backlog) names its class like every other error.
                        kind = (
                            ResourceExhausted.__name__ if response.status == ResourceExhausted.status else ""
                        )
                        metadata = (("lowtide-error", kind),) if kind else ()
                        code = grpc.StatusCode[response.status]
                        await context.abort(code, response.reason, trailing_metadata=metadata)
                    return
                yield response
        finally:
            hub.unsubscribe(subscription)

    @translated
    async def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthResponse:
        return pb.HealthResponse(status="SERVING", workers=self.front.workers.size, version=__version__)


async def _serve(config: ServerConfig) -> int:
    security = auth.load(config)  # TLS files and tokens are read and checked before anything starts
    # Both ports are taken before any worker starts: a start that fails says why in one line.
    ensure_free(config.host, config.port, "gRPC")
    if config.metrics_port > 0:
        ensure_free(config.metrics_host, config.metrics_port, "metrics")
    front = Front(config)
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
    ]
    server = grpc.aio.server(options=options, interceptors=security.interceptors)
    add_service(Service(front), server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        pb.DESCRIPTOR.services_by_name["Lowtide"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    )
    reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    try:
        if security.credentials is not None:
            port = server.add_secure_port(address, security.credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # taken since ensure_free looked
        raise StartupFailure(f"cannot serve gRPC on {address}: address already in use") from None
    metrics_url = "off"
    if config.metrics_port >= 0:
        try:
            bound = front.metrics.serve(config.metrics_host, config.metrics_port)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            where = f"{config.metrics_host}:{config.metrics_port}"
            raise StartupFailure(f"cannot serve metrics on {where}: {reason}") from None
        metrics_url = f"http://{config.metrics_host}:{bound}/metrics"
    if security.notice:
        print(security.notice, file=sys.stderr)
    if security.warning:
        print(security.warning, file=sys.stderr)
    if not config.state_dir:
        print("lowtide: no --state-dir: streams, queries and windows live in memory only", file=sys.stderr)
    await front.start()
    await front.sync()  # every worker is up and answering before the server says it serves
    if front.state is not None:
        began = time.monotonic()
        try:
            replayed, torn = await front.recover()
        except StartupFailure:
            await front.stop()  # the workers and their shared memory go; the state directory stays as it was
            raise
        if torn is not None:
            print(
                f"lowtide: dropped a torn last record (never acknowledged): {torn.dropped} bytes at "
                f"the end of {torn.path}",
                file=sys.stderr,
            )
        print(
            f"lowtide: state in {config.state_dir}: {len(front.engine.list_streams())} streams, "
            f"{len(front.engine.runner.queries)} queries, {replayed} logged changes replayed in "
            f"{time.monotonic() - began:.2f} s",
            file=sys.stderr,
        )
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stopping = front.stopping
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the ready line: a SIGTERM after it drains
        loop.add_signal_handler(sig, stopping.set)
    print(
        f"lowtide serving on {config.host}:{port} with {config.workers} workers; metrics on {metrics_url}",
        flush=True,
    )
    await stopping.wait()
    await health_servicer.enter_graceful_shutdown()
    stopped = asyncio.ensure_future(server.stop(grace=10))
    await front.stop()
    await stopped
    return front.exit_code


def serve(config: ServerConfig) -> int:
    """Run a server until SIGTERM or SIGINT; returns the exit code."""
    import uvloop

    return uvloop.run(_serve(config))
