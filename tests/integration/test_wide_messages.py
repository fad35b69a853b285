"""Wide results and wide streams through the real server: every row arrives, exactly once.

A result table over max_message_bytes travels in slices (``more``) and arrives as one table.
A producer (and a Stage call) cuts its messages below the server's max_message_bytes, which the
client asks once (Health): a server whose limit is below the 32 MiB a producer aimed at used to
refuse its batches with gRPC's own RESOURCE_EXHAUSTED. A row that fits in no message is refused
by the client, in one line naming the limit.

Messages between the front and its workers past 16 KiB used to be read in two parts from a
non-blocking pipe; the second part was taken for an error and the channel fell out of step,
dropping results without a word (issue: results dropped when a worker message is over 16 KiB).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from server_harness import running_server

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import AsyncClient, Client
from lowtide.errors import NotFound, ResourceExhausted

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("wide_messages")]

WAIT = 120.0


def read_to_end(client: Client, query: str) -> list[pa.Table]:
    """Every result table of ``query`` up to its end-of-stream punctuation."""
    tables: list[pa.Table] = []
    done = threading.Event()

    def run() -> None:
        with client.subscribe(query) as subscription:
            for item in subscription:
                if isinstance(item, pa.Table):
                    tables.append(item)
                elif isinstance(item, Punctuation) and item.value == END_OF_STREAM:
                    break
        done.set()

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    rows = sum(t.num_rows for t in tables)
    assert done.wait(WAIT), f"{query}: the stream did not end ({rows} rows so far)"
    return tables


def test_a_thousand_aggregates_give_every_window(target: str, fresh: Callable[[str], str]) -> None:
    stream, windows, width = fresh("wide_aggregates"), 1200, 1000
    columns = ", ".join(f"sum(v) AS s{i}" for i in range(width))
    with Client(target, timeout=60) as client:
        client.create_stream(stream, {"k": "int64", "v": "int64", "ts": "int64"})
        sql = f"SELECT k, {columns} [RANGE 1, SLIDE 1, WA ts] FROM {stream} GROUP BY k"
        query = client.register_query(sql)
        with client.producer(stream) as producer:
            for first in range(0, windows, 100):
                ts = np.arange(first, first + 100, dtype=np.int64)
                producer.send({"k": ts % 4, "v": ts * 3, "ts": ts})
                producer.punctuate(first + 100)
            producer.close()
        result = pa.concat_tables(read_to_end(client, query))
    assert result.num_rows == windows
    assert sorted(result.column("window_start").to_pylist()) == list(range(windows))
    starts = result.column("window_start").to_pylist()
    for name in ("s0", "s499", f"s{width - 1}"):
        assert dict(zip(starts, result.column(name).to_pylist(), strict=True)) == {w: 3 * w for w in starts}


def test_a_wide_stream_through_a_filter_gives_every_row(target: str, fresh: Callable[[str], str]) -> None:
    stream, rows, width = fresh("wide_stream"), 3000, 1023
    schema: dict[str, str] = {f"c{i}": "int64" for i in range(width - 1)}
    schema["ts"] = "int64"
    with Client(target, timeout=60) as client:
        client.create_stream(stream, schema)
        query = client.register_query(f"SELECT {', '.join(schema)} FROM {stream} WHERE c0 >= 0")
        with client.producer(stream) as producer:
            for first in range(0, rows, 500):
                ts = np.arange(first, first + 500, dtype=np.int64)
                table: dict[str, Any] = {name: ts + i for i, name in enumerate(schema) if name != "ts"}
                table["ts"] = ts
                producer.send(table)
                producer.punctuate(first + 500)
            producer.close()
        result = pa.concat_tables(read_to_end(client, query))
    assert result.num_rows == rows
    assert sorted(result.column("ts").to_pylist()) == list(range(rows))
    ts, last = result.column("ts").to_pylist(), result.column(f"c{width - 2}").to_pylist()
    assert all(value == t + width - 2 for t, value in zip(ts, last, strict=True))


def test_a_result_table_over_the_message_limit_arrives_whole(fresh: Callable[[str], str]) -> None:
    """One window closing on ~180,000 groups: a result table of several MiB, over a 1 MiB message
    limit; it travels in slices and the client gives it back as one table, every group once."""
    groups = 180_000
    limited = {"max_message_bytes": 1 << 20}
    with (
        running_server(workers=1, metrics=False, config=limited) as server,
        Client(server.target, timeout=60) as client,
    ):
        client.create_stream("S", {"k": "int64", "ts": "int64"})
        client.register_query("SELECT k, count(*) AS n [RANGE 10, WA ts] FROM S GROUP BY k", name="q")
        with client.producer("S", linger_ms=0, max_batch_rows=20_000) as producer:
            keys = np.arange(groups, dtype=np.int64)
            producer.send({"k": keys, "ts": keys % 10})
            producer.close()
        tables = read_to_end(client, "q")
    assert len(tables) == 1, [t.num_rows for t in tables]
    assert tables[0].num_rows == groups and tables[0].nbytes > 1 << 20
    assert sorted(tables[0].column("k").to_pylist()) == list(range(groups))


# -- a server whose message limit is below what a producer would send by default ------------------
LIMIT = 1 << 20  # the server's max_message_bytes: a 32 MiB message of old was refused whole
ROWS = 400_000  # three int64 columns: about 9.6 MB, many times the limit
TOTAL = "SELECT count(*) AS n, sum(k) AS total [RANGE 100, WA ts] FROM {}"


@pytest.fixture(scope="module")
def limited() -> Iterator[str]:
    """The target of a server taking messages of at most LIMIT bytes."""
    with running_server(workers=1, metrics=False, config={"max_message_bytes": LIMIT}) as server:
        yield server.target


def several_mib(first: int = 0) -> pa.Table:
    """ROWS rows whose keys start at ``first``, all in the window [0, 100)."""
    ts = np.arange(ROWS, dtype=np.int64)
    return pa.table({"k": ts + first, "v": ts * 2, "ts": ts % 100})


def total(client: Client, query: str) -> tuple[int, int]:
    """(count, sum of k) of the query's one window, once the stream has ended."""
    result = pa.concat_tables(read_to_end(client, query))
    assert result.num_rows == 1, result.to_pylist()
    return result.column("n")[0].as_py(), result.column("total")[0].as_py()


