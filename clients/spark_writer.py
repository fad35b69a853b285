"""``format("lowtide")`` written by Spark: micro-batches into a stream, exactly once
(docs/design.md, "Spark data source").

    (df.writeStream.format("lowtide").option("server", "db1:50051").option("stream", "Packets")
       .option("punctuation", "watermark:10 seconds").option("checkpointLocation", path).start())

Every task sends its partition's rows from its executor straight to the server, as Arrow, typed
per the stream's schema (:mod:`lowtide.clients._conform`), staged as part ``p<partition>.a<attempt>``
of the batch ``(stream, source, batchId + 1)``: checked, not applied. Once every task is done the
driver's ``commit`` names the parts its tasks reported and the server applies them as one batch
under that id, then raises the source's punctuation (the largest event time the tasks saw minus
the delay, or the largest value of the punctuation column); ``abort`` drops what was staged.

Invariant: a micro-batch is applied whole or not at all, once per batch id. Spark runs a batch
again under the same id after a restart (its commit log did not record it): the server
acknowledges its commit without applying it, however Spark partitions it this time. A task
that runs again (a retry, a speculative copy) stages under its own attempt, and only the attempt
Spark reports is applied. With ``--state-dir`` the server keeps staged parts and applied ids
across its own restart; every call waits for a server that cannot be reached (up to
``reconnect_timeout``) and is sent again whole.

Options (besides :mod:`.spark_options`'): ``stream`` (required), ``source`` (``spark``),
``punctuation`` (``watermark:<delay>`` | ``column:<name>`` | ``none``, as ``LowtideSink``'s;
``watermark:0`` by default), ``max_part_rows`` (rows per message, 100000: a task sends its first
messages while Spark converts the rest of its partition; ``Client.stage`` keeps each below the
server's max_message_bytes too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from lowtide.clients._conform import Conformed, Layout, PunctuationMode, conform
from lowtide.clients.spark_options import Connection
from lowtide.errors import InvalidArgument, LowtideError, NotFound
from lowtide.names import unknown
from lowtide.punctuation.generators import duration_units
from lowtide.punctuation.model import NO_PROGRESS, TIME_MIN

BATCH_ID = "streaming.sql.batchId"  # the local property Spark's micro-batch execution sets


@dataclass(frozen=True)
class StagedPart(WriterCommitMessage):
    """What a task tells the driver: the part it staged (``""``: none, it had no rows)."""

    part: str
    rows: int
    max_event: int  # the largest progressing value of its rows (NO_PROGRESS: none)
    watermark: int  # the largest value of its punctuation column (NO_PROGRESS: none, or no column)


@dataclass(frozen=True)
class Target:
    """Where the writer's rows go, as read on the driver when the query starts."""

    stream: str
    source: str
    layout: Layout
    mode: PunctuationMode
    delay: int  # of watermark:<delay>, in the progressing attribute's units
    max_part_rows: int

    @staticmethod
    def of(connection: Connection, options: Mapping[str, str]) -> Target:
        stream = options.get("stream")
        if not stream:
            raise InvalidArgument('writeStream.format("lowtide") needs the option "stream"')
        mode = PunctuationMode.parse(options.get("punctuation", "watermark:0"))
        streams = connection.call(lambda client: client.list_streams())
        info = next((s for s in streams if s["name"] == stream), None)
        if info is None:
            found = unknown("stream", stream, (s["name"] for s in streams))
            raise NotFound(f"{found}; create it before the Spark query starts")
        layout = Layout.of(info)
        delay = duration_units(mode.delay, layout.unit_ms) if mode.kind == "watermark" else 0
        try:
            max_part_rows = int(options.get("max_part_rows", "100000"))
        except ValueError:
            max_part_rows = 0
        if max_part_rows < 1:
            raise InvalidArgument(
                f"the option max_part_rows must be a row count, got {options['max_part_rows']!r}"
            )
        return Target(stream, options.get("source") or "spark", layout, mode, delay, max_part_rows)

    def punctuation(self, parts: list[StagedPart]) -> int | None:
        """What the source promises after a batch of ``parts`` (None: nothing new). The server
        keeps the largest it was given, so a batch's own largest event time makes the job's."""
        if self.mode.kind == "watermark":
            max_event = max((p.max_event for p in parts), default=NO_PROGRESS)
            return None if max_event == NO_PROGRESS else max(max_event - self.delay, TIME_MIN)
        if self.mode.kind == "column":
            watermark = max((p.watermark for p in parts), default=NO_PROGRESS)
            return None if watermark == NO_PROGRESS else watermark
        return None


