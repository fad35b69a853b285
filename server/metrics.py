"""Prometheus metrics of the server, as text on ``--metrics-port`` (docs/design.md, "Metrics").

The front process owns every metric: workers report their counters to the front, which hands them
to :class:`ServerMetrics` as a *snapshot* read at scrape time. There is no multiprocess mode and no
file to clean up. Each :class:`ServerMetrics` has its own ``CollectorRegistry`` (nothing lands in
prometheus_client's global registry), and every name starts with ``lowtide_``.

Observed by the server as things happen (histograms in seconds, counters):

``lowtide_ingest_batch_seconds{stream}``              histogram: time to admit one ingested batch
``lowtide_ingest_batch_tuples{stream}``               histogram: tuples per ingested batch
``lowtide_punctuation_to_result_seconds{query}``      histogram: from the input punctuation that
                                                      closes a window to its result leaving the
                                                      server (the dissertation's latency metric);
                                                      buckets from 0.5 ms to 10 s
``lowtide_worker_restarts_total{worker}``             counter: worker processes restarted
``lowtide_checkpoint_seconds``                        histogram: from a checkpoint's barrier to its
                                                      manifest written (``_count``: checkpoints
                                                      taken; ``--state-dir`` only)
``lowtide_checkpoint_pause_seconds``                  histogram: how long a worker stopped
                                                      processing for a checkpoint (one per worker
                                                      per checkpoint)
``lowtide_checkpoint_bytes``                          gauge: bytes on disk of the last checkpoint

(prometheus_client also exposes each of these with a ``_created`` gauge: its creation time.)

Read from the snapshot at scrape time:

``lowtide_ingested_tuples_total{stream}``             counter: tuples accepted on the stream
``lowtide_behind_punctuation_tuples_total{stream}``   counter: tuples that arrived below the
                                                      stream's published progress (behind
                                                      punctuation, not all late:
                                                      docs/design.md, "Punctuation and lateness")
``lowtide_late_tuples_total{stream}``                 counter: the same count, under its name
                                                      from before behind and late were told apart
``lowtide_low_watermark{stream}``                     gauge: the stream's progress (punctuation),
                                                      in its progressing attribute's units
``lowtide_query_late_tuples_total{query}``            counter: late tuples the query dropped:
                                                      those it could not count in some window
``lowtide_query_low_watermark{query}``                gauge: the query's output punctuation
``lowtide_open_windows{query}``                       gauge: windows holding state
``lowtide_state_bytes{query}``                        gauge: bytes of window state
``lowtide_query_status{query,status}``                gauge: 1 for the query's status (``running``,
                                                      ``recovering``, ``aborted``: ListQueries
                                                      says why), 0 for the other two
``lowtide_operator_tuples_in_total{query,operator}``  counter: tuples into one operator of the query
``lowtide_operator_tuples_out_total{query,operator}`` counter: tuples out of it
``lowtide_reader_lag_items{query,reader}``            gauge: the query's items past what the reader
                                                      last committed (CommitOffset: Spark's
                                                      ``format("lowtide")`` reader's commit)
``lowtide_string_pool_entries{process}``              gauge: strings the string pool holds, in the
                                                      front (``process="front"``) and in each
                                                      worker's mirror (``"worker <n>"``, as of its
                                                      last statistics, once a second)
``lowtide_worker_info{worker,node}``                  gauge: 1 for each worker, labelled with the
                                                      address of the node it runs on (``localhost``
                                                      for a local process); a worker placed again
                                                      elsewhere shows only its new node
``lowtide_staged_bytes``                              gauge: Arrow bytes of the parts staged for
                                                      batches not yet committed (Stage, Spark's
                                                      ``format("lowtide")`` writer)
``lowtide_staged_parts``                              gauge: those parts
``lowtide_staged_parts_expired_total``                counter: parts dropped uncommitted after
                                                      ``staging_timeout_s``
``lowtide_pending_batch_bytes``                       gauge: bytes the parts of multi-part Ingest
                                                      batches not yet applied hold (received Arrow
                                                      and admitted columns; ``max_pending_bytes``)
``lowtide_subscriber_sending_bytes``                  gauge: bytes of the result messages being
                                                      sent to subscribers
                                                      (``max_subscriber_bytes_total``)
``lowtide_snapshot_errors_total``                     counter: scrapes whose snapshot call raised
                                                      (the snapshot series are then left out)

A low watermark is left out while it is ``NO_PROGRESS`` (nothing promised yet) and reported as
``+Inf`` once it reaches ``END_OF_STREAM`` (every source closed). The ``operator`` label is the
operator's position in the query's graph and its name, ``"<index>:<label>"`` (``"2:WID Aggregate"``),
as ``lowtide query explain`` numbers them.

Snapshot shape (plain dicts and tuples; see :func:`snapshot_from_engine_stats` for the in-process
engine's ``Engine.stats()``)::

    {"streams": {name: {"low_watermark": int, "ingested": int, "behind": int, "late": int}},
     "queries": {name: {"low_watermark": int, "late": int, "open_windows": int, "state_bytes": int,
                        "operators": [(index, label, tuples_in, tuples_out), ...],
                        "readers": {reader: lag},     (optional)
                        "status": str}},              (optional: the server's queries)
     "strings": {process: int},   (optional)
     "workers": {index: node},    (optional)
     "staged": {"bytes": int, "parts": int, "expired": int},  (optional)
     "held": {"pending": int, "sending": int}}  (optional)

The snapshot function is called on the exposition's HTTP thread: it must be safe to call from
there (for instance, return a copy the front's event loop keeps up to date).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS

Snapshot = dict[str, Any]

PREFIX = "lowtide_"
# 0.5 ms .. 10 s: a window's result should follow its closing punctuation within milliseconds.
PUNCTUATION_TO_RESULT_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
INGEST_BATCH_BUCKETS = (0.0001, 0.00025, *PUNCTUATION_TO_RESULT_BUCKETS)
INGEST_BATCH_TUPLE_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)
CHECKPOINT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CHECKPOINT_PAUSE_BUCKETS = (0.0001, 0.00025, *PUNCTUATION_TO_RESULT_BUCKETS)
QUERY_STATUSES = ("running", "recovering", "aborted")  # every one has a series: alerts see 0 -> 1

log = logging.getLogger(__name__)


def watermark_value(value: int) -> float | None:
    """A low watermark as a sample value: ``None`` (no series) before progress, +Inf at the end."""
    if value <= NO_PROGRESS:
        return None
    if value >= END_OF_STREAM:
        return math.inf
    return float(value)


def operator_label(index: int, label: str) -> str:
    return f"{index}:{label}"


class SnapshotCollector(Collector):
    """Turns the snapshot function's answer into metric families, at each scrape."""

    def __init__(self) -> None:
        self.snapshot: Callable[[], Snapshot] | None = None
        self.errors = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        source = self.snapshot
        families: list[Metric] = []
        if source is not None:
            try:
                families = self._families(source())
            except Exception:  # a broken snapshot must not take the histograms down with it
                log.exception("metrics snapshot failed; its series are left out of this scrape")
                with self._lock:
                    self.errors += 1
        yield from families
        errors = CounterMetricFamily(
            PREFIX + "snapshot_errors",
            "Scrapes whose snapshot of the server's counters failed.",
        )
        errors.add_metric([], self.errors)
        yield errors

    @staticmethod
    def _families(snapshot: Mapping[str, Any]) -> list[Metric]:
        ingested = CounterMetricFamily(
            PREFIX + "ingested_tuples", "Tuples ingested per stream.", labels=["stream"]
        )
        late = CounterMetricFamily(
            PREFIX + "late_tuples",
            "Tuples that arrived below the stream's published progress.",
            labels=["stream"],
        )
        behind = CounterMetricFamily(
            PREFIX + "behind_punctuation_tuples",
            "Tuples that arrived below the stream's published progress (counted where still open).",
            labels=["stream"],
        )
        watermark = GaugeMetricFamily(
            PREFIX + "low_watermark",
            "Current low watermark (punctuation) per stream, in its progressing attribute's units; "
            "+Inf once every source closed.",
            labels=["stream"],
        )
        for name, stream in sorted(snapshot.get("streams", {}).items()):
            ingested.add_metric([name], stream["ingested"])
            late.add_metric([name], stream["late"])
            behind.add_metric([name], stream.get("behind", stream["late"]))
            value = watermark_value(int(stream["low_watermark"]))
            if value is not None:
                watermark.add_metric([name], value)

        query_late = CounterMetricFamily(
            PREFIX + "query_late_tuples", "Late tuples dropped per query.", labels=["query"]
        )
        query_watermark = GaugeMetricFamily(
            PREFIX + "query_low_watermark",
            "Current low watermark (output punctuation) per query; +Inf once its inputs ended.",
            labels=["query"],
        )
        open_windows = GaugeMetricFamily(
            PREFIX + "open_windows", "Windows holding state per query.", labels=["query"]
        )
        state_bytes = GaugeMetricFamily(
            PREFIX + "state_bytes", "Bytes of window state per query.", labels=["query"]
        )
        tuples_in = CounterMetricFamily(
            PREFIX + "operator_tuples_in",
            "Tuples into each operator of a query.",
            labels=["query", "operator"],
        )
        tuples_out = CounterMetricFamily(
            PREFIX + "operator_tuples_out",
            "Tuples out of each operator of a query.",
            labels=["query", "operator"],
        )
        reader_lag = GaugeMetricFamily(
            PREFIX + "reader_lag_items",
            "Items of a query emitted past a reader's committed offset (CommitOffset).",
            labels=["query", "reader"],
        )
        status = GaugeMetricFamily(
            PREFIX + "query_status",
            "1 for the query's status (running, recovering, aborted), 0 for the others.",
            labels=["query", "status"],
        )
        for name, query in sorted(snapshot.get("queries", {}).items()):
            if "status" in query:
                for each in QUERY_STATUSES:
                    status.add_metric([name, each], 1 if each == query["status"] else 0)
            for reader, lag in sorted(query.get("readers", {}).items()):
                reader_lag.add_metric([name, reader], lag)
            query_late.add_metric([name], query["late"])
            value = watermark_value(int(query["low_watermark"]))
            if value is not None:
                query_watermark.add_metric([name], value)
            open_windows.add_metric([name], query["open_windows"])
            state_bytes.add_metric([name], query["state_bytes"])
            for index, label, n_in, n_out in query.get("operators", ()):
                operator = operator_label(int(index), str(label))
                tuples_in.add_metric([name, operator], n_in)
                tuples_out.add_metric([name, operator], n_out)
        strings = GaugeMetricFamily(
            PREFIX + "string_pool_entries",
            "Strings the string pool holds, in the front and in each worker's mirror.",
            labels=["process"],
        )
        for process, entries in sorted(snapshot.get("strings", {}).items()):
            strings.add_metric([process], entries)
        workers = GaugeMetricFamily(
            PREFIX + "worker_info", "1 for each worker, on the node it runs on.", labels=["worker", "node"]
        )
        for worker, node in sorted(snapshot.get("workers", {}).items()):
            workers.add_metric([str(worker), node], 1)
        staged = snapshot.get("staged", {"bytes": 0, "parts": 0, "expired": 0})
        staged_bytes = GaugeMetricFamily(
            PREFIX + "staged_bytes", "Arrow bytes of the parts staged for batches not yet committed."
        )
        staged_bytes.add_metric([], staged["bytes"])
        staged_parts = GaugeMetricFamily(PREFIX + "staged_parts", "Parts staged, not yet committed.")
        staged_parts.add_metric([], staged["parts"])
        expired = CounterMetricFamily(
            PREFIX + "staged_parts_expired", "Staged parts dropped uncommitted after staging_timeout_s."
        )
        expired.add_metric([], staged["expired"])
        held = snapshot.get("held", {"pending": 0, "sending": 0})
        pending = GaugeMetricFamily(
            PREFIX + "pending_batch_bytes", "Bytes held by the parts of multi-part batches not yet applied."
        )
        pending.add_metric([], held["pending"])
        sending = GaugeMetricFamily(
            PREFIX + "subscriber_sending_bytes", "Bytes of the result messages being sent to subscribers."
        )
        sending.add_metric([], held["sending"])
        return [
            ingested,
            behind,
            late,
            watermark,
            query_late,
            query_watermark,
            open_windows,
            state_bytes,
            tuples_in,
            tuples_out,
            reader_lag,
            status,
            strings,
            workers,
            staged_bytes,
            staged_parts,
            expired,
            pending,
            sending,
        ]


