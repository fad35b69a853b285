"""The snapshot contract: every operator, restored mid-stream into a query planned again, goes on
exactly as if the process had never stopped (as Flink's ``WindowOperatorTest`` snapshots an
operator mid-stream and restores it into a fresh one).

For each operator kind - driven through queries that plan to it - and for every thesis query, a
random delivery (stream contents, arrival order, batch split, punctuation, late tuples, queries
registered and dropped midway) runs twice: uninterrupted, and cut at a random call (sometimes
twice) where every plan and share is snapshot, packed to bytes, unpacked and restored into
freshly planned queries (tests/checkpoint.py). From the cut on, both runs must emit the same
items - result rows, punctuation, late tuples - in the same order, value for value.

``LOWTIDE_SNAPSHOT_EXAMPLES=k`` runs k times as many examples.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from checkpoint import Registration, Rig, item_of
from harness import Recorder
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Spec, Window
from strategies import (
    AGGREGATES,
    COMBINABLE,
    HOLISTIC,
    SCHEMA,
    Close,
    Event,
    Punct,
    Push,
    Sources,
    deliveries,
    examples,
    landmark_windows,
    overlapping_windows,
    row_windows,
    session_windows,
    sizes,
    sliding_windows,
    specs,
    sql_of,
    stream_sources,
    tumbling_windows,
    tuples,
)
from thesis import packet_schema, thesis_queries

import lowtide.operators
from lowtide.batch import Batch
from lowtide.operators.adapt_wid import AdaptWIDAggregate
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.base import Operator
from lowtide.operators.bucket import Bucket
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.windows import Sliding
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.query import FromStream, parse_query
from lowtide.query.plan_state import share_key
from lowtide.schema import FLOAT64, INT64
from lowtide.snapshot import as_list, pack, unpack

pytestmark = pytest.mark.property

SCALE = int(os.environ.get("LOWTIDE_SNAPSHOT_EXAMPLES", "1") or "1")


@dataclass
class Case:
    """Queries (registered at a call, maybe dropped at another) over a delivery of events."""

    sources: Sources
    events: list[Event]
    queries: list[tuple[int, Registration]]
    drops: list[tuple[int, str]] = field(default_factory=list)
    flush: SlowFlush | None = None
    schemas: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.schemas = self.schemas or dict.fromkeys(self.sources, SCHEMA)


def run(case: Case, cuts: set[int]) -> tuple[dict[str, list[tuple[int, Any]]], set[str]]:
    """What each query emitted, with the call it came out of; and the operators planned."""
    rig = Rig(case.schemas, case.sources, case.flush)
    log: dict[str, list[tuple[int, Any]]] = {r.name: [] for _, r in case.queries}
    labels: set[str] = set()
    for call in range(len(case.events) + 1):
        if call in cuts:
            rig = rig.restored(rig.checkpoint())
        for start, registration in case.queries:
            if start == call:
                labels |= {op.label for op in rig.register(registration).plan.operators}
        for at, name in case.drops:
            if at == call and name in rig.queries:
                rig.drop(name)
        if call < len(case.events):
            rig.apply(case.events[call])
        for name, items in rig.drain().items():
            log[name] += [(call, item) for item in items]
    return log, labels


def check_restores(case: Case, data: st.DataObject, expected: set[str]) -> None:
    """The contract: from the first cut on, the restored run emits what the whole run emits."""
    whole, labels = run(case, set())
    assert expected <= labels, f"the queries did not plan to {expected - labels}"
    n = len(case.events)
    cut = data.draw(st.integers(n // 4, n - n // 4) | st.integers(0, n), label="cut")
    again = data.draw(st.none() | st.integers(cut, n), label="cut again")
    restored, _ = run(case, {cut} | ({again} if again is not None else set()))
    rows = 0
    for name, items in whole.items():
        want = [item for call, item in items if call >= cut]
        got = [item for call, item in restored[name] if call >= cut]
        assert got == want, f"{name} after the cut at call {cut}"
        rows += sum(len(item[2]) for item in want if item[0] in ("rows", "late"))
    before = sum(len(e.rows) for e in case.events[:cut] if isinstance(e, Push))
    if case.drops:
        tally(f"a query dropped before the cut: {any(at < cut for at, _ in case.drops)}")
    tally(f"tuples before the cut: {min(before // 10 * 10, 30)}+, rows after it: {min(rows // 10 * 10, 30)}+")


# -- cases, one kind of operator each -------------------------------------------------------------
flushes = st.none() | st.builds(SlowFlush, st.sampled_from([1, 2, 7]), st.integers(0, 3))
few_aggregates = st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3)
holistic = [a for a in AGGREGATES if a.func in HOLISTIC]
# Sliding windows overlapping less than Paned-WID's 4 times (WID, Fused), or more than once (AdaptWID).
few_overlaps = sizes.flatmap(lambda s: st.integers(1, 4 * s - 1).map(lambda r: Window("sliding", s, r)))
overlaps = st.integers(1, 6).flatmap(
    lambda s: st.integers(s + 1, 4 * s + 8).map(lambda r: Window("sliding", s, r))
)


@st.composite
def delivered(draw: Any, sources: Sources, honest: bool = True) -> list[Event]:
    streams = {s: draw(tuples(min_size=10, max_size=40), label=f"tuples {s}") for s in sources}
    events: list[Event] = draw(deliveries(streams, sources, honest=honest), label="events")
    return events


@st.composite
def one_query(
    draw: Any, sql: st.SearchStrategy[str], streams: int = 1, late: str = "drop", honest: bool | None = None
) -> Case:
    """One query from the start; punctuation honest or not (late tuples: the late side stream)."""
    sources = draw(stream_sources(streams, max_sources=2), label="sources")
    lied = draw(st.booleans()) if honest is None else not honest
    lateness = draw(st.sampled_from([None, 0, 3, 10])) if late == "update" else None
    events = draw(delivered(sources, honest=not lied))
    query = Registration("q", draw(sql, label="sql"), late, lateness)
    return Case(sources, events, [(0, query)], flush=draw(flushes, label="flush"))


def aggregate_sql(windows: st.SearchStrategy[Window], aggs: Any = None, streams: int = 1) -> Any:
    names = ["A", "B"][:streams]
    return specs(windows, aggs).map(lambda spec: sql_of(spec, names))


fusable_sql = st.builds(
    lambda key, window, aggs, c: (
        f"SELECT {key}, {', '.join(aggs)} [RANGE {window.range}, SLIDE {window.slide}, WA ts] "
        f"FROM A WHERE v > {c} GROUP BY {key}"
    ),
    st.sampled_from(["k1", "k2"]),
    few_overlaps,
    st.lists(st.sampled_from(["count(*) AS n", "sum(v) AS s", "count(k2) AS c2"]), min_size=1, unique=True),
    st.integers(-5, 10),
)
join_sql = st.one_of(
    st.builds(
        lambda r0, r1, extra: (
            f"SELECT A.k1, A.v, B.k1 AS bk, B.v AS bv, B.ts "
            f"FROM A [RANGE {r0}, WA ts], B [RANGE {r1}, WA ts] WHERE A.k2 = B.k2{extra}"
        ),
        st.integers(1, 8),
        st.integers(1, 8),
        st.sampled_from(["", " AND A.v > 3", " AND A.v < B.v"]),
    ),
    st.builds(
        lambda d: f"SELECT A.k2, A.ts, B.f FROM A, B [RANGE TUMBLING {d}, WA ts] WHERE A.k1 = B.k1",
        st.integers(1, 12),
    ),
    st.builds(  # an until join: bounded by a column of one side (its ends and heap are state)
        lambda x, c, d: (
            f"SELECT A.k2, A.v, B.v AS bv, B.ts FROM A, B WHERE A.k2 = B.k2 "
            f"AND {'AB'[1 - x]}.ts BETWEEN {'AB'[x]}.ts - {c} AND {'AB'[x]}.v + {d}"
        ),
        st.integers(0, 1),
        st.integers(0, 5),
        st.integers(0, 40),
    ),
    st.builds(
        lambda r, s: (
            f"SELECT count(*) AS n, sum(B.v) AS s [RANGE {s}, SLIDE {s}, WA A.ts] "
            f"FROM A [RANGE {r}, WA ts], B [RANGE {r}, WA ts] WHERE A.k2 = B.k2"
        ),
        st.integers(1, 6),
        sizes,
    ),
)
slide_by_tuple_sql = st.builds(
    lambda r, n, sattr, group, aggs: (
        f"SELECT {group}{', ' if group else ''}{', '.join(aggs)} "
        f"[RANGE {r}, RATTR ts, SLIDE {n} rows, SATTR {sattr}] FROM A"
        + (f" GROUP BY {group}" if group else "")
    ),
    st.integers(1, 12),
    st.integers(1, 4),
    st.sampled_from(["row-num", "rank(ts)"]),
    st.sampled_from(["", "k1", "k2"]),
    st.lists(
        st.sampled_from(["count(*) AS n", "sum(v) AS s", "max(f) AS m", "median(v) AS md", "var(f) AS va"]),
        min_size=1,
        unique=True,
    ),
)
flink_session_sql = st.builds(  # sessions that touch merge (Flink's rule)
    lambda gap, key, aggs: (
        f"SELECT {key}{', ' if key else ''}{', '.join(aggs)} "
        f"FROM A GROUP BY SESSION(ts, INTERVAL '{gap}' MILLISECOND){', ' if key else ''}{key}"
    ),
    st.integers(1, 15),
    st.sampled_from(["", "k1", "k2"]),
    st.lists(
        st.sampled_from(["count(*) AS n", "sum(v) AS s", "max(f) AS m", "median(v) AS md"]),
        min_size=1,
        unique=True,
    ),
)
distinct_sql = st.builds(
    lambda cols, where: f"SELECT DISTINCT {cols}, ts FROM A{where}",
    st.sampled_from(["k1", "k2", "k1, k2", "b"]),
    st.sampled_from(["", " WHERE v > 2"]),
)
window_top_n_sql = st.builds(  # one query: the rig plans no derived tables (WHERE r <= n)
    lambda function, size, partition, order: (
        f"SELECT *, {function}() OVER (PARTITION BY {partition} ORDER BY {order}) AS r "
        f"FROM TABLE(TUMBLE(TABLE A, DESCRIPTOR(ts), INTERVAL '{size}' MILLISECOND))"
    ),
    st.sampled_from(["ROW_NUMBER", "RANK", "DENSE_RANK"]),
    st.integers(1, 6),
    st.sampled_from(["window_start, window_end", "window_end, k1"]),
    st.sampled_from(["v DESC", "f, k2 DESC"]),
)
projection_sql = st.builds(
    lambda a, b: (
        f"SELECT k1 AS key, v + 1 AS w, f, ts FROM A UNION B WHERE v > {a} AND k2 != {b} AND k1 != 'c'"
    ),
    st.integers(-5, 10),
    st.integers(-1, 2),
)


@st.composite
def shared_queries(draw: Any) -> Case:
    """Two or three sliding queries reading one set of slices; the first (which feeds them) may
    be dropped midway: then another query feeds them after a restore, at their width."""
    sources = draw(stream_sources(1, max_sources=2), label="sources")
    events = draw(delivered(sources))
    group_by = draw(st.sampled_from([(), ("k1",), ("k2", "k1")]), label="group by")
    windows = st.builds(
        lambda s, k, extra: Window("sliding", s, s * k + extra),
        st.sampled_from([1, 2, 4]),
        st.integers(4, 10),
        st.integers(0, 2),
    )
    aggs = [st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=3)] + [few_aggregates] * 2
    n = draw(st.integers(2, 3), label="queries")
    queries = []
    for i in range(n):
        spec = Spec(
            draw(windows),
            group_by,
            tuple(Agg(a.func, a.column, f"a{j}", a.param) for j, a in enumerate(draw(aggs[i]))),
        )
        start = 0 if i == 0 else draw(st.integers(0, len(events)), label=f"start q{i}")
        queries.append((start, Registration(f"q{i}", sql_of(spec, ["A"]))))
    queries.sort(key=lambda q: q[0])
    drop = draw(st.none() | st.integers(0, len(events)), label="drop q0 at")
    drops = [] if drop is None else [(drop, "q0")]
    return Case(sources, events, queries, drops, flush=draw(flushes, label="flush"))


KINDS: dict[str, tuple[st.SearchStrategy[Case], set[str]]] = {
    "tumbling and landmark WID": (
        one_query(aggregate_sql(st.one_of(tumbling_windows, landmark_windows))),
        {"Input", "Bucket", "WID Aggregate"},
    ),
    "sliding WID, union": (
        one_query(
            aggregate_sql(
                few_overlaps,
                st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=3),
                streams=2,
            ),
            streams=2,
        ),
        {"Meld", "WID Aggregate"},
    ),
    "tuple windows (rows, PA)": (one_query(aggregate_sql(row_windows)), {"Bucket", "WID Aggregate"}),
    "Paned-WID on shared slices": (
        one_query(
            aggregate_sql(overlapping_windows, st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=3))
        ),
        {"Bucket", "Shared Slices", "Paned-WID Aggregate"},
    ),
    "Paned-WID on its own slices (union)": (
        one_query(
            aggregate_sql(
                overlapping_windows, st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=2), streams=2
            ),
            streams=2,
        ),
        {"Meld", "Shared Slices", "Paned-WID Aggregate"},
    ),
    "shared slices, several readers": (shared_queries(), {"Shared Slices", "Paned-WID Aggregate"}),
    "AdaptWID (holistic aggregates)": (
        one_query(
            aggregate_sql(
                overlaps,
                st.tuples(st.sampled_from(holistic), st.lists(st.sampled_from(AGGREGATES), max_size=2)).map(
                    lambda t: [t[0], *t[1]]
                ),
            )
        ),
        {"AdaptWID Aggregate"},
    ),
    "Fused WID": (one_query(fusable_sql), {"Fused WID Aggregate"}),
    "OA-Join": (one_query(join_sql, streams=2), {"OA-Join"}),
    "Slide-by-tuple": (one_query(slide_by_tuple_sql), {"Slide-by-tuple Aggregate"}),
    "DISTINCT": (one_query(distinct_sql), {"Project", "DupElim"}),
    "Window Top-N": (one_query(window_top_n_sql), {"Window Top-N"}),
    "Select, Project, Meld": (one_query(projection_sql, streams=2), {"Select", "Project", "Meld"}),
    "late update (revisions)": (
        one_query(aggregate_sql(st.one_of(tumbling_windows, sliding_windows)), late="update", honest=False),
        {"WID Aggregate"},
    ),
    "sessions (union)": (
        one_query(aggregate_sql(session_windows, streams=2), streams=2),
        {"Meld", "Session Aggregate"},
    ),
    "sessions, late update (revisions, retractions)": (
        one_query(aggregate_sql(session_windows), late="update", honest=False),
        {"Session Aggregate"},
    ),
    "Flink sessions (touching), late update": (
        one_query(flink_session_sql, late="update", honest=False),
        {"Session Aggregate"},
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
@settings(max_examples=examples(25) * SCALE, deadline=None, derandomize=SCALE == 1)
@given(data=st.data())
def test_restored_operators_go_on_exactly(kind: str, data: st.DataObject) -> None:
    cases, expected = KINDS[kind]
    check_restores(data.draw(cases, label="case"), data, expected)


# -- AdaptWID switching, at the operator level -----------------------------------------------------------
# Planned, AdaptWID runs holistic aggregates, whose groups Cond. 6.9 keeps lazy: drawn thresholds
# take groups eager, back to lazy and through transitions, so snapshots hold every mode.
ADAPT_CALLS = (
    AggregateCall(AggFunc.COUNT_STAR, None, None, None, "n"),
    AggregateCall(AggFunc.SUM, "v", INT64, None, "s"),
    AggregateCall(AggFunc.VAR, "f", FLOAT64, None, "va"),
    AggregateCall(AggFunc.MEDIAN, "v", INT64, None, "md"),
    AggregateCall(AggFunc.HEAVY_HITTERS, "v", INT64, 0.3, "hh"),
)


@st.composite
def adapt_steps(draw: Any) -> tuple[Any, list[tuple[list[dict[str, int]], int]]]:
    """Batches with one heavy group and a light tail, each followed by honest punctuation."""
    heavy = draw(st.floats(0.0, 0.9))
    rows = [
        {"k": 0 if draw(st.floats(0, 1)) < heavy else draw(st.integers(1, 9)), "v": draw(st.integers(-5, 20)),
         "f": draw(st.integers(-8, 8)), "ts": draw(st.integers(0, 40))}
        for _ in range(draw(st.integers(10, 60)))
    ]  # fmt: skip
    rows = draw(st.permutations(rows)) if draw(st.booleans()) else sorted(rows, key=lambda r: r["ts"])
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), min_size=3, max_size=10)))
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    steps, low = [], -1
    for i, batch in enumerate(batches):
        rest = [r["ts"] for b in batches[i + 1 :] for r in b]
        low = draw(st.integers(low, max(low, min(rest, default=50))))
        steps.append((batch, low))
    thresholds = st.sampled_from([(0.5, 0.0), (1.0, 3.0), (2.0, 1.0), (None, None), (None, None)])
    return draw(thresholds), [*steps, ([], END_OF_STREAM)]


def adapt_chain(window: Sliding, calls: tuple[AggregateCall, ...], thresholds: Any) -> list[Operator]:
    names = ("window_start", "window_end", "k", *(c.output for c in calls), "revision")
    high, low = thresholds
    ops: list[Operator] = [
        Bucket(window),
        AdaptWIDAggregate(window, ("k",), (INT64,), calls, names, high=high, low=low),
    ]
    ops[0].connect(ops[1]).connect(Recorder())
    return ops


def run_chain(window: Sliding, calls: Any, case: Any, cut: int | None) -> list[tuple[int, Any]]:
    thresholds, steps = case
    ops, log = adapt_chain(window, calls, thresholds), []
    for i, (rows, p) in enumerate(steps):
        if i == cut:
            adapt = ops[1]
            assert isinstance(adapt, AdaptWIDAggregate)
            tally(f"eager groups at the cut: {adapt.eager_groups() > 0}, lazy tuples: {adapt.buffer.n > 0}")
            tally(f"switched both ways before the cut: {adapt.to_eager > 0 and adapt.to_lazy > 0}")
            saved = as_list(unpack(pack([op.snapshot() for op in ops])), "chain")
            ops = adapt_chain(window, calls, thresholds)
            for op, state in zip(ops, saved, strict=True):
                op.restore(state)
        if rows:
            columns = {
                c: np.array([r[c] for r in rows], np.float64 if c == "f" else np.int64) for c in rows[0]
            }
            ops[0].process(Batch(columns, len(rows)))
        ops[0].punctuate(Punctuation(p, "ts"))
        adapt, out = ops[1], ops[1].outputs[0][0]
        assert isinstance(adapt, AdaptWIDAggregate) and isinstance(out, Recorder)
        # Beyond the rows (whose order within a batch follows the modes): how groups switched.
        modes = (adapt.eager_groups(), adapt.to_eager, adapt.to_lazy, adapt.combined, adapt.high, adapt.low)
        log += [(i, item_of(item)) for item in out.items] + [(i, ("modes", adapt.open_windows(), *modes))]
        out.clear()
    return log


@settings(max_examples=examples(40) * SCALE, deadline=None, derandomize=SCALE == 1)
@given(
    slide=st.integers(1, 5),
    extra=st.integers(0, 8),
    holistic=st.booleans(),
    case=adapt_steps(),
    data=st.data(),
)
def test_adaptwid_restores_in_every_mode(
    slide: int, extra: int, holistic: bool, case: Any, data: Any
) -> None:
    window = Sliding(slide + extra, slide, "ts")
    calls = ADAPT_CALLS if holistic else ADAPT_CALLS[:3]
    cut = data.draw(st.integers(1, len(case[1]) - 2), label="cut")  # state on both sides of it
    whole = run_chain(window, calls, case, None)
    assert [item for i, item in run_chain(window, calls, case, cut) if i >= cut] == [
        item for i, item in whole if i >= cut
    ]


def test_slices_whose_feeder_was_dropped_restore_at_their_width() -> None:
    """q0 starts slices of 1 and q1 (panes of 2) reads them; q0 is dropped. Planned again after
    a restore, q1 feeds the slices itself - at their width 1, not its pane 2."""
    rows = [
        {"k1": "a", "k2": i % 3, "v": i, "f": i / 4, "b": i % 2 == 0, "ts": t}
        for i, t in enumerate(range(0, 60, 3))
    ]
    events: list[Event] = [Push("A", "a0", tuple(rows[i : i + 4])) for i in range(0, 20, 4)]
    events[2:2] = [Punct("A", "a0", 12)]
    events += [Punct("A", "a0", 50), Close("A", "a0")]
    queries = [
        (0, Registration("q0", "SELECT k2, count(*) AS n [RANGE 4, SLIDE 1, WA ts] FROM A GROUP BY k2")),
        (
            1,
            Registration(
                "q1", "SELECT k2, sum(v) AS s, max(f) AS m [RANGE 8, SLIDE 2, WA ts] FROM A GROUP BY k2"
            ),
        ),
    ]
    case = Case({"A": ("a0",)}, events, queries, drops=[(3, "q0")])
    whole, _ = run(case, set())
    for cut in range(4, len(events) + 1):
        restored, _ = run(case, {cut})
        assert [i for c, i in restored["q1"] if c >= cut] == [i for c, i in whole["q1"] if c >= cut]
    rig = Rig(case.schemas, case.sources)
    for _, registration in queries:
        rig.register(registration)
    rig.apply(events[0])
    rig.drop("q0")
    assert [share_key(share).partition(":")[0] for share in rig.restored(rig.checkpoint()).shares] == ["1"]


def test_every_operator_kind_has_a_contract_case() -> None:
    """A new operator fails here until a kind of KINDS plans to it."""
    labels: set[str] = set()
    for module in pkgutil.iter_modules(lowtide.operators.__path__):
        for _, cls in inspect.getmembers(
            importlib.import_module(f"lowtide.operators.{module.name}"), inspect.isclass
        ):
            if (
                issubclass(cls, Operator)
                and not inspect.isabstract(cls)
                and cls.__module__.startswith("lowtide.operators")
            ):
                labels.add(cls.label)
    covered = set().union(*(expected for _, expected in KINDS.values()))
    assert labels == covered


# -- the dissertation's queries ----------------------------------------------------------------------
IPS = st.sampled_from(["a", "b", "c"])


@st.composite
def packets(draw: Any, flags: bool) -> list[dict[str, Any]]:
    scale = draw(st.sampled_from([1_000, 15_000, 60_000]), label="ts step (ms)")
    n = draw(st.integers(10, 40), label="packets")
    out = []
    for _ in range(n):
        row = {
            "srcIP": draw(IPS),
            "srcPort": draw(st.integers(1, 2)),
            "destIP": draw(IPS),
            "destPort": draw(st.integers(1, 2)),
            "len": draw(st.integers(40, 1500)),
            "ts": draw(st.integers(0, 30)) * scale,
        }
        out.append({**row, "flags": draw(st.sampled_from(["SYN", "SYN_ACK", "ACK"]))} if flags else row)
    return out


def streams_of(sql: str) -> list[str]:
    names: list[str] = []
    for item in parse_query(sql).from_:
        names += [item.name] if isinstance(item, FromStream) else list(item.streams)
    return names


@pytest.mark.parametrize(("label", "sql"), sorted(thesis_queries().items()))
@settings(max_examples=examples(4) * SCALE, deadline=None, derandomize=SCALE == 1)
@given(data=st.data())
def test_thesis_queries_restore_exactly(label: str, sql: str, data: st.DataObject) -> None:
    names = streams_of(sql)
    sources = {name: ("link",) for name in names}
    schemas = {name: packet_schema(name) for name in names}
    rows = {name: data.draw(packets(name in ("S0", "S1")), label=f"packets {name}") for name in names}
    events = data.draw(deliveries(rows, sources), label="events")
    case = Case(sources, events, [(0, Registration("q", sql))], flush=data.draw(flushes), schemas=schemas)
    check_restores(case, data, {"Input"})
