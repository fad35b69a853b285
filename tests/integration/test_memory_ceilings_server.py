"""Memory with a ceiling per server, not per call (issue 30, items 4 and 6), on a real server whose
front's resident memory is read from ``/proc`` (its peak, ``VmHWM``, reset before each probe).

* Multi-part Ingest: the parts of batches not yet applied, summed over every call, stay within
  ``max_pending_bytes``; the part past it ends its call with RESOURCE_EXHAUSTED and one line,
  nothing of its batch applies, the call's bytes are given back however it ends, and the next
  batch goes through.
* Stalled subscribers on a large retained table: each holds one slice, and the subscriber whose
  slice would take the total past ``max_subscriber_bytes_total`` ends with RESOURCE_EXHAUSTED
  naming the offset to resume from; resuming there gives every row once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from server_harness import Server, running_server, scrape, wait_for
from wire import Failure, arrow_bytes, connect, create_stream, failure_of, register, streams

from lowtide import END_OF_STREAM
from lowtide.clients import Client
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("memory_ceilings_server")]

MIB = 1 << 20
SCHEMA = {"k": "int64", "v": "int64", "ts": "int64"}


def peak_reset(server: Server) -> int:
    """The front's resident MiB now; its peak (``VmHWM``) starts again from here."""
    Path(f"/proc/{server.pid}/clear_refs").write_text("5")
    return status_mib(server, "VmRSS")


def status_mib(server: Server, key: str) -> int:
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no {key} in /proc/{server.pid}/status")


def gauge(server: Server, name: str) -> float:
    return scrape(server)[f"lowtide_{name}"][()]


# -- multi-part Ingest ----------------------------------------------------------------------------
PENDING_LIMIT = 64 * MIB
PART_ROWS = 15 * MIB // 24  # a part of 15 MiB of Arrow (three int64 columns)


@pytest.fixture(scope="module")
def ingest_server() -> Iterator[Server]:
    with running_server(workers=1, config={"max_pending_bytes": PENDING_LIMIT}) as running:
        yield running


def part_bytes(first_row: int = 0) -> bytes:
    keys = np.arange(first_row, first_row + PART_ROWS, dtype=np.int64)
    return arrow_bytes(pa.table({"k": keys, "v": keys, "ts": keys % 100}))


def parts(
    stream: str, source: str, payload: bytes, batch_id: int, count: int, of: int
) -> Iterator[pb.IngestRequest]:
    yield pb.IngestRequest(stream=stream, source=source)
    for _ in range(count):
        yield pb.IngestRequest(arrow=payload, batch_id=batch_id, batch_parts=of)


