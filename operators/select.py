"""Select: keeps the tuples that satisfy a predicate.

Stateless and order-preserving; punctuation passes through unchanged (a filter cannot make
smaller values appear).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.punctuation.model import Punctuation

Predicate = Callable[[Mapping[str, npt.NDArray[Any]]], Any]


class Select(Operator):
    label = "Select"

    def __init__(self, predicate: Predicate, text: str) -> None:
        super().__init__()
        self.predicate = predicate
        self.text = text

    def describe(self) -> str:
        return f"Select {self.text}"

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        keep = np.broadcast_to(np.asarray(self.predicate(batch.columns), dtype=np.bool_), (batch.n,))
        self.emit(batch if keep.all() else batch.select(keep))

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.emit_punctuation(punctuation)
