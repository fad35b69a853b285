"""Query outputs: engine batches become Arrow tables and punctuation items for ``poll``.

The sink is the last operator of every query graph. It keeps what the query emitted, in order,
until polled: a ``pyarrow.Table`` per result batch, then a :class:`Punctuation` when output progress
rises. It also feeds the query's result stream, which later queries may read by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.handles import Item
from lowtide.operators.base import Operator
from lowtide.punctuation.model import Punctuation
from lowtide.schema import ColumnType
from lowtide.strings import StringPool

Fields: TypeAlias = tuple[tuple[str, ColumnType], ...]


def to_table(batch: Batch, fields: Fields, pool: StringPool) -> pa.Table:
    """Engine columns to Arrow: string codes decoded, timestamps typed, NaN floats as nulls."""
    arrays = []
    for name, kind in fields:
        values: Any = batch.columns[name]
        if isinstance(values, pa.Array | pa.ChunkedArray):
            arrays.append(values)
        elif kind.is_string:
            arrays.append(pool.decode(np.asarray(values, dtype=np.int64)))
        elif kind.name == "float64":
            arrays.append(pa.array(np.asarray(values, dtype=np.float64), from_pandas=True))
        else:
            arrays.append(pa.array(np.asarray(values, dtype=kind.dtype)).cast(kind.arrow))
    return pa.Table.from_arrays(arrays, names=[name for name, _ in fields])


class Sink(Operator):
    """Collects a query's output items; forwards batches and punctuation to its result stream."""

    label = "Sink"

    def __init__(
        self,
        fields: Fields,
        pool: StringPool,
        attributes: tuple[str, ...],
        forward: Callable[[Batch], None] | None = None,
        forward_punctuation: Callable[[Punctuation], None] | None = None,
        keeps: bool = True,
    ) -> None:
        """``keeps``: hold the items for a poll (a derived table's only go to its result stream)."""
        super().__init__()
        self.keeps = keeps
        self.fields = fields
        self.pool = pool
        self.attributes = attributes
        self.items: list[Item] = []
        self.forward = forward
        self.forward_punctuation = forward_punctuation
        self.results = 0
        self.ended = False  # a query without progressing columns has passed on its end

    def describe(self) -> str:
        return f"Sink ({', '.join(name for name, _ in self.fields)})"

    def process(self, batch: Batch, port: int = 0) -> None:
        if batch.n == 0:
            return
        self.tuples_in += batch.n
        self.results += batch.n
        if self.keeps:
            self.items.append(to_table(batch, self.fields, self.pool))
        if self.forward is not None:
            self.forward(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute not in self.attributes:
            # Rows without a progressing column (a join's pairs projected without its times) have
            # no punctuation, but still an end: the first end-of-stream on any input attribute
            # (after a join, on either side, it comes once both inputs ended).
            if not self.attributes and punctuation.is_end and not self.ended:
                self.ended = True
                self.items.append(punctuation)
                if self.forward_punctuation is not None:  # ends the late side stream too
                    self.forward_punctuation(punctuation)
            return
        if self.keeps:
            self.items.append(punctuation)
        if self.forward_punctuation is not None:
            self.forward_punctuation(punctuation)

    def drain(self) -> list[Item]:
        items, self.items = self.items, []
        return items
