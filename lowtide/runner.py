"""The seam between the door and what runs operator graphs: the :class:`Runner` protocol.

The door (:mod:`lowtide.door`) owns streams, sources, progress, the string pool, the late check,
the query catalog and the order changes apply in; a runner owns the operator graphs. The door
plans a query once, into a :class:`~lowtide.query.description.PlanDescription`, then hands the
runner a :class:`PlannedQuery`: that description (the runner builds its operators from it, where
they run) and the query's output ends (the sink for results and output punctuation, the late side
stream, its failure). The runner answers with what each input stream of the query feeds; the door delivers
batches and punctuation there, in its order, and nothing else reaches a graph.

Invariant: every runner delivers a query's output into its ends in an order that depends only on
the input the door delivered (never on timing), so a replay of the same input reproduces it.
Runners: :class:`~lowtide.local_runner.LocalRunner` (this process) and the server's
``ProcessRunner`` (worker processes behind a transport).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lowtide.errors import ResourceExhausted
from lowtide.operators.input import Input
from lowtide.query.description import PlanDescription
from lowtide.results import Sink

Subscribers = list[tuple[str, Input]]  # (input stream, what it feeds), in the plan's input order


@dataclass(frozen=True)
class PlannedQuery:
    """One query as the door planned it, and where its output goes."""

    name: str
    description: PlanDescription  # what to build: operators, late rules, the slices it shares
    results_read: frozenset[str]  # the input streams that are other queries' results
    sink: Sink  # result rows and output punctuation
    on_late: Callable[[pa.Table, int], None]  # late tuples into the late side stream
    fail: Callable[[ResourceExhausted], None]  # a limit failed it while it ran, in this process
    # The columns its on-time tuples need, by name in any input (None: all): the columns it names
    # and each input stream's progressing one. A runner may leave the others out of what it moves.
    reads: frozenset[str] | None = None


class Runner(Protocol):
    """What the door asks of whatever runs the operator graphs (see the module)."""

    def check(self, description: PlanDescription) -> None:
        """Raise `~lowtide.errors.UnsupportedQuery` if a query planned so cannot run here (the
        door asks as it plans, before anything changes)."""
        ...

    def register(self, query: PlannedQuery) -> Subscribers:
        """Run ``query``; what each of its input streams feeds. A query that reads shared slices
        gets what feeds them (the door subscribes nothing new for it)."""
        ...

    def drop(self, name: str) -> None:
        """Stop running a query and release what it holds."""
        ...

    def emit_early(self, name: str) -> None:
        """The query's EMIT EVERY timer fired: its open windows' current rows, final = false."""
        ...

    def strings_released(self, codes: npt.NDArray[np.int64]) -> None:
        """The door's string pool freed ``codes`` (a dropped stream held them)."""
        ...

    def placement(self, description: PlanDescription) -> str:
        """What ``explain`` adds about where a query planned so runs ("": nothing to add)."""
        ...

    def operators(self, name: str) -> list[tuple[str, int, int]]:
        """The query's operators, from input to output: (label, tuples in, tuples out)."""
        ...

    def open_windows(self, name: str) -> int: ...

    def state_bytes(self, name: str) -> int: ...


__all__ = ["PlannedQuery", "Runner", "Subscribers"]
