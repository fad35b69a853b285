"""``format("lowtide")`` read by a real local Spark from a real server
(docs/design.md, "Spark data source").

A query's results, read in batch, are exactly what a subscription from the oldest retained
offset gives, each row tagged with its table's output offset. Read as a stream into Parquet:
a rerun on the same checkpoint adds nothing, and results emitted later come in the next run,
each once. An unknown query, a starting offset no longer retained and a missing option fail on
the driver with lowtide's one-line reason.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from server_harness import running_server
from spark_checks import Sessions

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]

SCHEMA = {"k": "string", "v": "int64", "ts": "timestamp[ms]"}
SQL = "SELECT k, count(*) AS n, sum(v) AS total, max(ts) AS last [RANGE 10 s, WA ts] FROM {s} GROUP BY k"
WAIT = 300.0


@pytest.fixture(scope="module")
def spark(spark_sessions: Sessions) -> Any:
    return spark_sessions.get()


def send(client: Client, stream: str, seconds: range, close: bool = False) -> None:
    """Five rows a second of event time over ``seconds``, then punctuation after them."""
    with client.producer(stream, source="p") as producer:
        for second in seconds:
            ts = [second * 1000 + 200 * i for i in range(5)]
            producer.send({"k": [f"k{(second + i) % 3}" for i in range(5)], "v": list(range(5)), "ts": ts})
        producer.punctuate((seconds.stop) * 1000)
        if close:
            producer.close()


def finished(client: Client, query: str) -> int:
    """Wait for the query's end of stream; its next offset then (every result is out)."""
    with client.subscribe(query) as items:
        for item in items:
            if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                break
    return next(q for q in client.list_queries() if q["name"] == query)["next_offset"]


def subscribed(client: Client, query: str, until: int) -> Counter[tuple[Any, ...]]:
    """The rows of the query's tables at offsets below ``until``, from the oldest, with offsets."""
    got: Counter[tuple[Any, ...]] = Counter()
    if until == 0:
        return got
    with client.subscribe(query, from_offset=0) as items:
        for item in items:
            assert items.offset is not None
            if isinstance(item, pa.Table):
                for row in item.to_pylist():
                    got[(*plain(row).values(), items.offset)] += 1
            if items.offset >= until - 1:
                break
    return got


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row's values as Spark gives them back (timestamps as epoch milliseconds)."""
    return {k: int(v.timestamp() * 1000) if hasattr(v, "timestamp") else v for k, v in row.items()}


def spark_rows(rows: list[Any]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(plain(row.asDict()).values()) for row in rows)


def reader(spark: Any, target: str, query: str) -> Any:
    return spark.read.format("lowtide").option("server", target).option("query", query)


def test_a_batch_read_is_what_a_subscription_gives(
    spark: Any, target: str, fresh: Callable[[str], str]
) -> None:
    stream = fresh("Readable")
    with Client(target, timeout=30) as client:
        client.create_stream(stream, SCHEMA, sources=["p"])
        query = client.register_query(SQL.format(s=stream), name=fresh("batch"))
        send(client, stream, range(0, 60), close=True)
        end = finished(client, query)
        assert next(q for q in client.list_queries() if q["name"] == query)["oldest_offset"] == 0
        frame = reader(spark, target, query).load()
        columns = ["window_start", "window_end", "k", "n", "total", "last", "revision", "_offset"]
        assert frame.columns == columns
        assert str(frame.schema["last"].dataType) == "TimestampType()"
        got = spark_rows(frame.collect())
        assert got and got == subscribed(client, query, end)


def test_a_stream_read_into_parquet_adds_each_result_once(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream = fresh("Streamed")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> None:
        query = (
            spark.readStream.format("lowtide")
            .option("server", target)
            .option("query", name)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(WAIT) is not False, "the Spark query did not finish in time"

    with Client(target, timeout=30) as client:
        client.create_stream(stream, SCHEMA, sources=["p"])
        name = client.register_query(SQL.format(s=stream), name=fresh("streamed"))
        send(client, stream, range(0, 30))
        run()
        first = spark_rows(spark.read.parquet(str(out)).collect())
        assert first
        run()  # the same checkpoint: nothing new to read
        assert spark_rows(spark.read.parquet(str(out)).collect()) == first
        send(client, stream, range(30, 60), close=True)
        end = finished(client, name)
        run()
        everything = subscribed(client, name, end)
        assert spark_rows(spark.read.parquet(str(out)).collect()) == everything
        # Spark commits a micro-batch to its source when it plans the next one: batch 1 told the
        # server that the reader is past batch 0's end, as Spark's offset log holds it.
        batch_0_end = json.loads((checkpoint / "offsets" / "0").read_text().splitlines()[-1])["offset"]
        assert next(q for q in client.list_queries() if q["name"] == name)["readers"] == {
            "spark": batch_0_end
        }


def test_what_cannot_be_read_fails_on_the_driver_in_one_line(
    spark: Any, target: str, fresh: Callable[[str], str]
) -> None:
    with pytest.raises(Exception, match="no query named 'nothing_here'") as raised:
        reader(spark, target, "nothing_here").load()
    said = f"lowtide.errors.NotFound: no query named 'nothing_here' on {target}"
    assert said in str(raised.value) and "Traceback" not in str(raised.value), raised.value
    with pytest.raises(Exception, match='needs the option "server"'):
        spark.read.format("lowtide").option("query", "q").load()
    stream = fresh("Short")
    with Client(target, timeout=30) as client:
        client.create_stream(stream, SCHEMA, sources=["p"])
        query = client.register_query(SQL.format(s=stream), name=fresh("short"))
        with pytest.raises(Exception, match="startingOffsets must be earliest, latest or an output offset"):
            (
                spark.readStream.format("lowtide")
                .option("server", target)
                .option("query", query)
                .option("startingOffsets", "soon")
                .load()
                .writeStream.format("console")
                .start()
                .awaitTermination(WAIT)
            )


def test_a_starting_offset_no_longer_retained_names_the_oldest_retained(
    spark: Any, fresh: Callable[[str], str]
) -> None:
    with running_server(workers=1, metrics=False, config={"retained_items": 4}) as server:
        with Client(server.target, timeout=30) as client:
            client.create_stream("S", SCHEMA, sources=["p"])
            query = client.register_query(SQL.format(s="S"), name="q")
            for start in range(0, 120, 10):  # a punctuation each 10 s: items enough to drop some
                send(client, "S", range(start, start + 10), close=start == 110)
            end = finished(client, query)
            oldest = next(q for q in client.list_queries() if q["name"] == query)["oldest_offset"]
        assert oldest == end - 4
        stream = (
            spark.readStream.format("lowtide")
            .option("server", server.target)
            .option("query", query)
            .option("startingOffsets", str(oldest - 1))
            .load()
            .writeStream.format("console")
        )
        said = f"offset {oldest - 1} of query 'q' is no longer retained: the oldest is {oldest}"
        with pytest.raises(Exception, match=re.escape(said)):
            stream.start().awaitTermination(WAIT)
        frame = reader(spark, server.target, query).load()  # a batch read: what is retained
        assert {row["_offset"] for row in frame.collect()} <= set(range(oldest, end))
