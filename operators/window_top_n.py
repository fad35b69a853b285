"""Window Top-N: ranks the rows of each window's partitions once punctuation completes the window.

Each row has a *key*, the value punctuation bounds: the input's progressing attribute (a query
result's ``window_end``; its PARTITION BY holds that column or one aligned to it, so the rows of
a partition share one key) or, with ``tumble`` set, the end of the TUMBLE window holding the
row's progressing attribute, which the operator adds as ``window_end``, with ``window_start``.
A partition is the rows of one key with equal PARTITION BY values.

Punctuation contract. On ``Punctuation(p, attribute)`` the keys below ``v`` are complete: ``v =
p``, or with ``tumble`` the end of the window holding ``p`` (a row at or above ``p`` is in that
window or a later one). The rows with a key below ``v`` are ranked within their partition,
emitted in one batch with their rank in column ``output`` (sorted by key, partition and rank), and
dropped; then ``Punctuation(v)`` on the key (``window_end`` with ``tumble``): no later row has a
smaller key. So a row is emitted at most once, never before punctuation covers its window and
always once it does. Punctuation on other attributes is not passed on: rows come out in another
order (TUMBLE holds back rows of the window holding ``p`` that lie below ``p``). No row comes
behind the punctuation already passed: the planner gives the query's Inputs no late rule, so a
tuple behind its stream's punctuation is late at the Input.

Ranks: ``row_number`` numbers a partition's rows 1, 2, 3, ...; ``rank`` is 1 + the rows ordered
strictly before; ``dense_rank`` 1 + the distinct ORDER BY values strictly before. Rows equal in
every ORDER BY column are ordered by their other columns, ascending in input column order (a
string by its code in the engine's dictionary): a window's output depends on its rows alone,
not on their arrival order or batches (rows equal in every column are interchangeable). A
float's NaN (its NULL) is below every number, as Flink orders NULL: first under ASC, last under
DESC; NaNs are equal to one another.
With ``limit`` (the reading query keeps ranks up to it) only the rows whose rank among the rows
held is at most ``limit`` are kept: a row's rank never falls as rows arrive, so a row dropped is
never in the top. Pruning runs when the rows added since the last one reach those it kept (and
``prune_at``), so the rows held per open partition stay below about twice its top (ties of
``rank`` and ``dense_rank`` aside) plus ``prune_at`` in all.

With ``whole`` set the partitions span the whole stream (Flink's Top-N over a stream that
ends, Nexmark q18, q19): no key divides them, only the end of the stream completes them, and
only it is passed on. ``limit`` bounds the rows held as above; without it every row is held.

Placement: by the PARTITION BY columns of the input (a partition's rows meet on one worker); one
worker when all of them are window bounds it adds. Its output rows are its input rows.
Its state: the rows held, as chunks of columns, and how many the last pruning kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.operators.windows import BOUNDS
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.snapshot import DATA, INT, Field, declare

Arr = npt.NDArray[Any]
Columns = dict[str, Arr]
PRUNE_AT = 4096  # rows added before a pruning at the least: pruning sorts every row held


class WindowTopN(Operator):
    label = "Window Top-N"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE, chunks=DATA.at("_chunks"), kept=INT.at("_kept")
    )

    def __init__(
        self,
        function: str,
        partition: tuple[str, ...],
        order: tuple[tuple[str, bool], ...],
        output: str,
        attribute: str,
        limit: int | None = None,
        tumble: int | None = None,
        prune_at: int = PRUNE_AT,
        whole: bool = False,
    ) -> None:
        super().__init__()
        assert function in ("row_number", "rank", "dense_rank"), function
        self.function = function
        self.partition = partition
        self.order = order
        self.output = output
        self.attribute = attribute
        self.limit = limit
        self.tumble = tumble
        self.prune_at = prune_at
        self.key = "window_end" if tumble is not None else attribute
        self.whole = whole
        self._chunks: list[Columns] = []
        self._kept = 0  # rows the last pruning kept

    def describe(self) -> str:
        order = ", ".join(f"{c} DESC" if desc else c for c, desc in self.order)
        tumble = "" if self.tumble is None else f" over TUMBLE {self.tumble} on {self.attribute},"
        limit = "" if self.limit is None else f", keeps ranks <= {self.limit}"
        partition = ", ".join(self.partition) or "stream"
        if self.whole:
            tumble = " over the whole stream, complete at its end,"
        return f"Window Top-N{tumble} {self.function}() per {partition} by {order} as {self.output}{limit}"

    def placement(self) -> Placement:
        return self.placement_for(self.partition, self.tumble)

    @staticmethod
    def placement_for(partition: tuple[str, ...], tumble: int | None) -> Placement:
        """By the PARTITION BY columns the input has; one worker if they are all added bounds."""
        keys = tuple(c for c in partition if tumble is None or c not in BOUNDS)
        return Placement.by_keys(keys, passes_rows=True)

    def state_bytes(self) -> int:
        return sum(column.nbytes for chunk in self._chunks for column in chunk.values())

    def open_windows(self) -> int:
        if self.whole:
            return int(bool(self._chunks))
        return len(np.unique(self._merged()[self.key])) if self._chunks else 0

    # -- input ------------------------------------------------------------------------------
    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if batch.n == 0:
            return
        columns = dict(batch.columns)
        if self.tumble is not None:
            ts = columns[self.attribute].astype(np.int64, copy=False)
            end = ts - ts % self.tumble + self.tumble  # floor modulo: right for negative times too
            columns.update(window_start=end - self.tumble, window_end=end)
        self._chunks.append(columns)
        if self.limit is not None and self._rows() - self._kept >= max(self._kept, self.prune_at):
            merged = self._merged()
            order, ranks = self._ranked(merged)
            self._chunks = [_take(merged, order[ranks <= self.limit])]
            self._kept = self._rows()

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute != self.attribute or punctuation.value == NO_PROGRESS:
            return
        complete = self._complete_below(punctuation.value)
        if complete == NO_PROGRESS:
            return  # whole: nothing completes before the end
        if self._chunks:
            merged = self._merged()
            done = merged[self.key] < complete
            if not done.any():
                self._chunks = [merged]  # one chunk: the next punctuation concatenates less
            else:
                self._chunks = [] if done.all() else [_take(merged, np.flatnonzero(~done))]
                self._kept = min(self._kept, self._rows())
                self._emit_ranked(_take(merged, np.flatnonzero(done)))
        self.emit_progress(complete, self.key)

    def _complete_below(self, value: int) -> int:
        """The keys below it are complete at punctuation ``value`` (see the module)."""
        if self.whole:
            return END_OF_STREAM if value >= END_OF_STREAM else NO_PROGRESS
        if self.tumble is None or value >= END_OF_STREAM:
            return value
        return value - value % self.tumble + self.tumble

    def _emit_ranked(self, rows: Columns) -> None:
        order, ranks = self._ranked(rows)
        if self.limit is not None:
            kept = ranks <= self.limit
            order, ranks = order[kept], ranks[kept]
        out = _take(rows, order)
        out[self.output] = ranks
        self.emit(Batch(out, len(order)))

    # -- ranking ----------------------------------------------------------------------------
    def _ranked(self, rows: Columns) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """The rows in output order (key, partition, ORDER BY, other columns) and their ranks."""
        used = {self.key, *self.partition, *(c for c, _ in self.order)}
        keys = self.partition if self.whole else (self.key, *self.partition)
        partition = [_comparable(rows[c], False) for c in keys]
        values = [_comparable(rows[c], desc) for c, desc in self.order]
        others = [rows[c] for c in rows if c not in used]
        order = np.lexsort([*reversed(others), *reversed(values), *reversed(partition)])
        index = np.arange(len(order))
        new_partition = _starts(partition, order)
        first = np.maximum.accumulate(np.where(new_partition, index, 0))
        if self.function == "row_number":
            return order, (index - first + 1).astype(np.int64)
        new_value = new_partition | _starts(values, order)
        if self.function == "rank":
            return order, (np.maximum.accumulate(np.where(new_value, index, 0)) - first + 1).astype(np.int64)
        seen = np.cumsum(new_value, dtype=np.int64)  # distinct values so far
        return order, seen - np.take(seen, first) + 1

    # -- state ------------------------------------------------------------------------------
    def _rows(self) -> int:
        return sum(len(chunk[self.key]) for chunk in self._chunks)

    def _merged(self) -> Columns:
        if len(self._chunks) == 1:
            return self._chunks[0]
        names = self._chunks[0].keys()
        return {name: np.concatenate([chunk[name] for chunk in self._chunks]) for name in names}


def _take(columns: Columns, index: npt.NDArray[np.intp]) -> Columns:
    return {name: values[index] for name, values in columns.items()}


def _comparable(values: Arr, descending: bool) -> Arr:
    """``values`` as sort keys: as they are, or their ranks among the distinct values, negated
    for DESC (an int64 cannot be negated safely); a float's NaNs are one value, below all."""
    floats = values.dtype.kind == "f"
    if not descending and not floats:
        return values
    codes = np.unique(values, return_inverse=True)[1].reshape(-1)
    if floats:
        codes = np.where(np.isnan(values), -1, codes)
    return -codes if descending else codes


def _starts(keys: Sequence[Arr], order: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """Where, in ``order``, a row differs from the one before it in some key (the first does)."""
    starts = np.zeros(len(order), np.bool_)
    if len(order):
        starts[0] = True
    for key in keys:
        ordered = key[order]
        starts[1:] |= ordered[1:] != ordered[:-1]
    return starts


__all__ = ["PRUNE_AT", "WindowTopN"]
