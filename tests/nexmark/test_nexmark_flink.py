"""Nexmark with Flink as the oracle: each query as the nexmark project writes it, over the same
events (nexmark's generator model, out of order within the bound both sides' watermark keeps),
run by lowtide through a real server with two workers and by PyFlink (bench/nexmark/
flink_oracle.py, in its own interpreter, .venv-pyflink); their rows compared as multisets. Each
side answers every query in one go: one server, one PyFlink process (tests/nexmark/
flink_batch.py: the JVM starts once), and the module is one xdist group, so that happens once.

``make test`` runs the QUICK queries on a small event count; ``make nexmark`` (NEXMARK_ALL=1)
runs every query both can, on more events (NEXMARK_EVENTS=n: on n). The rows compare by the
rules of bench/nexmark/nexmark_compare.py, which bench/nexmark.py follows too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nexmark as nx
import nexmark_compare as compare
import pytest
from server_harness import descendants, rows_until_end, running_server

from lowtide.clients import nexmark as generator
from lowtide.clients.client import Client

pytestmark = [pytest.mark.nexmark, pytest.mark.integration, pytest.mark.xdist_group("nexmark")]

FLINK_PYTHON, ORACLE = compare.FLINK_PYTHON, compare.ORACLE
BATCH = Path(__file__).with_name("flink_batch.py")
EVERY = os.environ.get("NEXMARK_ALL") == "1"
QUICK = (5, 8)  # windowed: a HOP join, a window join (each a JVM beside the other tests: few)
QUERIES = compare.BOTH if EVERY else QUICK
EVENTS = {
    "events": int(os.environ.get("NEXMARK_EVENTS", 200_000 if EVERY else 20_000)),
    "rate": 2_000,
    "seed": 11,
    "disorder_ms": 1_500,
    "base_ms": nx.BASE,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, generator.Events]]:
    if not FLINK_PYTHON.exists():
        pytest.fail(f"{FLINK_PYTHON} is missing: `make pyflink` makes it (make test does)")
    folder = tmp_path_factory.mktemp("nexmark")
    events = generator.generate(**EVENTS)
    generator.write_parquet(events, folder)
    yield folder, events


@pytest.fixture(scope="module")
def lowtide(data: tuple[Path, generator.Events]) -> dict[int, tuple[list[str], Counter[tuple[Any, ...]]]]:
    """Every query's columns and rows from one server: the queries registered, then the events sent."""
    _, events = data
    got: dict[int, tuple[list[str], Counter[tuple[Any, ...]]]] = {}
    with running_server(workers=2) as server, Client(server.target, timeout=120) as client:
        for name, schema in nx.SCHEMAS.items():
            client.create_stream(name, schema, progressing="dateTime")
        for n in QUERIES:
            client.register_query(nx.query(n), name=f"q{n}")
        producers = {name: client.producer(name) for name in nx.SCHEMAS}
        for stream, table, punctuation in generator.batches(events, 5_000):
            producers[stream].send(table)
            for producer in producers.values():
                producer.punctuate(punctuation)
        for producer in producers.values():
            producer.close()
        columns = {q["name"]: q["columns"] for q in client.list_queries()}
        for n in QUERIES:
            selected = compare.lowtide_columns(columns[f"q{n}"])
            got[n] = selected, compare.lowtide_rows(n, selected, rows_until_end(client, f"q{n}"))
    return got


@pytest.fixture(scope="module")
def flink(data: tuple[Path, generator.Events], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every query's answer from one PyFlink process at parallelism 2: the folder of its
    ``qN.jsonl`` (or ``qN.error``, what failed)."""
    out = tmp_path_factory.mktemp("flink")
    done = subprocess.run(
        [
            *(str(FLINK_PYTHON), str(BATCH), "--data", str(data[0]), "--out", str(out)),
            *("--parallelism", "2", "--watermark-ms", str(EVENTS["disorder_ms"])),
            *(str(compare.QUERIES / f"q{n}.sql") for n in QUERIES),
        ],
        capture_output=True,
        text=True,
        timeout=900 * len(QUERIES),
    )
    assert done.returncode == 0, f"PyFlink failed: {done.stderr[-3000:]}"
    return out


def flink_rows(out: Path, number: int, columns: list[str]) -> Counter[tuple[Any, ...]]:
    """Flink's rows of query ``number`` from the ``flink`` fixture's folder, as compared with
    lowtide's rows of ``columns`` (bench/nexmark/nexmark_compare.py's flink_rows reads them so)."""
    failed = out / f"q{number}.error"
    if failed.exists():
        raise RuntimeError(f"Flink failed on q{number}: {failed.read_text(encoding='utf-8')[-3000:]}")
    text = (out / f"q{number}.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line]
    return Counter(compare.compared(number, columns, [compare.value(v) for v in r.values()]) for r in rows)


@pytest.mark.parametrize("number", QUERIES)
def test_lowtide_gives_flinks_rows(
    number: int, lowtide: dict[int, tuple[list[str], Counter[tuple[Any, ...]]]], flink: Path
) -> None:
    columns, ours = lowtide[number]
    theirs = flink_rows(flink, number, columns)
    assert sum(theirs.values()) > 0, "the events make the query answer something"
    assert ours == theirs


# ---- Flink listens on loopback only ---------------------------------------------------------------
def _listening(pids: set[int]) -> set[str]:
    """The addresses the TCP sockets of ``pids`` listen on (/proc/net/tcp, tcp6: state 0A)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue  # gone, or not ours to read
    addresses = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                raw = bytes.fromhex(fields[1].split(":")[0])
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # host order
                addresses.add(socket.inet_ntop(family, words))
    return addresses


@pytest.mark.skipif(not EVERY, reason="runs in make nexmark (NEXMARK_ALL=1): one more JVM")
def test_flink_listens_on_loopback_only(data: tuple[Path, generator.Events], tmp_path: Path) -> None:
    """Every socket the oracle's processes (Python, the JVM it starts) listen on, polled while a
    query runs, is on 127.0.0.1 (or ::1, or 127.0.0.1 mapped into IPv6)."""
    command = [str(FLINK_PYTHON), str(ORACLE), "--data", str(data[0]), "--query", str(nx.QUERIES / "q8.sql")]
    process = subprocess.Popen(
        [*command, "--out", str(tmp_path / "q8.jsonl"), "--watermark-ms", str(EVENTS["disorder_ms"])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: set[str] = set()
    while True:  # a look at the listeners, then up to 0.2 s for the oracle to end
        seen |= _listening({process.pid, *descendants(process.pid)})
        try:
            process.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            continue
    assert process.returncode == 0
    assert seen, "no listener seen: the poll must find the JVM's"
    assert seen <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}, f"listening off loopback: {seen}"
