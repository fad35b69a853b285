"""What the ``lowtide`` command and the Python client say when something is wrong: one line that
names the problem in the user's terms (rows from 1, columns by name, the option that set a
timeout) and, for the client, a traceback of lowtide's error alone.

The client's errors are checked against a stand-in server on loopback that refuses each call the
way the real one does (a status code, the class in the ``lowtide-error`` trailing metadata).
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest

from lowtide.clients import AsyncClient, Client
from lowtide.clients.cli import build_parser, main
from lowtide.clients.cli.io import read_batches
from lowtide.clients.cli.timestamps import time_value
from lowtide.errors import AlreadyExists, DeadlineExceeded, LateTuple, LowtideError, NotFound
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.punctuation.model import NO_PROGRESS

SCHEMA = {"srcIP": "string", "len": "int32", "ts": "timestamp[ms]"}
SLOW_S = 3.0  # how long the stand-in takes to answer ListQueries: past any timeout used here


# -- files: rows from 1 after the header, columns by name ------------------------------------------
def _read_error(path: Path, header: bool = True) -> str:
    with pytest.raises(LowtideError) as refused:
        for _ in read_batches(str(path), SCHEMA, 1000, header=header):
            pass
    return str(refused.value)


def test_a_bad_csv_value_names_its_column_and_its_data_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("srcIP,len,ts\n10.0.0.1,sixty,1700000000000\n")
    assert _read_error(path) == f"cannot read {path}: row 1, column 'len': 'sixty' is not an int32"
    # The file's own column order, and a value that does not fit the type.
    path.write_text("ts,srcIP,len\n1,10.0.0.1,60\n2,10.0.0.2,99999999999\n")
    assert _read_error(path) == f"cannot read {path}: row 2, column 'len': '99999999999' is not an int32"
    # Without a header, rows count from the first line.
    path.write_text("10.0.0.1,60,1\n10.0.0.1,6.5,2\n")
    assert (
        _read_error(path, header=False) == f"cannot read {path}: row 2, column 'len': '6.5' is not an int32"
    )
    # A row of the wrong width: rows from 1 after the header too.
    path.write_text("srcIP,len,ts\n10.0.0.1,60,1\n10.0.0.1,60\n")
    assert "row 2: Expected 3 columns, got 2" in _read_error(path)


def test_a_bad_csv_value_in_a_later_block_names_its_row_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    rows = 400_000  # past the reader's first 4 MiB block
    path.write_text("srcIP,len,ts\n" + "10.0.0.1,60,1\n" * rows + "10.0.0.1,sixty,1\n")
    assert _read_error(path).endswith(f": row {rows + 1}, column 'len': 'sixty' is not an int32")


def test_a_jsonl_type_error_counts_rows_from_1_over_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"srcIP": "10.0.0.1", "len": "sixty", "ts": 1}) + "\n")
    assert _read_error(path) == f"cannot read {path}: row 1, column 'len': a JSON string is not an int32"
    line = json.dumps({"srcIP": "10.0.0.1", "len": 60, "ts": 1}) + "\n"
    rows = 200_000  # the bad row lies in the reader's second block, which counts its rows from 0
    path.write_text(line * rows + json.dumps({"srcIP": 7, "len": 60, "ts": 1}) + "\n")
    assert _read_error(path).endswith(f": row {rows + 1}, column 'srcIP': a JSON number is not a string")
    path.write_text(line + json.dumps({"srcIP": "10.0.0.1", "len": 60, "ts": "soon"}) + "\n")
    assert _read_error(path).endswith(
        ": row 2, column 'ts': a JSON string, where the rows before hold a number"
    )


# -- options: --punctuation, --timeout, --allowed-lateness -----------------------------------------
@pytest.mark.parametrize(
    ("unit", "text"),
    [
        ("ms", "2023-11-14T22:14:30"),
        ("ms", "2023-11-14 22:14:30.5Z"),
        ("s", "2023-11-14"),
        ("us", "2023-11-14T23:14:30.000001+01:00"),
        ("ns", "2023-11-14T22:14:30.123456789"),
    ],
)
def test_an_iso_punctuation_is_the_value_a_file_row_of_that_text_gets(
    tmp_path: Path, unit: str, text: str
) -> None:
    args = build_parser().parse_args(["send", "S", "f.csv", "--punctuation", text])
    assert args.punctuation == text
    path = tmp_path / "t.csv"
    path.write_text(f"ts\n{text}\n")
    table = next(iter(read_batches(str(path), {"ts": f"timestamp[{unit}]"}, 10)))
    assert time_value(text, unit) == table["ts"].cast(pa.int64())[0].as_py()


def test_punctuation_takes_none_end_an_integer_or_a_time(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    assert parse(["send", "S", "f.csv", "--punctuation", "end"]).punctuation == "end"
    assert parse(["send", "S", "f.csv", "--punctuation", "-5"]).punctuation == -5
    with pytest.raises(SystemExit) as usage:
        parse(["send", "S", "f.csv", "--punctuation", "soon"])
    assert usage.value.code == 2
    assert "expected none, end, an integer or an ISO 8601 time (2023-11-14T22:14:30), got 'soon'" in (
        capsys.readouterr().err
    )
    with pytest.raises(LowtideError, match=r"to the seconds at most, got '2023-11-14T22:14:30.5'"):
        time_value("2023-11-14T22:14:30.5", "s")


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_not_above_zero_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        build_parser().parse_args(["--timeout", text, "stream", "list"])
    assert usage.value.code == 2
    assert f"expected a number of seconds above 0, got {text!r}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("late", "fate"), [(None, "dropped (into <query>.late)"), ("error", "refused with their batch")]
)
def test_allowed_lateness_without_late_update_is_refused_before_any_call(
    late: str | None, fate: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No server listens at port 1: had the command called one, it would say so instead."""
    policy = ["--late", late] if late else []
    sql = "SELECT count(*) AS n [RANGE 10, WA ts] FROM S"
    code = main(["--server", "127.0.0.1:1", "query", "register", sql, "--allowed-lateness", "2s", *policy])
    assert code == 1
    assert capsys.readouterr().err == (
        f"lowtide: --allowed-lateness needs --late update (under --late {late or 'drop'} no window is "
        f"kept past its punctuation: late tuples are {fate}); add --late update, or leave "
        "--allowed-lateness out\n"
    )
    code = main(
        ["--server", "127.0.0.1:1", "query", "register", sql, "--allowed-lateness", "2s", "--late", "update"]
    )
    assert code == 1
    assert "no lowtide server is reachable at 127.0.0.1:1" in capsys.readouterr().err


