"""Meld of one query's workers, in an order that replay reproduces.

The front hands every input message of a query (a batch piece, empty pieces included, or a
punctuation) to each of the query's workers; each worker answers a message with what it emitted
for it, then an *epoch* marker. The output of a worker is a function of its input, but the order
in which the workers' outputs reach the front is not. So the meld waits until every worker has
answered the same message, then releases that epoch: the result rows of all workers as one
table (workers in index order), the late tuples as one table, then the output punctuation, the
minimum over the workers (as :class:`~lowtide.operators.meld.Meld` computes it).

Invariant: a query's output item sequence depends only on its input messages, never on process
timing: after a recovery replays the same input, item ``k`` holds the same rows as before. Rows
leave no later than the epoch of the message that made them (a batch's own epoch for stateless
queries; the releasing punctuation's epoch for windows), so melding adds no wait for punctuation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.meld import Meld
from lowtide.punctuation.model import Punctuation

_EPOCH = object()  # ends a worker's answer to one input message


def concat(batches: list[Batch]) -> Batch:
    """Result batches of one schema as one; heavy-hitter columns are Arrow lists."""
    if len(batches) == 1:
        return batches[0]
    columns: dict[str, Any] = {}
    for name, first in batches[0].columns.items():
        parts = [b.columns[name] for b in batches]
        if isinstance(first, pa.Array | pa.ChunkedArray):
            columns[name] = pa.concat_arrays(
                [p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in parts]
            )
        else:
            columns[name] = np.concatenate(parts)
    return Batch(columns, sum(b.n for b in batches), batches[0].late)


class OrderedMeld:
    """Per worker (port) a queue of its answers; epochs are released when every port has one."""

    def __init__(self, workers: int, downstream: Operator, on_late: Callable[[pa.Table, int], None]) -> None:
        self.meld = Meld(workers)  # output punctuation: min over workers, never repeated
        self.meld.connect(downstream)
        self.on_late = on_late
        self._queues: list[deque[object]] = [deque() for _ in range(workers)]
        self._epochs = [0] * workers  # epoch markers queued per port

    @property
    def low_watermark(self) -> int:
        return self.meld.low_watermark

    def result(self, port: int, batch: Batch) -> None:
        self._queues[port].append(batch)

    def punctuation(self, port: int, punctuation: Punctuation) -> None:
        self._queues[port].append(punctuation)

    def late(self, port: int, table: pa.Table) -> None:
        self._queues[port].append(table)

    def epoch(self, port: int) -> None:
        self._queues[port].append(_EPOCH)
        self._epochs[port] += 1
        while all(self._epochs):
            self._release()

    def _release(self) -> None:
        results: list[Batch] = []
        late: list[pa.Table] = []
        punctuation: list[tuple[int, Punctuation]] = []
        for port, queue in enumerate(self._queues):
            while (entry := queue.popleft()) is not _EPOCH:
                if isinstance(entry, Batch):
                    results.append(entry)
                elif isinstance(entry, Punctuation):
                    punctuation.append((port, entry))
                else:
                    assert isinstance(entry, pa.Table)
                    late.append(entry)
            self._epochs[port] -= 1
        if results:
            self.meld.process(concat(results))
        if late:
            table = pa.concat_tables(late)
            self.on_late(table, table.num_rows)
        for port, p in punctuation:
            self.meld.punctuate(p, port)
