"""Staged batches against a real server: Stage, CommitStaged, AbortStaged (server/staged_calls.py).

A commit applies exactly the parts it names, once per batch id (again: ``duplicate``, nothing
applied; a Stage for an applied id too; a batch of no rows as well); its punctuation raises the
source's, never lowers it; every part is checked as it is staged, and a refused call stages
nothing; ``max_staged_bytes`` refuses in one line and the server and the parts staged before
stay; with ``--state-dir`` staged parts survive ``kill -9`` and a commit applies once across
restarts; a part not committed within ``staging_timeout_s`` goes, and the metrics count it.

Most tests share the session's server (names from ``fresh``); the limits, expiry and state
directory tests start servers of their own, grouped with tests/integration/test_durability.py.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from server_harness import Server, kill9, running_server, scrape, start_server, wait_for
from wire import failure_of

from lowtide import Punctuation
from lowtide.clients import Client
from lowtide.clients._wire import arrow_bytes
from lowtide.errors import InvalidArgument, NotFound, ResourceExhausted, SchemaMismatch
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("durability")]

SCHEMA = {"k": "string", "v": "int64", "ts": "int64"}
SUM = "SELECT k, count(*) AS n, sum(v) AS total [RANGE 10, SLIDE 10, WA ts] FROM {} GROUP BY k"
SOURCE = "spark"
WAIT = 60.0  # seconds: the longest a subscription may take to deliver what it waits for


def part(keys: list[str], values: list[int], ts: list[int]) -> pa.Table:
    return pa.table(
        {"k": keys, "v": pa.array(values, pa.int64()), "ts": pa.array(ts, pa.int64())},
    )


# Three parts of one batch: 3, 5 and 2 rows.
P0 = part(["a", "b", "a"], [1, 2, 3], [1, 2, 3])
P1 = part(["a"] * 5, [10] * 5, [4, 5, 6, 7, 8])
P2 = part(["c", "b"], [100, 200], [11, 12])
# What SUM gives for P0 and P2 (window_start, k) -> (n, total): P1 left out.
P0_P2 = {(0, "a"): (2, 4), (0, "b"): (1, 2), (10, "b"): (1, 200), (10, "c"): (1, 100)}


def stream_info(client: Client, stream: str) -> dict[str, Any]:
    return next(s for s in client.list_streams() if s["name"] == stream)


def ingested(client: Client, stream: str) -> int:
    return int(stream_info(client, stream)["tuples_ingested"])


def results(client: Client, query: str, until: int) -> dict[tuple[int, str], tuple[int, int]]:
    """``(window_start, k) -> (n, total)`` of every result of ``query`` before its first
    punctuation at or past ``until``; fails (never hangs) after WAIT seconds."""
    found: dict[tuple[int, str], tuple[int, int]] = {}
    with client.subscribe(query) as subscription:
        watchdog = threading.Timer(WAIT, subscription.cancel)
        watchdog.start()
        try:
            for item in subscription:
                if isinstance(item, Punctuation):
                    if item.value >= until:
                        return found
                    continue
                for row in item.to_pylist():
                    key = (row["window_start"], row["k"])
                    assert key not in found, f"{key} twice in {query}'s results"
                    found[key] = (row["n"], row["total"])
        finally:
            watchdog.cancel()
    raise AssertionError(f"{query} gave no punctuation at or past {until} within {WAIT} s: {found}")


def metrics(server: Server) -> dict[str, float]:
    """The server's unlabelled samples, by name (a counter's as ``<name>_total``)."""
    return {name: samples[()] for name, samples in scrape(server).items() if () in samples}


def staged_metric(server: Server, **expected: float) -> Callable[[], bool]:
    """A probe: the staged metrics (``parts``, ``bytes``, ``parts_expired_total``) say ``expected``
    (scrapes read a snapshot the server refreshes every second)."""
    return lambda: all(metrics(server)[f"lowtide_staged_{name}"] == value for name, value in expected.items())


def one_line(error: BaseException) -> str:
    reason = str(error)
    assert reason.strip() and "\n" not in reason, repr(reason)
    return reason


def new_stream(client: Client, fresh: Callable[[str], str]) -> tuple[str, str]:
    stream, query = fresh("staged"), fresh("staged_q")
    client.create_stream(stream, SCHEMA)
    client.register_query(SUM.format(stream), name=query)
    return stream, query


# -- commits ----------------------------------------------------------------------------------------
def test_a_commit_applies_exactly_the_named_parts_once(target: str, fresh: Callable[[str], str]) -> None:
    with Client(target, timeout=30) as client:
        stream, query = new_stream(client, fresh)
        for name, table in (("p0", P0), ("p1", P1), ("p2", P2)):
            staged = client.stage(stream, 1, name, table, source=SOURCE)
            assert staged == {"tuples": table.num_rows, "duplicate": False}, name
        assert ingested(client, stream) == 0  # staged is not applied

        # A commit naming a part that was never staged applies nothing and keeps the parts.
        with pytest.raises(NotFound) as missing:
            client.commit_staged(stream, 1, ["p0", "p9"], source=SOURCE)
        assert "'p9'" in one_line(missing.value) and "nothing of the batch was applied" in str(missing.value)
        assert ingested(client, stream) == 0

        done = client.commit_staged(stream, 1, ["p2", "p0"], source=SOURCE, punctuation=100)
        assert done == {"tuples": 5, "duplicate": False, "low_watermark": 100}
        assert ingested(client, stream) == 5
        assert results(client, query, until=100) == P0_P2  # P1's rows are not there
        assert client.abort_staged(stream, 1, source=SOURCE) == 0  # P1 went with the commit

        # The commit again (its answer lost, say): acknowledged, nothing applied twice.
        again = client.commit_staged(stream, 1, ["p2", "p0"], source=SOURCE)
        assert again == {"tuples": 0, "duplicate": True, "low_watermark": 100}
        assert client.commit_staged(stream, 1, ["p1"], source=SOURCE)["duplicate"] is True
        # A task of the applied batch run again: nothing is staged.
        assert client.stage(stream, 1, "p1", P1, source=SOURCE) == {"tuples": 0, "duplicate": True}
        assert client.abort_staged(stream, 1, source=SOURCE) == 0
        assert ingested(client, stream) == 5

        # The same id under another source is another batch.
        assert client.stage(stream, 1, "p0", P2, source="other")["duplicate"] is False
        assert client.commit_staged(stream, 1, ["p0"], source="other")["tuples"] == 2
        assert ingested(client, stream) == 7


def test_a_commit_of_no_rows_applies_its_id_once(target: str, fresh: Callable[[str], str]) -> None:
    """A micro-batch of empty partitions stages parts of no rows: its commit still applies the
    id, so the commit retried (its answer lost) is acknowledged, not refused for parts gone."""
    with Client(target, timeout=30) as client:
        stream, _ = new_stream(client, fresh)
        assert client.stage(stream, 1, "p0", P0.slice(0, 0), source=SOURCE) == {
            "tuples": 0,
            "duplicate": False,
        }
        done = client.commit_staged(stream, 1, ["p0"], source=SOURCE, punctuation=50)
        assert done == {"tuples": 0, "duplicate": False, "low_watermark": 50}
        again = client.commit_staged(stream, 1, ["p0"], source=SOURCE)
        assert again == {"tuples": 0, "duplicate": True, "low_watermark": 50}
        assert client.stage(stream, 1, "p0", P0, source=SOURCE) == {"tuples": 0, "duplicate": True}
        # A commit naming no part holds no row either.
        assert client.commit_staged(stream, 2, [], source=SOURCE)["duplicate"] is False
        assert client.commit_staged(stream, 2, [], source=SOURCE)["duplicate"] is True
        assert ingested(client, stream) == 0


def test_a_part_staged_again_replaces_the_first(target: str, fresh: Callable[[str], str]) -> None:
    """A task run again stages its part under the same name: the commit applies the last."""
    with Client(target, timeout=30) as client:
        stream, query = new_stream(client, fresh)
        client.stage(stream, 1, "p0", P1, source=SOURCE)
        client.stage(stream, 1, "p0", P0, source=SOURCE, max_part_rows=1)  # three messages
        assert client.commit_staged(stream, 1, ["p0"], source=SOURCE, punctuation=10)["tuples"] == 3
        assert results(client, query, until=10) == {(0, "a"): (2, 4), (0, "b"): (1, 2)}


def test_an_aborted_batch_applies_nothing(target: str, fresh: Callable[[str], str]) -> None:
    with Client(target, timeout=30) as client:
        stream, _ = new_stream(client, fresh)
        client.stage(stream, 3, "p0", P0, source=SOURCE)
        client.stage(stream, 3, "p1", P1, source=SOURCE)
        client.stage(stream, 4, "p0", P2, source=SOURCE)
        assert client.abort_staged(stream, 3, source=SOURCE) == 2
        with pytest.raises(NotFound, match="'p0'"):
            client.commit_staged(stream, 3, ["p0"], source=SOURCE)
        assert ingested(client, stream) == 0
        assert client.commit_staged(stream, 4, ["p0"], source=SOURCE)["tuples"] == 2  # batch 4 stayed


def test_a_commits_punctuation_raises_the_sources_never_lowers_it(
    target: str, fresh: Callable[[str], str]
) -> None:
    with Client(target, timeout=30) as client:
        stream, _ = new_stream(client, fresh)

        def held() -> int:
            return int(stream_info(client, stream)["source_punctuation"][SOURCE])

        client.stage(stream, 1, "p0", part(["a"], [1], [10]), source=SOURCE)
        assert client.commit_staged(stream, 1, ["p0"], source=SOURCE, punctuation=50)["low_watermark"] == 50
        assert held() == 50
        client.stage(stream, 2, "p0", part(["a"], [1], [60]), source=SOURCE)
        lower = client.commit_staged(stream, 2, ["p0"], source=SOURCE, punctuation=20)  # no error
        assert (lower["tuples"], lower["low_watermark"], held()) == (1, 50, 50)
        assert client.commit_staged(stream, 2, ["p0"], source=SOURCE, punctuation=50)["duplicate"] is True
        assert held() == 50
        # A commit without parts moves the punctuation only (a micro-batch without rows).
        assert client.commit_staged(stream, 3, [], source=SOURCE, punctuation=80)["tuples"] == 0
        assert held() == 80
        # A repeated commit (its answer was lost) still raises it.
        assert client.commit_staged(stream, 2, ["p0"], source=SOURCE, punctuation=90)["duplicate"] is True
        assert held() == 90
        assert ingested(client, stream) == 2


# -- what a part must be ----------------------------------------------------------------------------
def test_a_part_of_the_wrong_schema_is_refused_and_stages_nothing(
    target: str, fresh: Callable[[str], str]
) -> None:
    with Client(target, timeout=30) as client:
        stream, _ = new_stream(client, fresh)
        client.stage(stream, 1, "p0", P0, source=SOURCE)
        wrong = pa.table({"k": ["a"], "v": pa.array([1], pa.int64()), "ts": ["not a time"]})
        for name in ("p0", "p1"):  # over a part staged before, and a new one
            with pytest.raises(SchemaMismatch) as refused:
                client.stage(stream, 1, name, wrong, source=SOURCE)
            assert "'ts'" in one_line(refused.value), refused.value
        # Refused at its second message, after one that passed: that one is not kept either.
        messages = [
            pb.StageRequest(stream=stream, source=SOURCE, batch_id=1, part="p2"),
            pb.StageRequest(arrow=arrow_bytes([P2])),
            pb.StageRequest(arrow=arrow_bytes([wrong])),
            pb.StageRequest(last=True),
        ]
        with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as raised:
            pb_grpc.LowtideStub(channel).Stage(iter(messages), timeout=30)
        assert failure_of(raised.value).kind == "SchemaMismatch", failure_of(raised.value)
        with pytest.raises(NotFound, match="'p1'"):
            client.commit_staged(stream, 1, ["p0", "p1"], source=SOURCE)
        with pytest.raises(NotFound, match="'p2'"):
            client.commit_staged(stream, 1, ["p0", "p2"], source=SOURCE)
        assert client.commit_staged(stream, 1, ["p0"], source=SOURCE)["tuples"] == 3  # p0 as first staged
        assert ingested(client, stream) == 3


def test_batch_ids_part_names_and_streams_are_checked(target: str, fresh: Callable[[str], str]) -> None:
    with Client(target, timeout=30) as client:
        stream, _ = new_stream(client, fresh)
        client.stage(stream, 1, "p0", P0, source=SOURCE)
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("Stage", lambda: client.stage(stream, 0, "p0", P0, source=SOURCE)),
            ("CommitStaged", lambda: client.commit_staged(stream, 0, ["p0"], source=SOURCE)),
            ("AbortStaged", lambda: client.abort_staged(stream, 0, source=SOURCE)),
        ]
        for call, send in calls:
            with pytest.raises(InvalidArgument) as refused:
                send()
            assert "batch_id of 1 or more" in one_line(refused.value), (call, refused.value)
        for name in ("", "x" * 257, "a\x00b"):
            with pytest.raises(InvalidArgument, match="1 to 256 bytes"):
                client.stage(stream, 1, name, P1, source=SOURCE)
            with pytest.raises(InvalidArgument, match="1 to 256 bytes"):
                client.commit_staged(stream, 1, ["p0", name], source=SOURCE)
        assert client.stage(stream, 1, "x" * 256, P2, source=SOURCE)["tuples"] == 2  # the longest name
        with pytest.raises(InvalidArgument) as twice:
            client.commit_staged(stream, 1, ["p0", "x" * 256, "p0"], source=SOURCE)
        assert "names a part twice" in one_line(twice.value)
        for send in (
            lambda: client.stage(fresh("nope"), 1, "p0", P0, source=SOURCE),
            lambda: client.commit_staged(fresh("nope"), 1, ["p0"], source=SOURCE),
            lambda: client.abort_staged(fresh("nope"), 1, source=SOURCE),
        ):
            with pytest.raises(NotFound) as unknown:
                send()
            assert "unknown stream" in one_line(unknown.value)
        assert ingested(client, stream) == 0  # nothing of it was applied
        assert client.commit_staged(stream, 1, ["p0", "x" * 256], source=SOURCE)["tuples"] == 5


# -- limits and expiry: servers of their own ------------------------------------------------------
def test_max_staged_bytes_refuses_in_one_line_and_keeps_what_was_staged() -> None:
    size = len(arrow_bytes([P0]))  # one message: the client sends P0 whole
    big = part(["k"] * 200, list(range(200)), list(range(200)))
    tenths = sum(len(arrow_bytes([big.slice(at, 10)])) for at in range(0, 30, 10))  # 3 messages of 10 rows
    limit = 2 * size + tenths
    assert len(arrow_bytes([big])) > tenths
    with (
        running_server(workers=1, config={"max_staged_bytes": limit}) as server,
        Client(server.target, timeout=30) as client,
    ):
        client.create_stream("s", SCHEMA)
        client.stage("s", 1, "p0", P0, source=SOURCE)
        client.stage("s", 1, "p1", P0, source=SOURCE)
        with pytest.raises(ResourceExhausted) as full:
            client.stage("s", 1, "p2", big, source=SOURCE)
        reason = one_line(full.value)
        assert f"max_staged_bytes ({limit})" in reason and f"{2 * size} bytes are staged" in reason
        # Messages of 10 rows: the first three fit, up to the limit; the fourth does not, and
        # the bytes of those before it go too.
        with pytest.raises(ResourceExhausted):
            client.stage("s", 2, "p0", big, source=SOURCE, max_part_rows=10)
        wait_for(
            "2 parts of P0's bytes staged",
            staged_metric(server, parts=2, bytes=2 * size),
            diagnostics=lambda: str(metrics(server)),
        )
        assert server.alive() and client.health()["status"] == "SERVING"
        with pytest.raises(NotFound, match="'p0'"):
            client.commit_staged("s", 2, ["p0"], source=SOURCE)
        assert client.commit_staged("s", 1, ["p0", "p1"], source=SOURCE)["tuples"] == 6
        wait_for("nothing staged", staged_metric(server, parts=0, bytes=0), diagnostics=server.stderr_tail)
        # All the room is back: parts up to the limit exactly fit.
        client.stage("s", 3, "p0", P0, source=SOURCE)
        client.stage("s", 3, "p1", P0, source=SOURCE)
        client.stage("s", 3, "p2", big.slice(0, 30), source=SOURCE, max_part_rows=10)
        assert client.commit_staged("s", 3, ["p0", "p1", "p2"], source=SOURCE)["tuples"] == 36
        assert ingested(client, "s") == 42


def test_a_part_not_committed_within_staging_timeout_goes() -> None:
    with (
        running_server(workers=1, config={"staging_timeout_s": 1.0}) as server,
        Client(server.target, timeout=30) as client,
    ):
        client.create_stream("s", SCHEMA)
        client.stage("s", 1, "p0", P0, source=SOURCE)
        wait_for(
            "the staged part to expire",
            staged_metric(server, parts=0, bytes=0, parts_expired_total=1),
            diagnostics=lambda: f"{metrics(server)}\n{server.stderr_tail()}",
        )
        with pytest.raises(NotFound) as gone:
            client.commit_staged("s", 1, ["p0"], source=SOURCE)
        assert "staging_timeout_s (1 s)" in one_line(gone.value)
        assert ingested(client, "s") == 0
        assert "1 staged parts dropped: not committed within staging_timeout_s" in server.stderr.read_text()


# -- kill -9 and restarts ---------------------------------------------------------------------------
def test_staged_parts_survive_kill_9_and_a_commit_applies_once(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    staging = state_dir / "staging"
    config = {"state_dir": str(state_dir)}

    first = start_server(workers=1, config=config)
    with Client(first.target, timeout=30) as client:
        client.create_stream("s", SCHEMA)
        client.register_query(SUM.format("s"), name="q")
        client.stage("s", 1, "p0", P0, source=SOURCE)
        client.stage("s", 1, "p2", P2, source=SOURCE)
    assert len(list(staging.glob("*.part"))) == 2  # acknowledged: in files
    kill9(first)
    copies = tmp_path / "staged-before-the-commit"
    shutil.copytree(staging, copies)

    second = start_server(workers=1, config=config)
    with Client(second.target, timeout=30) as client:
        assert client.commit_staged("s", 1, ["p0", "p2"], source=SOURCE, punctuation=100) == {
            "tuples": 5,
            "duplicate": False,
            "low_watermark": 100,
        }
        assert results(client, "q", until=100) == P0_P2
        client.stage("s", 2, "p0", P0.slice(0, 0), source=SOURCE)  # a batch of no rows
        assert client.commit_staged("s", 2, ["p0"], source=SOURCE)["duplicate"] is False
    assert list(staging.iterdir()) == []  # the commit removed their files
    kill9(second)
    # As if the server had died between logging the batch and removing the parts' files.
    for path in copies.iterdir():
        shutil.copy2(path, staging / path.name)

    with running_server(workers=1, config=config) as third, Client(third.target, timeout=30) as client:
        assert list(staging.iterdir()) == []  # the start removed the files of an applied batch
        assert ingested(client, "s") == 5
        assert client.commit_staged("s", 1, ["p0", "p2"], source=SOURCE) == {
            "tuples": 0,
            "duplicate": True,
            "low_watermark": 100,
        }
        assert client.stage("s", 1, "p1", P1, source=SOURCE) == {"tuples": 0, "duplicate": True}
        assert client.commit_staged("s", 2, ["p0"], source=SOURCE)["duplicate"] is True  # its id came back
        assert results(client, "q", until=100) == P0_P2
        assert ingested(client, "s") == 5
