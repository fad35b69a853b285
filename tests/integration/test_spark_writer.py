"""``writeStream.format("lowtide")`` from a real local Spark into a real server
(docs/design.md, "Spark data source").

Structured Streaming reads disordered packet files and writes them through the data source:
lowtide's tumbling and sliding windows equal Spark's own batch ``groupBy(window(ts, ...))`` over
the same files, each window once. Every row is applied once when Spark runs micro-batches again
(its commit log removed, as after a driver crash), when lowtide is killed with ``kill -9``
between micro-batches and started again on its ``--state-dir``, and when a task fails and
Spark runs it again.
"""

from __future__ import annotations

import fcntl
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from server_harness import START_TIMEOUT, free_port, start_server
from spark_checks import DELAY, ROWS, WAIT, Sessions, assert_exact, setup, stream_info
from spark_faults import FlakyLowtideDataSource, KillingLowtideDataSource

from lowtide.clients import Client
from lowtide.clients.demos.spark import SPARK_SCHEMA, write_packet_files

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]


@pytest.fixture(scope="module")
def spark(spark_sessions: Sessions) -> Any:
    session = spark_sessions.get(task_attempts=2)
    session.dataSource.register(FlakyLowtideDataSource)
    session.dataSource.register(KillingLowtideDataSource)
    return session


