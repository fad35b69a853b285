"""Select: keeps the tuples that satisfy every conjunct of a predicate.

Stateless and order-preserving; punctuation passes through unchanged (a filter cannot make
smaller values appear).

The conjuncts of a WHERE run one after another, each only on the rows the ones before kept, in
the order that does the least work: ascending ``cost / (1 - selectivity)`` (the classic rank for
independent filters), with cost per row and selectivity measured on the batches seen. The order
is re-ranked every ``RERANK`` batches, so it follows data whose selectivities drift. That order
and the measurements are its state. Placement: any split by row position; its rows pass on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.errors import CorruptState
from lowtide.operators.base import Operator
from lowtide.operators.placement import Placement
from lowtide.punctuation.model import Punctuation
from lowtide.snapshot import INT, Field, Keep, State, as_array, declare, fields

Predicate = Callable[[Mapping[str, npt.NDArray[Any]]], Any]
RERANK = 16  # batches between re-rankings
_DECAY = 0.5  # weight of the measurements before a re-ranking


@dataclass
class Conjunct:
    predicate: Predicate
    text: str
    position: int  # its place in the WHERE as written
    rows_in: float = 0.0
    rows_out: float = 0.0
    seconds: float = 0.0

    def rank(self) -> float:
        """Expected cost per row over the fraction of rows it removes (unmeasured: first)."""
        if self.rows_in == 0:
            return -1.0
        dropped = 1.0 - self.rows_out / self.rows_in
        return (self.seconds / self.rows_in) / max(dropped, 1e-9)


class _Rows(Mapping[str, npt.NDArray[Any]]):
    """The columns of a batch at the rows ``index``, gathered only for the columns read."""

    def __init__(self, columns: Mapping[str, npt.NDArray[Any]], index: npt.NDArray[np.int64]) -> None:
        self._columns = columns
        self._index = index
        self._gathered: dict[str, npt.NDArray[Any]] = {}

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        if name not in self._gathered:
            self._gathered[name] = self._columns[name][self._index]
        return self._gathered[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


class _Ranking(Keep):
    """The conjuncts in their current order (as places in the WHERE) and their measurements."""

    _MEASURED = ("rows_in", "rows_out", "seconds")

    def save(self, value: Any) -> State:
        measured: dict[str, State] = {
            name: np.array([getattr(c, name) for c in value], np.float64) for name in self._MEASURED
        }
        return {"order": np.array([c.position for c in value], np.int64), **measured}

    def load(self, fresh: Any, state: State, where: str) -> Any:
        found = fields(state, ("order", *self._MEASURED), where)
        order = as_array(found["order"], f"{where}.order", np.int64, 1).tolist()
        by_position = {c.position: c for c in fresh}
        if sorted(order) != sorted(by_position):
            raise CorruptState(f"state of {where} orders {len(order)} conjuncts, the WHERE has {len(fresh)}")
        ranked = [by_position[i] for i in order]
        for name in self._MEASURED:
            values = as_array(found[name], f"{where}.{name}", np.float64, 1).tolist()
            if len(values) != len(ranked):
                raise CorruptState(
                    f"state of {where}.{name} measures {len(values)} conjuncts, not {len(ranked)}"
                )
            for conjunct, measured in zip(ranked, values, strict=True):
                setattr(conjunct, name, measured)
        return ranked


def passing(predicates: Sequence[Predicate], batch: Batch) -> npt.NDArray[np.bool_]:
    """Which tuples of ``batch`` satisfy every one of ``predicates`` (no operator, no measurement:
    the door's late rules ask this of a WHERE, lowtide.query.late_rules)."""
    keep = np.ones(batch.n, np.bool_)
    for predicate in predicates:
        keep &= np.broadcast_to(np.asarray(predicate(batch.columns), dtype=np.bool_), (batch.n,))
    return keep


class Select(Operator):
    label = "Select"
    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(
        Operator.STATE, conjuncts=_Ranking(), batches=INT.at("_batches")
    )

    def __init__(self, conjuncts: list[tuple[Predicate, str]]) -> None:
        super().__init__()
        self.conjuncts = [Conjunct(predicate, text, i) for i, (predicate, text) in enumerate(conjuncts)]
        self._batches = 0

    def placement(self) -> Placement:
        return self.placement_for()

    @staticmethod
    def placement_for() -> Placement:
        return Placement.by_row(passes_rows=True)

    def describe(self) -> str:
        order = " AND ".join(c.text for c in self.conjuncts)
        return f"Select {order}" + (
            " (conjuncts ordered by measured selectivity)" if len(self.conjuncts) > 1 else ""
        )

    def process(self, batch: Batch, port: int = 0) -> None:
        self.tuples_in += batch.n
        if len(self.conjuncts) == 1:
            keep = self._evaluate(self.conjuncts[0], batch.columns, batch.n)
            self.emit(batch if keep.all() else batch.select(keep))
            return
        index = np.arange(batch.n, dtype=np.int64)
        for conjunct in self.conjuncts:
            if index.shape[0] == 0:
                break
            rows = batch.columns if index.shape[0] == batch.n else _Rows(batch.columns, index)
            index = index[self._evaluate(conjunct, rows, index.shape[0])]
        self.emit(batch if index.shape[0] == batch.n else batch.select(index))
        self._batches += 1
        if self._batches % RERANK == 0:
            self._rerank()

    def _evaluate(
        self, conjunct: Conjunct, rows: Mapping[str, npt.NDArray[Any]], n: int
    ) -> npt.NDArray[np.bool_]:
        began = time.perf_counter()
        keep = np.broadcast_to(np.asarray(conjunct.predicate(rows), dtype=np.bool_), (n,))
        conjunct.seconds += time.perf_counter() - began
        conjunct.rows_in += n
        conjunct.rows_out += int(np.count_nonzero(keep))
        return keep

    def _rerank(self) -> None:
        self.conjuncts.sort(key=Conjunct.rank)
        for c in self.conjuncts:  # older batches count less: the order follows drifting data
            c.rows_in, c.rows_out, c.seconds = c.rows_in * _DECAY, c.rows_out * _DECAY, c.seconds * _DECAY

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.emit_punctuation(punctuation)
