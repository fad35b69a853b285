"""The Spark connector: Structured Streaming micro-batches into a lowtide stream, exactly once.

    from lowtide.clients.spark import LowtideSink

    sink = LowtideSink("127.0.0.1:50051", stream="Main", punctuation="watermark:10 seconds")
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", path).start()
    ...
    query.stop()
    sink.close()  # end the source: its punctuation becomes +inf, the last windows close

Spark calls ``sink(batch_df, batch_id)`` on the driver for every micro-batch:

1. The batch leaves Spark as Arrow (``DataFrame.toArrow()``; an Arrow-enabled ``toPandas`` on
   Spark before 4.0) and is typed per the stream's schema (:mod:`lowtide.clients._conform`).
2. It goes to the server as one batch with id ``batch_id + 1`` (0 means "no id" on the wire),
   cut into parts under the message limit. The server applies it whole once the last part has
   arrived and acknowledges a replayed id without applying it again: ``foreachBatch`` is
   at-least-once (after a restart Spark replays the last batch from its checkpoint), the pair is
   exactly once.
3. In the same call the source punctuates, by ``punctuation``:

   * ``watermark:<delay>`` - the largest event time seen so far minus ``delay``, as Spark's own
     ``withWatermark`` (``10 seconds``, ``500ms``, or a number in the attribute's units);
   * ``column:<name>`` - each batch carries its low-watermark in a column (not sent as data):
     the largest value in the batch;
   * ``none`` - only ``close()`` ends the source.

   Punctuation never regresses: a restarted job starts from what the server already holds.
4. A server that cannot be reached (restarting after a crash, say) is waited for, up to
   ``reconnect_timeout`` seconds, and the batch is sent again under its id: with ``--state-dir``
   the server kept every batch it acknowledged and each source's punctuation, so the job goes on
   exactly once. Any other failure raises, with the server's reason as a lowtide exception, so
   that Spark's own retry and failure handling take over; a batch that did not complete left
   nothing behind.

``parallel=True`` sends from the executors instead (``mapInArrow``): each partition of the batch
goes from its task straight to the server as a source of its own, ``<source>/p<partition>``, with
the batch's id, and the driver punctuates every partition source only once all partitions were
acknowledged. Use it when micro-batches are large or the driver is the bottleneck: the rows never
pass through the driver. Each partition is applied whole; after a failure Spark replays the
batch, and partitions already applied are skipped (a replay partitions the batch the same way, as
Spark's file and Kafka sources do). Do not declare the partition sources on the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

from lowtide.clients._conform import Conformed, Layout, PunctuationMode, conform
from lowtide.clients._security import RootCertificates, pem_bytes
from lowtide.clients._wire import IngestResult
from lowtide.clients.client import Client, Producer
from lowtide.clients.spark_options import until_reachable
from lowtide.clients.spark_source import LowtideDataSource
from lowtide.errors import InvalidArgument, NotFound
from lowtide.names import unknown
from lowtide.punctuation.generators import duration_units
from lowtide.punctuation.model import NO_PROGRESS, TIME_MIN

T = TypeVar("T")

# What each partition's task reports back to the driver in parallel mode.
REPORT = pa.schema(
    [
        ("partition", pa.int64()),
        ("rows", pa.int64()),
        ("duplicates", pa.int64()),
        ("max_event", pa.int64()),
        ("watermark", pa.int64()),
    ]
)
REPORT_DDL = "partition long, rows long, duplicates long, max_event long, watermark long"


class LowtideSink:
    """A ``foreachBatch`` function that forwards each micro-batch to a lowtide stream.

    ``timeout`` (seconds) bounds each call to the server, so that a server that stops answering
    fails the batch instead of hanging the query. ``max_part_rows`` caps the rows of one message.
    ``root_certificates`` and ``token`` are :class:`~lowtide.clients.Client`'s (TLS, bearer
    token); the certificates are read here, on the driver, so executors need no copy of the file.
    ``reconnect_timeout`` (seconds): how long a micro-batch waits for an unreachable server.
    """

    def __init__(
        self,
        target: str,
        stream: str,
        source: str = "spark",
        punctuation: str = "watermark:0",
        *,
        parallel: bool = False,
        timeout: float = 60.0,
        max_part_rows: int = 250_000,
        root_certificates: RootCertificates | None = None,
        token: str | None = None,
        reconnect_timeout: float = 120.0,
    ) -> None:
        if not stream:
            raise InvalidArgument("the Spark sink needs a stream name")
        self.target = target
        self.stream = stream
        self.source = source
        self.mode = PunctuationMode.parse(punctuation)
        self.parallel = parallel
        self.timeout = timeout
        self.max_part_rows = max_part_rows
        # Plain bytes and a string: the sink is pickled to the executors, a channel could not be.
        self.root_certificates = pem_bytes(root_certificates)
        self.token = token
        self.reconnect_timeout = reconnect_timeout
        self.reconnects = 0  # times a micro-batch waited for the server and was sent again
        self.batches = 0  # micro-batches applied by this sink (replays skipped are not counted)
        self.rows = 0
        self.duplicates = 0  # batches (driver mode) or partitions (parallel) skipped as replays
        self._client: Client | None = None
        self._layout: Layout | None = None
        self._delay = 0
        self._max_event = NO_PROGRESS
        # Each source this sink feeds, with the punctuation the server holds for it.
        self._punctuated: dict[str, int] = {}

    # Spark Connect pickles the foreachBatch function: the channel stays behind.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        layout = self._until_reachable(self._prepare)
        wire_id = int(batch_id) + 1
        if self.parallel:
            self._until_reachable(lambda: self._forward_partitions(batch_df, layout, wire_id))
            return
        conformed = conform(_to_arrow(batch_df), layout, self.mode.column)
        self._until_reachable(lambda: self._forward(conformed, wire_id))

    def _until_reachable(self, send: Callable[[], T]) -> T:
        """``send()``, again while the server cannot be reached, up to ``reconnect_timeout``."""
        return until_reachable(send, self.reconnect_timeout, self._reconnect)

    def _reconnect(self) -> None:
        if self._client is not None:  # a new channel: the server may be a new process
            self._client.close()
            self._client = None
        self.reconnects += 1

    def _forward(self, conformed: Conformed, wire_id: int) -> None:
        """One micro-batch from the driver: the rows under their id, then the punctuation."""
        value = self._punctuation_after(conformed.max_event, conformed.watermark)
        if not conformed.table.num_rows and value <= self._punctuated[self.source]:
            return  # an empty batch that moves nothing
        with self._producer(self.source) as producer:
            if conformed.table.num_rows:
                producer.send(conformed.table, batch_id=wire_id)
            if value > self._punctuated[self.source]:
                producer.punctuate(value)
        if producer.result is not None:
            self._count(producer.result.tuples, producer.result.duplicates)
        self._punctuated[self.source] = max(value, self._punctuated[self.source])

    def close(self) -> None:
        """End every source of this sink (their punctuation becomes +inf); then let go of the server."""
        self._prepare()
        for source in sorted(self._punctuated):
            with self._producer(source) as producer:
                producer.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- internals ------------------------------------------------------------------------------
    def _connect(self) -> Client:
        if self._client is None:
            self._client = Client(self.target, self.timeout, self.root_certificates, self.token)
        return self._client

    def _producer(self, source: str) -> Producer:
        """One Ingest call of ``source``: sent as it is given (no linger), bounded by ``timeout``."""
        return self._connect().producer(
            self.stream, source, linger_ms=0, max_batch_rows=self.max_part_rows, timeout=self.timeout
        )

    def _prepare(self) -> Layout:
        """The stream's layout and what the server holds for this sink's sources, read once."""
        if self._layout is not None:
            return self._layout
        streams = self._connect().list_streams()
        info = next((s for s in streams if s["name"] == self.stream), None)
        if info is None:
            found = unknown("stream", self.stream, (s["name"] for s in streams))
            raise NotFound(f"{found}; create it before the Spark query starts")
        layout = Layout.of(info)
        if self.mode.kind == "watermark":
            self._delay = duration_units(self.mode.delay, layout.unit_ms)
        held: dict[str, int] = info["source_punctuation"]
        if self.parallel:
            self._punctuated = {s: v for s, v in held.items() if _partition_of(self.source, s) is not None}
        else:
            self._punctuated = {self.source: held.get(self.source, NO_PROGRESS)}
        self._layout = layout
        return layout

    def _punctuation_after(self, max_event: int, watermark: int) -> int:
        """The punctuation due after a batch, never below what any source already holds."""
        if self.mode.kind == "watermark" and max_event != NO_PROGRESS:
            self._max_event = max(self._max_event, max_event)
            due = max(self._max_event - self._delay, TIME_MIN)  # below it promises nothing more
        elif self.mode.kind == "column":
            due = watermark
        else:
            due = NO_PROGRESS
        return max(due, *self._punctuated.values(), NO_PROGRESS)

    def _count(self, rows: int, duplicates: int) -> None:
        self.rows += rows
        self.duplicates += duplicates
        self.batches += 1 if rows else 0

    def _forward_partitions(self, batch_df: Any, layout: Layout, wire_id: int) -> None:
        send = PartitionSender(
            self.target, self.stream, self.source, wire_id, layout, self.mode.column, self.timeout,
            self.max_part_rows, self.root_certificates, self.token,
        )  # fmt: skip
        reports = batch_df.mapInArrow(send, REPORT_DDL).toArrow().to_pylist()
        for report in reports:
            if report["rows"] or report["duplicates"]:
                self._punctuated.setdefault(f"{self.source}/p{report['partition']}", NO_PROGRESS)
            self.rows += report["rows"]
            self.duplicates += report["duplicates"]
        self.batches += 1 if any(r["rows"] for r in reports) else 0
        max_event = max((r["max_event"] for r in reports), default=NO_PROGRESS)
        watermark = max((r["watermark"] for r in reports), default=NO_PROGRESS)
        value = self._punctuation_after(max_event, watermark)
        for source, held in sorted(self._punctuated.items()):
            if value > held:
                with self._producer(source) as producer:
                    producer.punctuate(value)
                self._punctuated[source] = value


@dataclass(frozen=True)
class PartitionSender:
    """The ``mapInArrow`` function of parallel mode: one partition to its own source, whole."""

    target: str
    stream: str
    source: str
    batch_id: int
    layout: Layout
    watermark_column: str | None
    timeout: float
    max_part_rows: int
    root_certificates: bytes | None = None
    token: str | None = field(default=None, repr=False)  # kept out of Spark's plans and logs

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        received = list(batches)
        result: IngestResult | None = None
        conformed: Conformed | None = None
        if received:
            conformed = conform(pa.Table.from_batches(received), self.layout, self.watermark_column)
        if conformed is not None and conformed.table.num_rows:
            with _executor_client(self.target, self.timeout, self.root_certificates, self.token).producer(
                self.stream,
                f"{self.source}/p{partition}",
                linger_ms=0,
                max_batch_rows=self.max_part_rows,
                timeout=self.timeout,
            ) as producer:
                producer.send(conformed.table, batch_id=self.batch_id)
            result = producer.result
        report = {
            "partition": [partition],
            "rows": [result.tuples if result else 0],
            "duplicates": [result.duplicates if result else 0],
            "max_event": [conformed.max_event if conformed else NO_PROGRESS],
            "watermark": [conformed.watermark if conformed else NO_PROGRESS],
        }
        yield pa.RecordBatch.from_pydict(report, schema=REPORT)


# Spark reuses its Python workers across tasks: each keeps one channel per server for its lifetime.
_executor_clients: dict[tuple[str, float, bytes | None, str | None], Client] = {}


def _executor_client(
    target: str, timeout: float, root_certificates: bytes | None, token: str | None
) -> Client:
    key = (target, timeout, root_certificates, token)
    if key not in _executor_clients:
        _executor_clients[key] = Client(target, timeout, root_certificates, token)
    return _executor_clients[key]


def _partition_of(source: str, name: str) -> int | None:
    prefix = f"{source}/p"
    tail = name[len(prefix) :]
    return int(tail) if name.startswith(prefix) and tail.isdigit() else None


def _to_arrow(batch_df: Any) -> pa.Table:
    to_arrow = getattr(batch_df, "toArrow", None)
    if to_arrow is not None:  # Spark 4.0 and later
        return to_arrow()
    return pa.Table.from_pandas(batch_df.toPandas(), preserve_index=False)


__all__ = ["LowtideDataSource", "LowtideSink", "PartitionSender", "PunctuationMode"]
