"""Which tuples behind punctuation are late for a query, compiled from its description.

A tuple below its stream's published progress is late for a query only where the query's window
operator can no longer count it (docs/design.md, "Punctuation and lateness"). Under ``late = error``
the door rejects a batch holding such a tuple before any operator sees it, so the rule must be known
there: each input's :data:`~lowtide.query.description.LateJudge` (the window or join window that
counts its tuples, the streams whose minimum progress it is judged at, the WHERE before it) compiles
into a :data:`~lowtide.operators.input.LateRule`. Invariant: a rule answers exactly what the
operator's own ``late_mask`` answers at the same punctuation: it asks the same function - the
window's logic, ``late_for`` (:mod:`lowtide.operators.window_logic`), or the join's
:func:`~lowtide.operators.oa_join.late_mask_of`.

The Input of shared slices takes the rule of the query that started them; the queries joining
later read through that Input. Slices are shared under ``drop`` only, where a rule says just that
tuples behind punctuation travel on: its mask is asked under ``error`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.input import LateRule
from lowtide.operators.oa_join import late_mask_of
from lowtide.operators.select import passing
from lowtide.operators.window_logic import logic_of
from lowtide.query.description import JoinJudge, LateJudge, PlanDescription, Where, WindowJudge
from lowtide.query.expr import compile_conjuncts
from lowtide.strings import StringPool

Mask = npt.NDArray[np.bool_]


def late_rules(description: PlanDescription, pool: StringPool) -> tuple[LateRule | None, ...]:
    """Each input's late rule, in the order of ``description.inputs`` (None: every tuple behind
    punctuation is late at the Input)."""
    return tuple(None if i.judge is None else late_rule(i.judge, pool) for i in description.inputs)


def late_rule(judge: LateJudge, pool: StringPool) -> LateRule:
    """The rule ``judge`` describes; ``pool`` codes the string literals of its WHERE."""
    kept = _where(judge.where, pool)
    if isinstance(judge, WindowJudge):
        logic, streams = logic_of(judge.window), judge.streams

        def late(batch: Batch, progress: Mapping[str, int]) -> Mask:
            return logic.late_for(batch, min(progress[s] for s in streams))

    else:
        join: JoinJudge = judge

        def late(batch: Batch, progress: Mapping[str, int]) -> Mask:
            bounds = [min(progress[s] for s in names) for names in join.streams]
            return late_mask_of(join.window, join.side, np.asarray(batch.columns[join.ts], np.int64), bounds)

    if kept is None:
        return late

    def filtered(batch: Batch, progress: Mapping[str, int]) -> Mask:
        mask = late(batch, progress)
        return mask & kept(batch) if mask.any() else mask  # a tuple the WHERE drops is late for none

    return filtered


def _where(where: Where | None, pool: StringPool) -> Callable[[Batch], Mask] | None:
    if where is None:
        return None
    predicates = [fn for fn, _ in compile_conjuncts(where.conjuncts, where.scope, pool)]

    def kept(batch: Batch) -> Mask:
        return passing(predicates, batch)

    return kept


__all__ = ["late_rule", "late_rules"]
