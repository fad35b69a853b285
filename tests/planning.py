"""Plan and build a query at once, in the test's process: :func:`plan_query`.

The product never does both in one call: the door describes a query once and a runner builds
it where it runs. Tests of operators, partitioning and snapshots want the plan at hand. Planning
is two steps (:mod:`lowtide.query.describe`, then :mod:`lowtide.query.build`): the
decisions, into a picklable :class:`~lowtide.query.description.PlanDescription`, and the
operators. :class:`Context` holds what both take from one process that does both: the catalog,
the options, its live slices (whose :meth:`~lowtide.query.live_shares.Shares.index` tells the
description what is shared) and what building needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.windows import WindowLimits
from lowtide.punctuation.policies import LatePolicy
from lowtide.query.ast import QueryTree
from lowtide.query.build import BuildContext, LateSink, build
from lowtide.query.describe import describe
from lowtide.query.description import PlanOptions
from lowtide.query.live_shares import Shares
from lowtide.query.plan import Plan
from lowtide.schema import Schema
from lowtide.strings import StringPool


@dataclass
class Context:
    catalog: Callable[[str], Schema]  # a stream's schema by name; NotFound for an unknown one
    pool: StringPool
    policy: LatePolicy
    allowed_lateness: str | int | None
    on_drop: LateSink
    shares: Shares | None = None  # where slices to share are found; None: every query has its own
    flush: SlowFlush | None = None  # smooth emission of time windows; None: all at punctuation
    # Planning a query again to restore it: the share_key of the slices it read (plan_state.saved_share).
    restored_share: str | None = None
    windows: WindowLimits = field(
        default_factory=WindowLimits
    )  # windows per tuple and per step (the server's config)

    @property
    def options(self) -> PlanOptions:
        return PlanOptions(self.policy, self.allowed_lateness, self.windows, self.flush, self.restored_share)


def plan_query(query: QueryTree, ctx: Context) -> Plan:
    """Describe ``query`` and build it, in this process."""
    shared = ctx.shares.index() if ctx.shares is not None else None
    description = describe(query, ctx.catalog, ctx.options, shared)
    return build(description, BuildContext(ctx.pool, ctx.on_drop, ctx.shares))


__all__ = ["Context", "plan_query"]