class ServerMetrics:
    """Every metric of one server, in its own registry, and their HTTP exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._ingest_seconds = Histogram(
            PREFIX + "ingest_batch_seconds",
            "Time to admit one ingested batch, per stream.",
            ["stream"],
            registry=self.registry,
            buckets=INGEST_BATCH_BUCKETS,
        )
        self._ingest_tuples = Histogram(
            PREFIX + "ingest_batch_tuples",
            "Tuples per ingested batch, per stream.",
            ["stream"],
            registry=self.registry,
            buckets=INGEST_BATCH_TUPLE_BUCKETS,
        )
        self._punctuation_to_result = Histogram(
            PREFIX + "punctuation_to_result_seconds",
            "From the punctuation that closes a window to its result leaving the server, per query.",
            ["query"],
            registry=self.registry,
            buckets=PUNCTUATION_TO_RESULT_BUCKETS,
        )
        self._worker_restarts = Counter(
            PREFIX + "worker_restarts",
            "Worker processes restarted.",
            ["worker"],
            registry=self.registry,
        )
        self._checkpoint_seconds = Histogram(
            PREFIX + "checkpoint_seconds",
            "From a checkpoint's barrier to its manifest written.",
            registry=self.registry,
            buckets=CHECKPOINT_BUCKETS,
        )
        self._checkpoint_pause = Histogram(
            PREFIX + "checkpoint_pause_seconds",
            "How long a worker stopped processing for a checkpoint.",
            registry=self.registry,
            buckets=CHECKPOINT_PAUSE_BUCKETS,
        )
        self._checkpoint_bytes = Gauge(
            PREFIX + "checkpoint_bytes", "Bytes on disk of the last checkpoint taken.", registry=self.registry
        )
        self._collector = SnapshotCollector()
        self.registry.register(self._collector)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # -- observed as things happen ----------------------------------------------------------------
    def ingest_batch(self, stream: str, tuples: int, seconds: float) -> None:
        self._ingest_seconds.labels(stream).observe(seconds)
        self._ingest_tuples.labels(stream).observe(tuples)

    def punctuation_to_result(self, query: str, seconds: float) -> None:
        self._punctuation_to_result.labels(query).observe(seconds)

    def worker_restarted(self, worker: int) -> None:
        self._worker_restarts.labels(str(worker)).inc()

    def checkpoint_taken(self, seconds: float, size: int, pauses: Iterable[float]) -> None:
        self._checkpoint_seconds.observe(seconds)
        self._checkpoint_bytes.set(size)
        for pause in pauses:
            self._checkpoint_pause.observe(pause)

    def forget(self, *, stream: str | None = None, query: str | None = None) -> None:
        """Drop the histogram series of a dropped stream or query (snapshot series go by themselves)."""
        for histogram, name in (
            (self._ingest_seconds, stream),
            (self._ingest_tuples, stream),
            (self._punctuation_to_result, query),
        ):
            if name is not None:
                histogram.remove(name)

    # -- read at scrape time ----------------------------------------------------------------------
    def set_snapshot(self, snapshot: Callable[[], Snapshot]) -> None:
        """Use ``snapshot()`` (called on the HTTP thread, at each scrape) for the counters and gauges."""
        self._collector.snapshot = snapshot

    # -- exposition -------------------------------------------------------------------------------
    def serve(self, host: str, port: int) -> int:
        """Serve the Prometheus text format on ``host:port`` (0: a free port); returns the bound port."""
        if self._server is not None:
            raise RuntimeError("metrics are already served")
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server, self._thread = server, thread
        return int(server.server_address[1])

    @property
    def port(self) -> int | None:
        return int(self._server.server_address[1]) if self._server is not None else None

    def close(self) -> None:
        """Stop the exposition (if served); idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


