"""``--state-dir``: what was acknowledged survives ``kill -9`` and a restart, exactly once
(docs/design.md, "Durability").

Each test runs real servers on one state directory: it feeds them through the client, kills the
front and its workers with SIGKILL, starts a new server on the same directory and checks what
came back against the in-process engine fed the same data once. Tests that damage the same
state each damage a copy of it, made once for the module.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cluster import rows
from prometheus_client.parser import text_string_to_metric_families
from server_harness import Server, descendants, kill9, lowtide_command, running_server, start_server
from state_files import files, frame_starts, record_starts

from lowtide import END_OF_STREAM, Engine, Punctuation
from lowtide.clients import Client
from lowtide.errors import OutOfRange, ResourceExhausted
from lowtide.server.input_log import (
    CreateStreamRecord,
    DropQueryRecord,
    InputLog,
    Record,
    RefusedRecord,
    TickRecord,
)

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("durability")]

KEYS = [f"k{i}" for i in range(8)]
SCHEMA = {"k": "string", "v": "int64", "ts": "int64"}
TUMBLING = "SELECT k, count(*) AS n, sum(v) AS total [RANGE 10, SLIDE 10, WA ts] FROM s GROUP BY k"
SLIDING = "SELECT k, count(*) AS n [RANGE 30, SLIDE 10, WA ts] FROM s GROUP BY k"
ROUNDS = 16  # batches per source; round i holds ts in [10 i, 10 i + 20) and punctuates 10 i


def batch(source: str, i: int) -> pa.Table:
    rng = random.Random(f"{source}{i}")
    ts = [10 * i + rng.randrange(20) for _ in range(40)]
    return pa.table(
        {
            "k": [rng.choice(KEYS) for _ in ts],
            "v": pa.array([rng.randrange(100) for _ in ts], pa.int64()),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def expected(sql: str) -> Counter[tuple[Any, ...]]:
    """Every row the query gives fed each batch once, in-process."""
    engine = Engine()
    engine.create_stream("s", SCHEMA, sources=["a", "b"])
    engine.register_query(sql, name="q")
    for i in range(ROUNDS):
        for source in ("a", "b"):
            engine.push("s", batch(source, i), source)
            engine.punctuate("s", 10 * i, source)
    for source in ("a", "b"):
        engine.close_source("s", source)
    return rows([item for item in engine.poll("q")])


def read(client: Client, query: str, until: int, from_offset: int | None = None) -> list[tuple[int, Any]]:
    """``(offset, item)`` of ``query`` from ``from_offset`` (else the oldest) up to the first
    punctuation at or past ``until``."""
    got: list[tuple[int, Any]] = []
    done = threading.Event()

    def run() -> None:
        with client.subscribe(query, from_offset=from_offset) as subscription:
            for item in subscription:
                assert subscription.offset is not None
                got.append((subscription.offset, item))
                if isinstance(item, Punctuation) and item.value >= until:
                    break
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(60), f"{query} stopped at {got[-1] if got else 'nothing'}, waiting for {until}"
    return got


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


def copied(prepared: Path, state_dir: Path) -> Path:
    """``state_dir``, a copy of a state directory a module fixture prepared once for the tests
    that each damage it their own way (a start reads nothing outside its state directory)."""
    shutil.copytree(prepared, state_dir)
    return state_dir


def config(state_dir: Path, **extra: Any) -> dict[str, Any]:
    """Checkpoints every 0.3 s: restarts restore one and replay the log after it."""
    return {"state_dir": str(state_dir), "retained_items": 100_000, "checkpoint_interval_s": 0.3, **extra}


@contextlib.contextmanager
def server_on(state_dir: Path, **extra: Any) -> Iterator[tuple[Server, Client]]:
    with (
        running_server(config=config(state_dir, **extra)) as server,
        Client(server.target, timeout=30) as client,
    ):
        yield server, client


def feed(client: Client, rounds: range, batch_ids: bool = True) -> None:
    """Rounds of both sources, each batch under its id (round + 1), each round punctuated.

    As a producer that restarts does (docs/design.md, "Durability"): it resends its batches under
    the same ids and punctuates only above its source's recovered punctuation.
    """
    (stream,) = [s for s in client.list_streams() if s["name"] == "s"]
    recovered = stream["source_punctuation"]
    with client.producer("s", "a") as a, client.producer("s", "b") as b:
        for i in rounds:
            for source, producer in (("a", a), ("b", b)):
                producer.send(batch(source, i), batch_id=i + 1 if batch_ids else None)
                if 10 * i > recovered.get(source, -1):
                    producer.punctuate(10 * i)
        a.flush()
        b.flush()


def finish(client: Client) -> None:
    for source in ("a", "b"):
        with client.producer("s", source) as producer:
            producer.close()


def test_a_killed_server_comes_back_with_everything_it_acknowledged(state_dir: Path) -> None:
    server = start_server(config=config(state_dir))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        client.register_query(SLIDING, name="sliding")
        feed(client, range(8))
        before = read(client, "tumbling", until=60)
    kill9(server)

    with server_on(state_dir) as (_, client):
        (stream,) = client.list_streams()
        assert stream["source_punctuation"] == {"a": 70, "b": 70}
        assert stream["tuples_ingested"] == 8 * 2 * 40
        assert sorted(q["name"] for q in client.list_queries()) == ["sliding", "tumbling"]
        # The same offsets name the same rows as before the crash.
        again = dict(read(client, "tumbling", until=60, from_offset=0))
        for offset, item in before:
            assert rows([again[offset]]) == rows([item]), f"offset {offset} changed"
        # The producers start over from their first batch: what was applied is applied once.
        feed(client, range(ROUNDS))
        finish(client)
        resumed = read(client, "tumbling", until=END_OF_STREAM, from_offset=before[-1][0] + 1)
        assert rows([item for _, item in before + resumed]) == expected(TUMBLING)
        sliding = read(client, "sliding", until=END_OF_STREAM, from_offset=0)
        assert rows([item for _, item in sliding]) == expected(SLIDING)
        assert [offset for offset, _ in sliding] == list(range(len(sliding)))


def test_a_killed_worker_is_restored_and_its_queries_go_on(state_dir: Path) -> None:
    """kill -9 of one worker: every worker restarts from the last checkpoint plus the log; the
    queries go on (no ABORTED), and a subscriber sees no gap and no duplicate."""
    with server_on(state_dir) as (server, client):
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        client.register_query(SLIDING, name="sliding")
        live: list[tuple[int, Any]] = []
        subscriber = threading.Thread(
            target=lambda: live.extend(read(client, "tumbling", until=END_OF_STREAM)), daemon=True
        )
        subscriber.start()
        feed(client, range(8))
        server.await_checkpoint()  # the recovery restores it, then replays the log after it
        os.kill(server.worker_pids()[0], signal.SIGKILL)
        feed(client, range(8, 12))
        os.kill(server.worker_pids()[-1], signal.SIGKILL)
        feed(client, range(ROUNDS))
        finish(client)
        subscriber.join(60)
        assert rows([item for _, item in live]) == expected(TUMBLING)
        assert [offset for offset, _ in live] == list(range(len(live)))
        sliding = read(client, "sliding", until=END_OF_STREAM, from_offset=0)
        assert rows([item for _, item in sliding]) == expected(SLIDING)


def test_fsync_always_survives_the_same_way(state_dir: Path) -> None:
    """fsync = "always", and no checkpoint: the restart replays the whole log."""
    server = start_server(config=config(state_dir, fsync="always", checkpoint_interval_s=0))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        feed(client, range(6))
    kill9(server)
    with server_on(state_dir, fsync="always", checkpoint_interval_s=0) as (_, client):
        feed(client, range(ROUNDS))
        finish(client)
        got = read(client, "tumbling", until=END_OF_STREAM, from_offset=0)
        assert rows([item for _, item in got]) == expected(TUMBLING)


def fed_and_killed(state_dir: Path, **extra: Any) -> Path:
    """A server fed three rounds of stream ``s``, then killed; its log's one segment."""
    server = start_server(config=config(state_dir, **extra))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        feed(client, range(3))
    kill9(server)
    (segment,) = sorted((state_dir / "log").glob("*.seg"))
    return segment


