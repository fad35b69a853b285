"""``format("lowtide")`` writers that meet faults on purpose: the real writer, then the fault.

``lowtide_flaky``: the first attempt of every task stages its part, then raises; Spark runs the
task again (attempt 1), which stages its own part and succeeds. ``lowtide_killing``: the driver
kills the server around its commits (:class:`KillsTheServer`). The classes travel to Spark's
Python workers by value (this module is not importable there).
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext, cloudpickle
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from lowtide.clients.spark import LowtideDataSource
from lowtide.clients.spark_options import Connection
from lowtide.clients.spark_writer import LowtideStreamWriter, StagedPart, Target


class FailingFirstAttempts(LowtideStreamWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPart:
        staged = super().write(iterator)
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            raise RuntimeError(f"task attempt 0 fails after staging {staged.part!r} (on purpose)")
        return staged


class FlakyLowtideDataSource(LowtideDataSource):
    @classmethod
    def name(cls) -> str:
        return "lowtide_flaky"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return FailingFirstAttempts(self.connection, Target.of(self.connection, self.options))


class KillsTheServer(LowtideStreamWriter):
    """Kills the server (SIGKILL, the pid in ``pid_file``) before it commits micro-batch 1, its
    parts staged, and after it committed micro-batch 2: between two micro-batches."""

    def __init__(self, connection: Connection, target: Target, pid_file: Path) -> None:
        super().__init__(connection, target)
        self.pid_file = pid_file

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if batchId == 1:
            self._kill()
        super().commit(messages, batchId)
        if batchId == 2:
            self._kill()

    def _kill(self) -> None:
        """SIGKILL the server the pid file names. The test holds an exclusive lock on the file
        from a server's death until its successor's pid is in it: a shared lock waits for that."""
        with self.pid_file.open() as named:
            fcntl.flock(named, fcntl.LOCK_SH)
            os.kill(int(named.read()), signal.SIGKILL)


class KillingLowtideDataSource(LowtideDataSource):
    @classmethod
    def name(cls) -> str:
        return "lowtide_killing"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        target = Target.of(self.connection, self.options)
        return KillsTheServer(self.connection, target, Path(self.options["pid_file"]))


cloudpickle.register_pickle_by_value(__import__(__name__))
