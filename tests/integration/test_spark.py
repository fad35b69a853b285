"""The Spark connector with a real local Spark (Java 17) and a real server: Spark is the oracle.
(Also the ``session_window`` spelling, in an engine, against Spark's own session windows.)

Structured Streaming reads disordered packet files (one or two per micro-batch) and forwards them
through ``LowtideSink``; lowtide's tumbling and sliding windows must equal Spark's own batch
``groupBy(window(ts, ...))`` over the same files, each window exactly once, in driver mode and in
parallel mode; replayed batch ids apply once; a server that stops answering fails the batch, and
after it is back Spark's retry from its checkpoint still gives exact results.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from server_harness import START_TIMEOUT, free_port, start_server
from spark_checks import DELAY, ROWS, WAIT, Sessions, assert_exact, setup, stream_info, windows_of

from lowtide import Engine, NotFound, SchemaMismatch
from lowtide.clients import Client
from lowtide.clients.demos.spark import (
    SPARK_SCHEMA,
    spark_windows,
    write_packet_files,
)
from lowtide.clients.spark import LowtideSink

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]


@pytest.fixture(scope="module")
def spark(spark_sessions: Sessions) -> Any:
    return spark_sessions.get()


def stream_files(
    spark: Any, folder: Path, checkpoint: Path, sink: Callable[..., None], per_batch: int
) -> None:
    """A Structured Streaming query over ``folder`` into ``sink`` until every file is read."""
    query = (
        spark.readStream.schema(SPARK_SCHEMA)
        .option("maxFilesPerTrigger", per_batch)
        .parquet(str(folder))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT) is not False, "the Spark query did not finish in time"


def test_driver_and_parallel_mode_equal_sparks_own_windows(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    folder = tmp_path / "packets"
    total = write_packet_files(folder, files=8, rows=ROWS, seed=3)
    with Client(target, timeout=30) as client:
        for parallel in (False, True):
            stream, queries = setup(client, fresh)
            sink = LowtideSink(target, stream, punctuation=DELAY, parallel=parallel)
            # Two files a micro-batch: two partitions, so parallel mode feeds two sources.
            stream_files(spark, folder, tmp_path / f"checkpoint-{parallel}", sink, per_batch=2)
            sink.close()
            assert (sink.rows, sink.batches, sink.duplicates) == (total, 4, 0)
            info = stream_info(client, stream)
            assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
            assert info["sources"] == (["spark/p0", "spark/p1"] if parallel else ["spark"])
            assert_exact(client, spark, folder, queries)


def test_replayed_batch_ids_apply_once(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    folder = tmp_path / "packets"
    total = write_packet_files(folder, files=3, rows=ROWS, seed=4)
    batches = [spark.read.schema(SPARK_SCHEMA).parquet(str(p)) for p in sorted(folder.glob("*.parquet"))]
    with Client(target, timeout=30) as client:
        stream, queries = setup(client, fresh)
        first = LowtideSink(target, stream, punctuation=DELAY)
        for batch_id in (0, 1, 0):
            first(batches[batch_id], batch_id)
        # A restarted driver: a new sink, which replays the batch Spark had not committed.
        second = LowtideSink(target, stream, punctuation=DELAY)
        for batch_id in (2, 1):
            second(batches[batch_id], batch_id)
        second.close()
        assert (first.duplicates, second.duplicates) == (1, 1)
        assert stream_info(client, stream)["tuples_ingested"] == total
        assert_exact(client, spark, folder, queries)


def test_a_server_that_stops_fails_the_batch_and_the_retry_is_exact(
    spark: Any, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    folder, checkpoint = tmp_path / "packets", tmp_path / "checkpoint"
    total = write_packet_files(folder, files=6, rows=ROWS, seed=5)
    server = start_server()
    stopped: list[int] = []
    try:
        with Client(server.target, timeout=30) as client:
            stream, queries = setup(client, fresh)
            sink = LowtideSink(server.target, stream, punctuation=DELAY, timeout=3)

            def stop_at_batch_3(batch_df: Any, batch_id: int) -> None:
                if batch_id == 3 and not stopped:
                    os.kill(server.process.pid, signal.SIGSTOP)  # the server stops answering
                    stopped.append(batch_id)
                sink(batch_df, batch_id)

            with pytest.raises(Exception, match="DeadlineExceeded") as failed:
                stream_files(spark, folder, checkpoint, stop_at_batch_3, per_batch=1)
            assert stopped == [3], failed.value
            os.kill(server.process.pid, signal.SIGCONT)
            # The job restarts from its checkpoint: Spark replays batch 3, then reads on.
            restarted = LowtideSink(server.target, stream, punctuation=DELAY, timeout=30)
            stream_files(spark, folder, checkpoint, restarted, per_batch=1)
            restarted.close()
            assert sink.batches + restarted.batches + restarted.duplicates >= 6
            info = stream_info(client, stream)
            assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
            assert_exact(client, spark, folder, queries)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_a_server_killed_mid_job_comes_back_and_the_job_goes_on_exactly_once(
    spark: Any, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """kill -9 of a server with --state-dir before micro-batch 3, a new one on the same port and
    directory: the sink waits for it, and Spark's windows come out each once."""
    folder, checkpoint, state = tmp_path / "packets", tmp_path / "checkpoint", tmp_path / "state"
    total = write_packet_files(folder, files=6, rows=ROWS, seed=6)
    port = free_port()
    config = {"state_dir": str(state)}
    servers = [start_server(config=config, port=port)]
    restarted = threading.Thread(target=lambda: servers.append(start_server(config=config, port=port)))
    try:
        with Client(servers[0].target, timeout=30) as client:
            stream, queries = setup(client, fresh)
        sink = LowtideSink(servers[0].target, stream, punctuation=DELAY, timeout=10)

        def kill_at_batch_3(batch_df: Any, batch_id: int) -> None:
            if batch_id == 3 and not restarted.is_alive() and len(servers) == 1:
                servers[0].process.kill()  # SIGKILL: its workers follow when their channel closes
                servers[0].process.wait()
                servers[0].exit_code = 0  # killed on purpose
                restarted.start()
            sink(batch_df, batch_id)

        stream_files(spark, folder, checkpoint, kill_at_batch_3, per_batch=1)
        sink.close()
        assert sink.reconnects > 0 and len(servers) == 2
        with Client(servers[1].target, timeout=30) as client:
            info = stream_info(client, stream)
            assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
            assert_exact(client, spark, folder, queries)
    finally:
        if restarted.ident is not None:
            restarted.join(START_TIMEOUT)
        for server in servers:
            server.stop()


