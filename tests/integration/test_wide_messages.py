"""Wide results and wide streams through the real server: every row arrives, exactly once.

A result table over max_message_bytes travels in slices (``more``) and arrives as one table.

Messages between the front and its workers past 16 KiB used to be read in two parts from a
non-blocking pipe; the second part was taken for an error and the channel fell out of step,
dropping results without a word (issue: results dropped when a worker message is over 16 KiB).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from server_harness import running_server

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client

pytestmark = pytest.mark.integration

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
