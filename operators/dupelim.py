"""DupElim: passes the first occurrence of each distinct tuple, whatever the arrival order.

The distinct tuples include the progressing attribute, so punctuation ``p`` purges every seen
tuple with a smaller value: no duplicate of it can arrive any more. State is bounded by the tuples
at or above the punctuation. Punctuation passes through unchanged. Its state: the tuples seen.
Placement: one worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.bucket import key_matrix
from lowtide.operators.group_table import GroupTable
from lowtide.operators.placement import ONE_WORKER, Placement
from lowtide.punctuation.model import Punctuation
from lowtide.snapshot import NESTED, Field, declare


class DupElim(Operator):
    label = "DupElim"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(Operator.STATE, seen=NESTED.at("_seen"))

    def __init__(self, columns: tuple[str, ...], attribute: str) -> None:
        super().__init__()
        self.columns = columns
        self.attribute = attribute
        self._seen = GroupTable(len(columns))
        self._at = columns.index(attribute)

    def describe(self) -> str:
        return f"DupElim on {', '.join(self.columns)}"

    def placement(self) -> Placement:
        return self.placement_for()

    @staticmethod
    def placement_for() -> Placement:
        return ONE_WORKER

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        before = len(self._seen)
        ids = self._seen.ids(key_matrix(batch, self.columns))
        new_ids, first = np.unique(ids, return_index=True)
        self.emit(batch.select(np.sort(first[new_ids >= before])))

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        if punctuation.attribute == self.attribute and len(self._seen):
            self._seen.compact(self._seen.keys[:, self._at] >= punctuation.value)
        self.emit_punctuation(punctuation)

    def state_bytes(self) -> int:
        return self._seen.nbytes()
