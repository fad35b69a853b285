"""Talking to a real server with the raw generated stubs, and the in-process engine beside it.

* ``connect(target)``: a ``LowtideStub``; ``create_stream``, ``register``, ``ingest`` (a list of
  ``pyarrow.Table`` batches, ``int`` punctuation values and ``CLOSE``, as one Ingest call);
* :class:`Subscription`: a Subscribe call read by a thread, items collected until a punctuation
  value (``until``) or the end of the call (``end``: its status, reason and ``lowtide-error``);
* ``failure(call, ...)``: the status, reason and ``lowtide-error`` class of a call that must fail;
* :class:`Mirror`: the same streams, queries and Ingest calls on the server and on the oracles, in
  the same order: the reference (tests/reference_queries.py, from the definitions) for the
  queries within its reach, an in-process ``lowtide.Engine`` for the others; ``assert_same``
  compares items (timestamps as integers in their unit: ``rows``);
* ``packets`` and ``schedule``: packet-schema rows, and honest, band-disordered, interleaved
  Ingest calls of several sources each, every source closed at the end.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow as pa
from reference_queries import Unsupported, World
from thesis import PACKET

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine, LowtideError, Punctuation
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc

ARROW = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "timestamp[ms]": pa.timestamp("ms")}
CLOSE = "close"
Item = pa.Table | Punctuation
Call = tuple[str, str, list[Any]]  # (stream, source, items of one Ingest call)


def connect(target: str) -> lowtide_pb2_grpc.LowtideStub:
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    return lowtide_pb2_grpc.LowtideStub(grpc.insecure_channel(target, options=options))


def table(rows: Sequence[dict[str, Any]], schema: dict[str, str] = PACKET) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=pa.schema([(n, ARROW[t]) for n, t in schema.items()]))


def arrow_bytes(data: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    return bytes(sink.getvalue().to_pybytes())


def create_stream(stub: Any, name: str, schema: dict[str, str] = PACKET, **options: Any) -> None:
    columns = [pb.Column(name=n, type=t) for n, t in schema.items()]
    stub.CreateStream(
        pb.CreateStreamRequest(name=name, schema=columns, progressing="ts", **options), timeout=30
    )


def register(stub: Any, sql: str, name: str = "", late: str = "drop") -> pb.RegisterQueryResponse:
    return stub.RegisterQuery(pb.RegisterQueryRequest(sql=sql, name=name, late=late), timeout=30)


def requests(stream: str, source: str, items: Sequence[Any]) -> Iterator[pb.IngestRequest]:
    yield pb.IngestRequest(stream=stream, source=source)
    for item in items:
        if isinstance(item, pa.Table):
            yield pb.IngestRequest(arrow=arrow_bytes(item))
        elif isinstance(item, bytes):
            yield pb.IngestRequest(arrow=item)
        elif isinstance(item, pb.IngestRequest):  # as it is: a part of a batch, say
            yield item
        elif item == CLOSE:
            yield pb.IngestRequest(close=True)
        else:
            yield pb.IngestRequest(punctuation=int(item))


def ingest(stub: Any, stream: str, source: str, items: Sequence[Any]) -> pb.IngestResponse:
    return stub.Ingest(requests(stream, source, items), timeout=120)


def streams(stub: Any) -> dict[str, pb.StreamInfo]:
    return {s.name: s for s in stub.ListStreams(pb.ListStreamsRequest(), timeout=30).streams}


@dataclass
class Failure:
    code: grpc.StatusCode
    reason: str
    kind: str  # the ``lowtide-error`` trailing metadata ("" when absent)


def failure_of(error: grpc.RpcError) -> Failure:
    metadata = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
    return Failure(error.code(), error.details() or "", metadata.get("lowtide-error", ""))  # type: ignore[attr-defined]


def failure(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Failure:
    """Run a call that must fail; its status, reason and error class."""
    try:
        call(*args, **kwargs)
    except grpc.RpcError as error:
        return failure_of(error)
    raise AssertionError(f"{getattr(call, '__name__', call)} succeeded; an error status was expected")


class Subscription:
    """A Subscribe call read by a thread: ``items`` grows until the call ends."""

    def __init__(self, stub: Any, query: str, from_oldest: bool = False) -> None:
        self.call = stub.Subscribe(pb.SubscribeRequest(query=query, from_oldest=from_oldest))
        self.items: list[Item] = []
        self.ended: Failure | None = None  # code OK for a clean end
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        ended = Failure(grpc.StatusCode.OK, "", "")
        try:
            for message in self.call:
                if message.WhichOneof("item") == "arrow":
                    item: Item = pa.ipc.open_stream(message.arrow).read_all()
                else:
                    item = Punctuation(message.punctuation.value, message.punctuation.attribute)
                with self._changed:
                    self.items.append(item)
                    self._changed.notify_all()
        except grpc.RpcError as error:
            ended = failure_of(error)
        with self._changed:
            self.ended = ended
            self._changed.notify_all()

    def wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or (self.ended is not None and not done()):
                    raise AssertionError(
                        f"subscription: no {what} (ended: {self.ended}; {len(self.items)} items)"
                    )
                self._changed.wait(left)

    def until(self, value: int = END_OF_STREAM, timeout: float = 60.0) -> list[Item]:
        """Items up to the first output punctuation at or past ``value``."""

        def reached() -> bool:
            return any(isinstance(i, Punctuation) and i.value >= value for i in self.items)

        self.wait(reached, timeout, f"punctuation >= {value}")
        return list(self.items)

    def reach(self, expected: Sequence[Item], timeout: float = 30.0) -> list[Item]:
        """Items once there are as many rows as ``expected`` has and the last punctuation of
        each attribute is at least ``expected``'s (some windows promise nothing before the end)."""
        want, count = last_punctuation(expected), len(rows(expected))

        def reached() -> bool:
            got = last_punctuation(self.items)
            done = all(got.get(attribute, NO_PROGRESS) >= v for attribute, v in want.items())
            return done and sum(i.num_rows for i in self.items if isinstance(i, pa.Table)) >= count

        self.wait(reached, timeout, f"{count} rows and punctuation {want}")
        return list(self.items)

    def end(self, timeout: float = 30.0) -> Failure:
        self.wait(lambda: self.ended is not None, timeout, "end")
        assert self.ended is not None
        return self.ended

    def cancel(self) -> None:
        self.call.cancel()
        self.end()