def test_parts_past_max_pending_bytes_are_refused_whole_and_the_memory_stays_bounded(
    ingest_server: Server,
) -> None:
    stub = connect(ingest_server.target)
    create_stream(stub, "parts", SCHEMA)
    payload = part_bytes()
    before = peak_reset(ingest_server)
    # 40 parts of 15 MiB in four concurrent calls: each batch alone (150 MiB) is over the limit,
    # so each call is refused, whichever order the server takes their parts in.
    failures: list[Failure] = []

    def call(batch_id: int) -> None:
        try:
            stub.Ingest(parts("parts", f"p{batch_id}", payload, batch_id, 10, 10), timeout=120)
        except grpc.RpcError as error:
            failures.append(failure_of(error))

    threads = [threading.Thread(target=call, args=(batch_id,)) for batch_id in (1, 2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    grown = status_mib(ingest_server, "VmHWM") - before
    assert len(failures) == 4, failures
    for refused in failures:
        assert (refused.code, refused.kind) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "ResourceExhausted"), (
            refused
        )
        assert "\n" not in refused.reason and f"max_pending_bytes ({PENDING_LIMIT};" in refused.reason, (
            refused
        )
        assert (
            "nothing of it was applied: send smaller batches, or fewer multi-part batches" in refused.reason
        )
    # 600 MiB sent (the front grew 1.7 GiB holding them before the limit): now the limit, and
    # each call's message at hand in three copies (gRPC's buffer, the parsed message, its bytes),
    # its next one already read by gRPC while a loaded front is slow to take it, and as much
    # again of allocator slack: 544 MiB (measured: 230 to 290 alone, 435 once in a full run).
    bound = (PENDING_LIMIT + 4 * 8 * len(payload)) // MIB
    assert grown < bound, f"the front grew {grown} MiB (from {before} MiB) receiving refused parts"
    assert ingest_server.alive()
    wait_for("the refused calls' bytes given back", lambda: gauge(ingest_server, "pending_batch_bytes") == 0)
    assert streams(stub)["parts"].tuples_ingested == 0  # nothing of a refused batch applied

    # A batch of 45 MiB on another call fits only if every refused call gave its bytes back.
    response = stub.Ingest(parts("parts", "after", payload, 9, 3, 3), timeout=120)
    assert (response.batches, response.tuples) == (1, 3 * PART_ROWS)
    assert streams(stub)["parts"].tuples_ingested == 3 * PART_ROWS


def test_a_call_cancelled_before_its_last_part_gives_its_bytes_back(ingest_server: Server) -> None:
    stub = connect(ingest_server.target)
    create_stream(stub, "cancelled", SCHEMA)
    payload = part_bytes()
    stop = threading.Event()

    def two_of_three() -> Iterator[pb.IngestRequest]:
        yield from parts("cancelled", "p", payload, 1, 2, 3)
        stop.wait(60)  # the last part never comes: the client goes first

    call = stub.Ingest.future(two_of_three(), timeout=120)
    held = wait_for(
        "two parts held", lambda: (g := gauge(ingest_server, "pending_batch_bytes")) >= 2 * len(payload) and g
    )
    assert held < PENDING_LIMIT
    call.cancel()
    stop.set()
    wait_for(
        "the cancelled call's bytes given back", lambda: gauge(ingest_server, "pending_batch_bytes") == 0
    )
    assert streams(stub)["cancelled"].tuples_ingested == 0


# -- stalled subscribers ----------------------------------------------------------------------------
GROUPS = 500_000  # one window closing on them: a result table of 20 MB, over the message limit
MESSAGE_LIMIT = 2 * MIB
STALLED = 12


def stalled_call(target: str, query: str) -> tuple[grpc.Channel, grpc.Future]:
    """A Subscribe call nobody reads: without BDP probing the client's receive window stays at its
    initial size, so the server's send of a slice parks on flow control, holding that slice."""
    channel = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
    call = lowtide_pb2_grpc.LowtideStub(channel).Subscribe(
        pb.SubscribeRequest(query=query, from_oldest=True), timeout=120
    )
    return channel, call


def test_stalled_subscribers_hold_one_slice_each_within_the_total() -> None:
    # The first slice's size decides how many stalled subscribers fit: measured below.
    config = {"max_message_bytes": MESSAGE_LIMIT, "max_subscriber_bytes_total": 4 * MIB}
    with running_server(workers=1, config=config) as server, Client(server.target, timeout=60) as client:
        stub = connect(server.target)
        create_stream(stub, "wide", SCHEMA)
        register(stub, "SELECT k, count(*) AS n, sum(v) AS s [RANGE 10, WA ts] FROM wide GROUP BY k", "q")
        keys = np.arange(GROUPS, dtype=np.int64)
        with client.producer("wide", source="p", linger_ms=0, max_batch_rows=50_000) as producer:
            producer.send({"k": keys, "v": keys, "ts": keys % 10})
            producer.close()
        # A reader that keeps up: the whole table, and the size of its first slice.
        with client.subscribe("q", from_oldest=True) as reader:
            table = next(reader)
            assert isinstance(table, pa.Table) and table.num_rows == GROUPS
            offset = reader.offset
        probe = stub.Subscribe(pb.SubscribeRequest(query="q", from_oldest=True), timeout=60)
        first = next(probe)
        probe.cancel()
        assert first.more and first.offset == offset
        fit = 4 * MIB // first.ByteSize()  # the stalled subscribers the total holds at once
        assert 0 < fit < STALLED
        wait_for("the readers' slices given back", lambda: gauge(server, "subscriber_sending_bytes") == 0)

        before = peak_reset(server)
        calls = [stalled_call(server.target, "q") for _ in range(STALLED)]
        ends: list[Failure] = []
        ended = threading.Condition()

        def wait_end(call: grpc.Future) -> None:
            code = call.code()  # blocks until the call ends (its messages stay unread)
            kind = dict(call.trailing_metadata() or ()).get("lowtide-error", "")
            with ended:
                ends.append(Failure(code, call.details() or "", kind))
                ended.notify_all()

        for _, call in calls:
            threading.Thread(target=wait_end, args=(call,), daemon=True).start()
        with ended:
            assert ended.wait_for(lambda: len(ends) >= STALLED - fit, timeout=60), ends
            cut = list(ends)
        grown = status_mib(server, "VmHWM") - before
        assert len(cut) == STALLED - fit, cut  # the others still hold their slice
        for one in cut:
            assert (one.code, one.kind) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "ResourceExhausted"), one
            assert "\n" not in one.reason and f"max_subscriber_bytes_total ({4 * MIB} bytes)" in one.reason
            assert one.reason.endswith(f"resume with from_offset={offset}"), one
        # Each held one slice (the whole table serialized, about 50 MB each, before): measured 11 to 15 MiB.
        assert grown < 60, f"the front grew {grown} MiB (from {before} MiB) for {STALLED} stalled subscribers"
        assert gauge(server, "subscriber_sending_bytes") <= 4 * MIB

        # The stalled ones go; one that was cut resumes at the offset it was told: every row once.
        for channel, call in calls:
            call.cancel()
            channel.close()
        wait_for(
            "the stalled subscribers' slices given back",
            lambda: gauge(server, "subscriber_sending_bytes") == 0,
        )
        with client.subscribe("q", from_offset=offset) as resumed:
            again = next(resumed)
            assert isinstance(again, pa.Table) and resumed.offset == offset
            rest = list(resumed)
        assert sorted(again.column("k").to_pylist()) == list(range(GROUPS))
        assert again.column("n").to_pylist() == [1] * GROUPS
        assert rest[-1].value == END_OF_STREAM and not any(isinstance(item, pa.Table) for item in rest)
        assert stub.Health(pb.HealthRequest(), timeout=10).status == "SERVING"
