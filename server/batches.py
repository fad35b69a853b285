"""Exactly-once batches: which batch ids a source has applied, and batches sent in parts.

A producer may tag a batch with an id; the server applies each ``(stream, source, batch_id)`` once
and acknowledges a replay without applying it again (Spark's ``foreachBatch`` replays a micro-batch
after a restart). A batch too large for one message travels as ``batch_parts`` consecutive
messages with the same id and is applied only once every part has arrived, all parts together:
a call that ends early leaves nothing of that batch behind.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.door import Epoch
from lowtide.errors import InvalidArgument, ResourceExhausted


class AppliedBatches:
    """The ids applied for one source, kept as disjoint runs ``[lo, hi]``.

    Ids that count up (Spark's batch ids do) stay a single run, so the memory is bounded by the
    number of gaps, not by the length of the stream.
    """

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []

    def __contains__(self, batch_id: int) -> bool:
        k = bisect_right(self._lo, batch_id) - 1
        return k >= 0 and batch_id <= self._hi[k]

    @property
    def runs(self) -> int:
        return len(self._lo)

    def as_runs(self) -> tuple[list[int], list[int]]:
        """The runs' first and last ids (a checkpoint keeps them)."""
        return list(self._lo), list(self._hi)

    @staticmethod
    def from_runs(lo: list[int], hi: list[int]) -> AppliedBatches:
        ids = AppliedBatches()
        ids._lo, ids._hi = list(lo), list(hi)
        return ids

    def add(self, batch_id: int) -> None:
        if batch_id in self:
            return
        k = bisect_right(self._lo, batch_id)  # runs before k start at or below batch_id
        joins_left = k > 0 and self._hi[k - 1] == batch_id - 1
        joins_right = k < len(self._lo) and self._lo[k] == batch_id + 1
        if joins_left and joins_right:
            self._hi[k - 1] = self._hi[k]
            del self._lo[k], self._hi[k]
        elif joins_left:
            self._hi[k - 1] = batch_id
        elif joins_right:
            self._lo[k] = batch_id
        else:
            self._lo.insert(k, batch_id)
            self._hi.insert(k, batch_id)


class PartialBatch:
    """The parts of one multi-part batch received so far on one Ingest call, admitted (checked
    and coded) as they arrive and applied together once the last is in."""

    def __init__(self, batch_id: int, parts: int, duplicate: bool, epoch: Epoch | None = None) -> None:
        if parts > 1 and not batch_id:
            raise InvalidArgument("a batch in several parts needs a batch_id")
        self.batch_id = batch_id
        self.parts = parts
        self.duplicate = duplicate  # applied before: its parts are counted, never decoded
        self.received = 0
        self.admitted: list[Batch] = []
        self.payloads: list[bytes] = []  # each part's Arrow IPC stream, for the input log
        # The door's as the first part was admitted (see Front.submit_batch).
        self.epoch = epoch if epoch is not None else Epoch()
        self.began = time.perf_counter()  # the first part's arrival
        self.held = 0  # bytes of its parts charged to the server's PendingBytes

    def check(self, batch_id: int, parts: int) -> None:
        """The next message must be the next part of this batch."""
        if batch_id != self.batch_id or parts != self.parts:
            raise InvalidArgument(self.cut_short())

    def take(self, admitted: Batch | None) -> bool:
        """Add the next part (None for a duplicate's); True once the batch is whole."""
        self.received += 1
        if admitted is not None:
            self.admitted.append(admitted)
        return self.received == self.parts

    def cut_short(self) -> str:
        return (
            f"batch {self.batch_id} ended after {self.received} of its {self.parts} parts; "
            "nothing of it was applied"
        )


def admitted_bytes(admitted: Batch, payload: bytes) -> int:
    """The memory an admitted part keeps beyond its Arrow ``payload``: the buffers of its columns
    (numpy or Arrow) that lie outside it (a converted column, codes). Arrow reads the payload in
    place, so a column that is a view of it (most numeric columns, a string column kept as
    Arrow) costs nothing more; a buffer two columns share counts once."""
    start = pa.py_buffer(payload).address
    outside: dict[int, int] = {}
    for column in admitted.columns.values():
        for address, size in _buffers(column):
            if not start <= address < start + len(payload):
                outside[address] = max(size, outside.get(address, 0))
    return sum(outside.values())


def _buffers(column: Any) -> Iterator[tuple[int, int]]:
    """The ``(address, size)`` of each memory block an engine column (numpy, or Arrow) uses."""
    if isinstance(column, np.ndarray):
        yield column.ctypes.data, column.nbytes
        return
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    for chunk in chunks:
        dictionary = [chunk.dictionary] if pa.types.is_dictionary(chunk.type) else []
        for array in [chunk, *dictionary]:
            yield from ((b.address, b.size) for b in array.buffers() if b is not None)


class PendingBytes:
    """What every multi-part batch not yet applied holds, summed over all Ingest calls, within
    ``max_pending_bytes``: each part stays in the front's memory until its batch applies, so
    without a bound concurrent calls could hold any amount. A call gives back what its batch
    held when the batch applies or the call ends, however it ends."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def hold(self, batch: PartialBatch, size: int) -> None:
        """Charge ``size`` more bytes to ``batch``, or ResourceExhausted (nothing is charged)."""
        if self.held + size > self.limit:
            raise ResourceExhausted(
                f"batch {batch.batch_id}: part {batch.received + 1} of {batch.parts} would take the bytes "
                f"held for multi-part batches past max_pending_bytes ({self.limit}; {self.held} held by "
                "calls in progress); nothing of it was applied: send smaller batches, or fewer "
                "multi-part batches at once"
            )
        self.held += size
        batch.held += size

    def release(self, batch: PartialBatch) -> None:
        """Give back all ``batch`` holds (once: a second release gives back nothing)."""
        self.held -= batch.held
        batch.held = 0


__all__ = ["AppliedBatches", "PartialBatch", "PendingBytes", "admitted_bytes"]