def test_a_default_producer_cuts_its_batches_below_the_servers_limit(limited: str) -> None:
    """Sends of several MiB, with a batch id or not, arrive whole and once; the stage call too."""
    first, second = several_mib(), several_mib(ROWS)
    expected = 2 * ROWS, sum(range(2 * ROWS))
    with Client(limited, timeout=60) as client:
        assert client.health()["max_message_bytes"] == LIMIT
        client.create_stream("S", {"k": "int64", "v": "int64", "ts": "int64"})
        query = client.register_query(TOTAL.format("S"))
        with client.producer("S") as producer:
            producer.send(first)
            producer.send(second, batch_id=1)
            producer.send(second, batch_id=1)  # applied once
            result = producer.close()
        assert (result.tuples, result.duplicates) == (2 * ROWS, 1)
        assert stream_info(client, "S")["tuples_ingested"] == 2 * ROWS
        assert total(client, query) == expected

        client.create_stream("Staged", {"k": "int64", "v": "int64", "ts": "int64"})
        query = client.register_query(TOTAL.format("Staged"))
        assert client.stage("Staged", 1, "p0", first)["tuples"] == ROWS
        assert client.stage("Staged", 1, "p1", iter([second]), max_part_rows=ROWS)["tuples"] == ROWS
        assert client.commit_staged("Staged", 1, ["p0", "p1"])["tuples"] == 2 * ROWS
        with client.producer("Staged") as producer:
            producer.close()
        assert total(client, query) == expected


def test_an_async_producer_cuts_its_batches_below_the_servers_limit(limited: str) -> None:
    async def scenario() -> tuple[int, int]:
        async with AsyncClient(limited, timeout=60) as client:
            assert (await client.health())["max_message_bytes"] == LIMIT
            await client.create_stream("A", {"k": "int64", "v": "int64", "ts": "int64"})
            async with client.producer("A") as producer:
                await producer.send(several_mib())
                await producer.send(several_mib(ROWS), batch_id=1)
                result = await producer.close()
            streams = await client.list_streams()
        return result.tuples, next(s for s in streams if s["name"] == "A")["tuples_ingested"]

    assert asyncio.run(scenario()) == (2 * ROWS, 2 * ROWS)


def test_a_row_over_the_servers_limit_is_refused_in_one_line(limited: str) -> None:
    """The producer's next call raises it, naming the row and the limit; the rest goes through."""
    huge = "x" * (2 * LIMIT)
    limit = rf"takes \d+ bytes as Arrow, .* max_message_bytes \({LIMIT}\)$"
    with Client(limited, timeout=60) as client:
        client.create_stream("Wide", {"s": "string", "ts": "int64"})
        with client.producer("Wide") as producer:
            producer.send({"s": ["a", huge, "b"], "ts": [1, 2, 3]})
            row = "^row 1 of send #1 was not sent: it "
            with pytest.raises(ResourceExhausted, match=row + limit) as info:
                producer.flush()
            batch = r"^batch_id 7 \(row 3 of send #2\) was not sent: row 3 "
            with pytest.raises(ResourceExhausted, match=batch + limit):
                producer.send({"s": [huge], "ts": [4]}, batch_id=7)
            producer.send({"s": ["c"], "ts": [5]}, batch_id=7)  # the id was not used
            result = producer.close()
        assert "\n" not in str(info.value)
        assert (result.tuples, result.duplicates) == (3, 0)
        assert stream_info(client, "Wide")["tuples_ingested"] == 3

        client.create_stream("WideStaged", {"s": "string", "ts": "int64"})
        with pytest.raises(ResourceExhausted, match=f"^part 'p0' was not staged: row 2 {limit}"):
            client.stage("WideStaged", 1, "p0", pa.table({"s": ["a", "b", huge], "ts": [1, 2, 3]}))
        with pytest.raises(NotFound):  # nothing of it was staged
            client.commit_staged("WideStaged", 1, ["p0"])


def stream_info(client: Client, name: str) -> dict[str, Any]:
    return next(s for s in client.list_streams() if s["name"] == name)
