"""Spark Structured Streaming's answer to Nexmark queries over the events of a folder, timed: the
third engine of bench/nexmark.py, beside lowtide and PyFlink.

    python bench/nexmark/spark_runner.py --data DIR --query N [--disorder-ms 2000] [--chunks 20]
                                         [--out FILE]

``DIR`` holds person.parquet, auction.parquet and bid.parquet as lowtide.clients.nexmark's
``write_parquet`` writes them: rows in arrival order, every row's ``dateTime`` at least the largest
``dateTime`` before it (all streams) less ``disorder_ms``. ``run`` gives the seconds and the final
rows; the CLI prints ``seconds=.. rows=..`` on stderr and the rows as JSON lines (keys the Flink
query's column names, as bench/nexmark/flink_oracle.py writes them, rows sorted).

Streaming, in arrival order: off the clock, each stream the query reads is cut into ``chunks``
files of consecutive rows, then a last file of one sentinel row (below); their modification times
follow that order, which is the order Spark's file source takes them in, so ``readStream.parquet``
with ``maxFilesPerTrigger`` 1 makes file ``i`` of every stream micro-batch ``i``. (The streams are
cut at the same fractions of their rows, not at the same arrivals: the files hold no arrival
times. Each stream's watermark is honest whatever the cut, so only the state held varies.) Each
stream is ``withWatermark("dateTime", disorder_ms + 1 ms)``, then ``dateTime < sentinel``. Spark
drops a row *at* the watermark (lowtide's punctuation and Flink's watermark ``dateTime -
disorder`` let it through), hence the 1 ms; no row is then late, and a run fails if Spark reports
a row dropped by the watermark or a source that did not read all its rows (Parquet filter
pushdown is off for that count).

End of input: Spark's watermark moves only with data (the global one is the least of the
streams') and Spark has no end of stream. The sentinel, a row one day after the last event in
every stream read, moves the watermark past every window; Spark's no-data micro-batch then
closes them all, as Flink's final watermark and lowtide's end of stream do. The filter after
``withWatermark`` drops the sentinel before any operator sees it. (A query's own filters that
Spark pushes below ``withWatermark`` may drop it first, as in q2, q3, q14 and q20: none of those
has a window to close.)

Sinks: append mode (stateless queries, joins, event-time windows) into Spark's Parquet file sink;
complete mode for the non-windowed aggregations (q15-q17, whose Flink answer is an updating
table's final state) into the memory sink, whose last micro-batch is the final table. The session
is lowtide.clients.demos.spark.local_session's (local[2], 2 shuffle partitions, loopback only,
quiet logs, the session time zone UTC) with a 4 GiB driver heap (local mode's executors share
it: q20's join holds every bid) and Spark's default state store (HDFS-backed, in memory).

The clock runs from ``start()`` to ``awaitTermination()`` under ``trigger(availableNow=True)``:
planning, every micro-batch and writing the result. Off it: the SparkSession's start (a local JVM,
some seconds once per process: ``session()``, kept for later runs until ``stop()``), cutting the
files, a warm-up run of the same query over the first chunk (JIT and code generation, as lowtide
is warmed), and reading the result back. A micro-batch of a stateful query costs Spark about a
second here whatever its size (planning, state store commits, the offset and commit logs), so
its figure for q5, q7 and q8 depends on ``chunks`` more than on the events.

Rows are normalised as bench/nexmark.py and the Flink oracle do: timestamps as epoch ms, decimals
and doubles as floats at 9 significant digits, columns in the Flink query's select order.

Left out: the queries in ``CANNOT``, each with why. Spark Structured Streaming has no ROW_NUMBER
over a stream, no chained aggregation outside event-time windows and no exact ``count(DISTINCT)``;
q15 and q16 count distinct values exactly as ``size(collect_set(..))``, which holds each group's
set in state (what a Spark user writes when an approximate count will not do).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from lowtide.clients import nexmark

Frame = Any  # a streaming pyspark.sql.DataFrame
Row = tuple[Any, ...]

DRIVER_MEMORY = "4g"
SENTINEL_AFTER_MS = 86_400_000  # the sentinel's dateTime: this long after the last event
NO_SUCH_FILE = "no such query in tests/data/nexmark (nor for lowtide or Flink)"
CANNOT: dict[int, str] = {
    4: "an average over a non-windowed max per auction: Spark streaming chains aggregations only "
    "over event-time windows in append mode (no retraction of a max's earlier value)",
    6: "ROW_NUMBER and an OVER (ROWS ...) window: Spark streaming supports neither on a stream",
    9: "ROW_NUMBER over a stream (top-1 bid per auction): not supported by Spark streaming",
    12: NO_SUCH_FILE,
    13: "a processing-time temporal join with a side_input table that the events folder lacks",
    18: "ROW_NUMBER over a stream (last bid per bidder and auction): not supported by Spark "
    "streaming; max_by(.., dateTime) keeps any of the bids tied on dateTime (many here), Flink "
    "the last to arrive",
    19: "ROW_NUMBER over a stream (top 10 bids per auction): not supported by Spark streaming",
    21: NO_SUCH_FILE,
}
# Non-windowed aggregations: complete mode, the last micro-batch being the final table.
COMPLETE = frozenset({15, 16, 17})


class Streams:
    """The streams of a folder as streaming DataFrames (watermarked, the sentinel filtered out),
    each cut into files on first use; ``rows`` counts the rows each holds (sentinel included)."""

    def __init__(
        self, spark: Any, source: Path, target: Path, chunks: int, disorder_ms: int, first: bool = False
    ) -> None:
        self.spark, self.source, self.target, self.chunks = spark, source, target, chunks
        self.disorder_ms, self.first = disorder_ms, first
        ends = [_last_ms(source / f"{name}.parquet") for name in nexmark.STREAMS]
        self.end_ms = max(ends) + SENTINEL_AFTER_MS
        self.rows: dict[str, int] = {}
        self.frames: dict[str, Frame] = {}

    def __getitem__(self, name: str) -> Frame:
        """A stream's DataFrame, made once: a query that reads it twice (q5, q7) has one source."""
        if name not in self.frames:
            folder = self.target / name
            self.rows[name] = _cut(
                self.source / f"{name}.parquet", folder, self.chunks, self.end_ms, self.first
            )
            self.frames[name] = (
                self.spark.readStream.schema(_spark_schema(nexmark.SCHEMAS[name]))
                .option("maxFilesPerTrigger", 1)
                .parquet(str(folder))
                .withWatermark("dateTime", f"{self.disorder_ms + 1} milliseconds")
                .where(F.col("dateTime") < F.timestamp_millis(F.lit(self.end_ms)))
            )
        return self.frames[name]