# -- the client's errors: lowtide's alone, gRPC's kept as grpc_error -------------------------------
class Refusing(pb_grpc.LowtideServicer):  # type: ignore[misc]
    """A stand-in server: one stream S, and every other call refused as the real server does."""

    def ListStreams(self, request: Any, context: Any) -> Any:
        columns = [pb.Column(name="k", type="string"), pb.Column(name="ts", type="int64")]
        stream = pb.StreamInfo(
            name="S", schema=columns, progressing="ts", punctuation="explicit", low_watermark=NO_PROGRESS
        )
        return pb.ListStreamsResponse(streams=[stream])

    def CreateStream(self, request: Any, context: Any) -> Any:
        context.set_trailing_metadata((("lowtide-error", "AlreadyExists"),))
        context.abort(grpc.StatusCode.ALREADY_EXISTS, f"stream {request.name!r} already exists")

    def Subscribe(self, request: Any, context: Any) -> Any:
        context.set_trailing_metadata((("lowtide-error", "NotFound"),))
        context.abort(grpc.StatusCode.NOT_FOUND, f"unknown query {request.query!r}")

    def Ingest(self, request_iterator: Any, context: Any) -> Any:
        for _ in request_iterator:
            pass
        context.set_trailing_metadata((("lowtide-error", "LateTuple"),))
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "1 tuple is late for query 'q' (late='error')")

    def ListQueries(self, request: Any, context: Any) -> Any:
        time.sleep(SLOW_S)  # never in time: the caller's deadline passes first
        return pb.ListQueriesResponse()

    def Health(self, request: Any, context: Any) -> Any:  # a producer asks the message limit first
        return pb.HealthResponse(status="SERVING", workers=1, max_message_bytes=1 << 20)


@pytest.fixture(scope="module")
def refusing() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_LowtideServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def _only_lowtides(error: BaseException, kind: type[LowtideError], code: grpc.StatusCode) -> None:
    """``error`` is a ``kind`` raised ``from None``, holding the gRPC error of status ``code``."""
    assert isinstance(error, kind)
    assert error.__cause__ is None and error.__suppress_context__ is True
    grpc_error: Any = getattr(error, "grpc_error", None)
    assert isinstance(grpc_error, grpc.RpcError) and grpc_error.code() is code
    printed = "".join(traceback.format_exception(error))
    assert "_InactiveRpcError" not in printed and "During handling" not in printed
    assert "The above exception was the direct cause" not in printed


def test_a_client_error_is_lowtides_alone_with_the_grpc_error_kept(refusing: str) -> None:
    with Client(refusing, timeout=10) as client:
        with pytest.raises(AlreadyExists) as created:
            client.create_stream("S", {"k": "string", "ts": "int64"})
        _only_lowtides(created.value, AlreadyExists, grpc.StatusCode.ALREADY_EXISTS)
        with pytest.raises(NotFound) as subscribed, client.subscribe("q") as subscription:
            next(iter(subscription))
        _only_lowtides(subscribed.value, NotFound, grpc.StatusCode.NOT_FOUND)
        with pytest.raises(LateTuple) as sent, client.producer("S") as producer:
            producer.send({"k": ["a"], "ts": [1]})
            producer.flush()
        _only_lowtides(sent.value, LateTuple, grpc.StatusCode.INVALID_ARGUMENT)


def test_an_async_client_error_is_lowtides_alone_with_the_grpc_error_kept(refusing: str) -> None:
    async def calls() -> list[BaseException]:
        raised: list[BaseException] = []
        async with AsyncClient(refusing, timeout=10) as client:
            try:
                await client.create_stream("S", {"k": "string", "ts": "int64"})
            except LowtideError as exc:
                raised.append(exc)
            try:
                async with client.subscribe("q") as subscription:
                    await subscription.__anext__()
            except LowtideError as exc:
                raised.append(exc)
        return raised

    created, subscribed = asyncio.run(calls())
    _only_lowtides(created, AlreadyExists, grpc.StatusCode.ALREADY_EXISTS)
    _only_lowtides(subscribed, NotFound, grpc.StatusCode.NOT_FOUND)


def test_a_deadline_passed_is_a_sentence_naming_the_timeout(
    refusing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(refusing, timeout=0.3) as client, pytest.raises(DeadlineExceeded) as late:
        client.list_queries()
    _only_lowtides(late.value, DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert str(late.value) == (
        f"the server at {refusing} did not answer within 0.3 s (timeout): is it overloaded or stopped? "
        "A larger timeout waits longer"
    )
    assert main(["--server", refusing, "--timeout", "0.3", "query", "list"]) == 1
    assert capsys.readouterr().err == (
        f"lowtide: the server at {refusing} did not answer within 0.3 s (--timeout): is it overloaded or "
        "stopped? A larger --timeout waits longer\n"
    )
