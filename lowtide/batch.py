"""A batch: equal-length numpy columns, the unit every operator consumes and produces."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Column = npt.NDArray[Any]


@dataclass
class Batch:
    """Columns by name, all of length ``n``.

    ``late`` marks tuples behind their stream's published progress: the query's window operator
    counts them in its windows not yet emitted (docs/design.md, "Punctuation and lateness") or,
    under ``update``, revises its windows.
    """

    columns: dict[str, Column]
    n: int
    late: bool = field(default=False)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> Column:
        return self.columns[name]

    def select(self, index: npt.NDArray[Any]) -> Batch:
        """Rows by boolean mask or integer index, in that order."""
        columns = {name: values[index] for name, values in self.columns.items()}
        n = int(index.sum()) if index.dtype == np.bool_ else len(index)
        return Batch(columns, n, self.late)

    def with_columns(self, extra: Mapping[str, Column]) -> Batch:
        return Batch({**self.columns, **extra}, self.n, self.late)

    def renamed(self, names: Mapping[str, str]) -> Batch:
        return Batch({names.get(k, k): v for k, v in self.columns.items()}, self.n, self.late)

    @staticmethod
    def concat(batches: Iterable[Batch]) -> Batch:
        parts = [b for b in batches if b.n]
        if not parts:
            raise ValueError("no rows to concatenate")
        if len(parts) == 1:
            return parts[0]
        names = parts[0].columns.keys()
        columns = {name: np.concatenate([b.columns[name] for b in parts]) for name in names}
        return Batch(columns, sum(b.n for b in parts), parts[0].late)
