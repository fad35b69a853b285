"""The front's engine: the door and the catalog here, the operator graphs in the workers.

``FrontEngine`` is the in-process :class:`~lowtide.engine.Engine` with one change: a query's
inputs do not feed local operators but :class:`Dispatch` subscribers that split each batch by the
query's partitioning key and post the pieces to the workers owning them, and broadcast every
punctuation. Worker outputs come back into a :class:`~lowtide.operators.meld.Meld` per query -
results pass through, output punctuation is the minimum over the query's workers - and then into
the query's sink, exactly where the in-process engine's graph would have delivered them.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, assert_never

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.engine import Engine, Limits, RunningQuery, SlowFlush
from lowtide.operators.input import Input
from lowtide.punctuation.model import Punctuation
from lowtide.punctuation.policies import LatePolicy
from lowtide.results import to_table
from lowtide.schema import ColumnType
from lowtide.server import messages as msg
from lowtide.server.ordered_meld import OrderedMeld
from lowtide.server.partitioning import Partitioning, partitioning_of, split
from lowtide.server.worker_process import decode_columns
from lowtide.server.local_workers import WorkerPool
from lowtide.strings import StringPool
from lowtide.testing import Clock

MAX_RELEASING = 1_000  # punctuation still waiting for some of a query's workers to release it


@dataclass
class RemoteQuery:
    name: str
    running: RunningQuery
    partitioning: Partitioning
    workers: list[int]
    meld: OrderedMeld
    failed: str | None = None
    status: str = "ABORTED"  # the gRPC code its subscriptions end with once it failed
    worker_stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    released: dict[float, int] = field(default_factory=dict)  # punctuation sent_at -> workers done

    def port(self, worker: int) -> int:
        return self.workers.index(worker)


class Dispatch(Input):
    """A stream's subscriber at the front for one input of one query."""

    label = "Dispatch"

    def __init__(
        self, front: FrontEngine, query: RemoteQuery, index: int, stream: str, policy: LatePolicy
    ) -> None:
        super().__init__(stream, policy, lambda batch: None)
        self.front = front
        self.query = query
        self.index = index
        self.derived = front._streams[stream].derived  # fed by another query's output

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        self._send(batch, late=False)

    def process_late(self, batch: Batch) -> None:
        self.late_tuples += batch.n
        self._send(batch, late=True)

    def _send(self, batch: Batch, late: bool) -> None:
        query = self.query
        if query.failed or batch.n == 0:
            return
        front = self.front
        front.sync_strings()
        if len(query.workers) == 1:
            message = msg.Batch(query.name, self.index, late, batch.n)
            front.post(query.workers[0], message, batch.columns, self.derived)
            return
        pieces = split(batch, query.partitioning.keys[self.index], len(query.workers))
        for worker, rows in zip(query.workers, pieces, strict=True):
            # An empty piece goes too: every worker answers every message (an epoch, see ordered_meld).
            piece = batch.select(rows)
            message = msg.Batch(query.name, self.index, late, piece.n)
            front.post(worker, message, piece.columns if piece.n else None, self.derived)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if self.query.failed:
            return
        message = msg.Punctuate(
            self.query.name, self.index, punctuation.attribute, punctuation.value, time.monotonic()
        )
        for worker in self.query.workers:
            self.front.post(worker, message, None, self.derived)


