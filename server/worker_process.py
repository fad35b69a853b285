"""What runs inside a worker: its partition of every query's operator graph.

The front process owns the door (schemas, string codes, sources, progress, late detection) and
sends each worker the tuples of the partitions it owns, already split by the query's partitioning
key, plus every punctuation. The worker builds each query's operators from the description the
door planned (it plans nothing itself) and sends back result batches, output punctuation and late
tuples, still as engine columns (string codes): the front decodes them once, after melding all
workers' outputs.

The messages in and out are those of :mod:`lowtide.server.messages`: in, the front's
:data:`~lowtide.server.messages.ToWorker` (the string pool's new and released entries its
queries need, which the worker's pool mirrors: see :mod:`~lowtide.server.process_runner`;
queries registered and dropped; batches and punctuation; sync, stats, checkpoint, reset,
restore, stop); out, :data:`~lowtide.server.messages.ToFront` (results, output
punctuation, late tuples; ``ReleasedMessage`` after the results a punctuation released;
``EpochMessage`` after everything one batch, punctuation or ``EmitMessage`` (early results) made
for a query; the answers to the control messages). A :class:`Worker` only handles messages and
sends its answers to an :class:`Outbound`; :func:`worker_main` runs one in a process started by
:class:`~lowtide.server.local_workers.LocalWorkers`, over shared-memory channels.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol, assert_never

import numpy as np

from lowtide.batch import Batch
from lowtide.errors import CorruptState, ResourceExhausted
from lowtide.operators.base import Operator
from lowtide.operators.input import Input
from lowtide.punctuation.model import Punctuation
from lowtide.query.build import BuildContext, build
from lowtide.query.description import Fields, InputNode, PlanDescription
from lowtide.query.live_shares import Shares, share_key
from lowtide.query.plan import Plan
from lowtide.query.plan_state import restore_plan, restore_share, snapshot_plan, snapshot_share
from lowtide.schema import ColumnType
from lowtide.server import messages as msg
from lowtide.server.channel import ChannelReader, ChannelWriter
from lowtide.server.snapshot_writer import Written, write_in_child
from lowtide.server.transport import Arrays, encode_columns
from lowtide.snapshot import State, as_dict, fields, unpack
from lowtide.strings import NULL_CODE, StringPool


class Outbound(Protocol):
    """Where a worker's answers go, in order (a :class:`~lowtide.server.channel.ChannelWriter`)."""

    def send(self, message: msg.ToFront, arrays: Arrays | None = None) -> None: ...


class _Forward(Operator):
    """The end of a query graph in a worker: hands its output to the outbound channel."""

    label = "Forward"

    def __init__(self, query: str, out: Outbound) -> None:
        super().__init__()
        self.query = query
        self.out = out
        self.punctuations = 0  # output punctuation sent so far

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        self.out.send(msg.ResultMessage(self.query, batch.n), encode_columns(batch.columns))

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.punctuations += 1
        self.out.send(msg.PunctuatedMessage(self.query, punctuation.attribute, punctuation.value))


@dataclass
class _Hosted:
    plan: Plan
    inputs: list[Input]
    forward: _Forward
    slow_flush: bool  # its output punctuation may leave after the punctuation that released it
    operators: list[Operator] = field(default_factory=list)


def _layout(description: PlanDescription, node: int) -> Fields:
    kind = description.nodes[node].kind
    assert isinstance(kind, InputNode)
    return kind.layout


def _whole(batch: Batch, layout: Fields) -> Batch:
    """``batch`` with every column of its input: the front leaves out of on-time tuples the
    columns their query never names (``PlannedQuery.reads``), and the operators that carry whole
    tuples (a join's payload) get a constant in their place, which no result shows."""
    missing = {
        name: np.full(batch.n, NULL_CODE if kind.is_string else 0, dtype=kind.dtype)
        for name, kind in layout
        if name not in batch.columns
    }
    return batch.with_columns(missing) if missing else batch