def write_files(
    spark: Any,
    folder: Path,
    checkpoint: Path,
    target: str,
    stream: str,
    per_batch: int = 1,
    source_format: str = "lowtide",
    **options: str,
) -> Any:
    """A Structured Streaming query over ``folder`` into ``format("lowtide")`` until every file
    is read."""
    files = spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", per_batch).parquet(str(folder))
    writer = (
        files.writeStream.format(source_format)
        .option("server", target)
        .option("stream", stream)
        .option("punctuation", DELAY)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    query = writer.options(**options).start()
    assert query.awaitTermination(WAIT) is not False, "the Spark query did not finish in time"
    return query


def end_source(client: Client, stream: str) -> None:
    """The job's source ends (its punctuation +inf): the last windows close."""
    with client.producer(stream, source="spark") as producer:
        producer.close()


def test_the_writer_equals_sparks_own_windows(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    folder = tmp_path / "packets"
    total = write_packet_files(folder, files=8, rows=ROWS, seed=13)
    with Client(target, timeout=30) as client:
        stream, queries = setup(client, fresh)
        # Two files a micro-batch, each task one file: two staged parts per batch.
        write_files(spark, folder, tmp_path / "checkpoint", target, stream, per_batch=2)
        end_source(client, stream)
        info = stream_info(client, stream)
        assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
        assert info["sources"] == ["spark"]
        assert_exact(client, spark, folder, queries)


def test_a_rerun_without_spark_commit_log_applies_each_row_once(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    folder, checkpoint = tmp_path / "packets", tmp_path / "checkpoint"
    total = write_packet_files(folder, files=4, rows=ROWS, seed=14)
    with Client(target, timeout=30) as client:
        stream, queries = setup(client, fresh)
        write_files(spark, folder, checkpoint, target, stream)
        assert stream_info(client, stream)["tuples_ingested"] == total
        # A driver that crashed after the sink committed but before Spark recorded it: the
        # commit log is gone, the offsets stay. Spark runs every batch again, under its id.
        shutil.rmtree(checkpoint / "commits")
        write_files(spark, folder, checkpoint, target, stream)
        end_source(client, stream)
        info = stream_info(client, stream)
        assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
        assert_exact(client, spark, folder, queries)


def test_a_task_that_fails_and_runs_again_is_applied_once(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """Attempt 0 of every task stages its rows, then fails; attempt 1 stages them again and
    succeeds: the commit applies attempt 1's parts only."""
    folder = tmp_path / "packets"
    total = write_packet_files(folder, files=4, rows=ROWS, seed=15)
    with Client(target, timeout=30) as client:
        stream, queries = setup(client, fresh)
        checkpoint = tmp_path / "checkpoint"
        query = write_files(
            spark, folder, checkpoint, target, stream, per_batch=2, source_format="lowtide_flaky"
        )
        assert failed_tasks(spark, str(query.runId)) == 4  # two micro-batches of two tasks
        end_source(client, stream)
        info = stream_info(client, stream)
        assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
        assert_exact(client, spark, folder, queries)


def failed_tasks(spark: Any, group: str) -> int:
    """The tasks that failed in the jobs of ``group`` (a streaming query's run id)."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info is not None else ():
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info is not None else 0
    return failed


def test_lowtide_killed_around_commits_goes_on_exactly_once(
    spark: Any, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """kill -9 of a server with --state-dir after micro-batch 1 was staged, before its commit,
    and again after micro-batch 2 was committed; each time a new server on the same port and
    directory: the job goes on, every row applied once, each window once."""
    folder, checkpoint, state = tmp_path / "packets", tmp_path / "checkpoint", tmp_path / "state"
    total = write_packet_files(folder, files=5, rows=ROWS, seed=16)
    port = free_port()
    config = {"state_dir": str(state)}
    servers = [start_server(config=config, port=port)]
    pid_file = tmp_path / "server.pid"
    pid_file.write_text(str(servers[0].pid))

    def restart_twice() -> None:
        for _ in range(2):
            servers[-1].process.wait()
            servers[-1].exit_code = 0  # killed on purpose
            with pid_file.open("r+") as named:
                fcntl.flock(named, fcntl.LOCK_EX)  # the next kill reads the pid once it is written
                servers.append(start_server(config=config, port=port))
                named.truncate()
                named.write(str(servers[-1].pid))

    restarts = threading.Thread(target=restart_twice, daemon=True)
    restarts.start()
    try:
        with Client(servers[0].target, timeout=30) as client:
            stream, queries = setup(client, fresh)
        write_files(
            spark, folder, checkpoint, servers[0].target, stream,
            source_format="lowtide_killing", pid_file=str(pid_file),
        )  # fmt: skip
        restarts.join(START_TIMEOUT)
        assert len(servers) == 3, "the server was not killed and started again twice"
        with Client(servers[-1].target, timeout=30) as client:
            end_source(client, stream)
            info = stream_info(client, stream)
            assert (info["tuples_ingested"], info["late_tuples"]) == (total, 0)
            assert_exact(client, spark, folder, queries)
    finally:
        for server in servers:
            if server.alive():
                server.stop()


def test_what_cannot_be_written_fails_start_in_one_line(spark: Any, target: str, tmp_path: Path) -> None:
    folder = tmp_path / "packets"
    write_packet_files(folder, files=1, rows=10, seed=17)
    files = spark.readStream.schema(SPARK_SCHEMA).parquet(str(folder))

    def start(**options: str) -> None:
        files.writeStream.format("lowtide").options(**options).option(
            "checkpointLocation", str(tmp_path / "checkpoint")
        ).start().awaitTermination(WAIT)

    with pytest.raises(Exception, match="unknown stream 'nowhere'") as raised:
        start(server=target, stream="nowhere")
    assert "create it before the Spark query starts" in str(raised.value)
    assert "Traceback" not in str(raised.value), raised.value
    with pytest.raises(Exception, match='needs the option "stream"'):
        start(server=target)
    with pytest.raises(Exception, match="unknown punctuation 'soon'"):
        start(server=target, stream="nowhere", punctuation="soon")


def test_rows_the_server_refuses_fail_the_job_with_its_reason_and_apply_nothing(
    spark: Any, target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    folder = tmp_path / "packets"
    folder.mkdir()
    wide = pa.table(
        {
            "srcIP": ["10.0.0.1", "10.0.0.2"],
            "len": pa.array([60, 3_000_000_000], pa.int64()),  # over the stream's int32
            "ts": pa.array([1_700_000_000_000, 1_700_000_000_001], pa.timestamp("ms")),
        }
    )
    pq.write_table(wide, folder / "part-0.parquet")
    with Client(target, timeout=30) as client:
        stream, _ = setup(client, fresh)
        files = spark.readStream.schema("srcIP string, len bigint, ts timestamp").parquet(str(folder))
        query = (
            files.writeStream.format("lowtide")
            .options(server=target, stream=stream)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="int32, got values out of its range"):
            query.awaitTermination(WAIT)
        assert stream_info(client, stream)["tuples_ingested"] == 0
