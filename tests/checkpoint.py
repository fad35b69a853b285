"""Planned queries behind a door, checkpointed mid-stream: the rig of the snapshot contract.

A :class:`Rig` is one worker process: the door (``lowtide.stream.Stream``: sources, progress,
late tuples; the string pool) feeds queries planned with ``plan_query`` and wired as the engine
wires them (a query reading slices another query feeds subscribes nothing). :meth:`Rig.restored`
is the process after a crash: the same door, every live query planned again in registration order
and restored from the bytes of :meth:`Rig.checkpoint` - plans and shares saved apart, as a worker
saves them. Outputs are kept per query as plain values, so two runs compare exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from harness import Recorder
from planning import Context, plan_query
from strategies import Close, Event, Push, Sources

from lowtide.batch import Batch
from lowtide.clock import ManualClock
from lowtide.operators.result_queue import SlowFlush
from lowtide.punctuation.generators import Generator
from lowtide.punctuation.model import NO_PROGRESS, Punctuation
from lowtide.punctuation.policies import LatePolicy
from lowtide.query import parse_query
from lowtide.query.live_shares import Shares
from lowtide.query.plan import Plan
from lowtide.query.plan_state import (
    restore_plan,
    restore_share,
    saved_share,
    share_key,
    snapshot_plan,
    snapshot_share,
)
from lowtide.schema import Schema, to_arrow_table
from lowtide.snapshot import as_dict, pack, unpack
from lowtide.stream import Stream
from lowtide.strings import StringPool


@dataclass(frozen=True)
class Registration:
    name: str
    sql: str
    late: str = "drop"
    allowed_lateness: int | None = None


@dataclass
class Running:
    registration: Registration
    plan: Plan
    out: Recorder
    late: list[Any] = field(default_factory=list)


def value(x: Any) -> Any:
    """NaN as a string: NaN != NaN would fail an exact comparison of equal outputs."""
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    return [value(y) for y in x] if isinstance(x, list) else x


def rows_of(batch: Batch) -> tuple[Any, ...]:
    """A batch as its column names and rows of plain values."""
    columns = [
        c.to_pylist() if isinstance(c, pa.Array) else np.asarray(c).tolist() for c in batch.columns.values()
    ]
    return (tuple(batch.columns), tuple(tuple(value(x) for x in row) for row in zip(*columns, strict=True)))


def item_of(item: Batch | Punctuation) -> tuple[Any, ...]:
    if isinstance(item, Punctuation):
        return ("punctuation", item.attribute, item.value)
    return ("rows", *rows_of(item))


class Rig:
    def __init__(
        self, schemas: dict[str, dict[str, str]], sources: Sources, flush: SlowFlush | None = None
    ) -> None:
        self.clock = ManualClock()
        self.pool = StringPool()
        self.flush = flush
        self.streams = {
            name: Stream(
                name, Schema.of(schemas[name], "ts"), Generator("explicit"), self.clock, sources[name]
            )
            for name in sources
        }
        self.shares = Shares()
        self.queries: dict[str, Running] = {}

    # -- queries ------------------------------------------------------------------------------------
    def register(self, registration: Registration, restored: dict[str, Any] | None = None) -> Running:
        """Plan and start a query; ``restored``: its plan state, to plan it again for a restore
        (then it is not caught up with the streams' progress: its state already is)."""
        holder: list[Running] = []

        def on_drop(batch: Batch, fields: Any) -> None:
            holder[0].late.append(("late", *rows_of(batch)))

        policy = LatePolicy.parse(registration.late)
        ctx = Context(
            lambda name: self.streams[name].schema,
            self.pool,
            policy,
            registration.allowed_lateness,
            on_drop,
            self.shares,
            self.flush,
            restored_share=saved_share(restored) if restored is not None else None,
        )
        plan = plan_query(parse_query(registration.sql), ctx)
        running = Running(registration, plan, Recorder())
        holder.append(running)
        plan.output.connect(running.out)
        self.queries[registration.name] = running
        plan.start()
        if self.shares.enter(plan):
            return running  # it reads slices whose input is subscribed already
        for stream_name, op in plan.inputs:
            stream = self.streams[stream_name]
            stream.subscribers.append(op)
            if restored is None and stream.progress > NO_PROGRESS:
                op.punctuate(Punctuation(stream.progress, stream.attribute))
        return running

    def drop(self, name: str) -> None:
        running = self.queries.pop(name)
        self.shares.leave(running.plan)
        for stream_name, op in running.plan.inputs:
            if not any(op is other for q in self.queries.values() for _, other in q.plan.inputs):
                self.streams[stream_name].subscribers.remove(op)

    # -- data ---------------------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        stream = self.streams[event.stream]
        if isinstance(event, Push):
            names = stream.schema.names
            batch = stream.admit(to_arrow_table({c: [r[c] for r in event.rows] for c in names}), self.pool)
            stream.ingest(batch, stream.late_mask(batch), event.source)
        elif isinstance(event, Close):
            stream.close(event.source)
        else:
            stream.punctuate(event.source, event.value)

    def drain(self) -> dict[str, list[Any]]:
        """What each query emitted (results, punctuation, late tuples) since the last drain, and
        the windows (join tuples, ...) its operators hold open now: state beyond the output."""
        out = {}
        for name, running in self.queries.items():
            held = ("open windows", [op.open_windows() for op in running.plan.operators])
            out[name] = [item_of(item) for item in running.out.items] + running.late + [held]
            running.out.clear()
            running.late = []
        return out

    # -- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self) -> bytes:
        """Every plan and every share, snapshot at this point, as a worker would write them."""
        plans = {name: snapshot_plan(q.plan) for name, q in self.queries.items()}
        shares = {share_key(share): snapshot_share(share) for share in self.shares}
        return pack({"plans": plans, "shares": shares})

    def restored(self, data: bytes) -> Rig:
        """The process after a crash: this rig's door, its queries planned again and restored."""
        state = as_dict(unpack(data), "checkpoint")
        plans, shares = as_dict(state["plans"], "plans"), as_dict(state["shares"], "shares")
        new = Rig.__new__(Rig)
        new.clock, new.pool, new.flush, new.streams = self.clock, self.pool, self.flush, self.streams
        new.shares, new.queries = Shares(), {}
        for stream in self.streams.values():
            stream.subscribers.clear()  # the old process is gone
        for name, running in self.queries.items():
            new.register(running.registration, as_dict(plans[name], name))
        for name, running in new.queries.items():
            restore_plan(running.plan, plans[name])
        for share in new.shares:
            restore_share(share, shares[share_key(share)])
        assert len(list(new.shares)) == len(shares)
        return new
