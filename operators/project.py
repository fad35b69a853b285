"""Project/Apply: computes the output columns of each tuple.

Stateless; punctuation on a column that is projected under a new name is renamed with it (the
output promises the same bound on that column), other punctuation passes through. Its state is
only what every operator keeps (``Operator.STATE``). Placement: any split by row position; its
rows are new (computed columns), so keys needed after it cannot be traced to the stream - unless
it keeps its input (``keeps_input``: every input column, with the computed ones added, as before
an aggregate of expressions), whose rows are the input's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.punctuation.model import Punctuation

Columns = Mapping[str, npt.NDArray[Any]]


class Project(Operator):
    label = "Project"

    def __init__(
        self, outputs: dict[str, Callable[[Columns], Any]], renames: dict[str, str], keeps_input: bool = False
    ) -> None:
        super().__init__()
        self.expressions = outputs
        self.renames = renames  # input column -> output name, for columns passed through as they are
        self.keeps_input = keeps_input

    def describe(self) -> str:
        return f"Project {'*, ' if self.keeps_input else ''}{', '.join(self.expressions)}"

    def placement(self) -> Placement:
        return self.placement_for(self.keeps_input)

    @staticmethod
    def placement_for(keeps_input: bool = False) -> Placement:
        return Placement.by_row(passes_rows=keeps_input)  # else new rows: computed columns

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        columns = {name: _column(fn(batch.columns), batch.n) for name, fn in self.expressions.items()}
        self.emit(Batch({**batch.columns, **columns} if self.keeps_input else columns, batch.n, batch.late))

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        attribute = self.renames.get(punctuation.attribute, punctuation.attribute)
        self.emit_punctuation(Punctuation(punctuation.value, attribute))


def _column(values: Any, n: int) -> Any:
    """``values`` as a column of ``n`` rows: a constant repeated; an Arrow array (an aggregate's
    heavy hitters, a list per row) passed on as it is."""
    return values if isinstance(values, pa.Array) else np.broadcast_to(np.asarray(values), (n,))
