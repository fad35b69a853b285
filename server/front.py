"""The front process's state: the door, the worker pool, the hubs and the journal.

Batches pass the door (schema, string codes, sources, progress, late detection), a
:class:`~lowtide.server.server_door.ServerDoor`, and go to the workers of its
:class:`~lowtide.server.process_runner.ProcessRunner`, which the front reaches through the door
only; worker output comes back, is melded per query and waits in a :class:`Hub` for
subscribers. Every change is applied in the journal's order (:meth:`Front.apply`), live and at
replay, so recovery - from the newest checkpoint at start, or after a worker's death - rebuilds
exactly what was served. The gRPC calls that feed it are in :mod:`lowtide.server.service`;
start-up and shutdown in :mod:`lowtide.server.serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import itertools
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from lowtide.batch import Batch
from lowtide.clock import ManualClock
from lowtide.door import CheckedBatch, Epoch, Limits
from lowtide.errors import LowtideError, StartupFailure
from lowtide.ipc import read_ipc
from lowtide.operators.result_queue import SlowFlush
from lowtide.query.derived import part_of
from lowtide.server import input_log as records
from lowtide.server import messages as msg
from lowtide.server.batches import AppliedBatches, PendingBytes
from lowtide.server.checkpoint_coordinator import CheckpointCoordinator
from lowtide.server.checkpoint_store import LoadedCheckpoint
from lowtide.server.config import ServerConfig
from lowtide.server.front_snapshot import restore_catalog, restore_output
from lowtide.server.hub import Hub, SendBudget
from lowtide.server.input_log import Record, TornTail
from lowtide.server.journal import Journal, Prepared, RestoredQuery, StateDirectory
from lowtide.server.local_workers import LocalWorkers
from lowtide.server.metrics import ServerMetrics
from lowtide.server.process_runner import ProcessRunner, RemoteQuery, lost_state
from lowtide.server.server_door import ServerDoor
from lowtide.server.staging import StagingArea
from lowtide.server.transport import WorkerPlace, WorkerTransport
from lowtide.snapshot import as_dict
from lowtide.strings import StringPool

log = logging.getLogger("lowtide.server")


class Front:
    """The door, the worker pool, the hubs and the metrics of one server."""

    def __init__(self, config: ServerConfig, truncate_log_tail: bool = False) -> None:
        self.config = config
        self.metrics = ServerMetrics()
        self.workers = self._transport(config)
        self.stopping = asyncio.Event()  # SIGTERM, SIGINT, or workers that cannot start
        self.serving = False  # the start's recovery is over (a restore failing after it stops the server)
        self.gave_up = ""  # why the server stops on its own (workers that cannot run): subscribers hear it
        # The door's clock reads the time each change was applied at (the input log records it),
        # so replay runs heartbeats and idle timeouts exactly as they ran.
        self.clock = ManualClock(time.time())
        self.door = self._new_door()
        self.hubs: dict[str, Hub] = {}
        self.applied: dict[tuple[str, str], AppliedBatches] = {}  # exactly-once ids per source
        self.state = (
            StateDirectory(config.state_dir, config.fsync, truncate_log_tail) if config.state_dir else None
        )
        self.staging = StagingArea(
            self.state.path / "staging" if self.state else None,
            config.fsync == "always",
            config.staging_timeout_s,
            config.max_staged_bytes,
        )
        self.pending = PendingBytes(config.max_pending_bytes)  # multi-part batches not yet applied
        self.sending = SendBudget(config.max_subscriber_bytes_total)  # result messages being sent
        self.journal = Journal(self.apply, self.state.log if self.state else None)
        # The catalog as created: what a checkpoint re-creates before it restores the state.
        self.catalog_streams: dict[str, records.CreateStreamRecord] = {}
        self.catalog_queries: dict[str, records.RegisterQueryRecord] = {}
        self.checkpoints = (
            CheckpointCoordinator(
                self, self.workers, self.journal, self.state, config, self.metrics, self._deliver
            )
            if self.state is not None
            else None
        )
        self._resetting: set[int] = set()  # workers whose messages are moot until they reset
        self._recovered = asyncio.Event()  # clear while recoveries are due or running
        self._recoveries_due = 1 if self.state is not None else 0  # the start's own, see recover()
        if not self._recoveries_due:
            self._recovered.set()
        # Why the queries are recovering, while a recovery is due or its output is made again.
        self._recovering = "the server starts: every worker is restored from the state directory"
        self._recovery = asyncio.Lock()  # one at a time: a worker may die during another's
        self._syncs: dict[int, tuple[set[int], asyncio.Future[None]]] = {}  # token -> workers owing
        self._tokens = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self.unrefused: tuple[Exception, int] | None = None  # the log's last record failed at replay
        # Scrapes run on the exposition's thread: they read a copy the event loop refreshes.
        self._snapshot: dict[str, Any] = {"streams": {}, "queries": {}}
        self._state_seen: dict[str, int] = {}  # each query's state bytes at the last round

    def _transport(self, config: ServerConfig) -> WorkerTransport:
        """Local worker processes, or with ``ray`` actors of that Ray cluster (the ray extra)."""
        if not config.ray:
            return LocalWorkers(config.workers, self._on_message, self._on_death, self._give_up)
        node_ip = config.ray_node_ip
        if config.ray == "local" and (not node_ip or ipaddress.ip_address(node_ip).is_loopback):
            # Ray reads this as it is imported, and the private cluster's processes inherit it:
            # Ray's one-machine mode, where every node address is 127.0.0.1 and listens there only
            # (an address given as loopback, Ray would turn into the machine's own).
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            node_ip = ""
        try:
            from lowtide.server.ray_workers import RayWorkers
        except ModuleNotFoundError as exc:
            if exc.name != "ray" and not (exc.name or "").startswith("ray."):
                raise
            raise StartupFailure("--ray needs Ray: pip install 'lowtide[ray]'") from None
        return RayWorkers(
            config.workers,
            config.ray,
            config.worker_cpus,
            self._on_message,
            self._on_death,
            self._give_up,
            config.restart(),
            node_ip,
        )

    @property
    def generation(self) -> int:
        """Recoveries so far: each makes a new door, in the next generation of :class:`Epoch`
        (what was prepared with the door before is redone), and resets the workers under it."""
        return self.door.epoch.generation

    def _new_door(self, generation: int = 0) -> ServerDoor:
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
        runner = ProcessRunner(self.workers, pool)
        runner.on_released = self.metrics.punctuation_to_result
        # The hubs number every item of a late side stream, and recovery replays them to the same
        # offsets; a drain follows each worker message, so what would collapse depends on timing.
        return ServerDoor(
            runner, pool, self.clock, limits, flush, collapses_late_markers=False, generation=generation
        )

    async def start(self) -> None:
        self.workers.start()
        self.metrics.set_snapshot(lambda: self._snapshot)
        self._tasks.append(asyncio.get_running_loop().create_task(self._ticker()))

    # -- changes: applied in the journal's order, live and at replay ---------------------------
    async def submit(self, record: Record, prepared: Prepared | None = None) -> Any:
        """Log and apply ``record``, with what was made ready for it (see :data:`Prepared`)."""
        await self._recovered.wait()  # a worker's death is being recovered from: changes wait
        return await self.journal.submit(record, prepared)

    async def submit_batch(
        self,
        stream: str,
        source: str,
        batch_id: int,
        payloads: Sequence[bytes],
        admitted: Sequence[Batch],
        epoch: Epoch,
    ) -> int:
        """Log and apply one whole batch, its parts ``admitted`` by the door in ``epoch``; the
        rows applied (0: the id was applied meanwhile). Nothing is logged that cannot apply: the
        door judges it here, and its judgement travels to the application (:class:`CheckedBatch`)."""
        await self._recovered.wait()  # judged by the door it will apply on
        door = self.door
        if not epoch.admits_like(door.epoch):  # a catalog change, or a recovery, came in between
            admitted = self._admitted(stream, payloads)
        checked = door.check_batch(stream, admitted, source)
        record = records.BatchRecord(time.time(), stream, source, batch_id, tuple(payloads))
        rows: int = await self.journal.submit(record, checked)
        return rows

    def _admitted(self, stream: str, payloads: Iterable[bytes]) -> list[Batch]:
        """The parts of a batch admitted now, from the bytes received (validated then)."""
        limit = self.door.limits.max_batch_rows
        return [self.door.admit(stream, read_ipc(part, limit), validated=True) for part in payloads]

    def apply(self, record: Record, prepared: Prepared | None = None) -> Any:
        """Apply one change at the time it was made (see :mod:`lowtide.server.journal`), with
        what was made ready for it, if anything (none at replay)."""
        self.clock.set(record.now)
        door = self.door
        match record:
            case records.CreateStreamRecord():
                door.create_stream(
                    record.name,
                    record.schema,
                    progressing=record.progressing,
                    punctuation=record.punctuation,
                    sources=record.sources,
                    idle_timeout=record.idle_timeout,
                )
                self.catalog_streams[record.name] = record
            case records.DropStreamRecord():
                self.drop_stream(record.name)
                del self.catalog_streams[record.name]
            case records.RegisterQueryRecord():
                share = prepared.share if isinstance(prepared, RestoredQuery) else None
                with self._registered_under(record):
                    lateness = record.allowed_lateness
                    name = self.register(record.sql, record.name, record.late, lateness, share)
                self.catalog_queries[name] = dataclasses.replace(record, name=name)
                return name
            case records.DropQueryRecord():
                self.drop(record.name)
                del self.catalog_queries[record.name]
            case records.FailQueryRecord():
                if door.fail_remote(record.name, record.reason, record.status):
                    self._close_failed(record.name, record.status, record.reason)
            case records.BatchRecord():
                return self._apply_batch(record, prepared if isinstance(prepared, CheckedBatch) else None)
            case records.PunctuateRecord():
                door.punctuate(record.stream, record.value, record.source)
            case records.CloseSourceRecord():
                door.close_source(record.stream, record.source)
            case records.TickRecord():
                door.tick()
        return None

    def _apply_batch(self, record: records.BatchRecord, checked: CheckedBatch | None) -> int:
        """Apply a batch once per id; returns its rows (0 for a replay of an applied id).
        ``checked``: the batch as the door judged it when accepted (None at replay): it applies
        as judged in the same epoch, is judged again where progress alone moved since, and is
        admitted again from its bytes where the catalog changed or a recovery came since."""
        applied = self.applied_batches(record.stream, record.source)
        if record.batch_id and record.batch_id in applied:
            return 0
        if not record.parts:  # a committed staged batch of no rows: only its id applies
            self.door.low_watermark(record.stream)  # NotFound once the stream is dropped
            applied.add(record.batch_id)
            return 0
        if checked is None or not checked.epoch.admits_like(self.door.epoch):
            parts = self._admitted(record.stream, record.parts)  # at replay: as it was when accepted
            self.door.push_admitted(record.stream, parts, record.source)
        else:
            parts = checked.parts
            self.door.push_admitted(record.stream, checked, record.source)
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
            self.journal.refused = self.state.log.refused  # filled as each segment is read
            replayed = await self._replay(self.state.log.replay(start, self.checkpoints.store.extent()))
            await self.sync()
            if self.checkpoints.restore_errors:
                raise StartupFailure(f"cannot restore the checkpoint: {self.checkpoints.restore_errors[0]}")
            # Recovered: now, and only now, the state directory may change.
            torn = self.state.log.recovered()
            if self.unrefused is not None:
                self.journal.refuse(*self.unrefused)
            self.checkpoints.store.remove_interrupted()
            kept, dropped = self.staging.load(lambda key: key[2] in self.applied_batches(key[0], key[1]))
            if kept or dropped:
                log.warning(
                    "lowtide: %d staged parts kept for their commit, %d unreadable dropped", kept, dropped
                )
            self.serving = True
        self._recoveries_due -= 1
        if not self._recoveries_due:
            self._recovered.set()
        return replayed, torn

    async def _replay(self, logged: Iterable[tuple[int, Record]]) -> int:
        """Apply logged records again, each as it applied live: limits judged new input when it was
        logged, so today's (perhaps lowered) limits do not apply to it, and a record that failed
        as it applied (a :class:`~lowtide.server.input_log.Refused` names it) is passed over. Any
        other record that fails is damage, unless the log ends with it (a crash came before its
        ``Refused``): :class:`StartupFailure` naming it and why, before anything in the state
        directory changes."""
        assert self.state is not None
        replayed = 0
        failed: tuple[int, Record, str] | None = None
        self.unrefused = None
        for seq, record in logged:
            if failed is not None:  # records follow it: it did apply live
                at, what, reason = failed
                raise StartupFailure(
                    f"record {at} of the input log ({what.kind}, in {self.state.log.segment_of(at)}) "
                    f"applied when it was logged but fails now: {reason}"
                )
            if seq not in self.journal.refused and not isinstance(record, records.RefusedRecord):
                try:
                    with self._replaying():
                        self.apply(record)
                except Exception as exc:
                    failed = (seq, record, str(exc) or type(exc).__name__)
            self.journal.applied_through = max(self.journal.applied_through, seq)
            replayed += 1
            await self.workers.wait_for_room()
        if failed is not None:  # the log's last: logged as refused once recovered (records will follow it)
            self.unrefused = Exception(failed[2]), failed[0]
        return replayed

    @contextlib.contextmanager
    def _replaying(self) -> Iterator[None]:
        """Limits judge new input, not the log: lifted while a logged record applies again."""
        door = self.door
        limits = door.limits
        door.limits = limits.lifted()
        try:
            yield
        finally:
            door.limits = limits

    @contextlib.contextmanager
    def _registered_under(self, record: records.RegisterQueryRecord) -> Iterator[None]:
        """Plan a logged query under the settings it was registered with (its windows per step
        and smooth emission shape its output), whatever the configuration says today."""
        door = self.door
        limits, flush = door.limits, door.flush
        if record.windows_per_step is not None:
            door.limits = dataclasses.replace(limits, max_windows_per_step=record.windows_per_step)
        if record.flush_every is not None:
            shape = (record.flush_every, record.flush_max_windows or 0)
            door.flush = SlowFlush(*shape) if record.flush_every else None
        try:
            yield
        finally:
            door.limits, door.flush = limits, flush

    def query_record(
        self, sql: str, name: str | None, late: str, allowed_lateness: str | int | None
    ) -> records.RegisterQueryRecord:
        """A query to register, with the settings it runs under (see :meth:`_registered_under`)."""
        config = self.config
        return records.RegisterQueryRecord(
            time.time(),
            sql,
            name,
            late,
            allowed_lateness,
            windows_per_step=self.door.limits.max_windows_per_step,
            flush_every=config.flush_every,
            flush_max_windows=config.flush_max_windows,
        )

    def _restore(self, checkpoint: LoadedCheckpoint, live_hubs: bool) -> int:
        """Put the front and every worker where ``checkpoint`` was taken; returns its log position.
        New hubs take the offsets and items it retained; live ones skip what comes again."""
        front_state = as_dict(checkpoint.front, "front state")
        try:
            with self._replaying():  # the catalog as it was accepted, whatever today's limits
                restore_catalog(self, front_state["door"])
        except LowtideError as exc:
            raise StartupFailure(f"cannot restore the checkpoint {checkpoint.directory}: {exc}") from None
        messages = restore_output(self, front_state["output"], live_hubs)
        self.door.sync_strings()
        for worker in range(self.workers.size):
            self.workers.post(
                worker, msg.RestoreMessage(self.generation, str(checkpoint.worker_path(worker)))
            )
        for worker, record, arrays in messages:
            self.workers.post(worker, msg.from_record(record), arrays)
        return checkpoint.seq

    async def _recover_from_death(self, worker: int) -> None:
        """A worker died: every worker starts over from the last checkpoint plus the log, while
        changes wait; subscribers see no gap and no duplicate (the hubs skip what comes again)."""
        assert self.state is not None and self.checkpoints is not None
        await self._recovery.acquire()
        began = time.monotonic()
        try:
            if self.checkpoints.pending is not None:  # the lost worker never wrote its part
                print(
                    f"lowtide: checkpoint {self.checkpoints.pending.seq} abandoned: worker {worker} "
                    "is restored from the one before",
                    file=sys.stderr,
                )
            self.checkpoints.abandon()
            generation = self.generation + 1
            self._resetting = set(range(self.workers.size))
            for w in range(self.workers.size):
                self.workers.post(w, msg.ResetMessage(generation))
            self.door = self._new_door(generation)  # what was prepared with the old one is redone
            self.applied = {}
            self.catalog_streams, self.catalog_queries = {}, {}
            for hub in self.hubs.values():  # the subscribers stay; what comes again is skipped
                hub.remade = hub.next_offset
            through = self.journal.applied_through
            try:
                checkpoint = self.checkpoints.load()
                start = 0
                if checkpoint is not None:
                    start = self._restore(checkpoint, live_hubs=True)
                logged = ((seq, r) for seq, r in self.state.log.records(start) if seq <= through)
                replayed = await self._replay(logged)
            except StartupFailure as exc:  # damage found while serving: going on would lose results
                self._give_up(f"worker {worker} cannot be recovered: {exc}")
                return
            print(
                f"lowtide: worker {worker} recovered: every worker restored from "
                f"{f'checkpoint {checkpoint.seq}' if checkpoint is not None else 'the start'} and "
                f"{replayed} logged changes sent again in {time.monotonic() - began:.2f} s",
                file=sys.stderr,
            )
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
        query = self.door.register_query(sql, name, late, allowed_lateness, restored_share)
        for key in (query.name, f"{query.name}.late"):  # a recovery keeps the live hubs
            self.hubs.setdefault(
                key,
                Hub(self.config.retained_items, self.config.retained_bytes, self.config.max_subscriber_bytes),
            )
        return query.name

    def drop(self, name: str) -> None:
        self.door.drop_query(name)
        for key in (name, f"{name}.late"):
            hub = self.hubs.pop(key, None)
            if hub is not None:
                hub.close()

    def applied_batches(self, stream: str, source: str) -> AppliedBatches:
        return self.applied.setdefault((stream, source), AppliedBatches())

    def drop_stream(self, name: str) -> None:
        if self.checkpoints is not None:
            self.checkpoints.abandon()  # a code it frees could name a string made meanwhile (pin_held)
        self.door.drop_stream(name)
        for key in [k for k in self.applied if k[0] == name]:
            del self.applied[key]

    def _publish(self, name: str) -> None:
        for key in (name, f"{name}.late"):
            hub = self.hubs.get(key)
            if hub is not None:
                items = self.door.drain(key)
                if items:
                    hub.publish(items)
        remote = self.door.remote(name)
        if remote is not None and remote.failed:  # a derived table's part fails its query's hubs
            self._close_failed(part_of(name) or name, remote.status, remote.failed)

    def query_statuses(self) -> dict[str, tuple[str, str]]:
        """Each query's status, ``running``, ``recovering`` or ``aborted``, and why in one line
        (empty while running).

        Aborted: the query or a part planning one of its derived tables failed, or a worker of it
        died without ``--state-dir`` (its state went with it). Recovering, with ``--state-dir``: a
        worker of it is being started again, a recovery is due or running, or its output is being
        made again up to where it was (its hubs skip what comes again)."""
        places = self.workers.places()
        remotes: dict[str, list[RemoteQuery]] = {}
        for name, remote in self.door.remotes().items():
            remotes.setdefault(part_of(name) or name, []).append(remote)
        return {name: self._status(name, own, places) for name, own in remotes.items()}

    def _status(self, name: str, remotes: list[RemoteQuery], places: list[WorkerPlace]) -> tuple[str, str]:
        # Its own reason first, the one its subscriptions ended with, else a part's.
        failed = sorted((remote.name != name, remote.failed) for remote in remotes if remote.failed)
        if failed:
            return "aborted", failed[0][1]
        for worker in sorted({w for remote in remotes for w in remote.workers}):
            status = places[worker].status
            if status == "running":
                continue
            if self.state is None:  # the transport reports the death once it runs again: already lost
                return "aborted", lost_state(worker, name)
            if status == "pending":
                return "recovering", f"worker {worker} died and waits to be started again (a back-off)"
            return "recovering", f"worker {worker} died and is being started again"
        if not self._recovered.is_set():
            return "recovering", self._recovering
        hubs = [self.hubs.get(key) for key in (name, f"{name}.late")]
        # What a hub skips is made again before anything new comes; an ended hub takes nothing more.
        remade = sum(hub.remade for hub in hubs if hub is not None and not hub.ended)
        if remade:
            return "recovering", f"{self._recovering}; {remade} items of its output to make again"
        return "running", ""

    def _close_failed(self, name: str, status: str, reason: str) -> None:
        for key in (name, f"{name}.late"):
            hub = self.hubs.get(key)
            if hub is not None:
                hub.close(status, reason)

    def _on_message(self, worker: int, message: msg.ToFront, arrays: dict[str, Any]) -> None:
        if worker in self._resetting:  # sent before the reset: about a world that is gone
            if isinstance(message, msg.ResetDoneMessage) and message.generation == self.generation:
                self._resetting.discard(worker)
            return
        match message:
            case msg.ResetDoneMessage():
                pass  # a recovery already over: nothing waits for it
            case msg.CheckpointedMessage() | msg.PersistedMessage() | msg.RestoredMessage():
                if self.checkpoints is not None:
                    self.checkpoints.answered(worker, message)
                if isinstance(message, msg.RestoredMessage) and message.error is not None and self.serving:
                    # A recovery's restore failed (a file its worker cannot read: with --ray, a
                    # state directory not every node reaches): going on would lose state unseen.
                    self._give_up(f"cannot restore worker {worker} from the checkpoint: {message.error}")
            case _:
                if self.checkpoints is None or not self.checkpoints.holds(worker, message, arrays):
                    self._deliver(worker, message, arrays)

    def _deliver(
        self,
        worker: int,
        message: msg.QueryOutput | msg.StatsMessage | msg.SyncedMessage,
        arrays: dict[str, Any],
    ) -> None:
        """A worker's answer to what it was sent: outputs, stats, a sync."""
        if worker in self._resetting:  # held across a recovery's start: about a world that is gone
            return
        match message:
            case msg.SyncedMessage():
                self._synced(message.token, worker)
            case _:
                name = self.door.on_worker_message(worker, message, arrays)
                if name is not None:
                    self._publish(name)
                if isinstance(message, msg.FailedMessage):  # the queries sharing its slices failed with it
                    for remote in self.door.remotes().values():
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
            self._recovering = f"worker {worker} died: every worker is restored from the state directory"
            self._tasks.append(asyncio.get_running_loop().create_task(self._recover_from_death(worker)))
            return
        self.metrics.worker_restarted(worker)
        aborted = self.door.worker_died(worker)
        for name in aborted:
            self._close_failed(name, "ABORTED", self.door.remotes()[name].failed or "worker died")
        print(
            f"lowtide: worker {worker} started again, empty (no --state-dir): "
            f"{', '.join(aborted) or 'no query'} ABORTED",
            file=sys.stderr,
        )

    async def _subscriptions_ended(self, timeout: float) -> None:
        """Give each closed subscription's call its turn to send its end before the workers stop
        (stopping may block the loop: Ray's shutdown), within ``timeout`` (a reader stalled)."""
        deadline = time.monotonic() + timeout
        while any(hub.listeners for hub in self.hubs.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    @property
    def exit_code(self) -> int:
        return 1 if self.gave_up else 0

    def _give_up(self, reason: str) -> None:
        """The server cannot go on (a worker that cannot be kept running, a Ray cluster gone, a
        restore that failed while serving): it stops, saying why (exit code 1)."""
        if not self.stopping.is_set():
            print(f"lowtide: {reason}; stopping", file=sys.stderr)
            self.gave_up = reason
            self.stopping.set()

    async def sync(self, timeout: float = 60.0) -> None:
        """Wait until every worker has processed everything posted to it so far (or died); past
        ``timeout`` seconds, a ``TimeoutError`` names the workers that have not."""
        token = next(self._tokens)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        owing = set(range(self.workers.size))
        self._syncs[token] = (owing, future)
        self.workers.broadcast(msg.SyncMessage(token))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:  # raised again naming the workers: the caller decides, nothing is hidden
            self._syncs.pop(token, None)
            late = ", ".join(str(worker) for worker in sorted(owing))
            named = f"workers {late}" if len(owing) > 1 else f"worker {late}"
            raise TimeoutError(f"{named} did not answer within {timeout:g} s") from None

    async def _ticker(self) -> None:
        """Heartbeats, idle sources and EMIT EVERY timers every 20 ms (a logged Tick when any is
        due); worker statistics and state limits every second."""
        last_stats = 0.0
        while True:
            await asyncio.sleep(0.02)
            wall = time.time()
            try:
                if self.door.tick_due(wall):
                    await self.submit(records.TickRecord(wall))
                now = time.monotonic()
                if now - last_stats >= 1.0:
                    last_stats = now
                    self.door.request_stats()
                    await self._enforce_state_limit()
                    if self.state is not None:
                        self.state.log.sync_every_second()
                    if self.checkpoints is not None and self._recovered.is_set():
                        self.checkpoints.maybe_begin()
                    if expired := self.staging.expire(wall):
                        log.warning(
                            "lowtide: %d staged parts dropped: not committed within staging_timeout_s (%g s)",
                            expired,
                            self.config.staging_timeout_s,
                        )
                    self._snapshot = self.snapshot()
            except LowtideError as exc:  # a full disk: the next round tries again
                log.warning("lowtide: %s", exc)

    async def _enforce_state_limit(self) -> None:
        """Fail each query holding more state than ``max_query_state_bytes``; then, while all the
        others hold more than ``max_state_bytes_total`` together, the one that grew most since
        the last round (the one taking the memory now, not those that hold what they held)."""
        limit, total_limit = self.config.max_query_state_bytes, self.config.max_state_bytes_total
        held = {
            name: self.door.state_bytes(name)
            for name, remote in list(self.door.remotes().items())
            if not remote.failed
        }
        seen, self._state_seen = self._state_seen, held
        for name, size in list(held.items()):
            if size > limit:
                reason = f"query {name!r} holds {size} bytes of state, over {limit}"
                await self.submit(records.FailQueryRecord(time.time(), name, "RESOURCE_EXHAUSTED", reason))
                del held[name]
        total = sum(held.values())
        growth = sorted(held, key=lambda name: (held[name] - seen.get(name, 0), held[name]), reverse=True)
        for name in growth:
            if total <= total_limit:
                break
            reason = (
                f"query {name!r} grew to {held[name]} bytes of state, taking all queries' state to "
                f"{total} bytes, over max_state_bytes_total ({total_limit})"
            )
            await self.submit(records.FailQueryRecord(time.time(), name, "RESOURCE_EXHAUSTED", reason))
            total -= held[name]

    def snapshot(self) -> dict[str, Any]:
        stats = self.door.stats()
        statuses = self.query_statuses()
        queries: dict[str, Any] = {}
        for name, remote in self.door.remotes().items():
            counted = stats["queries"][name]
            queries[name] = {
                "low_watermark": remote.meld.low_watermark,
                "late": counted["late"],
                "open_windows": counted["open_windows"],
                "state_bytes": counted["state_bytes"],
                "operators": [
                    (i, op["operator"], op["in"], op["out"]) for i, op in enumerate(counted["operators"])
                ],
            }
            if name in statuses:  # not a derived table's part: its query's status is the one
                queries[name]["status"] = statuses[name][0]
            hub = self.hubs.get(name)
            if hub is not None and hub.readers:
                queries[name]["readers"] = {r: hub.next_offset - offset for r, offset in hub.readers.items()}
        inputs = {s["name"] for s in self.door.list_streams()}  # not the queries' result streams
        streams = {name: value for name, value in stats["streams"].items() if name in inputs}
        strings = {"front": len(self.door.pool)}
        strings.update((f"worker {w}", n) for w, n in sorted(self.door.worker_strings().items()))
        workers = {w: place.node for w, place in enumerate(self.workers.places())}
        staged = {"bytes": self.staging.bytes, "parts": self.staging.parts, "expired": self.staging.expired}
        return {
            "streams": streams,
            "queries": queries,
            "strings": strings,
            "workers": workers,
            "staged": staged,
            "held": {"pending": self.pending.held, "sending": self.sending.held},
        }

    async def stop(self, drain_timeout: float = 60.0) -> None:
        """Drain: what the workers hold reaches the hubs, then every subscription ends cleanly.
        A worker that has not processed its input within ``drain_timeout`` seconds is not waited
        for, and a line on stderr says so."""
        for task in self._tasks:
            task.cancel()
        try:
            if not self.gave_up:  # workers that cannot run hold nothing to drain
                await self.workers.idle()
                await self.sync(drain_timeout)
        except TimeoutError as exc:
            after = (
                "the next start from --state-dir makes them from the input log"
                if self.state is not None
                else "they are lost (no --state-dir)"
            )
            print(
                f"lowtide: stopping without a full drain: {exc}; results of the input not processed "
                f"yet reach no subscriber: {after}",
                file=sys.stderr,
            )
        for hub in self.hubs.values():
            if self.gave_up:  # it says why, in the status a client retries on (it may come back)
                hub.close("UNAVAILABLE", f"the server stops: {self.gave_up}")
            else:  # a drain ends subscriptions cleanly
                hub.close()
        await self._subscriptions_ended(timeout=5.0)
        await self.workers.stop()
        self.metrics.close()
        if self.state is not None:
            self.state.close()