class FrontEngine(Engine):
    # The hubs number every item of a late side stream, and recovery replays them to the same
    # offsets; a drain follows each worker message, so what would collapse depends on timing.
    collapses_late_markers = False

    def __init__(
        self,
        workers: WorkerPool,
        clock: Clock | None = None,
        limits: Limits | None = None,
        flush: SlowFlush | None = None,
    ) -> None:
        super().__init__(clock, limits, flush)
        self.workers = workers
        self.remote: dict[str, RemoteQuery] = {}
        self.pool = StringPool(mirrored=True)  # the workers' pools mirror it (sync_strings)
        self.worker_strings: dict[int, int] = {}  # what each worker's pool held at its last Stats
        self.on_released: Callable[[str, float], None] | None = None  # (query, seconds since sent)
        # Shared slices -> the query feeding them and its dispatches (they outlive it while read).
        self._feeders: dict[int, tuple[RemoteQuery, list[tuple[str, Input]]]] = {}
        # While a checkpoint waits for its barriers: what result streams send to workers meanwhile,
        # as plain data (messages.to_record).
        self.recording: list[tuple[int, tuple[Any, ...], dict[str, Any] | None]] | None = None

    def post(
        self, worker: int, message: msg.QueryInput, arrays: dict[str, Any] | None, derived: bool
    ) -> None:
        """Send a query's input to a worker; recorded for a checkpoint when a result stream sent it."""
        if derived and self.recording is not None:
            self.recording.append((worker, msg.to_record(message), arrays))
        self.workers.post(worker, message, arrays)

    # -- registration ---------------------------------------------------------------------------
    def _subscribers(self, running: RunningQuery) -> list[tuple[str, Input]]:
        plan = running.plan
        partitioning = partitioning_of(plan)
        n = self.workers.size
        single = partitioning.single or n == 1
        workers = [zlib.crc32(running.name.encode()) % n] if single else list(range(n))
        feeder = self._feeders.get(id(plan.share)) if plan.joins_share else None
        if feeder is not None:  # its slices are in the workers of the query that feeds them
            workers = feeder[0].workers

        meld = OrderedMeld(len(workers), running.sink, running.found_late)
        remote = RemoteQuery(running.name, running, partitioning, workers, meld)
        self.remote[running.name] = remote
        spec = msg.QuerySpec(
            running.sql,
            running.policy.value,
            running.allowed_lateness,
            {
                stream: (
                    tuple((c, t.name) for c, t in self._streams[stream].schema.columns),
                    self._streams[stream].attribute,
                )
                for stream, _ in plan.inputs
            },
            self.flush,
            running.restored_share,
            self.limits.windows,
        )
        self.sync_strings()
        for worker in workers:
            self.workers.post(worker, msg.Register(running.name, spec))
        if feeder is not None:
            return feeder[1]  # the feeding query's dispatch sends the tuples once for all readers
        dispatches: list[tuple[str, Input]] = []
        for index, (stream, planned) in enumerate(plan.inputs):
            dispatch = Dispatch(self, remote, index, stream, running.policy)
            dispatch.late_rule = planned.late_rule  # late='error' is judged here, as the workers would
            dispatch.numbers_rows = planned.numbers_rows
            dispatches.append((stream, dispatch))
        if plan.share is not None:
            self._feeders[id(plan.share)] = (remote, dispatches)
        return dispatches

    def sync_strings(self) -> None:
        """Broadcast the string pool's new entries, so every worker decodes as the front does."""
        codes = self.pool.take_unsent()
        if codes:
            self.workers.broadcast(msg.Strings(codes, self.pool.values(codes)))

    def _strings_released(self, codes: npt.NDArray[np.int64]) -> None:
        """A dropped stream's strings were freed: the workers forget them too, after the entries
        added before (a freed code is given out again only after this)."""
        self.sync_strings()
        if codes.size:
            self.workers.broadcast(msg.Forget(codes.tolist()))

    def _emit_early(self, running: RunningQuery) -> None:
        """The query's EMIT EVERY timer fired (while a logged change applies: a replay fires it
        at the same point): its workers emit the open windows' rows, melded like its output."""
        remote = self.remote.get(running.name)
        if remote is not None and not remote.failed:
            for worker in remote.workers:
                self.workers.post(worker, msg.Emit(remote.name))

    def explain(self, sql: str) -> str:
        running = self._plan(sql, "explain", LatePolicy.DROP, None)
        placement = partitioning_of(running.plan).describe(self.workers.size)
        return super().explain(sql) + f"\n(the query {placement})"

    def _forget(self, name: str) -> None:
        remote = self.remote.pop(name, None)
        if remote is not None:
            for worker in remote.workers:
                self.workers.post(worker, msg.Drop(name))
        live = {id(q.plan.share) for q in self._queries.values() if q.plan.share is not None}
        self._feeders = {share: feeder for share, feeder in self._feeders.items() if share in live}

    # -- worker output --------------------------------------------------------------------------
    def on_worker_message(
        self, worker: int, message: msg.QueryOutput | msg.Stats, arrays: dict[str, Any]
    ) -> str | None:
        """Apply one message from a worker; returns the name of the query it concerns."""
        if isinstance(message, msg.Stats):
            self.worker_strings[worker] = message.strings
            for name, stats in message.queries.items():
                if name in self.remote:
                    self.remote[name].worker_stats[worker] = stats
            return None
        remote = self.remote.get(message.query)
        if remote is None or worker not in remote.workers:
            return None
        match message:
            case msg.Result():
                remote.meld.result(remote.port(worker), Batch(decode_columns(arrays), message.rows))
            case msg.Punctuated():
                remote.meld.punctuation(remote.port(worker), Punctuation(message.value, message.attribute))
            case msg.Late():
                fields = tuple((name, ColumnType(kind)) for name, kind in message.columns)
                table = to_table(Batch(arrays, message.rows), fields, self.pool)
                remote.meld.late(remote.port(worker), table)
            case msg.Epoch():
                remote.meld.epoch(remote.port(worker))
            case msg.Released():
                self._released(remote, message.sent_at)
            case msg.Failed():
                reason = f"query {remote.name!r} failed on worker {worker}: {message.reason}"
                self.fail(remote, reason, message.status)
                if any(feeder is remote for feeder, _ in self._feeders.values()):
                    # The queries reading the slices it fed get no more tuples: they fail with it.
                    for other in self.remote.values():
                        if other.running.subscribers is remote.running.subscribers and not other.failed:
                            self.fail(other, reason)
            case _:
                assert_never(message)
        return remote.name

    def _released(self, remote: RemoteQuery, sent_at: float) -> None:
        """One of the query's workers released the punctuation sent at ``sent_at``."""
        done = remote.released.get(sent_at, 0) + 1
        if done < len(remote.workers):
            remote.released[sent_at] = done
            if len(remote.released) > MAX_RELEASING:  # a worker that never answers: forget
                del remote.released[min(remote.released)]
        else:
            remote.released.pop(sent_at, None)
            if self.on_released is not None:
                self.on_released(remote.name, time.monotonic() - sent_at)

    def worker_died(self, worker: int) -> list[str]:
        """Fail every query that had state on ``worker``; returns their names.

        The pool has already respawned the worker, with an empty string pool: it gets the
        front's whole pool first, so the queries registered on it later decode as the front does.
        """
        self.sync_strings()
        codes = self.pool.entries()
        if codes:
            self.workers.post(worker, msg.Strings(codes, self.pool.values(codes)))
        lost = []
        for remote in self.remote.values():
            if worker in remote.workers and not remote.failed:
                self.fail(remote, f"worker {worker} died; query {remote.name!r} lost its window state")
                lost.append(remote.name)
        return lost

    def fail(self, remote: RemoteQuery, reason: str, status: str = "ABORTED") -> None:
        remote.failed = reason
        remote.status = status
        for worker in remote.workers:
            self.workers.post(worker, msg.Drop(remote.name))

    def request_stats(self) -> None:
        self.workers.broadcast(msg.GetStats())

    def state_bytes(self, query: str) -> int:
        remote = self.remote.get(query)
        if remote is None:
            return super().state_bytes(query)
        return int(sum(s.get("state_bytes", 0) for s in remote.worker_stats.values()))
