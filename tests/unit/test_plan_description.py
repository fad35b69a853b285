"""A query is planned once, into a PlanDescription that travels: what the door and a runner need.

Every thesis query's description survives a pickle round trip unchanged, and the plan built from
the unpickled copy - with another process's string pool - runs a disordered input (batches out of
order, punctuation, tuples behind it) exactly as the plan built in place: the same rows, the same
punctuation, the same late tuples. The late rules the door compiles from a description answer as
the built Inputs do. The share index the door keeps, entered and left per description, is the
live registry's view of its slices.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from checkpoint import rows_of
from harness import Recorder
from planning import Context, plan_query
from thesis import packet_schema, thesis_queries

from lowtide.batch import Batch
from lowtide.clock import ManualClock
from lowtide.errors import UnsupportedQuery
from lowtide.punctuation.generators import Generator
from lowtide.punctuation.model import END_OF_STREAM
from lowtide.punctuation.policies import LatePolicy
from lowtide.query import parse_query
from lowtide.query.build import BuildContext, build
from lowtide.query.describe import describe
from lowtide.query.description import PlanDescription, PlanOptions
from lowtide.query.late_rules import late_rules
from lowtide.query.live_shares import Shares
from lowtide.query.plan import Plan
from lowtide.query.sharing import ShareIndex
from lowtide.schema import Schema, to_arrow_table
from lowtide.stream import Stream
from lowtide.strings import StringPool

THESIS = sorted(thesis_queries().items())


def schema_of(name: str) -> Schema:
    return Schema.of(packet_schema(name), "ts")


def streams_of(description: PlanDescription) -> list[str]:
    return sorted({i.stream for i in description.inputs})


def packets(stream: str, seed: int) -> list[dict[str, Any]]:
    """40 packets over 30 s, in a shuffled order."""
    rng = np.random.default_rng(seed)
    rows = [
        {
            "srcIP": str(rng.choice(["a", "b", "c"])),
            "srcPort": int(rng.integers(1, 3)),
            "destIP": str(rng.choice(["a", "b"])),
            "destPort": int(rng.integers(1, 3)),
            "len": int(rng.integers(40, 1500)),
            "ts": int(rng.integers(0, 30)) * 1000,
            "flags": str(rng.choice(["SYN", "SYN_ACK", "ACK"])),
        }
        for _ in range(40)
    ]
    names = schema_of(stream).names
    return [{c: row[c] for c in names} for row in rows]


class Door:
    """Streams and a string pool feeding one plan, as the engine wires them."""

    def __init__(self, names: list[str]) -> None:
        self.pool = StringPool()
        clock = ManualClock()
        self.streams = {n: Stream(n, schema_of(n), Generator("explicit"), clock, ("s",)) for n in names}
        self.late: list[Any] = []

    def on_drop(self, batch: Batch, fields: Any) -> None:
        self.late.append(("late", *rows_of(batch)))

    def attach(self, plan: Plan) -> Recorder:
        out = Recorder()
        plan.output.connect(out)
        plan.start()
        for name, op in plan.inputs:
            self.streams[name].subscribers.append(op)
        return out

    def run(self, seed: int) -> list[Any]:
        """Push each stream's packets in batches of 6, punctuating after each batch below what is
        still to come - except twice, ahead of it, so that later tuples are behind punctuation."""
        for k, (name, stream) in enumerate(self.streams.items()):
            rows = packets(name, seed + k)
            for i in range(0, len(rows), 6):
                batch = rows[i : i + 6]
                admitted = stream.admit(
                    to_arrow_table({c: [r[c] for r in batch] for c in batch[0]}), self.pool
                )
                stream.ingest(admitted, stream.late_mask(admitted), "s")
                rest = [r["ts"] for r in rows[i + 6 :]]
                ahead = i in (12, 24)
                value = max(rest) if ahead and rest else min(rest, default=END_OF_STREAM)
                if value > stream.progress:
                    stream.punctuate("s", value)
        for stream in self.streams.values():
            stream.close("s")
        return self.late


def run_built(sql: str, seed: int, pickled: bool) -> tuple[list[Any], list[Any]]:
    parsed = parse_query(sql)
    description = describe(parsed, schema_of, PlanOptions(LatePolicy.DROP))
    door = Door(streams_of(description))
    if pickled:
        description = pickle.loads(pickle.dumps(description))
        plan = build(description, BuildContext(door.pool, door.on_drop))
    else:
        ctx = Context(schema_of, door.pool, LatePolicy.DROP, None, door.on_drop)
        plan = plan_query(parsed, ctx)
    out = door.attach(plan)
    late = door.run(seed)
    return [rows_of(i) if isinstance(i, Batch) else i for i in out.items], late


@pytest.mark.parametrize(("label", "sql"), THESIS)
def test_every_thesis_description_pickles_and_builds_a_plan_that_runs_the_same(label: str, sql: str) -> None:
    for policy in (LatePolicy.DROP, LatePolicy.ERROR):
        description = describe(parse_query(sql), schema_of, PlanOptions(policy))
        assert pickle.loads(pickle.dumps(description)) == description
    for seed in (1, 2):
        in_place, late = run_built(sql, seed, pickled=False)
        travelled, late_again = run_built(sql, seed, pickled=True)
        assert travelled == in_place and late_again == late
        assert any(not isinstance(item, tuple) for item in in_place)  # punctuation came out at least


@pytest.mark.parametrize(("label", "sql"), THESIS)
def test_the_door_compiles_the_late_rules_the_built_inputs_use(label: str, sql: str) -> None:
    parsed = parse_query(sql)
    pool = StringPool()
    plan = plan_query(parsed, Context(schema_of, pool, LatePolicy.ERROR, None, lambda b, f: None))
    door_pool = StringPool()  # the door's own: the same strings, the same codes
    rules = late_rules(pickle.loads(pickle.dumps(plan.description)), door_pool)
    assert [r is None for r in rules] == [op.late_rule is None for _, op in plan.inputs]
    for (stream, op), rule in zip(plan.inputs, rules, strict=True):
        if rule is None or op.late_rule is None:
            continue
        rows = packets(stream, 7)
        columns = {c: [r[c] for r in rows] for c in rows[0]}
        batch = Stream(stream, schema_of(stream), Generator("explicit"), ManualClock(), ("s",)).admit(
            to_arrow_table(columns), pool
        )
        door_batch = Stream(stream, schema_of(stream), Generator("explicit"), ManualClock(), ("s",)).admit(
            to_arrow_table(columns), door_pool
        )
        for low in range(0, 32_000, 3_000):
            progress = {s: low + 1000 * k for k, s in enumerate(streams_of(plan.description))}
            assert rule(door_batch, progress).tolist() == op.late_rule(batch, progress).tolist()


def test_describe_refuses_what_planning_refuses_and_builds_nothing() -> None:
    schemas = {"A": Schema.of({"k": "string", "v": "int64", "ts": "int64"}, "ts")}
    with pytest.raises(UnsupportedQuery, match="strings can only be compared"):
        describe(
            parse_query("SELECT count(*) [RANGE 4, WA ts] FROM A WHERE k > 'x'"),
            schemas.__getitem__,
            PlanOptions(),
        )
    pool = StringPool()
    sql = "SELECT count(*) AS n [RANGE 4, WA ts] FROM A WHERE k = 'only-here'"
    description = describe(parse_query(sql), schemas.__getitem__, PlanOptions())
    assert len(pool) == 0  # the literal is coded by whoever builds, with its own pool
    build(description, BuildContext(pool, lambda b, f: None))
    assert len(pool) == 1 and pool.values(pool.entries()) == ["only-here"]


def test_the_share_index_the_door_keeps_is_the_live_registrys() -> None:
    """Queries registered and dropped: the index entered and left per description equals the
    index read off the live slices, and so describes each next query alike."""
    schema = Schema.of({"k": "int64", "v": "int64", "ts": "int64"}, "ts")
    sqls = [
        "SELECT k, count(*) AS n [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k",
        "SELECT k, sum(v) AS s [RANGE 8, SLIDE 2, WA ts] FROM A GROUP BY k",
        "SELECT k, sum(v) AS s [RANGE 12, SLIDE 3, WA ts] FROM A GROUP BY k",
        "SELECT k, sum(v) AS s [RANGE 24, SLIDE 6, WA ts] FROM A GROUP BY k",
        "SELECT k, max(v) AS m [RANGE 24, SLIDE 6, WA ts] FROM A WHERE v > 1 GROUP BY k",
    ]
    live, door = Shares(), ShareIndex()
    plans: dict[int, Plan] = {}

    def register(i: int) -> None:
        described = describe(parse_query(sqls[i]), lambda name: schema, PlanOptions(), door)
        ctx = Context(lambda name: schema, StringPool(), LatePolicy.DROP, None, lambda b, f: None, live)
        plan = plan_query(parse_query(sqls[i]), ctx)
        assert plan.description == described
        plan.start()
        live.enter(plan)
        door.enter(described.share)
        plans[i] = plan

    def drop(i: int) -> None:
        plan = plans.pop(i)
        live.leave(plan)
        door.leave(plan.description.share)

    for i in range(len(sqls)):
        register(i)
        assert door.readers() == live.index().readers()
    assert sorted(door.readers().values()) == [1, 1, 3]  # slices of 2 read by three queries
    for i in (0, 2, 1, 3):
        drop(i)
        assert door.readers() == live.index().readers()
    register(0)  # the slices of 2 went with their last reader: it starts them again
    assert door.readers() == live.index().readers() and plans[0].description.share is not None
    assert not plans[0].description.share.joins
