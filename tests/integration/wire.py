"""Talking to a real server with the raw generated stubs, and the in-process engine beside it.

* ``connect(target)``: a ``LowtideStub``; ``create_stream``, ``register``, ``ingest`` (a list of
  ``pyarrow.Table`` batches, ``int`` punctuation values and ``CLOSE``, as one Ingest call);
* :class:`Subscription`: a Subscribe call read by a thread, items collected until a punctuation
  value (``until``) or the end of the call (``end``: its status, reason and ``lowtide-error``);
* ``failure(call, ...)``: the status, reason and ``lowtide-error`` class of a call that must fail;
* :class:`Mirror`: the same streams, queries and Ingest calls on the server and on an in-process
  ``lowtide.Engine`` (the oracle), in the same order; ``assert_same`` compares their items;
* ``packets`` and ``schedule``: packet-schema rows, and honest, band-disordered, interleaved
  Ingest calls of several sources each, every source closed at the end.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pyarrow as pa
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


# -- comparison with the in-process engine ------------------------------------------------------
def rows(items: Sequence[Item]) -> list[dict[str, Any]]:
    return [row for item in items if isinstance(item, pa.Table) for row in item.to_pylist()]


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


@dataclass
class Mirror:
    """A server and an in-process engine fed the same calls in the same order."""

    stub: Any
    engine: Engine = field(default_factory=Engine)
    expected: dict[str, list[Item]] = field(default_factory=dict)

    def create_stream(self, name: str, schema: dict[str, str] = PACKET, **options: Any) -> None:
        create_stream(self.stub, name, schema, **options)
        self.engine.create_stream(
            name,
            schema,
            "ts",
            options.get("punctuation", "explicit"),
            list(options.get("sources", ())),
            options.get("idle_timeout_s") or None,
        )

    def register(self, sql: str, name: str, late: str = "drop") -> str:
        register(self.stub, sql, name, late)
        self.engine.register_query(sql, name=name, late=late)
        self.expected[name] = []
        return name

    def ingest(self, stream: str, source: str, items: Sequence[Any]) -> pb.IngestResponse:
        response = ingest(self.stub, stream, source, items)
        for item in items:
            self.apply(stream, source, item)
        return response

    def reject(self, stream: str, source: str, items: Sequence[Any]) -> Failure:
        """An Ingest call whose last item must fail: the items before it stay applied, on the
        server as on the engine, which must raise the class the server names (raw bytes: only
        the server reads them)."""
        found = failure(ingest, self.stub, stream, source, items)
        for item in items[:-1]:
            self.apply(stream, source, item)
        if not isinstance(items[-1], bytes):
            try:
                self.apply(stream, source, items[-1])
            except LowtideError as exc:
                assert type(exc).__name__ == found.kind, (exc, found)
            else:
                raise AssertionError(f"the engine accepted what the server rejected: {found}")
        return found

    def apply(self, stream: str, source: str, item: Any) -> None:
        """One item to the engine only (what the server took in a call of its own)."""
        if isinstance(item, pa.Table):
            self.engine.push(stream, item, source=source)
        elif item == CLOSE:
            self.engine.close_source(stream, source)
        else:
            self.engine.punctuate(stream, int(item), source=source)

    def results(self, query: str) -> list[Item]:
        """Everything the engine emitted for ``query`` so far."""
        self.expected[query] += self.engine.poll(query)
        return self.expected[query]


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