def test_a_torn_last_record_is_dropped_and_damage_stops_the_start(state_dir: Path) -> None:
    segment = fed_and_killed(state_dir)
    whole = segment.read_bytes()
    segment.write_bytes(whole + b"\x40\x00\x00\x00torn")  # a frame cut short by the crash
    with server_on(state_dir) as (server, client):
        assert client.list_streams()[0]["tuples_ingested"] == 3 * 2 * 40
        dropped = f"lowtide: dropped a torn last record (never acknowledged): 8 bytes at the end of {segment}"
        assert dropped in server.stderr_tail()
    assert segment.read_bytes()[: len(whole)] == whole
    damaged = bytearray(segment.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # inside an acknowledged record
    segment.write_bytes(bytes(damaged))
    with pytest.raises(RuntimeError, match=f"the input log is damaged at byte [0-9]+ of {segment}"):
        start_server(config=config(state_dir))


def serve_refuses(state_dir: Path) -> str:
    """``lowtide serve`` on ``state_dir`` fails at once (exit 1, no ready line), leaving every file
    and directory of ``state_dir`` as it was; returns its one line on stderr."""
    before = files(state_dir)
    command = [*lowtide_command(), "serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1"]
    done = subprocess.run(
        [*command, "--workers", "2", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert files(state_dir) == before
    return lines[0]


@pytest.fixture(scope="module")
def killed_after_a_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory: a server fed eight rounds, checkpointed after them, then killed. An
    interrupted checkpoint is left beside the whole one: only a start that has recovered may
    remove it."""
    state_dir = tmp_path_factory.mktemp("killed_after_a_checkpoint") / "state"
    server = start_server(config=config(state_dir))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        feed(client, range(8))
        server.await_checkpoint()
    kill9(server)
    (state_dir / "checkpoints" / f"{2**63:020d}").mkdir()
    return state_dir


def segment_and_manifest(state_dir: Path) -> tuple[Path, Path]:
    """The log's one segment and the newest checkpoint's manifest."""
    (segment,) = sorted((state_dir / "log").glob("*.seg"))
    manifests = sorted((state_dir / "checkpoints").glob("*/MANIFEST.json"))
    return segment, manifests[-1]


def test_a_damaged_length_mid_log_stops_the_start_and_changes_nothing(
    state_dir: Path, killed_after_a_checkpoint: Path
) -> None:
    """The high byte of a record's length flipped in the middle of the last segment: it now runs
    past the end of the file, as a torn write's would, but the whole records after it prove it
    damage. Before, the start cut them off and started without a word."""
    segment, _ = segment_and_manifest(copied(killed_after_a_checkpoint, state_dir))
    data = bytearray(segment.read_bytes())
    starts = record_starts(bytes(data))
    at, following = starts[len(starts) // 2], starts[len(starts) // 2 + 1]
    data[at + 3] ^= 0x01
    segment.write_bytes(bytes(data))
    assert serve_refuses(state_dir) == (
        f"lowtide: the input log is damaged at byte {at} of {segment}: whole records follow it from byte "
        f"{following} (lowtide serve --truncate-log-tail drops it and what follows, on your word)"
    )


def test_a_log_cut_short_or_deleted_stops_the_start_and_changes_nothing(
    state_dir: Path, killed_after_a_checkpoint: Path
) -> None:
    """Cut in the middle, the log looks torn; the newest manifest says how far it reached (fsynced
    before the manifest was written). Before, the start went on from the checkpoint silently."""
    segment, manifest = segment_and_manifest(copied(killed_after_a_checkpoint, state_dir))
    seq = json.loads(manifest.read_text())["seq"]
    data = segment.read_bytes()
    segment.write_bytes(data[: record_starts(data)[seq // 2] + 5])  # inside record seq // 2
    line = serve_refuses(state_dir)
    covered = json.loads(manifest.read_text())["log"]
    assert line == (
        f"lowtide: the input log ends at record {seq // 2} in {segment}, but {manifest} was written when "
        f"it held {covered['records']} records, through byte {covered['bytes']} of {segment}: a segment is "
        "missing or cut short"
    )
    segment.unlink()
    no_segment = f"lowtide: the input log {segment.parent} holds no segment (a log always holds one)"
    assert serve_refuses(state_dir) == no_segment
    (segment.parent / "end").unlink()
    segment.parent.rmdir()
    assert serve_refuses(state_dir) == f"lowtide: the input log {segment.parent} is missing"


def test_one_server_per_state_directory_and_format_checked(state_dir: Path) -> None:
    with server_on(state_dir), pytest.raises(RuntimeError, match="is in use by another lowtide server"):
        start_server(config=config(state_dir))
    marker = state_dir / "lowtide-state.json"
    marker.write_text('{"format": 99, "version": "9.0.0"}')
    with pytest.raises(RuntimeError, match=r"holds state of format 99 .* reads format 1"):
        start_server(config=config(state_dir))


def test_a_full_disk_refuses_the_batch_and_loses_nothing(state_dir: Path) -> None:
    server = start_server(config=config(state_dir))
    acknowledged = 0
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        # No file of the front may grow past 200 kB more: the log's disk is full from there.
        (segment,) = (state_dir / "log").glob("*.seg")
        limit = segment.stat().st_size + 200_000
        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (limit, limit))
        with pytest.raises(ResourceExhausted, match="state directory is full"):
            for i in range(1000):
                with client.producer("s", "a") as producer:
                    producer.send(batch("a", i), batch_id=i + 1)
                acknowledged += 40
        assert client.list_streams()[0]["tuples_ingested"] == acknowledged  # still serving
    server.stop()
    with server_on(state_dir) as (_, client):
        assert client.list_streams()[0]["tuples_ingested"] == acknowledged


def test_an_offset_no_longer_retained_is_out_of_range(state_dir: Path) -> None:
    with server_on(state_dir, retained_items=4) as (_, client):
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        feed(client, range(8))
        read(client, "tumbling", until=70)  # the results of round 7 reached the hub: 0 is evicted
        with pytest.raises(OutOfRange, match="offset 0 is no longer retained"):
            next(iter(client.subscribe("tumbling", from_offset=0)))


@pytest.fixture(scope="module")
def checkpointed_every_two_rounds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory: a server fed eight rounds, a checkpoint after every second, then killed."""
    state_dir = tmp_path_factory.mktemp("checkpointed_every_two_rounds") / "state"
    server = start_server(config=config(state_dir))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        for first in range(0, 8, 2):  # checkpoints in between
            feed(client, range(first, first + 2))
            server.await_checkpoint()
    kill9(server)
    return state_dir


@pytest.mark.parametrize(
    "damage", ["a worker's file cut short", "the manifest's seq changed", "the manifest's workers changed"]
)
def test_a_damaged_checkpoint_falls_back_to_the_one_before(
    state_dir: Path, checkpointed_every_two_rounds: Path, damage: str
) -> None:
    """A damaged digit of the manifest's seq still parses: before, the log replayed from the
    position it named, and windows came out twice (found by test_faults, seed 2). One of its
    workers count advised ``--workers 3``, and a start with it printed IndexError tracebacks."""
    copied(checkpointed_every_two_rounds, state_dir)
    # The newest whole one (a later one the kill interrupted has no manifest and is ignored);
    # the one before it stays whole.
    newest = max(path for path in (state_dir / "checkpoints").iterdir() if (path / "MANIFEST.json").exists())
    if damage.startswith("a worker's"):
        damaged = newest / "worker-0.state"
        damaged.write_bytes(damaged.read_bytes()[:-10])
    elif damage.endswith("seq changed"):
        manifest = newest / "MANIFEST.json"
        text = manifest.read_text()
        seq = json.loads(text)["seq"]
        assert f'"seq": {seq},' in text
        manifest.write_text(text.replace(f'"seq": {seq},', f'"seq": {seq - 1},'))
    else:
        manifest = newest / "MANIFEST.json"
        text = manifest.read_text()
        assert '"workers": 2,' in text
        manifest.write_text(text.replace('"workers": 2,', '"workers": 3,'))
        with pytest.raises(RuntimeError) as refusal:
            start_server(workers=3, config=config(state_dir))
        assert "Traceback" not in str(refusal.value) and "Error:" not in str(refusal.value)
        assert f"checkpoint {newest} is damaged ({manifest} fails its CRC); falling back" in str(
            refusal.value
        )
        assert "was taken with 2 workers; start with --workers 2" in str(refusal.value)
    with server_on(state_dir) as (server, client):
        assert f"checkpoint {newest} is damaged" in server.stderr_tail()
        feed(client, range(ROUNDS))
        finish(client)
        got = read(client, "tumbling", until=END_OF_STREAM, from_offset=0)
        assert rows([item for _, item in got]) == expected(TUMBLING)
    for checkpoint in (state_dir / "checkpoints").iterdir():
        if not (checkpoint / "MANIFEST.json").exists():
            continue  # one a kill interrupted: it may lack front.state, and no start reads it
        front = checkpoint / "front.state"
        front.write_bytes(b"\0" * len(front.read_bytes()))
    with pytest.raises(
        RuntimeError,
        match=r"no whole checkpoint left: .*(front\.state does not match its manifest|fails its CRC)",
    ):
        start_server(config=config(state_dir))


def test_checkpoints_are_reported_and_their_files_match_the_manifest(state_dir: Path) -> None:
    """A worker's file is written by a forked child; the manifest records the size and CRC-32
    it reported, the server says so on stderr and in its metrics."""
    with server_on(state_dir) as (server, client):
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(TUMBLING, name="tumbling")
        feed(client, range(4))
        server.await_checkpoint()
        assert server.metrics_url is not None
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
        taken = {s.name: s.value for s in families["lowtide_checkpoint_seconds"].samples}
        assert taken["lowtide_checkpoint_seconds_count"] >= 1
        pauses = {s.name: s.value for s in families["lowtide_checkpoint_pause_seconds"].samples}
        assert pauses["lowtide_checkpoint_pause_seconds_count"] >= 2  # one per worker
        assert families["lowtide_checkpoint_bytes"].samples[0].value > 0
    written = [path for path in (state_dir / "checkpoints").iterdir() if (path / "MANIFEST.json").exists()]
    assert written
    for checkpoint in written:
        manifest = json.loads((checkpoint / "MANIFEST.json").read_text())
        for name, entry in manifest["files"].items():
            data = (checkpoint / name).read_bytes()
            assert (len(data), zlib.crc32(data)) == (entry["bytes"], entry["crc32"]), name


EARLY = (
    "SELECT k, count(*) AS n, sum(v) AS total [RANGE 10, SLIDE 10, WA ts, EMIT EVERY 20 ms] FROM s GROUP BY k"
)


def final_rows(found: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """The rows with ``final = true`` (the last column of an EMIT query)."""
    return Counter({row: n for row, n in found.items() if row[-1] is True})


def test_early_results_fire_again_alike_after_a_kill(state_dir: Path) -> None:
    """EMIT EVERY fires on logged ticks: after kill -9 the same offsets name the same rows,
    partial rows too, and each window's final row comes exactly once."""
    server = start_server(config=config(state_dir))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(EARLY, name="early")
        for i in range(8):
            feed(client, range(i, i + 1))
            time.sleep(0.06)  # paced on purpose: EMIT EVERY 20 ms fires on wall time between rounds
        before = read(client, "early", until=60)
    kill9(server)
    partial = rows([item for _, item in before]) - final_rows(rows([item for _, item in before]))
    assert partial, "no partial rows before the kill: the test would not test them"

    with server_on(state_dir) as (_, client):
        again = dict(read(client, "early", until=60, from_offset=0))
        for offset, item in before:
            assert rows([again[offset]]) == rows([item]), f"offset {offset} changed"
        feed(client, range(ROUNDS))
        finish(client)
        resumed = read(client, "early", until=END_OF_STREAM, from_offset=before[-1][0] + 1)
        assert [offset for offset, _ in before + resumed] == list(range(len(before) + len(resumed)))
        assert final_rows(rows([item for _, item in before + resumed])) == final_rows(expected(EARLY))


def test_early_results_go_on_alike_when_a_worker_dies(state_dir: Path) -> None:
    """kill -9 of a worker under an EMIT query: the recovery replays the logged ticks, so the
    live subscriber's offsets stay contiguous and each final row comes once."""
    with server_on(state_dir) as (server, client):
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.register_query(EARLY, name="early")
        live: list[tuple[int, Any]] = []
        subscriber = threading.Thread(
            target=lambda: live.extend(read(client, "early", until=END_OF_STREAM)), daemon=True
        )
        subscriber.start()
        for i in range(ROUNDS):
            if i == 6:
                server.await_checkpoint()
                os.kill(server.worker_pids()[0], signal.SIGKILL)
            feed(client, range(i, i + 1))
            time.sleep(0.05)  # paced on purpose: EMIT EVERY 20 ms fires on wall time between rounds
        finish(client)
        subscriber.join(60)
        assert [offset for offset, _ in live] == list(range(len(live)))
        assert final_rows(rows([item for _, item in live])) == final_rows(expected(EARLY))


def _mapped_segments(pid: int) -> set[str]:
    """The shared-memory files a process has mapped (its channels' rings)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1] for line in maps.splitlines() if " /dev/shm/" in line}


def test_a_start_removes_the_rings_a_killed_server_left(state_dir: Path) -> None:
    """kill -9 of the whole process tree (front, fork server, workers, multiprocessing's resource tracker)
    leaves no process to unlink the channels' shared memory: the next start does it."""
    first = start_server(config=config(state_dir))
    left = _mapped_segments(first.pid)
    assert len(left) == 2 * first.workers  # one ring each way per worker
    for pid in [first.pid, *descendants(first.pid)]:
        os.kill(pid, signal.SIGKILL)
    first.process.wait(30)
    first.exit_code = 0  # killed on purpose
    with server_on(state_dir) as (server, _):
        assert not {path for path in left if Path(path).exists()}
        assert len(_mapped_segments(server.pid)) == 2 * server.workers


# Each below today's use: 40-row batches, two streams (three with the harness's warm-up), two
# queries, a sliding window of three windows a tuple.
LOWERED = {"max_batch_rows": 10, "max_streams": 1, "max_queries": 1, "max_windows_per_tuple": 2}


def test_a_restart_with_lowered_limits_keeps_everything_acknowledged(state_dir: Path) -> None:
    """Limits judge new input, not the log. Before, replay dropped what today's limits refused
    (125 acknowledged tuples became 0, a query and a stream vanished) and the next checkpoint
    made it permanent."""
    server = start_server(config=config(state_dir, checkpoint_interval_s=0))  # the whole log replays
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        client.create_stream("t", SCHEMA)
        client.register_query(TUMBLING, name="tumbling")
        client.register_query(SLIDING, name="sliding")
        feed(client, range(6))
    kill9(server)
    lowered = start_server(config=config(state_dir, **LOWERED), warm_up=False)
    with Client(lowered.target, timeout=30) as client:
        assert {s["name"]: s["tuples_ingested"] for s in client.list_streams()} == {"s": 6 * 2 * 40, "t": 0}
        assert sorted(q["name"] for q in client.list_queries()) == ["sliding", "tumbling"]
        with pytest.raises(ResourceExhausted, match="at most 1 streams"):  # new input: today's limits
            client.create_stream("u", SCHEMA)
        lowered.await_checkpoint()  # taken under the lowered limits, it holds everything too
    lowered.stop()
    with server_on(state_dir) as (_, client):
        feed(client, range(ROUNDS))
        finish(client)
        for name, sql in (("tumbling", TUMBLING), ("sliding", SLIDING)):
            got = read(client, name, until=END_OF_STREAM, from_offset=0)
            assert rows([item for _, item in got]) == expected(sql), name


def appended(state_dir: Path, *logged: Record) -> list[int]:
    """Append records to a stopped server's log, as if it had logged them; their numbers."""
    log = InputLog(state_dir / "log")
    list(log.replay())
    log.recovered()
    seqs = [log.append(record) for record in logged]
    log.close()
    return seqs


def test_a_record_that_no_longer_applies_stops_the_start_and_a_refused_one_is_passed_over(
    state_dir: Path,
) -> None:
    """Replay no longer swallows errors: a logged record that fails is damage, unless a
    ``RefusedRecord`` says it failed live (then it is passed over, even where it would apply now), or
    it is the log's last (a crash came before its ``RefusedRecord``)."""
    with server_on(state_dir, checkpoint_interval_s=0) as (_, client):
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        feed(client, range(2))
    (ghost,) = appended(
        state_dir, CreateStreamRecord(time.time(), "ghost", SCHEMA, "ts", "explicit", [], None)
    )
    appended(state_dir, RefusedRecord(time.time(), ghost, "stream 'ghost' already exists"))
    (last,) = appended(state_dir, DropQueryRecord(time.time(), "nope"))
    with server_on(state_dir) as (_, client):
        assert [s["name"] for s in client.list_streams()] == ["s"]  # ghost failed live: passed over
    bad, _ = appended(state_dir, DropQueryRecord(time.time(), "nope"), TickRecord(time.time()))
    segment = sorted((state_dir / "log").glob("*.seg"))[-1]
    assert last < bad
    assert serve_refuses(state_dir).startswith(
        f"lowtide: record {bad} of the input log (drop_query, in {segment}) applied when it was logged "
        "but fails now: unknown query 'nope'"
    )


def test_a_damaged_last_record_stops_the_start_until_the_operator_gives_it_up(state_dir: Path) -> None:
    """One flipped byte in the last record, an acknowledged batch: before, the start cut it off
    as a torn write and 40 acknowledged tuples were gone with the evidence."""
    server = start_server(config=config(state_dir, checkpoint_interval_s=0))
    with Client(server.target, timeout=30) as client:
        client.create_stream("s", SCHEMA, sources=["a", "b"])
        feed(client, range(2))
        with client.producer("s", "a") as producer:
            producer.send(batch("a", 2), batch_id=3)
    kill9(server)
    (segment,) = sorted((state_dir / "log").glob("*.seg"))
    data = bytearray(segment.read_bytes())
    at = record_starts(bytes(data))[-1]
    data[len(data) - 100] ^= 0x04  # inside its Arrow bytes
    segment.write_bytes(bytes(data))
    line = serve_refuses(state_dir)
    assert line.startswith(f"lowtide: the last record of {segment}, at byte {at}, fails its CRC")
    assert line.endswith("(lowtide serve --truncate-log-tail drops it and what follows, on your word)")
    server = start_server("--truncate-log-tail", config=config(state_dir))
    try:
        said = (
            f"lowtide: --truncate-log-tail: gave up 1 acknowledged record(s) at the end of the input log "
            f"({len(data) - at} bytes cut from {segment})"
        )
        assert said in server.stderr_tail()
        with Client(server.target, timeout=30) as client:
            assert client.list_streams()[0]["tuples_ingested"] == 2 * 2 * 40
    finally:
        server.stop()


def test_a_log_cut_at_a_record_boundary_stops_the_start(state_dir: Path) -> None:
    """Without checkpoints nothing but the log's end file vouches for its length: before, a last
    segment cut to nothing started silently, empty."""
    segment = fed_and_killed(state_dir, checkpoint_interval_s=0)
    data = segment.read_bytes()
    segment.write_bytes(data[: frame_starts(data)[1]])  # all but the frame that opens it
    line = serve_refuses(state_dir)
    assert line.startswith(
        f"lowtide: the input log ends at record 0 in {segment}, but {state_dir / 'log' / 'end'} says"
    )
    assert "acknowledged records are missing" in line