class Chunks:
    """A task's rows, typed for the stream in chunks of ``max_part_rows`` as Spark hands them
    over, so that the first chunks are on their way to the server while Spark converts the next.
    Kept as they are made: a Stage call sent again (a server that restarted) sends them again,
    then goes on with the rows not yet read. Iterated under a lock: a call given up on may still
    be reading when its retry begins."""

    def __init__(self, batches: Iterator[pa.RecordBatch], target: Target) -> None:
        self.batches = batches
        self.target = target
        self.done: list[Conformed] = []
        self.failure: Exception | None = None  # what typing a chunk raised, in gRPC's thread
        self._exhausted = False
        self._lock = threading.Lock()

    def empty(self) -> bool:
        with self._lock:
            return not self._more(0)

    def __iter__(self) -> Iterator[pa.Table]:
        index = 0
        while True:
            with self._lock:
                try:
                    more = self._more(index)
                except Exception as exc:  # gRPC ends the call ("Exception iterating requests")
                    self.failure = exc
                    raise
                if not more:
                    return
                table = self.done[index].table
            index += 1
            yield table

    def _more(self, index: int) -> bool:
        """Whether chunk ``index`` exists, reading (and typing) rows to make it if need be."""
        while index >= len(self.done) and not self._exhausted:
            pending: list[pa.RecordBatch] = []
            rows = 0
            for batch in self.batches:
                pending.append(batch)
                rows += batch.num_rows
                if rows >= self.target.max_part_rows:
                    break
            else:
                self._exhausted = True
            if rows:
                table = pa.Table.from_batches(pending)
                self.done.append(conform(table, self.target.layout, self.target.mode.column))
        return index < len(self.done)


class LowtideStreamWriter(DataSourceStreamArrowWriter):
    """Stages each task's rows; the driver commits a micro-batch whole (see the module)."""

    def __init__(self, connection: Connection, target: Target) -> None:
        self.connection = connection
        self.target = target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPart:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "write runs in a Spark task"
        batch_id = int(context.getLocalProperty(BATCH_ID) or -1) + 1
        if batch_id < 1:
            raise InvalidArgument('format("lowtide") writes streaming queries only (writeStream)')
        target = self.target
        chunks = Chunks(iterator, target)
        if chunks.empty():
            return StagedPart("", 0, NO_PROGRESS, NO_PROGRESS)
        part = f"p{context.partitionId()}.a{context.attemptNumber()}"
        try:
            self.connection.call(
                lambda client: client.stage(
                    target.stream, batch_id, part, chunks, target.source, target.max_part_rows
                )
            )
        except LowtideError:
            if chunks.failure is not None:  # the rows' own fault (a column the stream lacks...)
                raise chunks.failure from None
            raise
        rows = sum(chunk.table.num_rows for chunk in chunks.done)
        max_event = max(chunk.max_event for chunk in chunks.done)
        watermark = max(chunk.watermark for chunk in chunks.done)
        return StagedPart(part, rows, max_event, watermark)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        parts = [m for m in messages if isinstance(m, StagedPart) and m.part]
        target = self.target
        punctuation = target.punctuation(parts)
        if not parts and punctuation is None:
            return  # a micro-batch without rows moves nothing
        self.connection.call(
            lambda client: client.commit_staged(
                target.stream,
                batchId + 1,
                [p.part for p in parts],
                target.source,
                punctuation,
            )
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        target = self.target
        self.connection.call(lambda client: client.abort_staged(target.stream, batchId + 1, target.source))


__all__ = ["LowtideStreamWriter", "StagedPart", "Target"]
