"""Randomized faults against a ``--state-dir`` server: the guarantee where no other test walks.

Each scenario is drawn from a seed: a random schema (up to the column limit), wide aggregates and
several window kinds over it, timestamps at the ends of the event-time domain and far apart.
While one producer feeds it (batch ids, punctuation), ``kill -9`` hits a worker, the front or the
whole server at random rounds; the producer goes on after each, as a restarted producer does
(resending under its ids from where the server's acknowledgements stopped); a multi-part batch
whose call is cut short on the way changes nothing. Then random damage hits the state directory
(a flipped byte, a cut or a deletion of any file; a flipped byte in the log's last record, its
last segment cut where a record begins, a segment renamed) and the server starts again, perhaps
with limits lowered below what it accepted before (limits judge new input, not the log). The
outcome is always one of two:

* the start refuses, with one line naming a file of the state directory; or
* it starts, the producer sends everything again under the same ids and closes, and every
  query's rows equal the in-process engine's on the same data, each row exactly once, at
  contiguous offsets from 0.

``make test`` runs a fixed set of seeds; ``pytest tests/integration/test_faults.py --fault-runs N``
runs N (``--fault-seed S`` starts elsewhere).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest
from cluster import Cluster, retrying, rows
from server_harness import start_server
from state_files import record_starts

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine, Punctuation
from lowtide.clients import Client
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc
from lowtide.punctuation.model import TIME_END, TIME_MIN
from lowtide.schema import MAX_COLUMNS

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("durability")]

SOURCE = "src"
ROWS = 40  # per round
RETRY_FOR = 90.0  # seconds a producer or reader keeps trying through restarts


@dataclass(frozen=True)
class Scenario:
    seed: int
    schema: dict[str, str]
    queries: dict[str, str]
    base: int  # the first round's event times start here
    step: int  # event times of round i start at base + i * step
    spread: int  # ... and spread over this many units
    rounds: int
    kills: dict[int, str]  # round -> what to kill after it
    ending: str  # how the server goes before the damage: stop (SIGTERM) | kill (-9, everything)
    damage: str  # flip | cut | delete | none | flip-last | cut-at-record | rename
    limits: dict[str, int]  # the configuration's limits at the start after the damage
    cut_call: int  # the round after which a multi-part call is cut short (-1: none)


def draw(seed: int) -> Scenario:
    rng = random.Random(seed)
    width = rng.choice([3, 40, 300, MAX_COLUMNS - 2])  # value columns besides k and ts
    types = ["int64", "int32", "float64", "bool"]
    schema = {"k": rng.choice(["string", "int64"])}
    schema |= {f"c{i}": rng.choice(types) for i in range(width)}
    schema["ts"] = "int64"
    summed = [c for c, t in schema.items() if t in ("int64", "int32")]
    floats = [c for c, t in schema.items() if t == "float64"]
    d = rng.choice([1, 7, 1000, 2**40])
    wide = ", ".join(f"sum({c}) AS s_{c}" for c in summed[:1000]) or "count(*) AS n"
    templates = {
        "tumbling_wide": f"SELECT k, {wide} [RANGE {d}, SLIDE {d}, WA ts] FROM s GROUP BY k",
        "sliding": f"SELECT k, count(*) AS n, max({(floats or summed or ['ts'])[0]}) AS top "
        f"[RANGE {3 * d}, SLIDE {d}, WA ts] FROM s GROUP BY k",
        "session": f"SELECT k, count(*) AS n [SESSION {2 * d}, WA ts] FROM s GROUP BY k",
        "holistic": f"SELECT k, median(ts) AS mid [RANGE {2 * d}, SLIDE {2 * d}, WA ts] FROM s GROUP BY k",
        "ungrouped": f"SELECT count(*) AS n, min(ts) AS first [RANGE {d}, SLIDE {d}, WA ts] FROM s",
    }
    chosen = rng.sample(sorted(templates), rng.randint(2, len(templates)))
    rounds = rng.randint(8, 14)
    spread = rng.choice([3 * d, 2**60])  # 2^60: one batch spans a quarter of the domain
    step = rng.choice([d, 5 * d, 2**50])
    lowest, highest = TIME_MIN, TIME_END - rounds * step - spread
    base = rng.choice([lowest, highest, 0, 1_700_000_000_000, rng.randrange(lowest, highest)])
    kill_rounds = rng.sample(range(1, rounds - 1), 2)
    kills = {r: rng.choice(["worker", "front", "everything"]) for r in kill_rounds}
    return Scenario(
        seed,
        schema,
        {name: templates[name] for name in chosen},
        base,
        step,
        spread,
        rounds,
        kills,
        rng.choice(["stop", "kill"]),
        rng.choice(["flip", "cut", "delete", "none", "flip-last", "cut-at-record", "rename"]),
        # Below what the scenario used: 40-row batches, five key strings, three windows a tuple.
        rng.choice([{}, {"max_batch_rows": 10, "max_strings": 2, "max_windows_per_tuple": 2}]),
        rng.choice([-1, rng.randrange(rounds)]),
    )


def batch(scenario: Scenario, i: int) -> pa.Table:
    rng = np.random.default_rng([scenario.seed, i])
    ts = scenario.base + i * scenario.step + rng.integers(0, scenario.spread, ROWS)
    columns: dict[str, Any] = {}
    for name, kind in scenario.schema.items():
        if name == "ts":
            columns[name] = pa.array(ts, pa.int64())
        elif name == "k":
            keys = rng.integers(0, 5, ROWS)
            columns[name] = [f"k{v}" for v in keys] if kind == "string" else pa.array(keys, pa.int64())
        elif kind == "bool":
            columns[name] = pa.array(rng.integers(0, 2, ROWS).astype(bool))
        elif kind == "float64":
            columns[name] = pa.array(rng.integers(-1000, 1000, ROWS) / 4.0, pa.float64())
        else:
            columns[name] = pa.array(
                rng.integers(-1000, 1000, ROWS), pa.int64() if kind == "int64" else pa.int32()
            )
    return pa.table(columns)


def punctuation(scenario: Scenario, i: int) -> int:
    return scenario.base + i * scenario.step


def expected(scenario: Scenario) -> dict[str, Counter[tuple[Any, ...]]]:
    engine = Engine()
    engine.create_stream("s", scenario.schema, sources=[SOURCE])
    for name, sql in scenario.queries.items():
        engine.register_query(sql, name=name)
    for i in range(scenario.rounds):
        engine.push("s", batch(scenario, i), SOURCE)
        engine.punctuate("s", punctuation(scenario, i), SOURCE)
    engine.close_source("s", SOURCE)
    return {name: rows(engine.poll(name)) for name in scenario.queries}


def produce(cluster: Cluster, scenario: Scenario, rounds: range, close: bool) -> None:
    """Send ``rounds`` under their batch ids, punctuating above what the server recovered."""

    def run() -> None:
        with Client(cluster.target, timeout=30) as client:
            (stream,) = client.list_streams()
            last = stream["source_punctuation"].get(SOURCE, NO_PROGRESS)
            with client.producer("s", SOURCE, linger_ms=0) as producer:
                for i in rounds:
                    producer.send(batch(scenario, i), batch_id=i + 1)
                    if punctuation(scenario, i) > last:
                        producer.punctuate(punctuation(scenario, i))
                        last = punctuation(scenario, i)
                producer.flush()
                if close:
                    producer.close()

    retrying(run, time.monotonic() + RETRY_FOR)


def read_all(cluster: Cluster, query: str) -> list[tuple[int, Any]]:
    got: list[tuple[int, Any]] = []

    def run() -> None:
        got.clear()
        with Client(cluster.target, timeout=30) as client, client.subscribe(query, from_offset=0) as items:
            for item in items:
                assert items.offset is not None
                got.append((items.offset, item))
                if isinstance(item, Punctuation) and item.value == END_OF_STREAM:
                    return
        raise ConnectionError(f"{query} ended before the end of the stream")

    done = threading.Event()
    reader = threading.Thread(
        target=lambda: (retrying(run, time.monotonic() + RETRY_FOR), done.set()), daemon=True
    )
    reader.start()
    assert done.wait(RETRY_FOR + 10), f"{query} stopped at {got[-1] if got else 'nothing'}"
    return got


def damage(state_dir: Path, how: str, rng: random.Random) -> Path | None:
    """Damage one file of the state directory; the file, or None for ``none``."""
    segments = sorted((state_dir / "log").glob("*.seg"))
    if how in ("flip-last", "cut-at-record"):
        last = segments[-1]
        data = bytearray(last.read_bytes())
        starts = record_starts(bytes(data))
        if not starts:
            return None
        if how == "flip-last":
            data[rng.randrange(starts[-1], len(data))] ^= 1 << rng.randrange(8)
            last.write_bytes(bytes(data))
        else:
            last.write_bytes(bytes(data[: rng.choice(starts)]))
        return last
    if how == "rename":
        target = rng.choice(segments)
        taken = {int(p.stem) for p in segments}
        number = rng.choice(
            [
                n
                for n in (int(target.stem) - 1, int(target.stem) + 1, int(target.stem) + 2)
                if n >= 0 and n not in taken
            ]
        )
        target.rename(target.with_name(f"{number:020d}.seg"))
        return target
    files = sorted(p for p in state_dir.rglob("*") if p.is_file() and p.stat().st_size > 0)
    if how == "none" or not files:
        return None
    target = rng.choice(files)
    data = bytearray(target.read_bytes())
    if how == "flip":
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
    elif how == "cut":
        target.write_bytes(bytes(data[: rng.randrange(len(data))]))
    else:
        target.unlink()
    return target


def cut_call(cluster: Cluster, scenario: Scenario) -> None:
    """Two parts of a three-part batch, then the call ends: refused whole, nothing applied."""
    sink = pa.BufferOutputStream()
    table = batch(scenario, scenario.rounds + 1)  # rows no other batch holds
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    part = sink.getvalue().to_pybytes()
    requests = [
        pb.IngestRequest(stream="s", source=SOURCE, arrow=part, batch_id=10_000, batch_parts=3),
        pb.IngestRequest(arrow=part, batch_id=10_000, batch_parts=3),
    ]
    with grpc.insecure_channel(cluster.target) as channel, pytest.raises(grpc.RpcError) as cut:
        lowtide_pb2_grpc.LowtideStub(channel).Ingest(iter(requests), timeout=30)
    assert cut.value.code() == grpc.StatusCode.INVALID_ARGUMENT, cut.value


def refused(state_dir: Path, config: dict[str, Any], port: int) -> str | None:
    """Start on the damaged directory: None if it serves, else the line it refused with."""
    try:
        server = start_server(config=config, port=port)
    except RuntimeError as exc:
        return str(exc)
    server.stop()
    return None


def run(scenario: Scenario, state_dir: Path) -> None:
    cluster = Cluster(state_dir, checkpoint_interval_s=0.3)
    try:
        with Client(cluster.target, timeout=30) as client:
            client.create_stream("s", scenario.schema, sources=[SOURCE])
            for name, sql in scenario.queries.items():
                client.register_query(sql, name=name)
        done = 0

        def produce_through(last: int) -> None:  # rounds done..last, the cut call after its round
            nonlocal done
            if done <= scenario.cut_call <= last:
                produce(cluster, scenario, range(done, scenario.cut_call + 1), close=False)
                cut_call(cluster, scenario)
                done = scenario.cut_call + 1
            produce(cluster, scenario, range(done, last + 1), close=False)
            done = last + 1

        for at, what in sorted(scenario.kills.items()):
            produce_through(at)
            assert cluster.server is not None
            cluster.server.await_checkpoint()  # a recovery restores one, then replays the log after it
            cluster.kill(what)
        produce_through(scenario.rounds - 1)
        assert cluster.server is not None
        cluster.server.await_checkpoint()
        if scenario.ending == "kill":
            cluster.kill("worker")  # then the rest: a crash with a worker already gone
            cluster.kill("everything", restart=False)
        cluster.stop()
        rng = random.Random(scenario.seed)
        hit = damage(state_dir, scenario.damage, rng)
        cluster.config.update(scenario.limits)
        why = refused(state_dir, cluster.config, cluster.port)
        if why is not None:
            assert hit is not None, f"an undamaged state directory was refused: {why}"
            line = why.strip().splitlines()[-1]
            assert str(state_dir) in line, f"{scenario.damage} of {hit}: the refusal names no file: {why}"
            print(f"seed {scenario.seed}: {scenario.damage} of {hit} refused: {line}")
            return
        cluster.start()
        produce(cluster, scenario, range(scenario.rounds), close=True)
        want = expected(scenario)
        for name in scenario.queries:
            got = read_all(cluster, name)
            assert [offset for offset, _ in got] == list(range(len(got))), f"{name}: a gap or a repeat"
            assert rows([item for _, item in got]) == want[name], f"{name}: {scenario}, damaged {hit}"
        print(f"seed {scenario.seed}: {scenario.damage} of {hit}: every window once")
    finally:
        cluster.stop()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        first = metafunc.config.getoption("--fault-seed")
        metafunc.parametrize("seed", range(first, first + metafunc.config.getoption("--fault-runs")))


def test_faults_lose_nothing_acknowledged(seed: int, tmp_path: Path) -> None:
    run(draw(seed), tmp_path / "state")
