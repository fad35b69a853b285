"""The domain of a progressing attribute through a real server (issue 21, item 3): a batch with a
value outside ``[-2^62, 2^62)`` or a punctuation outside ``[-2^62, 2^62]`` is refused with
INVALID_ARGUMENT and a one-line reason, nothing of it applied, the server serving on; the
Python producer raises the same at once, with nothing sent; values at the domain's ends are
counted, and the end-of-stream value is published only once every source has closed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pyarrow as pa
import pytest

from lowtide import END_OF_STREAM, InvalidArgument, Punctuation, SchemaMismatch
from lowtide.clients import Client
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc

pytestmark = pytest.mark.integration

SCHEMA = {"k": "string", "ts": "int64"}
TIME_MIN, TIME_END = -(2**62), 2**62
WAIT = 30.0


def arrow(ts: list[int]) -> bytes:
    table = pa.table({"k": ["a"] * len(ts), "ts": pa.array(ts, pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def ingest(target: str, stream: str, source: str, *items: pb.IngestRequest) -> tuple[str, str]:
    """One raw Ingest call (no client-side checks): its status code and details."""
    with grpc.insecure_channel(target) as channel:
        stub = lowtide_pb2_grpc.LowtideStub(channel)
        try:
            stub.Ingest(iter([pb.IngestRequest(stream=stream, source=source), *items]), timeout=WAIT)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""  # type: ignore[attr-defined]
        return "OK", ""


def info(client: Client, stream: str) -> dict[str, Any]:
    return next(s for s in client.list_streams() if s["name"] == stream)


def read_until_end(client: Client, query: str) -> tuple[list[tuple[int, int]], list[int]]:
    """(window_start, n) of every row, and every punctuation, up to the end of the stream."""
    rows, marks = [], []
    with client.subscribe(query, from_oldest=True) as subscription:
        for item in subscription:
            if isinstance(item, Punctuation):
                marks.append(item.value)
                if item.value >= END_OF_STREAM:
                    return sorted(rows), marks
                continue
            rows += [(r["window_start"], r["n"]) for r in item.to_pylist()]
    raise AssertionError("the subscription ended early")


def test_values_and_punctuation_outside_the_domain_are_refused_and_the_rest_counted(
    target: str, fresh: Callable[[str], str]
) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA, sources=["a", "b"])
        query = client.register_query(
            f"SELECT count(*) AS n [RANGE 10, WA ts] FROM {stream}", name=fresh("q")
        )
        # One batch each: the WID operators size a batch's state by the windows it spans.
        batches = [pb.IngestRequest(arrow=arrow([t])) for t in (TIME_MIN, 5, TIME_END - 1)]
        assert ingest(target, stream, "a", *batches) == ("OK", "")
        for bad in (-(2**63), 2**63 - 7):
            code, reason = ingest(target, stream, "a", pb.IngestRequest(arrow=arrow([7, bad])))
            assert code == "INVALID_ARGUMENT", (code, reason)
            assert f"column 'ts' has {bad} at row 1, outside the domain" in reason and "\n" not in reason, (
                reason
            )
        for bad in (2**63 - 2, 2**63 - 1, TIME_END + 1, TIME_MIN - 1):
            code, reason = ingest(target, stream, "a", pb.IngestRequest(punctuation=bad))
            assert code == "INVALID_ARGUMENT" and f"punctuation {bad} of stream" in reason, (code, reason)
            assert "[-2^62, 2^62]" in reason and "\n" not in reason, reason
        assert info(client, stream)["tuples_ingested"] == 3  # nothing of the refused batches
        assert client.health()["status"] == "SERVING"
        # The top of the domain from both sources, b still open: every window is out, not the end.
        assert ingest(target, stream, "a", pb.IngestRequest(punctuation=TIME_END)) == ("OK", "")
        assert ingest(target, stream, "b", pb.IngestRequest(punctuation=TIME_END)) == ("OK", "")
        assert info(client, stream)["low_watermark"] == TIME_END
        with client.producer(stream, source="a") as producer:
            producer.close()
        with client.producer(stream, source="b") as producer:
            producer.close()
        rows, marks = read_until_end(client, query)
        assert rows == [(t // 10 * 10, 1) for t in (TIME_MIN, 5, TIME_END - 1)], rows
        assert marks[-1] == END_OF_STREAM and all(m < END_OF_STREAM for m in marks[:-1]), marks
        # While b was open: the end of the one window the top of the domain leaves open.
        assert marks[-2] == (TIME_END - 1) // 10 * 10 + 10, marks


def test_the_producer_refuses_what_the_domain_does_not_hold_before_sending(
    target: str, fresh: Callable[[str], str]
) -> None:
    stream = fresh("S")
    with Client(target, timeout=10) as client:
        client.create_stream(stream, SCHEMA)
        with client.producer(stream, linger_ms=0) as producer:
            producer.send({"k": ["a"], "ts": [1]})
            with pytest.raises(
                SchemaMismatch, match=r"column 'ts' has 9223372036854775801 at row 0, outside"
            ):
                producer.send({"k": ["a"], "ts": [2**63 - 7]})
            with pytest.raises(SchemaMismatch, match="outside the domain"):
                producer.send({"k": "a", "ts": -(2**63)})  # one row
            with pytest.raises(
                InvalidArgument, match=r"punctuation 9223372036854775806 .* \[-2\^62, 2\^62\]"
            ):
                producer.punctuate(2**63 - 2)
            producer.punctuate(TIME_END)
            producer.flush()
        assert info(client, stream)["tuples_ingested"] == 1
        assert info(client, stream)["source_punctuation"]["default"] == TIME_END
