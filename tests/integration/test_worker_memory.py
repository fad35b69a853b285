"""What the workers hold is what their queries need, and the state of all queries has a ceiling
(issue 30, item 7), on real servers whose workers' resident memory is read from ``/proc``:

* the string pool stays at the front: half a million short strings leave each worker's memory
  where it was (it used to take a copy of the pool: about 150 bytes a string, in every worker);
* a small query costs the state it holds: two hundred of them, each grouping a thousand keys
  spread over 65,000 values, take a few MiB a worker (each used to take a 512 KiB index);
* past ``max_state_bytes_total`` the query whose state grows fails with RESOURCE_EXHAUSTED and a
  one-line reason; the query beside it goes on with the in-process engine's results.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from server_harness import Server, running_server, scrape, wait_for
from wire import (
    CLOSE,
    Mirror,
    Subscription,
    assert_same,
    connect,
    create_stream,
    ingest,
    packets,
    register,
    table,
)

pytestmark = pytest.mark.integration

MIB = 1 << 20
MINUTE = 60_000
T0 = 1_700_000_000_000 // MINUTE * MINUTE
STRINGS = 500_000
QUERIES = 200
STATE_TOTAL = 200_000


def resident(pid: int) -> int:
    """Bytes ``pid`` has resident without the pages of files and shared memory (the channels'
    segments): what it allocated itself."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def pool_entries(server: Server) -> dict[str, float]:
    samples = scrape(server).get("lowtide_string_pool_entries", {})
    return {dict(labels)["process"]: value for labels, value in samples.items()}


def test_workers_hold_no_copy_of_the_string_pool() -> None:
    with running_server(workers=2) as server:
        stub = connect(server.target)
        create_stream(stub, "S", {"k": "string", "ts": "int64"})
        register(stub, "SELECT count(*) AS n [RANGE 10, WA ts] FROM S WHERE k != 'none'", "q")
        reader = Subscription(stub, "q")
        ingest(stub, "S", "p", [pa.table({"k": ["warm"], "ts": pa.array([0], pa.int64())})])
        workers = server.worker_pids()
        before = [resident(pid) for pid in workers]
        for chunk in range(STRINGS // 100_000):  # short strings, each new: 16 characters
            keys = [f"host-{chunk}-{i:09d}" for i in range(100_000)]
            ingest(stub, "S", "p", [pa.table({"k": keys, "ts": pa.array(np.full(100_000, chunk, np.int64))})])
        ingest(stub, "S", "p", [10])
        reader.until(10)  # the workers have taken every batch
        grown = [resident(pid) - b for pid, b in zip(workers, before, strict=True)]
        # The sizes are scraped from a copy the front makes every second.
        entries = wait_for(
            "the front's pool", lambda: (e := pool_entries(server)).get("front", 0) > STRINGS and e
        )
        assert entries["worker 0"] == entries["worker 1"] == 1, entries  # the literal 'none'
        assert max(grown) < 25 * MIB, [g // MIB for g in grown]  # a copy of the pool: 70 MiB each


def test_small_queries_cost_the_state_they_hold() -> None:
    with running_server(workers=2) as server:
        stub = connect(server.target)
        create_stream(stub, "S", {"port": "int64", "ts": "int64"})
        register(stub, "SELECT port, count(*) AS n [RANGE 10, WA ts] FROM S GROUP BY port", "warm")
        ports = np.arange(1000, dtype=np.int64) * 65  # a thousand ports out of 65,536
        batch = pa.table({"port": ports, "ts": np.arange(1000, dtype=np.int64) % 10})
        ingest(stub, "S", "p", [batch])  # every worker's kernels compiled and run once
        workers = server.worker_pids()
        before = [resident(pid) for pid in workers]
        names = [f"q{i}" for i in range(QUERIES)]
        for name in names:
            register(stub, f"SELECT port, count(*) AS {name}_n [RANGE 10, WA ts] FROM S GROUP BY port", name)
        ingest(stub, "S", "p", [batch, 5])  # windows stay open: their state is held

        def measured() -> bool:  # every query's state, as both workers reported it after the batch
            state = scrape(server).get("lowtide_state_bytes", {})
            held = {dict(labels)["query"]: value for labels, value in state.items()}
            return all(held.get(name, 0) > 0 for name in names)

        wait_for("every query's state to be measured", measured, 60)
        grown = [resident(pid) - b for pid, b in zip(workers, before, strict=True)]
        assert max(grown) < 40 * MIB, [g // MIB for g in grown]  # a 512 KiB index each: 100 MiB


def test_past_the_total_state_the_query_that_grows_fails_alone() -> None:
    with running_server(workers=2, config={"max_state_bytes_total": STATE_TOTAL}) as server:
        mirror = Mirror(connect(server.target))
        mirror.create_stream("grows", sources=["p"])
        register(  # on the server only: the engine has no total
            mirror.stub,
            "SELECT srcPort, count(*) AS n [RANGE ALL, SLIDE 1 minute, WA ts] FROM grows GROUP BY srcPort",
            "wide",
        )
        small = mirror.register("SELECT count(*) AS n [RANGE 1 minute, WA ts] FROM grows", "small")
        subs = {q: Subscription(mirror.stub, q) for q in ("wide", small)}
        rnd = random.Random(30)
        now = T0
        for _ in range(8):  # a thousand new ports a batch: the landmark's state only grows
            rows = table(packets(rnd, 1000, now, now + MINUTE))
            ports = pa.array([rnd.randrange(1 << 30) for _ in range(1000)], pa.int32())
            now += MINUTE
            mirror.ingest("grows", "p", [rows.set_column(1, "srcPort", ports), now])
        found = subs["wide"].end(timeout=15)  # state is measured every second
        assert found.kind == "ResourceExhausted" and "\n" not in found.reason, found
        assert re.search(rf"'wide'.*max_state_bytes_total \({STATE_TOTAL}\)", found.reason), found
        mirror.ingest("grows", "p", [CLOSE])
        assert_same(subs[small].until(), mirror.results(small), "the query beside it")
