"""Checkpoints of planned queries: the state of a plan's operators, and of the slices plans share.

A worker checkpoints between two calls (no batch half processed): one :func:`snapshot_plan` per
query, one :func:`snapshot_share` per share (``for share in shares``, each under its
:func:`share_key`), every part taken at that same point, then :func:`~lowtide.snapshot.pack`.
A share's operators (Input, [Select], Bucket, Shared Slices) outlive the query that started them,
so they are saved with the share and not with any plan; a plan's snapshot covers the rest of its
graph (:func:`owned_operators`) and names the share it reads.

To restore, a fresh process plans the queries again in their registration order, each with
``PlanOptions(restored_share=saved_share(state))`` so that it reads the slices it read before (it
joins them, or starts them with their width when their first reader is gone), starts them as
usual, then calls :func:`restore_plan` for each plan and :func:`restore_share` for each share
(in any order). From then on every plan emits exactly what it would have emitted had the
process never stopped: the same rows in the same order, the same punctuation. The door - the
streams' sources and progress, and the string pool - is not operator state: the process that
owns it restores it to the same point.

    plan state:  {"share": share_key | None, "operators": [{"operator": label, "state": ...}]}
    share state: {"share": share_key, "operators": [{"operator": label, "state": ...}]}
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.errors import CorruptState
from lowtide.operators.base import Operator
from lowtide.query.live_shares import Share, share_key
from lowtide.query.plan import Plan
from lowtide.snapshot import State, as_list, as_str, fields


def owned_operators(plan: Plan) -> list[Operator]:
    """The operators of ``plan`` that its snapshot covers: all but its share's."""
    shared = plan.share.operators if plan.share is not None else []
    return [op for op in plan.operators if not any(op is other for other in shared)]


def snapshot_plan(plan: Plan) -> State:
    """The state of the operators ``plan`` owns, and the share it reads (None: none)."""
    share = share_key(plan.share) if plan.share is not None else None
    return {"share": share, "operators": _snapshot(owned_operators(plan))}


def restore_plan(plan: Plan, state: State) -> None:
    """Put ``plan``, planned again and started, where :func:`snapshot_plan` took ``state``.
    Raises ``CorruptState`` if ``state`` is another plan's (the plan is then partly restored:
    plan it afresh)."""
    found = fields(state, ("share", "operators"), "plan")
    want = share_key(plan.share) if plan.share is not None else None
    if found["share"] != want:
        raise CorruptState(
            f"the plan reads the slices {want!r}, its state was saved reading {found['share']!r}: "
            "plan it with PlanOptions(restored_share=saved_share(state))"
        )
    _restore(owned_operators(plan), found["operators"], "plan")


def saved_share(state: State) -> str | None:
    """The :func:`share_key` of the slices the plan of ``state`` read (None: none), for the
    ``restored_share`` of the PlanOptions it is planned again with."""
    share = fields(state, ("share", "operators"), "plan")["share"]
    return None if share is None else as_str(share, "plan.share")


def snapshot_share(share: Share) -> State:
    """The state of the operators feeding a share's slices, and the slices."""
    return {"share": share_key(share), "operators": _snapshot(share.operators)}


def restore_share(share: Share, state: State) -> None:
    """Put ``share`` where :func:`snapshot_share` took ``state`` (``share_key`` must match)."""
    found = fields(state, ("share", "operators"), "share")
    if found["share"] != share_key(share):
        raise CorruptState(f"state of the slices {found['share']!r} restored into {share_key(share)!r}")
    _restore(share.operators, found["operators"], f"share {share_key(share)}")


def _snapshot(operators: Sequence[Operator]) -> State:
    return [{"operator": op.label, "state": op.snapshot()} for op in operators]


def _restore(operators: Sequence[Operator], state: State, where: str) -> None:
    saved = as_list(state, f"{where}.operators")
    if len(saved) != len(operators):
        raise CorruptState(f"state of the {where} holds {len(saved)} operators, it has {len(operators)}")
    for i, (op, part) in enumerate(zip(operators, saved, strict=True)):
        found = fields(part, ("operator", "state"), f"{where}.operators[{i}]")
        label = as_str(found["operator"], f"{where}.operators[{i}].operator")
        if label != op.label:
            raise CorruptState(f"operator {i} of the {where} is a {op.label}, its state a {label[:40]}'s")
        op.restore(found["state"])


__all__ = [
    "owned_operators",
    "restore_plan",
    "restore_share",
    "saved_share",
    "share_key",
    "snapshot_plan",
    "snapshot_share",
]
