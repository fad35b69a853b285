"""Bucket (Figure 6-2): tags each tuple with the range of window ids it belongs to.

Output tuples carry ``wid_start`` and ``wid_end`` (int64): the tuple belongs to the windows
``[wid_start, wid_end)`` of its window specification (``wids()`` of chapter 5). Tuples that fall in
no window (SLIDE > RANGE gaps) are not passed on, except for partitioned tuple windows, where the
aggregate counts every row of a partition to know which of its windows are complete.

Punctuation contract: punctuation ``p`` on the windowing attribute becomes ``Punctuation(q, "wid")``
where ``q = first_open(p)``: every window ``< q`` is complete, so no later tuple carries a window
id below ``q``. For tuple windows progress is the arrival count itself: after each batch Bucket
punctuates ``first_open(rows seen)``; only end of stream is taken from upstream. Under the late
policy ``update`` (allowed lateness ``L >= 0``) Bucket also punctuates ``"wid_retain"``: windows
below it end at or before ``p - L`` and may be forgotten. For partitioned tuple windows every
partition progresses on its own; Bucket adds a ``partition`` column (a dense partition id) and the
aggregate tracks each partition's count. Its state: the rows seen, overall and per partition.
Placement: by row position for time windows; tuple windows by their PA columns, or one worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.group_table import GroupTable
from lowtide.operators.placement import Placement
from lowtide.operators.window_logic import logic_of
from lowtide.operators.windows import Landmark, Rows, Sliding, Window
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.snapshot import ARRAY, INT, NESTED, Field, declare

I64 = npt.NDArray[np.int64]


@nb.njit(cache=True, nogil=True)
def rank_in_partition(partition: I64, counts: I64) -> I64:
    """Arrival rank of each tuple within its partition, advancing ``counts`` (mutated).

    partition [n] int64 dense partition ids; counts [n_partitions] int64 tuples seen so far.
    """
    out = np.empty(partition.shape[0], np.int64)
    for i in range(partition.shape[0]):
        p = partition[i]
        out[i] = counts[p]
        counts[p] += 1
    return out


def key_matrix(batch: Batch, columns: tuple[str, ...]) -> I64:
    """Key columns as an int64 matrix ``[n, k]`` (floats by bit pattern, bools as 0/1)."""
    parts = []
    for name in columns:
        values = batch.columns[name]
        if values.dtype == np.float64:
            values = values.view(np.int64)
        parts.append(values.astype(np.int64, copy=False))
    return np.stack(parts, axis=1) if parts else np.zeros((batch.n, 0), dtype=np.int64)


class Bucket(Operator):
    label = "Bucket"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE,
        rows_seen=INT.at("_rows_seen"),
        partitions=NESTED.at("_partitions"),
        partition_counts=ARRAY.at("_partition_counts"),
    )

    def __init__(self, window: Window, allowed_lateness: int | None = None) -> None:
        super().__init__()
        self.window = window
        self.logic = logic_of(window)  # tags with open_for, punctuates close_for
        self.allowed_lateness = allowed_lateness
        self._rows_seen = 0
        self._partitions = GroupTable(len(window.partition)) if isinstance(window, Rows) else None
        self._partition_counts = np.zeros(0, dtype=np.int64)

    def placement(self) -> Placement:
        return self.placement_for(self.window)

    @staticmethod
    def placement_for(window: Window) -> Placement:
        """Tuple windows count rows in arrival order: the rows of a partition on one worker
        (PA), or all of them; time windows tag each tuple on its own. Its rows pass on."""
        if isinstance(window, Rows):
            return Placement.by_keys(window.partition, passes_rows=True)  # no PA: one worker
        return Placement.by_row(passes_rows=True)

    def describe(self) -> str:
        late = (
            f", retains {self.allowed_lateness} past punctuation" if self.allowed_lateness is not None else ""
        )
        return f"Bucket {self.window.describe()}{late}"

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        window = self.window
        extra: dict[str, I64] = {}
        if isinstance(window, Rows):
            if window.partition:
                assert self._partitions is not None
                pid = self._partitions.ids(key_matrix(batch, window.partition))
                if len(self._partitions) > self._partition_counts.shape[0]:
                    grown = np.zeros(
                        max(len(self._partitions), 2 * self._partition_counts.shape[0]), np.int64
                    )
                    grown[: self._partition_counts.shape[0]] = self._partition_counts
                    self._partition_counts = grown
                positions = rank_in_partition(pid, self._partition_counts)
                extra["partition"] = pid
            else:
                positions = np.arange(self._rows_seen, self._rows_seen + batch.n, dtype=np.int64)
            self._rows_seen += batch.n
            start, end = self.logic.open_for(positions)
        else:
            start, end = self.logic.open_for(batch.columns[window.attribute].astype(np.int64, copy=False))
        out = batch.with_columns({"wid_start": start, "wid_end": end, **extra})
        inside = start < end
        if not inside.all() and "partition" not in extra:
            out = out.select(inside)
        self.emit(out)
        if isinstance(window, Rows) and not window.partition:
            self._advance(self.logic.close_for(self._rows_seen), None)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        window = self.window
        if isinstance(window, Rows):
            if punctuation.value >= END_OF_STREAM:
                self._advance(END_OF_STREAM, END_OF_STREAM)
            return
        if punctuation.attribute != window.attribute:
            return
        p = punctuation.value
        retain = None
        if self.allowed_lateness is not None:
            retain = (
                END_OF_STREAM
                if p >= END_OF_STREAM
                else self.logic.close_for(max(NO_PROGRESS, p - self.allowed_lateness))
            )
        self._advance(self.logic.close_for(p), retain)

    def _advance(self, first_open: int, retain: int | None) -> None:
        # Windows are emitted (wid) before they may be forgotten (wid_retain <= wid).
        self.emit_progress(first_open, "wid")
        if retain is not None:
            self.emit_progress(retain, "wid_retain")

    def state_bytes(self) -> int:
        return self._partitions.nbytes() + int(self._partition_counts.nbytes) if self._partitions else 0


__all__ = ["Bucket", "Landmark", "Rows", "Sliding", "key_matrix"]