class Worker:
    def __init__(self, out: Outbound) -> None:
        self.out = out
        self.reset()

    def reset(self) -> None:
        """Forget every query and string (the front restores the worker from a checkpoint)."""
        self.pool = StringPool(mirror=True)  # it never gives codes out (StringPool.codes)
        self.queries: dict[str, _Hosted] = {}
        # Sliding queries on one stream share slices here as in the in-process engine. The front
        # sends their tuples once, under the name of the query that feeds the slices: ``feeds``
        # maps a name to the inputs its messages go to, kept while any query reads through them.
        self.shares = Shares()
        self.feeds: dict[str, list[Input]] = {}
        self.layouts: dict[str, list[Fields]] = {}  # feed -> each input's columns (see _whole)
        self.readers: dict[str, list[str]] = {}  # feed -> the queries whose output its input moves

    def snapshot(self) -> State:
        """The state of every query and share at this point of the input."""
        queries: dict[str, State] = {name: snapshot_plan(h.plan) for name, h in self.queries.items()}
        shares: dict[str, State] = {share_key(share): snapshot_share(share) for share in self.shares}
        return {"queries": queries, "shares": shares}

    def checkpoint(self, message: msg.CheckpointMessage) -> None:
        """Answer the barrier at once; a forked child writes the state as it is now (see
        :mod:`lowtide.server.snapshot_writer`) and a thread reports the file when it is on disk."""

        def persisted(written: Written) -> None:
            self.out.send(msg.PersistedMessage(message.token, written.size, written.crc32, written.error))

        try:
            pause = write_in_child(self.snapshot, Path(message.path), persisted)
        except OSError as exc:  # no memory or processes left to fork: the front abandons it
            self.out.send(msg.CheckpointedMessage(message.token, 0.0, f"cannot fork a writer: {exc}"[:300]))
            return
        self.out.send(msg.CheckpointedMessage(message.token, pause, None))

    def restore(self, path: str) -> None:
        """Put the queries registered again (in their order) where :meth:`checkpoint` saved them."""
        state = unpack(Path(path).read_bytes())
        saved = fields(state, ("queries", "shares"), path)
        queries, shares = as_dict(saved["queries"], path), as_dict(saved["shares"], path)
        for name, hosted in self.queries.items():
            if name not in queries:
                raise CorruptState(f"{path} holds no state for query {name!r}")
            restore_plan(hosted.plan, queries[name])
        for share in self.shares:
            key = share_key(share)
            if key not in shares:
                raise CorruptState(f"{path} holds no state for the slices {key}")
            restore_share(share, shares[key])

    def register(self, name: str, description: PlanDescription) -> None:
        """Build the query's graph as the door described it, with this worker's mirror of the
        door's string pool and its live slices."""

        def on_drop(batch: Batch, fields: tuple[tuple[str, ColumnType], ...]) -> None:
            names = [n for n, _ in fields]
            self.out.send(
                msg.LateMessage(name, batch.n, tuple((n, t.name) for n, t in fields)),
                {n: batch.columns[n] for n in names},
            )

        plan = build(description, BuildContext(self.pool, on_drop, self.shares))
        plan.start()
        forward = _Forward(name, self.out)
        plan.output.connect(forward)
        inputs = [op for _, op in plan.inputs]
        self.queries[name] = _Hosted(plan, inputs, forward, description.flushes_slowly, plan.operators)
        if not self.shares.enter(plan):
            self.feeds[name] = inputs
            self.layouts[name] = [_layout(description, about.node) for about in description.inputs]
            self.readers[name] = [name]
        else:
            assert plan.share is not None
            feed = next(f for f, feeding in self.feeds.items() if plan.share.input in feeding)
            self.readers[feed].append(name)

    def drop(self, name: str) -> None:
        hosted = self.queries.pop(name, None)
        if hosted is None:
            return
        self.shares.leave(hosted.plan)
        feeding = {id(op) for h in self.queries.values() if h.plan.share is not None for op in h.inputs}
        self.feeds = {
            query: inputs
            for query, inputs in self.feeds.items()
            if query in self.queries or any(id(op) in feeding for op in inputs)
        }
        self.layouts = {feed: layout for feed, layout in self.layouts.items() if feed in self.feeds}
        self.readers = {
            feed: [reader for reader in readers if reader != name]
            for feed, readers in self.readers.items()
            if feed in self.feeds
        }

    def handle(self, message: msg.ToWorker, arrays: dict[str, np.ndarray[Any, Any]]) -> bool:
        """Apply one message from the front; False for :class:`~lowtide.server.messages.StopMessage`."""
        try:
            match message:
                case msg.BatchMessage():
                    self._process(message, arrays)
                    self._epoch(message.query)
                case msg.PunctuateMessage():
                    self._punctuate(message)
                    self._epoch(message.query)
                case msg.EmitMessage():
                    self._emit(message.query)
                case msg.SyncMessage():
                    self.out.send(msg.SyncedMessage(message.token))
                case msg.StringsMessage():
                    self.pool.adopt(message.codes, message.values)
                case msg.ForgetMessage():
                    self.pool.forget(message.codes)
                case msg.RegisterMessage():
                    self.register(message.query, message.description)
                case msg.DropMessage():
                    self.drop(message.query)
                case msg.GetStatsMessage():
                    self.out.send(msg.StatsMessage(self.stats(), len(self.pool)))
                case msg.CheckpointMessage():  # after everything before it, before what follows
                    self.checkpoint(message)
                case msg.RestoreMessage():  # after the queries are registered again
                    error = _attempt(lambda: self.restore(message.path))
                    self.out.send(msg.RestoredMessage(message.generation, error))
                case msg.ResetMessage():  # what follows is a restore; what was sent before is moot
                    self.reset()
                    self.out.send(msg.ResetDoneMessage(message.generation))
                case msg.StopMessage():
                    return False
                case _:
                    assert_never(message)
        except (EOFError, OSError):
            raise  # the front went away: worker_main ends the process quietly
        except Exception as exc:  # MemoryError, OverflowError, ... too: the query fails, not the worker
            query = _query_of(message)
            self.drop(query)
            lines = str(exc).strip().splitlines()
            reason = f"{type(exc).__name__}: {lines[0] if lines else ''}"
            # A limit passed keeps its status (RESOURCE_EXHAUSTED); anything else aborts the query.
            status = exc.status if isinstance(exc, ResourceExhausted) else "ABORTED"
            self.out.send(msg.FailedMessage(query, reason[:300], status))
        return True

    def _process(self, message: msg.BatchMessage, arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        inputs = self.feeds.get(message.query)
        if inputs is not None and message.rows:
            batch = Batch(dict(arrays), message.rows)
            target = inputs[message.input_index]
            if message.late:
                target.process_late(batch)
            else:
                target.process(_whole(batch, self.layouts[message.query][message.input_index]))

    def _punctuate(self, message: msg.PunctuateMessage) -> None:
        inputs = self.feeds.get(message.query)
        if inputs is None:
            return
        before = {name: hosted.forward.punctuations for name, hosted in self.queries.items()}
        inputs[message.input_index].punctuate(Punctuation(message.value, message.attribute))
        # The front times punctuation to result for each query whose output this punctuation
        # moved on (every worker of a query moves alike: windows close by punctuation, not by
        # data), after the results it released.
        for name, hosted in self.queries.items():
            moved = hosted.forward.punctuations > before.get(name, hosted.forward.punctuations)
            if moved or (hosted.slow_flush and name == message.query):
                self.out.send(msg.ReleasedMessage(name, message.sent_at))

    def _emit(self, query: str) -> None:
        """EMIT EVERY: the query's open windows' current rows, then its epoch (the front sends
        this to each of the query's workers, at the same point of their input)."""
        hosted = self.queries.get(query)
        if hosted is not None:
            hosted.plan.emit_partials()
            self.out.send(msg.EpochMessage(query))

    def _epoch(self, feed: str) -> None:
        """Mark the end of what one input message made, for each query it feeds (the front
        releases a query's output by these, in the same order at every replay)."""
        for reader in self.readers.get(feed, ()):
            self.out.send(msg.EpochMessage(reader))

    def stats(self) -> dict[str, Any]:
        return {
            name: {
                "operators": [(op.label, op.tuples_in, op.tuples_out) for op in hosted.operators],
                "state_bytes": sum(op.state_bytes() for op in hosted.operators),
                "open_windows": sum(op.open_windows() for op in hosted.operators),
                "late": sum(op.late_tuples for op in hosted.inputs),
            }
            for name, hosted in self.queries.items()
        }


def worker_main(
    inbound_name: str, inbound_conn: Connection, outbound_name: str, outbound_conn: Connection
) -> None:
    """Entry point of a worker process (a fork of the fork server, :mod:`lowtide.server.worker_fork`)."""
    # The front decides when workers stop (it drains them first): a SIGTERM or Ctrl-C sent to
    # the whole process group (systemd, timeout, a terminal) reaches the front alone. A worker
    # whose front is gone ends at the end of its pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbound = shared_memory.SharedMemory(name=inbound_name)
    outbound = shared_memory.SharedMemory(name=outbound_name)
    reader = ChannelReader(inbound, inbound_conn, msg.TO_WORKER)
    worker = Worker(ChannelWriter(outbound, outbound_conn, msg.TO_FRONT))
    try:
        while worker.handle(*reader.recv()):
            pass
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the front went away: nothing left to serve
    finally:
        inbound.close()
        outbound.close()
        os._exit(0)


def _attempt(work: Callable[[], None]) -> str | None:
    """Run ``work`` (files only, never the channel): None, or the one-line reason it failed (a
    full disk, a damaged or foreign file: the front decides)."""
    try:
        work()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def _query_of(message: msg.ToWorker) -> str:
    """The query that fails when handling ``message`` raises ("" when it concerns none)."""
    match message:
        case (
            msg.BatchMessage()
            | msg.PunctuateMessage()
            | msg.EmitMessage()
            | msg.RegisterMessage()
            | msg.DropMessage()
        ):
            return message.query
        case _:
            return ""