# -- comparison with the oracles ----------------------------------------------------------------
def plain(data: pa.Table, units: dict[str, str] | None = None) -> pa.Table:
    """Timestamps as integers in their unit (``units``: a column's type to convert to first)."""
    for i, column in enumerate(data.schema):
        if pa.types.is_timestamp(column.type):
            values = data.column(i)
            unit = re.fullmatch(r"timestamp\[(s|ms|us|ns)\]", (units or {}).get(column.name, ""))
            if unit is not None:
                values = values.cast(pa.timestamp(unit.group(1)))
            data = data.set_column(i, column.name, values.cast(pa.int64()))
    return data


def rows(items: Sequence[Item]) -> list[dict[str, Any]]:
    return [row for item in items if isinstance(item, pa.Table) for row in plain(item).to_pylist()]


def last_punctuation(items: Sequence[Item]) -> dict[str, int]:
    return {i.attribute: i.value for i in items if isinstance(i, Punctuation)}


def _key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{k}={round(v, 6) if isinstance(v, float) else v!r}" for k, v in sorted(row.items()))


def assert_same_rows(
    actual: Sequence[dict[str, Any]], expected: Sequence[dict[str, Any]], what: str = ""
) -> None:
    """Equal as multisets of rows, floats within a relative 1e-9."""
    got, want = sorted(actual, key=_key), sorted(expected, key=_key)
    assert len(got) == len(want), f"{what}: {len(got)} rows, expected {len(want)}"
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys(), f"{what}: columns {list(a)} != {list(b)}"
        for k in a:
            x, y = a[k], b[k]
            close = isinstance(x, float) and isinstance(y, float) and math.isclose(x, y, rel_tol=1e-9)
            assert close or x == y, f"{what}: row {a} != expected {b}"


def assert_same(actual: Sequence[Item], expected: Sequence[Item], what: str = "") -> None:
    assert_same_rows(rows(actual), rows(expected), what)
    assert last_punctuation(actual) == last_punctuation(expected), what


REFERENCE = "the reference"


