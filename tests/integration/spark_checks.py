"""What the Spark tests check lowtide's results against: Spark's own windows over the same files;
and the one local SparkSession they share (:class:`Sessions`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from lowtide import END_OF_STREAM, Punctuation
from lowtide.clients import Client
from lowtide.clients.demos.spark import (
    SCHEMA,
    WINDOWS,
    Window,
    local_session,
    lowtide_windows,
    spark_windows,
    window_sql,
)
from lowtide.clients.spark import LowtideDataSource

ROWS = 20_000  # per packet file
DELAY = "watermark:5 seconds"  # the packet files overlap by 3 s: nothing is late
WAIT = 300.0  # for a Spark query to finish


def setup(client: Client, fresh: Callable[[str], str]) -> tuple[str, dict[str, str]]:
    """A packet stream and, per window of WINDOWS, a query on it: (stream, {window: query})."""
    stream = fresh("Packets")
    client.create_stream(stream, SCHEMA, progressing="ts")
    queries = {w: client.register_query(window_sql(stream, *WINDOWS[w]), name=fresh(w)) for w in WINDOWS}
    return stream, queries


def windows_of(client: Client, query: str) -> Counter[Window]:
    """Every result row the query emitted (from the oldest retained), up to its end of stream."""
    tables: list[pa.Table] = []
    for item in client.subscribe(query, from_oldest=True):
        if isinstance(item, Punctuation):
            if item.value >= END_OF_STREAM:
                break
        else:
            tables.append(item)
    return lowtide_windows(tables)


def assert_exact(client: Client, spark: Any, folder: Path, queries: dict[str, str]) -> None:
    for window, query in queries.items():
        expected = spark_windows(spark, folder, *WINDOWS[window])
        found = windows_of(client, query)
        assert max(found.values()) == 1, f"{window}: a window was emitted twice"
        assert found == expected, f"{window}: lowtide's windows differ from Spark's"


def stream_info(client: Client, stream: str) -> dict[str, Any]:
    return next(s for s in client.list_streams() if s["name"] == stream)


class Sessions:
    """The test session's local SparkSession, with ``format("lowtide")`` registered, shared by
    every Spark test (they run on one xdist worker: group ``spark``). A JVM holds one SparkContext
    at a time, and each new one starts Spark's Python daemons afresh: it is made again only for
    other ``task_attempts`` (the writer's tests retry a failed task, the others must not)."""

    def __init__(self) -> None:
        self.current: Any = None
        self.task_attempts = 0

    def get(self, task_attempts: int = 1) -> Any:
        if self.current is None or task_attempts != self.task_attempts:
            self.stop()
            self.current = local_session("lowtide-tests", task_attempts=task_attempts)
            self.current.dataSource.register(LowtideDataSource)
            self.task_attempts = task_attempts
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
