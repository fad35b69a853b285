"""The in-process engine: the door (:mod:`lowtide.door`) with every graph run in this process.

The same calls and items as the network client, minus the network (docs/design.md, "Interfaces"):
streams, queries, ``push``, ``punctuate``, ``poll`` and the rest are the door's (see
:class:`~lowtide.door.Door` for what each guarantees); the queries' operator graphs run in a
:class:`~lowtide.local_runner.LocalRunner`.
"""

from __future__ import annotations

from lowtide.clock import Clock
from lowtide.door import DEFAULT_SOURCE, Door, Limits
from lowtide.handles import Query
from lowtide.local_runner import LocalRunner
from lowtide.operators.result_queue import SlowFlush
from lowtide.query.description import PlanOptions
from lowtide.strings import StringPool


class Engine(Door[LocalRunner]):
    def __init__(
        self,
        clock: Clock | None = None,
        limits: Limits | None = None,
        flush: SlowFlush | None = None,
        *,
        share_slices: bool = PlanOptions.share_slices,
        paned_min_overlap: int = PlanOptions.paned_min_overlap,
    ) -> None:
        """``flush``: smooth emission (§8.3.3) for the time windows of every query; None: each
        window's results leave as soon as punctuation completes it. ``share_slices``: sliding
        queries on one stream fed alike read one set of slices (False: each keeps its own);
        ``paned_min_overlap``: sliding windows overlapping at least this much (RANGE / SLIDE) run
        as Paned-WID. Both change how fast queries run, never what they emit."""
        pool = StringPool()
        super().__init__(
            LocalRunner(pool),
            pool,
            clock,
            limits,
            flush,
            share_slices=share_slices,
            paned_min_overlap=paned_min_overlap,
        )


__all__ = ["DEFAULT_SOURCE", "Engine", "Limits", "Query", "SlowFlush"]