@dataclass
class Mirror:
    """A server and the oracles fed the same calls in the same order: what the server gives is
    compared with what the definitions give wherever they can say.

    Each query's oracle is chosen when it is registered, and kept in ``oracle`` (its name:
    :data:`REFERENCE`, or why the engine): the Mirror asks the reference
    (:func:`reference_queries.read`) whether it evaluates the query, and the query's expected
    items come from it (:meth:`reference_queries.World.output`, fed every tuple, punctuation and
    close per source as the server took them, progress and lateness judged from the definitions)
    unless it answers what it cannot. Those queries, and the few a test keeps on the engine by
    name (``engine_because``: too many tuples for a brute-force evaluation), compare with an
    in-process ``lowtide.Engine`` fed the same calls, which runs the same door as the server, so
    a door bug cannot show there. What the reference cannot evaluate, so the engine answers:

    * joins (band, tumbling, interval; aggregates over a join);
    * slide-by-tuple windows (``RATTR``, ``SATTR``);
    * ``late='update'`` (revisions), and ``late='error'`` with a WHERE;
    * WHERE beyond a conjunction of column-literal comparisons; functions, ``CASE``, ``FILTER``,
      ``DISTINCT``, expressions; derived tables, Spark's and Flink's spellings, whole-stream
      GROUP BY without a bracket window; selected columns other than the group columns;
    * streams with generated punctuation (``ordered``, ``bounded``, ``heartbeat``);
    * over a query's results: any window but sliding or tumbling, and a query the reference does
      not evaluate itself.

    The engine is fed every call all the same: it judges what the server refuses
    (:meth:`reject`: schema, limits, strings), and ``results`` polls it first, so a limit the
    engine enforces (``max_windows_per_step``) raises there. A batch the server takes must hold
    no tuple the reference finds late for a query under ``late='error'``, and one refused as
    late must hold one (when every such query is the reference's). ``late_results``: a query's
    late side stream, the reference's for its time-window queries under ``'drop'`` without
    WHERE, else the engine's.
    """

    stub: Any
    engine: Engine = field(default_factory=Engine)
    expected: dict[str, list[Item]] = field(default_factory=dict)  # what the engine emitted
    world: World = field(default_factory=World)
    oracle: dict[str, str] = field(default_factory=dict)  # query: REFERENCE, or why the engine
    late: dict[str, str] = field(default_factory=dict)  # query: its late policy

    def now(self) -> float:
        """The engine's clock judges idle sources for both oracles; its time-driven work runs
        whenever it is called, the reference's here."""
        now = self.engine.clock.now()
        self.world.tick(now)
        return now

    def create_stream(self, name: str, schema: dict[str, str] = PACKET, **options: Any) -> None:
        create_stream(self.stub, name, schema, **options)
        args = (
            options.get("punctuation", "explicit"),
            list(options.get("sources", ())),
            options.get("idle_timeout_s") or None,
        )
        self.engine.create_stream(name, schema, "ts", *args)
        self.world.create_stream(name, schema, "ts", *args, self.now())

    def register(self, sql: str, name: str, late: str = "drop", engine_because: str = "") -> str:
        """Register on the server and the engine, and on the reference if it evaluates the query
        (``engine_because``: why a test keeps it on the engine all the same)."""
        register(self.stub, sql, name, late)
        self.engine.register_query(sql, name=name, late=late)
        self.expected[name] = []
        self.late[name] = late
        self.now()
        if engine_because:
            self.oracle[name] = f"the engine: {engine_because}"
            return name
        try:
            query = self.world.read(sql, late)
        except Unsupported as exc:
            self.oracle[name] = f"the engine: the reference cannot evaluate {exc}"
        else:
            self.world.register(name, query)
            self.oracle[name] = REFERENCE
        return name

    def on_engine(self) -> dict[str, str]:
        """The queries compared with the engine, and why."""
        return {name: why for name, why in self.oracle.items() if why != REFERENCE}

    def ingest(self, stream: str, source: str, items: Sequence[Any]) -> pb.IngestResponse:
        response = ingest(self.stub, stream, source, items)
        for item in items:
            self.apply(stream, source, item)
        return response

    def reject(self, stream: str, source: str, items: Sequence[Any]) -> Failure:
        """An Ingest call whose last item must fail: the items before it stay applied, on the
        server as on the oracles; the engine must raise the class the server names (raw bytes:
        only the server reads them), and the reference must find a late tuple in a batch refused
        as late."""
        found = failure(ingest, self.stub, stream, source, items)
        for item in items[:-1]:
            self.apply(stream, source, item)
        last = items[-1]
        if isinstance(last, pa.Table) and found.kind == "LateTuple":
            unjudged = [q for q, late in self.late.items() if late == "error" and self.oracle[q] != REFERENCE]
            refusing = self.world.refusing(stream, self._tuples(stream, last))
            assert refusing or unjudged, "refused as late: the reference finds no tuple late under 'error'"
        if not isinstance(last, bytes):
            try:
                self.apply(stream, source, last)
            except LowtideError as exc:
                assert type(exc).__name__ == found.kind, (exc, found)
            else:
                raise AssertionError(f"the engine accepted what the server rejected: {found}")
        return found

    def apply(self, stream: str, source: str, item: Any) -> None:
        """One item to the oracles only (what the server took in a call of its own)."""
        now = self.now()
        if isinstance(item, pa.Table):
            self.engine.push(stream, item, source=source)
            tuples = self._tuples(stream, item)
            refusing = self.world.refusing(stream, tuples)
            assert not refusing, f"taken, yet the reference finds a tuple late for {refusing} (late='error')"
            self.world.push(stream, source, tuples, now)
        elif item == CLOSE:
            self.engine.close_source(stream, source)
            self.world.close(stream, source, now)
        else:
            self.engine.punctuate(stream, int(item), source=source)
            self.world.punctuate(stream, source, int(item), now)

    def _tuples(self, stream: str, data: pa.Table) -> list[dict[str, Any]]:
        """The batch's tuples as the reference reads them, when a query of the reference reads
        the stream (timestamps as integers in the stream's unit)."""
        if not any(stream in q.query.inputs for q in self.world.queries.values()):
            return []
        return plain(data, self.world.streams[stream].schema.columns).to_pylist()

    def results(self, query: str) -> list[Item]:
        """What ``query`` owes so far: the reference's rows and output punctuation, or everything
        the engine emitted (polled either way)."""
        self.expected[query] += self.engine.poll(query)
        self.now()
        if self.oracle[query] != REFERENCE:
            return self.expected[query]
        found, punctuation = self.world.output(query)
        items: list[Item] = [pa.Table.from_pylist(found)] if found else []
        if punctuation is not None:
            items.append(Punctuation(punctuation, "window_end"))
        return items

    def late_results(self, query: str) -> list[Item]:
        """What ``<query>.late`` owes so far: the tuples the query could not count, and its output
        punctuation as the side stream marks it (``<query>.window_end``); the reference's where
        it judges them (:meth:`reference_queries.World.late`), else the engine's."""
        side = f"{query}.late"
        self.expected[side] = self.expected.get(side, []) + self.engine.poll(side)
        self.now()
        if self.oracle[query] != REFERENCE:
            return self.expected[side]
        try:
            late = self.world.late(query)
        except Unsupported:
            return self.expected[side]
        items: list[Item] = [pa.Table.from_pylist(late)] if late else []
        punctuation = self.world.punctuation(query)
        if punctuation is not None:
            items.append(Punctuation(punctuation, f"{query}.window_end"))
        return items


