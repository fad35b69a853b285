"""An example Spark Structured Streaming job that forwards packet files to lowtide, exactly once.

    spark-submit --master 'local[2]' deploy/spark/forward_packets.py \
        --server 127.0.0.1:50051 --input /data/packets --checkpoint /var/lib/spark/packets

Reads Parquet packet files (``srcIP string, len int, ts timestamp``) as they land in ``--input``,
and forwards every micro-batch to the lowtide stream ``--stream`` through ``LowtideSink``. The
stream (and a sliding count per srcIP reading it) is created when missing. Spark's checkpoint
plus lowtide's batch ids make the pair exactly once: stop the job and start it again with the
same ``--checkpoint`` and nothing is lost or applied twice. ``--once`` reads what is there and
stops (``trigger(availableNow=True)``), then closes the source so every window is emitted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lowtide.clients import Client
from lowtide.clients.spark import LowtideSink
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
    parser.add_argument("--parallel", action="store_true", help="send from the executors")
    parser.add_argument("--once", action="store_true", help="read the files there, then stop")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    spark: Any = SparkSession.builder.appName("lowtide-forward-packets").getOrCreate()
    declare(args.server, args.stream)
    sink = LowtideSink(
        args.server, args.stream, punctuation=f"watermark:{args.watermark}", parallel=args.parallel
    )
    writer = (
        spark.readStream.schema(SPARK_SCHEMA)
        .option("maxFilesPerTrigger", args.files_per_batch)
        .parquet(args.input)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.once:
        writer.trigger(availableNow=True).start().awaitTermination()
        sink.close()  # the files are all read: every window can close
    else:
        writer.start().awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