def snapshot_from_engine_stats(stats: Mapping[str, Any]) -> Snapshot:
    """The snapshot of an in-process :class:`~lowtide.engine.Engine` from its ``stats()``.

    A query's result stream appears in ``stats()["streams"]`` under the query's name: its progress
    is the query's low watermark, and it is not reported again as a stream.
    """
    streams: Mapping[str, Mapping[str, Any]] = stats.get("streams", {})
    queries: Mapping[str, Mapping[str, Any]] = stats.get("queries", {})
    return {
        "streams": {
            name: {
                "low_watermark": int(s["low_watermark"]),
                "ingested": int(s["ingested"]),
                "behind": int(s.get("behind", s["late"])),
                "late": int(s["late"]),
            }
            for name, s in streams.items()
            if name not in queries
        },
        "queries": {
            name: {
                "low_watermark": int(streams.get(name, {}).get("low_watermark", NO_PROGRESS)),
                "late": int(q.get("late", 0)),
                "open_windows": int(q.get("open_windows", 0)),
                "state_bytes": int(q.get("state_bytes", 0)),
                "operators": [
                    (index, str(op["operator"]), int(op["in"]), int(op["out"]))
                    for index, op in enumerate(q.get("operators", ()))
                ],
            }
            for name, q in queries.items()
        },
    }


__all__ = [
    "PUNCTUATION_TO_RESULT_BUCKETS",
    "QUERY_STATUSES",
    "ServerMetrics",
    "Snapshot",
    "snapshot_from_engine_stats",
    "watermark_value",
]