def test_a_rejected_batch_raises_with_the_reason_and_applies_nothing(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    with Client(target, timeout=30) as client:
        stream, _ = setup(client, fresh)
        good = spark.sql("SELECT '10.0.0.1' AS srcIP, 60 AS len, timestamp_millis(1000) AS ts")
        out_of_range = good.selectExpr("srcIP", "CAST(3000000000 AS BIGINT) AS len", "ts")
        sink = LowtideSink(target, stream, punctuation=DELAY)
        with pytest.raises(SchemaMismatch, match="int32, got values out of its range"):
            sink(out_of_range, 0)  # the server's reason
        with pytest.raises(SchemaMismatch, match=r"has column\(s\) 'extra'"):
            sink(good.selectExpr("*", "1 AS extra"), 0)  # the sink's own check, before sending
        assert stream_info(client, stream)["tuples_ingested"] == 0
        sink(good, 0)  # Spark's retry of batch 0, mended
        assert stream_info(client, stream)["tuples_ingested"] == 1
        sink.close()
    with pytest.raises(NotFound, match="unknown stream 'nowhere'"):
        LowtideSink(target, "nowhere")(good, 0)


def test_the_deploy_example_job_forwards_exactly(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "forward_packets.py"
    spec = importlib.util.spec_from_file_location("forward_packets", path)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    folder, stream = tmp_path / "packets", fresh("Packets")
    total = write_packet_files(folder, files=4, rows=ROWS, seed=6)
    argv = [
        "--server",
        target,
        "--stream",
        stream,
        "--input",
        str(folder),
        "--checkpoint",
        str(tmp_path / "ck"),
    ]
    assert job.main([*argv, "--watermark", "5 seconds", "--once"]) == 0
    with Client(target, timeout=30) as client:
        assert stream_info(client, stream)["tuples_ingested"] == total
        found = windows_of(client, f"{stream}_by_src")
        assert found == spark_windows(spark, folder, 60, 10)


def test_session_window_merges_touching_sessions_as_spark_does(spark: Any) -> None:
    """Spark merges sessions that touch - a tuple exactly the gap after the last one joins its
    session - and lowtide's ``session_window`` spelling gives Spark's own rows (the bracket form
    keeps the strict rule: docs/queries.md)."""
    ms = [("a", 0), ("a", 10_000), ("a", 25_000), ("a", 34_999), ("a", 45_000), ("b", 0), ("b", 10_001)]
    ms += [("b", 20_001), ("b", 20_001), ("c", 7), ("c", 9_999), ("c", 19_999), ("c", 30_000)]
    spark.createDataFrame(ms, "k string, t long").selectExpr(
        "k", "timestamp_millis(t) AS ts"
    ).createOrReplaceTempView("touching")
    theirs = spark.sql(
        "SELECT k, unix_millis(session_window.start) AS s, unix_millis(session_window.end) AS e, "
        "count(*) AS n FROM touching GROUP BY k, session_window(ts, '10 seconds')"
    ).collect()
    engine = Engine()
    engine.create_stream("S", {"k": "string", "ts": "timestamp[ms]"}, sources=["s"])
    q = engine.register_query("SELECT k, count(*) AS n FROM S GROUP BY k, session_window(ts, '10 seconds')")
    engine.push("S", {"k": [k for k, _ in ms], "ts": [t for _, t in ms]}, source="s")
    engine.close_source("S", "s")
    ours = [row for item in engine.poll(q) if isinstance(item, pa.Table) for row in item.to_pylist()]
    assert sorted((r["k"], r["window_start"], r["window_end"], r["n"]) for r in ours) == sorted(
        (r.k, r.s, r.e, r.n) for r in theirs
    )
    assert ("a", 0, 20_000, 2) in [(r.k, r.s, r.e, r.n) for r in theirs]  # 10 s apart: one session
