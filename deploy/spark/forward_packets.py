"""An example Spark Structured Streaming job that forwards packet files to lowtide, exactly once.

    spark-submit --master 'local[2]' deploy/spark/forward_packets.py \
        --server 127.0.0.1:50051 --input /data/packets --checkpoint /var/lib/spark/packets

Reads Parquet packet files (``srcIP string, len int, ts timestamp``) as they land in ``--input``,
and writes every micro-batch to the lowtide stream ``--stream`` with ``writeStream.format("lowtide")``:
the executors send their partitions straight to the server, the driver commits each micro-batch
whole (``--foreach-batch`` sends through ``LowtideSink`` on the driver instead, ``--parallel``
through its parallel mode). The stream (and a sliding count per srcIP reading it) is created
when missing. Spark's checkpoint plus lowtide's batch ids make the pair exactly once: stop the
job and start it again with the same ``--checkpoint`` and nothing is lost or applied twice.
``--once`` reads what is there and stops (``trigger(availableNow=True)``), then closes the
source so every window is emitted. The executors need ``lowtide`` installed (``pip install
lowtide``: the thin client is enough).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lowtide.clients import Client
from lowtide.clients.spark import LowtideDataSource, LowtideSink
from lowtide.errors import AlreadyExists

SCHEMA = {"srcIP": "string", "len": "int32", "ts": "timestamp[ms]"}
SPARK_SCHEMA = "srcIP string, len int, ts timestamp"
QUERY = (
    "SELECT srcIP, count(*) AS packets, sum(len) AS bytes "
    "[RANGE 1 minute, SLIDE 10 seconds, WA ts] FROM {stream} GROUP BY srcIP"
)


def declare(server: str, stream: str) -> None:
    """The stream and its query, unless they exist already (a restarted job)."""
    with Client(server, timeout=30) as client:
        try:
            client.create_stream(stream, SCHEMA, progressing="ts")
        except AlreadyExists:
            return
        client.register_query(QUERY.format(stream=stream), name=f"{stream}_by_src")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="forward packet files from Spark to lowtide")
    parser.add_argument("--server", default="127.0.0.1:50051", help="lowtide's host:port")
    parser.add_argument("--stream", default="Packets")
    parser.add_argument("--input", required=True, help="folder of Parquet packet files")
    parser.add_argument("--checkpoint", required=True, help="Spark's checkpoint folder")
    parser.add_argument("--watermark", default="10 seconds", help="allowed disorder, as withWatermark")
    parser.add_argument("--files-per-batch", type=int, default=1)
    sink = parser.add_mutually_exclusive_group()
    sink.add_argument("--foreach-batch", action="store_true", help="send through LowtideSink on the driver")
    sink.add_argument("--parallel", action="store_true", help="send through LowtideSink's parallel mode")
    parser.add_argument("--once", action="store_true", help="read the files there, then stop")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    spark: Any = SparkSession.builder.appName("lowtide-forward-packets").getOrCreate()
    declare(args.server, args.stream)
    punctuation = f"watermark:{args.watermark}"
    files = spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", args.files_per_batch)
    frame = files.parquet(args.input).writeStream.option("checkpointLocation", args.checkpoint)
    sink: LowtideSink | None = None
    if args.foreach_batch or args.parallel:
        sink = LowtideSink(args.server, args.stream, punctuation=punctuation, parallel=args.parallel)
        writer = frame.foreachBatch(sink)
    else:
        spark.dataSource.register(LowtideDataSource)
        writer = frame.format("lowtide").options(
            server=args.server, stream=args.stream, punctuation=punctuation
        )
    if not args.once:
        writer.start().awaitTermination()
        return 0
    writer.trigger(availableNow=True).start().awaitTermination()
    # The files are all read: the source ends, and every window can close.
    if sink is not None:
        sink.close()
    else:
        with Client(args.server, timeout=30) as client, client.producer(args.stream, "spark") as producer:
            producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
