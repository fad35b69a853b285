"""What the server holds for subscribers and for retained results is bounded in bytes
(docs/design.md, "Bounded memory"), on a real server: a subscriber that stops reading ends with
RESOURCE_EXHAUSTED as soon as it is ``max_subscriber_bytes`` behind - not after its backlog - and
resumes from the offset the reason names; a reader beside it gets everything; the retention keeps
only ``retained_bytes`` of results.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import Server, running_server
from wire import CLOSE, Subscription, connect, create_stream, failure_of, ingest, register

from lowtide import END_OF_STREAM, Punctuation
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("bounded_memory")]

MIB = 1 << 20
LIMITS = {"max_subscriber_bytes": 2 * MIB, "retained_bytes": 16 * MIB, "retained_items": 100_000}
KEYS = 6_000  # result rows per window: a result table of 288 KB (6 columns), 40 of them 11.5 MB
WINDOWS = 40
SCHEMA = {"k": "int64", "v": "int64", "ts": "int64"}
_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(workers=1, config=LIMITS) as running:
        yield running


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


def feed(stub: object, stream: str, reader: Subscription) -> list[object]:
    """Every key once in each of ``WINDOWS`` unit windows, each closed by punctuation (one result
    table per window), the next sent once the reader has the one before: the reader never falls
    behind by more than a window, however slow the machine. Then the source closes; the reader's
    items up to the end of the stream."""
    keys = pa.array(np.arange(KEYS, dtype=np.int64))
    for w in range(WINDOWS):
        ingest(
            stub,
            stream,
            "p",
            [pa.table({"k": keys, "v": keys, "ts": pa.array(np.full(KEYS, w, np.int64))}), w + 1],
        )
        reader.until(w + 1)
    ingest(stub, stream, "p", [CLOSE])
    return reader.until(END_OF_STREAM)


def items_of(messages: list[pb.SubscribeResponse]) -> list[object]:
    return [
        pa.ipc.open_stream(m.arrow).read_all()
        if m.WhichOneof("item") == "arrow"
        else Punctuation(m.punctuation.value, m.punctuation.attribute)
        for m in messages
    ]


def until_the_end(call: Iterator[pb.SubscribeResponse]) -> list[pb.SubscribeResponse]:
    """The messages of a Subscribe call before its end-of-stream punctuation (then cancelled)."""
    messages = list(itertools.takewhile(lambda m: m.punctuation.value != END_OF_STREAM, call))
    call.cancel()  # type: ignore[attr-defined]
    return messages


def test_a_stalled_subscriber_ends_at_once_and_resumes_from_its_offset(server: Server) -> None:
    stub = connect(server.target)
    stream, query = fresh("stall"), fresh("stall_q")
    create_stream(stub, stream, SCHEMA)
    register(
        stub,
        f"SELECT k, sum(v) AS s, count(*) AS n [RANGE 1, SLIDE 1, WA ts] FROM {stream} GROUP BY k",
        query,
    )
    reader = Subscription(stub, query, from_oldest=True)
    # A raw call nobody reads until the end: the server's send waits on HTTP/2 flow control.
    # Without BDP probing the client's receive window stays at its initial size: what reaches it
    # before the server's send waits does not depend on timing.
    channel = grpc.insecure_channel(server.target, options=[("grpc.http2.bdp_probe", 0)])
    stalled = lowtide_pb2_grpc.LowtideStub(channel).Subscribe(
        pb.SubscribeRequest(query=query, from_oldest=True), timeout=60
    )
    everything = feed(stub, stream, reader)
    assert sum(isinstance(item, pa.Table) for item in everything) == WINDOWS

    received: list[pb.SubscribeResponse] = []
    with pytest.raises(grpc.RpcError) as caught:
        for message in stalled:
            received.append(message)
    channel.close()
    ended = failure_of(caught.value)
    assert (ended.code, ended.kind) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "ResourceExhausted"), ended
    assert "\n" not in ended.reason and f"max_subscriber_bytes ({2 * MIB} bytes)" in ended.reason, ended
    # At once: what was on its way when the limit passed, then the end - not the backlog.
    assert [m.offset for m in received] == list(range(len(received)))
    assert sum(len(m.arrow) for m in received) < LIMITS["max_subscriber_bytes"], len(received)
    assert ended.reason.endswith(f"resume with from_offset={len(received)}"), ended

    # It resumes there (still retained) and has every item once; the server serves on.
    rest = until_the_end(
        stub.Subscribe(pb.SubscribeRequest(query=query, from_offset=len(received)), timeout=60)
    )
    assert items_of(received + rest) == everything[:-1]
    assert stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING"


def test_the_retention_is_bounded_in_bytes(server: Server) -> None:
    stub = connect(server.target)
    stream, query = fresh("retain"), fresh("retain_q")
    create_stream(stub, stream, SCHEMA)
    # Wider rows (11 columns): 40 windows make 21 MB of results, more than retained_bytes (16 MiB).
    aggregates = "sum(v) AS s, count(*) AS n, min(v) AS lo, max(v) AS hi, avg(v) AS mean, sum(k) AS sk"
    register(stub, f"SELECT k, {aggregates} [RANGE 1, SLIDE 1, WA ts] FROM {stream} GROUP BY k", query)
    reader = Subscription(stub, query, from_oldest=True)
    everything = feed(stub, stream, reader)

    with pytest.raises(grpc.RpcError) as caught:
        next(stub.Subscribe(pb.SubscribeRequest(query=query, from_offset=0), timeout=30))
    ended = failure_of(caught.value)
    assert (ended.code, ended.kind) == (grpc.StatusCode.OUT_OF_RANGE, "OutOfRange"), ended
    oldest = int(ended.reason.split("the oldest is ")[1].split()[0])
    assert 0 < oldest < len(everything), ended  # evicted by bytes: retained_items is 100,000
    retained = until_the_end(stub.Subscribe(pb.SubscribeRequest(query=query, from_oldest=True), timeout=30))
    assert retained[0].offset == oldest
    assert items_of(retained) == everything[oldest:-1]
    assert sum(len(m.arrow) for m in retained) <= LIMITS["retained_bytes"]
