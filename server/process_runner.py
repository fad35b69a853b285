"""The runner of the server: every query's operator graph in worker processes, behind a transport.

The door's subscribers of a query's inputs are :class:`Dispatch` operators: each splits a batch
by the query's partitioning key and posts the pieces to the workers owning them, and posts every
punctuation to all of them. Worker outputs come back into an
:class:`~lowtide.server.ordered_meld.OrderedMeld` per query - results pass through, output
punctuation is the minimum over the query's workers, in an order replay reproduces - and then
into the query's sink and late side stream, exactly where an in-process graph would deliver them.
A query fails when a worker reports it failed, or dies (the front decides: without a state
directory the queries on it fail here).

The workers' string pools mirror the door's as far as their queries need it: the codes of pinned
strings (query literals, and the strings queries made), and every string only while a query that
decodes strings runs (:attr:`~lowtide.query.description.PlanDescription.decodes_strings`).
Otherwise results and late tuples leave a worker as codes, which the front decodes: a worker holds
no copy of the pool. A mirror gives no code out, so a query's last Project that makes strings
runs here, between its meld and its sink, with the door's pool
(:func:`~lowtide.server.partitioning.at_front`); a query making strings elsewhere is refused as
it is planned (:meth:`ProcessRunner.check`).

Invariant: this module decides what is sent where and how outputs meld; how messages reach the
workers is the :class:`~lowtide.server.transport.WorkerTransport`'s, so a transport is the whole
of what another kind of worker (a Ray actor) needs.
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
from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.punctuation.model import Punctuation
from lowtide.query.build import project
from lowtide.query.description import PlanDescription
from lowtide.results import to_table
from lowtide.runner import PlannedQuery, Subscribers
from lowtide.schema import ColumnType
from lowtide.server import messages as msg
from lowtide.server.ordered_meld import OrderedMeld
from lowtide.server.partitioning import Partitioning, at_front, partitioning_of, split
from lowtide.server.transport import Arrays, WorkerTransport, decode_columns
from lowtide.strings import StringPool

MAX_RELEASING = 1_000  # punctuation still waiting for some of a query's workers to release it


@dataclass
class RemoteQuery:
    """A query the workers run: where its input goes, how its output melds, how it ended."""

    query: PlannedQuery
    partitioning: Partitioning
    workers: list[int]
    meld: OrderedMeld
    dispatches: Subscribers = field(default_factory=list)  # of the query feeding its slices, if shared
    failed: str | None = None
    status: str = "ABORTED"  # the gRPC code its subscriptions end with once it failed
    worker_stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    released: dict[float, int] = field(default_factory=dict)  # punctuation sent_at -> workers done

    @property
    def name(self) -> str:
        return self.query.name

    def port(self, worker: int) -> int:
        return self.workers.index(worker)


class Dispatch(Input):
    """A stream's subscriber for one input of one query: posts it to the query's workers."""

    label = "Dispatch"

    def __init__(self, runner: ProcessRunner, remote: RemoteQuery, index: int, stream: str) -> None:
        super().__init__(stream, remote.query.description.policy, lambda batch: None)
        self.runner = runner
        self.remote = remote
        self.index = index
        self.derived = stream in remote.query.results_read  # fed by another query's output
        # What its on-time tuples carry to the workers: the columns the query reads. Late ones go
        # whole (the late side stream shows every column); so do a result stream's and what feeds
        # shared slices (other queries may read more of them).
        reads = remote.query.reads
        self.reads = None if reads is None or self.derived or remote.query.description.share else reads

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if self.reads is not None:
            batch = Batch({k: v for k, v in batch.columns.items() if k in self.reads}, batch.n, batch.late)
        self._send(batch, late=False)

    def process_late(self, batch: Batch) -> None:
        self.late_tuples += batch.n
        self._send(batch, late=True)

    def _send(self, batch: Batch, late: bool) -> None:
        remote = self.remote
        if remote.failed or batch.n == 0:
            return
        runner = self.runner
        runner.sync_strings()
        if len(remote.workers) == 1:
            message = msg.BatchMessage(remote.name, self.index, late, batch.n)
            runner.post(remote.workers[0], message, batch.columns, self.derived)
            return
        pieces = split(batch, remote.partitioning.keys[self.index], len(remote.workers))
        for worker, rows in zip(remote.workers, pieces, strict=True):
            # An empty piece goes too: every worker answers every message (an epoch, see ordered_meld).
            piece = batch.select(rows)
            message = msg.BatchMessage(remote.name, self.index, late, piece.n)
            runner.post(worker, message, piece.columns if piece.n else None, self.derived)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if self.remote.failed:
            return
        message = msg.PunctuateMessage(
            self.remote.name, self.index, punctuation.attribute, punctuation.value, time.monotonic()
        )
        for worker in self.remote.workers:
            self.runner.post(worker, message, None, self.derived)


class ProcessRunner:
    """The :class:`~lowtide.runner.Runner` of the server's front (see the module)."""

    def __init__(self, workers: WorkerTransport, pool: StringPool) -> None:
        """``pool``: the door's, which the workers' pools mirror (``pool.mirrored``)."""
        self.workers = workers
        self.pool = pool
        self.queries: dict[str, RemoteQuery] = {}
        self.worker_strings: dict[int, int] = {}  # what each worker's pool held at its last Stats
        self._decoding: set[str] = set()  # queries that decode strings: the workers mirror the pool
        self.on_released: Callable[[str, float], None] | None = None  # (query, seconds since sent)
        # Shared slices, by name -> the query feeding them (its dispatches outlive it while others read).
        self._feeders: dict[str, RemoteQuery] = {}
        # While a checkpoint waits for its barriers: what result streams send to workers meanwhile,
        # as plain data (messages.to_record).
        self.recording: list[tuple[int, tuple[Any, ...], dict[str, Any] | None]] | None = None

    def post(self, worker: int, message: msg.QueryInput, arrays: Arrays | None, derived: bool) -> None:
        """Send a query's input to a worker; recorded for a checkpoint when a result stream sent it."""
        if derived and self.recording is not None:
            self.recording.append((worker, msg.to_record(message), arrays))
        self.workers.post(worker, message, arrays)

    # -- the Runner protocol --------------------------------------------------------------------
    def check(self, description: PlanDescription) -> None:
        """Refuse a query that would make strings in a worker (see :func:`at_front`)."""
        at_front(description)

    def register(self, query: PlannedQuery) -> Subscribers:
        description, front = at_front(query.description)  # what the workers run, and the front
        share = description.share
        partitioning = partitioning_of(description)
        n = self.workers.size
        single = partitioning.single or n == 1
        workers = [zlib.crc32(query.name.encode()) % n] if single else list(range(n))
        feeder = self._feeders.get(share.name) if share is not None and share.joins else None
        if feeder is not None:  # its slices are in the workers of the query that feeds them
            workers = feeder.workers
        output: Operator = query.sink
        if front is not None:  # its strings are coded here, as the outputs meld, in their order
            output = project(front, self.pool)
            output.connect(query.sink)
        remote = RemoteQuery(query, partitioning, workers, OrderedMeld(len(workers), output, query.on_late))
        self.queries[query.name] = remote
        if description.decodes_strings:
            if not self._decoding:  # from now on the workers mirror every string
                self.pool.take_unsent()
                self._post_strings(None, self.pool.entries())
            self._decoding.add(query.name)
        self.sync_strings()
        for worker in workers:
            self.workers.post(worker, msg.RegisterMessage(query.name, description))
        if feeder is not None:
            remote.dispatches = feeder.dispatches  # the feeder's dispatch sends the tuples once for all
            return remote.dispatches
        remote.dispatches = [
            (about.stream, self._dispatch(remote, index, about.stream, about.numbers_rows))
            for index, about in enumerate(description.inputs)
        ]
        if share is not None:
            self._feeders[share.name] = remote
        return remote.dispatches

    def _dispatch(self, remote: RemoteQuery, index: int, stream: str, numbers_rows: bool) -> Dispatch:
        dispatch = Dispatch(self, remote, index, stream)
        dispatch.numbers_rows = numbers_rows  # the stream delivers such a batch whole
        return dispatch

    def drop(self, name: str) -> None:
        remote = self.queries.pop(name, None)
        if remote is not None:
            for worker in remote.workers:
                self.workers.post(worker, msg.DropMessage(name))
        if name in self._decoding:
            self._decoding.discard(name)
            if not self._decoding:  # the workers need the literals alone again
                self.sync_strings()
                held = self.pool.entries()
                pinned = set(self.pool.pinned(held))
                self.workers.broadcast(msg.ForgetMessage([code for code in held if code not in pinned]))
        shares = (q.query.description.share for q in self.queries.values())
        live = {share.name for share in shares if share is not None}
        self._feeders = {share: feeder for share, feeder in self._feeders.items() if share in live}

    def emit_early(self, name: str) -> None:
        """The query's EMIT EVERY timer fired (while a logged change applies: a replay fires it
        at the same point): its workers emit the open windows' rows, melded like its output."""
        remote = self.queries.get(name)
        if remote is not None and not remote.failed:
            for worker in remote.workers:
                self.workers.post(worker, msg.EmitMessage(remote.name))

    def strings_released(self, codes: npt.NDArray[np.int64]) -> None:
        """A dropped stream's strings were freed: the workers forget them too, after the entries
        added before (a freed code is given out again only after this). Literals are never
        freed: workers that hold nothing else have nothing to forget."""
        self.sync_strings()
        if codes.size and self._decoding:
            self.workers.broadcast(msg.ForgetMessage(codes.tolist()))

    def placement(self, description: PlanDescription) -> str:
        workers, front = at_front(description)
        where = partitioning_of(workers).describe(self.workers.size)
        made = "; the front runs its last Project, which makes or reads strings" if front is not None else ""
        return f"\n(the query {where}{made})"

    def operators(self, name: str) -> list[tuple[str, int, int]]:
        """Summed over the query's workers, as of their last statistics."""
        totals: list[tuple[str, int, int]] = []
        for stats in self.queries[name].worker_stats.values():
            for index, (label, n_in, n_out) in enumerate(stats.get("operators", [])):
                if index == len(totals):
                    totals.append((label, 0, 0))
                _, total_in, total_out = totals[index]
                totals[index] = (label, total_in + n_in, total_out + n_out)
        return totals

    def open_windows(self, name: str) -> int:
        return int(sum(s.get("open_windows", 0) for s in self.queries[name].worker_stats.values()))

    def state_bytes(self, name: str) -> int:
        return int(sum(s.get("state_bytes", 0) for s in self.queries[name].worker_stats.values()))

    def hosted(self, worker: int) -> dict[str, int]:
        """The queries with operators on ``worker`` (not those that failed: their operators were
        dropped), each with its state bytes there as of the worker's last statistics."""
        return {
            name: int(remote.worker_stats.get(worker, {}).get("state_bytes", 0))
            for name, remote in self.queries.items()
            if worker in remote.workers and not remote.failed
        }

    # -- the workers ----------------------------------------------------------------------------
    def sync_strings(self) -> None:
        """Broadcast the string pool's new entries the workers need (see the module), so every
        worker codes literals, and decodes, as the door does."""
        codes = self.pool.take_unsent()
        if codes and not self._decoding:
            codes = self.pool.pinned(codes)
        self._post_strings(None, codes)

    def _post_strings(self, worker: int | None, codes: list[int]) -> None:
        """The strings of ``codes`` to ``worker`` (None: every worker)."""
        if not codes:
            return
        message = msg.StringsMessage(codes, self.pool.values(codes))
        if worker is None:
            self.workers.broadcast(message)
        else:
            self.workers.post(worker, message)

    def on_worker_message(
        self, worker: int, message: msg.QueryOutput | msg.StatsMessage, arrays: Arrays
    ) -> str | None:
        """Apply one message from a worker; returns the name of the query it concerns."""
        if isinstance(message, msg.StatsMessage):
            self.worker_strings[worker] = message.strings
            for name, stats in message.queries.items():
                if name in self.queries:
                    self.queries[name].worker_stats[worker] = stats
            return None
        remote = self.queries.get(message.query)
        if remote is None or worker not in remote.workers:
            return None
        match message:
            case msg.ResultMessage():
                remote.meld.result(remote.port(worker), Batch(decode_columns(arrays), message.rows))
            case msg.PunctuatedMessage():
                remote.meld.punctuation(remote.port(worker), Punctuation(message.value, message.attribute))
            case msg.LateMessage():
                fields = tuple((name, ColumnType(kind)) for name, kind in message.columns)
                table = to_table(Batch(arrays, message.rows), fields, self.pool)
                remote.meld.late(remote.port(worker), table)
            case msg.EpochMessage():
                remote.meld.epoch(remote.port(worker))
            case msg.ReleasedMessage():
                self._released(remote, message.sent_at)
            case msg.FailedMessage():
                reason = f"query {remote.name!r} failed on worker {worker}: {message.reason}"
                self.fail(remote, reason, message.status)
                if any(feeder is remote for feeder in self._feeders.values()):
                    # The queries reading the slices it fed get no more tuples: they fail with it.
                    for other in self.queries.values():
                        if other.dispatches is remote.dispatches and not other.failed:
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

        The transport has already started the worker again, with an empty string pool: it gets
        what the workers mirror of the door's pool first, so the queries registered on it later
        code and decode as the door does.
        """
        self.sync_strings()
        codes = self.pool.entries()
        self._post_strings(worker, codes if self._decoding else self.pool.pinned(codes))
        lost = []
        for remote in self.queries.values():
            if worker in remote.workers and not remote.failed:
                self.fail(remote, lost_state(worker, remote.name))
                lost.append(remote.name)
        return lost

    def fail(self, remote: RemoteQuery, reason: str, status: str = "ABORTED") -> None:
        remote.failed = reason
        remote.status = status
        for worker in remote.workers:
            self.workers.post(worker, msg.DropMessage(remote.name))

    def request_stats(self) -> None:
        self.workers.broadcast(msg.GetStatsMessage())


def lost_state(worker: int, query: str) -> str:
    """Why a query failed when its worker died without a state directory."""
    return f"worker {worker} died; query {query!r} lost its window state"


__all__ = ["Dispatch", "ProcessRunner", "RemoteQuery", "lost_state"]