# -- data ---------------------------------------------------------------------------------------
IPS = [f"10.0.{i // 4}.{i % 4 + 1}" for i in range(10)]


def packets(rnd: random.Random, n: int, t0: int, t1: int, flags: bool = False) -> list[dict[str, Any]]:
    """``n`` packet rows with ts in ``[t0, t1)`` ms (few IPs and ports: joins find partners)."""
    out = []
    for _ in range(n):
        row = {
            "srcIP": rnd.choice(IPS),
            "srcPort": rnd.choice([80, 443, 5000]),
            "destIP": rnd.choice(IPS),
            "destPort": rnd.choice([80, 443, 5000]),
            "len": rnd.randrange(40, 1500),
            "ts": rnd.randrange(t0, t1),
        }
        if flags:
            row["flags"] = rnd.choice(["SYN", "SYN_ACK", "ACK"])
        out.append(row)
    return out


def schedule(
    data: dict[tuple[str, str], list[dict[str, Any]]],
    rnd: random.Random,
    schemas: dict[str, dict[str, str]],
    band: int = 30_000,
    batch: int = 12,
    close: bool = True,
) -> list[Call]:
    """Ingest calls per (stream, source): rows in ts order disordered within ``band`` ms, in
    batches most followed by honest punctuation (the least ts still to come; after the last
    batch, past the largest ts sent), 1-3 items a call; the calls of all sources interleaved
    at random, then (``close``) every source closed."""
    queues: list[list[Call]] = []
    for (stream, source), rows_of in data.items():
        order = sorted(rows_of, key=lambda r: r["ts"] + rnd.randrange(0, band + 1))
        items: list[Any] = []
        for start in range(0, len(order), batch):
            items.append(table(order[start : start + batch], schemas[stream]))
            rest = order[start + batch :]
            if not rest:
                items.append(max(r["ts"] for r in order) + 1)
            elif rnd.random() < 0.7:
                items.append(min(r["ts"] for r in rest))
        calls = []
        while items:
            size = rnd.randint(1, 3)
            calls.append((stream, source, items[:size]))
            items = items[size:]
        queues.append(calls)
    out: list[Call] = []
    while any(queues):
        queue = rnd.choice([q for q in queues if q])
        out.append(queue.pop(0))
    if close:
        out += [(stream, source, [CLOSE]) for stream, source in data]
    return out