def _last_ms(path: Path) -> int:
    return int(pc.max(pq.read_table(path, columns=["dateTime"])["dateTime"]).cast(pa.int64()).as_py())


def _cut(source: Path, folder: Path, chunks: int, end_ms: int, first: bool) -> int:
    """``source``'s rows as ``chunks`` files of consecutive rows (only the first with ``first``),
    then a file of one sentinel row, modification times 1 s apart in that order; times as UTC
    instants (``TimestampType`` to Spark). The sentinel's times are ``end_ms``, its numbers -1,
    its strings empty: none null, as Spark pushes a join's inferred ``IS NOT NULL`` below
    ``withWatermark``, where a null would keep it from moving the watermark. The rows written."""
    table = pq.read_table(source)
    for index, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(index, field.name, table[field.name].cast(pa.timestamp("ms", "UTC")))
    bounds = [table.num_rows * i // chunks for i in range(chunks + 1)]
    parts = [table.slice(a, b - a) for a, b in pairwise(bounds)]
    if first:
        parts = parts[:1]
    fill = {pa.int64(): -1, pa.string(): "", pa.timestamp("ms", "UTC"): end_ms}
    sentinel = pa.table([pa.array([fill[f.type]], f.type) for f in table.schema], schema=table.schema)
    folder.mkdir(parents=True)
    oldest = time.time() - len(parts) - 60
    for i, part in enumerate([*parts, sentinel]):
        path = folder / f"part-{i:05d}.parquet"
        pq.write_table(part, path)
        os.utime(path, (oldest + i, oldest + i))
    return sum(int(p.num_rows) for p in parts) + 1


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql import types as T

    kinds = {pa.int64(): T.LongType(), pa.string(): T.StringType(), pa.timestamp("ms"): T.TimestampType()}
    return T.StructType([T.StructField(f.name, kinds[f.type]) for f in schema])


# ---- the queries, as tests/data/nexmark/q*.sql, columns named as Flink names them ---------------

QUERIES: dict[int, Callable[[Streams], Frame]] = {}


def query(number: int) -> Callable[[Callable[[Streams], Frame]], Callable[[Streams], Frame]]:
    def register(build: Callable[[Streams], Frame]) -> Callable[[Streams], Frame]:
        QUERIES[number] = build
        return build

    return register


@query(0)
def q0(s: Streams) -> Frame:
    return s["bid"].select("auction", "bidder", "price", "dateTime", "extra")


@query(1)
def q1(s: Streams) -> Frame:
    # 0.908 is DECIMAL(3, 3) to Spark, (4, 3) to Flink: the products are the same decimals.
    return s["bid"].selectExpr("auction", "bidder", "0.908 * price AS price", "dateTime", "extra")


@query(2)
def q2(s: Streams) -> Frame:
    return s["bid"].where("auction % 123 = 0").select("auction", "price")


@query(3)
def q3(s: Streams) -> Frame:
    """An unbounded inner join: both sides stay in state for good, as in Flink."""
    auctions = s["auction"].where("category = 10").alias("A")
    people = s["person"].where("state IN ('OR', 'ID', 'CA')").alias("P")
    return auctions.join(people, F.expr("A.seller = P.id")).select("P.name", "P.city", "P.state", "A.id")


@query(5)
def q5(s: Streams) -> Frame:
    """Bids per auction per HOP window (2 s slide, 10 s size), joined with each window's most.
    A plan is a tree, so Spark counts twice: four stateful operators (count, count, max, join),
    chained in append mode by the window column's event time."""
    counts = s["bid"].groupBy(F.window("dateTime", "10 seconds", "2 seconds"), "auction")
    counts = counts.agg(F.count("*").alias("num"))
    most = counts.groupBy("window").agg(F.max("num").alias("maxn"))
    joined = counts.alias("C").join(most.alias("M"), F.expr("C.window = M.window AND C.num >= M.maxn"))
    return joined.select("C.auction", "C.num")


@query(7)
def q7(s: Streams) -> Frame:
    """Each bid at its 10 s window's highest price, the window's end inclusive (BETWEEN)."""
    bids = s["bid"]
    top = bids.groupBy(F.window("dateTime", "10 seconds")).agg(F.max("price").alias("maxprice"))
    on = "B.price = T.maxprice AND B.dateTime BETWEEN T.window.end - INTERVAL 10 SECONDS AND T.window.end"
    joined = bids.alias("B").join(top.alias("T"), F.expr(on))
    return joined.select("B.auction", "B.price", "B.bidder", "B.dateTime", "B.extra")


@query(8)
def q8(s: Streams) -> Frame:
    """Persons who opened an auction in the 10 s tumbling window they joined in."""
    tumble = F.window("dateTime", "10 seconds")
    people = s["person"].groupBy("id", "name", tumble).agg(F.count("*").alias("n")).alias("P")
    sellers = s["auction"].groupBy("seller", tumble).agg(F.count("*").alias("n")).alias("A")
    joined = people.join(sellers, F.expr("P.id = A.seller AND P.window = A.window"))
    return joined.select("P.id", "P.name", F.col("P.window.start").alias("starttime"))


@query(10)
def q10(s: Streams) -> Frame:
    return s["bid"].selectExpr(
        "auction",
        "bidder",
        "price",
        "dateTime",
        "extra",
        "date_format(dateTime, 'yyyy-MM-dd') AS `EXPR$5`",
        "date_format(dateTime, 'HH:mm') AS `EXPR$6`",
    )


@query(11)
def q11(s: Streams) -> Frame:
    """Bids per bidder per session (10 s gap)."""
    sessions = s["bid"].groupBy("bidder", F.session_window("dateTime", "10 seconds"))
    counted = sessions.agg(F.count("*").alias("bid_count"))
    return counted.select(
        "bidder",
        "bid_count",
        F.col("session_window.start").alias("starttime"),
        F.col("session_window.end").alias("endtime"),
    )


@query(14)
def q14(s: Streams) -> Frame:
    """count_char(extra, 'c') as built-ins: the bytes that removing every 'c' takes away (UTF-8
    has no 'c' byte inside another character), 0 for a null, as nexmark's CountChar."""
    return (
        s["bid"]
        .where("0.908 * price > 1000000 AND 0.908 * price < 50000000")
        .selectExpr(
            "auction",
            "bidder",
            "0.908 * price AS price",
            "CASE WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime' "
            "WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
            "ELSE 'otherTime' END AS bidTimeType",
            "dateTime",
            "extra",
            "coalesce(octet_length(extra) - octet_length(replace(extra, 'c', '')), 0) AS c_counts",
        )
    )


RANKS = (
    "price < 10000",
    "price >= 10000 AND price < 1000000",
    "price >= 1000000",
)


def _counts(what: str) -> list[str]:
    """``count(*)`` or ``count(distinct what)`` overall, then under each of RANKS (Flink's
    FILTER), as Spark SQL: a distinct count as the size of a set."""
    name = "bids" if what == "*" else f"{what}s"
    one = "count(*)" if what == "*" else f"size(collect_set({what}))"
    ranked = [
        f"count_if({r})" if what == "*" else f"size(collect_set({what}) FILTER (WHERE {r}))" for r in RANKS
    ]
    return [f"{one} AS total_{name}"] + [f"{e} AS rank{i}_{name}" for i, e in enumerate(ranked, 1)]


def _daily(s: Streams, keys: list[str], columns: list[str]) -> Frame:
    """``bid`` grouped by ``keys`` and its day, the aggregates ``columns`` (Spark SQL)."""
    day = F.date_format("dateTime", "yyyy-MM-dd").alias("day")
    grouped = s["bid"].groupBy(*keys, day).agg(*(F.expr(c) for c in columns))
    return grouped.select(*keys, "day", *(c.rsplit(" AS ", 1)[1] for c in columns))


@query(15)
def q15(s: Streams) -> Frame:
    return _daily(s, [], [*_counts("*"), *_counts("bidder"), *_counts("auction")])


@query(16)
def q16(s: Streams) -> Frame:
    minute = "max(date_format(dateTime, 'HH:mm')) AS minute"
    return _daily(s, ["channel"], [minute, *_counts("*"), *_counts("bidder"), *_counts("auction")])


@query(17)
def q17(s: Streams) -> Frame:
    """Flink's AVG of a BIGINT is a BIGINT (the sum divided by the count, truncated)."""
    columns = [
        *_counts("*"),
        "min(price) AS min_price",
        "max(price) AS max_price",
        "CAST(sum(price) DIV count(price) AS BIGINT) AS avg_price",
        "sum(price) AS sum_price",
    ]
    return _daily(s, ["auction"], columns)


@query(20)
def q20(s: Streams) -> Frame:
    """An unbounded inner join; Flink names the second dateTime and extra dateTime0, extra0."""
    bids, auctions = s["bid"].alias("B"), s["auction"].where("category = 10").alias("A")
    joined = bids.join(auctions, F.expr("B.auction = A.id"))
    return joined.select(
        *(f"B.{c}" for c in ("auction", "bidder", "price", "channel", "url", "dateTime", "extra")),
        *(f"A.{c}" for c in ("itemName", "description", "initialBid", "reserve")),
        F.col("A.dateTime").alias("dateTime0"),
        *(f"A.{c}" for c in ("expires", "seller", "category")),
        F.col("A.extra").alias("extra0"),
    )


@query(22)
def q22(s: Streams) -> Frame:
    """SPLIT_INDEX keeps empty tokens and is null past the last, as ``get(split(..), i)``."""
    return s["bid"].selectExpr(
        "auction",
        "bidder",
        "price",
        "channel",
        *(f"get(split(url, '/'), {i}) AS dir{i - 2}" for i in (3, 4, 5)),
    )


# ---- running ------------------------------------------------------------------------------------


def session() -> Any:
    """The local SparkSession (made on first use, some seconds: off every clock)."""
    from lowtide.clients.demos.spark import local_session

    # Local mode runs the executors in the driver's JVM, whose default heap (1 GiB) q20's join
    # state (every bid) outgrows at 1,000,000 events; read when the JVM starts.
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-memory {DRIVER_MEMORY} pyspark-shell")
    spark = local_session("lowtide-nexmark", cores=2)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")  # for _check
    # Row groups pruned by a pushed-down filter are not counted as read (a filter pushed below
    # withWatermark prunes the sentinel's file): off, so that _check can count. No chunk of
    # events is pruned anyway: each holds every category, state and so on.
    spark.conf.set("spark.sql.parquet.filterPushdown", "false")
    return spark


def stop() -> None:
    """Stop the session ``session()`` made (a later ``run`` makes another)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def run(
    folder: Path, number: int, disorder_ms: int, chunks: int = 20, warm: bool = True
) -> tuple[float, Counter[Row]] | None:
    """Spark's seconds and final rows for Nexmark query ``number`` over ``folder``'s events (the
    module docstring has how), or None where Spark cannot express it (``CANNOT`` says why)."""
    found = _run(folder, number, disorder_ms, chunks, warm)
    return None if found is None else (found[0], _multiset(found[1]))


def _run(
    folder: Path, number: int, disorder_ms: int, chunks: int, warm: bool
) -> tuple[float, pa.Table] | None:
    if number in CANNOT:
        return None
    if number not in QUERIES:
        raise ValueError(f"no Nexmark query {number}")
    spark = session()
    with tempfile.TemporaryDirectory(prefix="spark-nexmark-") as tmp:
        scratch = Path(tmp)
        if warm:
            _timed(spark, Streams(spark, folder, scratch / "warm", chunks, disorder_ms, first=True), number)
        return _timed(spark, Streams(spark, folder, scratch / "events", chunks, disorder_ms), number)


def _timed(spark: Any, streams: Streams, number: int) -> tuple[float, pa.Table]:
    """Run query ``number`` over ``streams`` to its end: the seconds, and its result."""
    frame = QUERIES[number](streams)  # cuts the files its streams need
    out = streams.target / "out"
    complete = number in COMPLETE
    name = f"nexmark_q{number}_{time.monotonic_ns()}"
    writer = frame.writeStream.option("checkpointLocation", str(streams.target / "checkpoint"))
    writer = writer.trigger(availableNow=True).outputMode("complete" if complete else "append")
    writer = writer.format("memory").queryName(name) if complete else writer.format("parquet")
    began = time.perf_counter()
    running = writer.start() if complete else writer.start(str(out))
    running.awaitTermination()
    seconds = time.perf_counter() - began
    _check(running.recentProgress, streams.rows, number)
    if complete:
        result = spark.table(name).toArrow()
        spark.catalog.dropTempView(name)
    else:
        result = spark.read.schema(frame.schema).parquet(str(out)).toArrow()  # as the sink committed
    return seconds, result


def _check(progress: list[dict[str, Any]], rows: dict[str, int], number: int) -> None:
    """Every source read all its folder's rows (a stream that a query reads twice, as q5's self
    join, is one source whose count is of both scans), and no row dropped by the watermark."""
    read: Counter[str] = Counter()
    for p in progress:
        for source in p["sources"]:
            read[source["description"].rstrip("]").rsplit("/", 1)[1]] += source["numInputRows"]
    short = {name: (n, rows[name]) for name, n in read.items() if n == 0 or n % rows[name]}
    dropped = sum(o.get("numRowsDroppedByWatermark", 0) for p in progress for o in p["stateOperators"])
    if short or dropped or read.keys() != rows.keys():
        raise RuntimeError(f"q{number}: Spark read (rows, of) {short}, dropped {dropped} rows as late")


def _multiset(table: pa.Table) -> Counter[Row]:
    """The rows as tuples: timestamps as epoch ms, decimals and doubles at 9 significant digits."""
    columns = []
    for column in table.columns:
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms", column.type.tz)).cast(pa.int64())
        elif pa.types.is_decimal(column.type):
            column = column.cast(pa.float64())
        values = column.to_pylist()
        if pa.types.is_floating(column.type):
            values = [None if v is None else float(f"{v:.9g}") for v in values]
        columns.append(values)
    return Counter(zip(*columns, strict=True)) if columns else Counter()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of person/auction/bid.parquet")
    parser.add_argument("--query", type=int, required=True, help="the Nexmark query's number")
    parser.add_argument("--disorder-ms", type=int, default=2000, help="the events' disorder bound")
    parser.add_argument("--chunks", type=int, default=20, help="micro-batches of events")
    parser.add_argument("--no-warm", dest="warm", action="store_false", help="skip the warm-up run")
    parser.add_argument("--out", type=Path, help="the rows as JSON lines (default stdout)")
    args = parser.parse_args(argv)
    if args.query in CANNOT:
        raise SystemExit(f"Spark cannot run q{args.query}: {CANNOT[args.query]}")
    try:
        found = _run(args.data.resolve(), args.query, args.disorder_ms, args.chunks, args.warm)
    finally:
        stop()
    assert found is not None
    seconds, table = found
    names = table.column_names
    rows = sorted(_multiset(table).elements(), key=lambda r: tuple((v is None, v) for v in r))
    out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
    for row in rows:
        out.write(json.dumps(dict(zip(names, row, strict=True)), ensure_ascii=False) + "\n")
    if args.out:
        out.close()
    print(f"seconds={seconds:.3f} rows={len(rows)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
