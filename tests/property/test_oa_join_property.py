"""OA-Join against a nested-loop join under random order, splits, interleaving and punctuation.

Behind punctuation (docs/design.md, "Punctuation and lateness"; issue 14): punctuation runs ahead of
the tuples by random amounts on both inputs; the pairs then equal a replay of the arrivals under the
join's rule (a tuple behind punctuation meets the partners at or above ``T_other`` if it lies at or
above the output punctuation of its column; it is late iff its partner range reaches below
``T_other`` or it lies below that punctuation), no pair comes below an output punctuation published,
every pair not emitted has its later tuple in the late stream, and ``late='error'`` (through the
Engine) rejects exactly the batches holding a tuple late by that rule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest
from harness import columns, late_rows
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    TIMESTAMPS,
    Event,
    Punct,
    Push,
    Sources,
    ahead_deliveries,
    deliveries,
    examples,
    stream_sources,
)

from lowtide import Engine, LateTuple
from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.join_windows import Band, JoinSide, Tumbling, Until
from lowtide.operators.oa_join import OAJoin
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.snapshot import pack, unpack

pytestmark = pytest.mark.property

Tup = tuple[int, int, int]  # ts, key a, key b

COLUMNS = {0: "S0", 1: "S1"}


class Checker(Operator):
    """Collects output pairs and checks rows against the punctuation emitted before them."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[npt.NDArray[np.int64]] = []
        self.last = {"S0.t": NO_PROGRESS, "S1.t": NO_PROGRESS}

    def process(self, batch: Batch, port: int = 0) -> None:
        assert batch.n > 0 and not batch.late
        for name, bound in self.last.items():
            assert int(batch[name].min()) >= bound, (name, bound)
        self.chunks.append(pair_codes(batch["S0.id"], batch["S1.id"]))

    def pairs(self) -> list[int]:
        """The output (left id, right id) pairs as a sorted list of codes: a multiset."""
        return sorted(np.concatenate([np.zeros(0, np.int64), *self.chunks]).tolist())

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        assert punctuation.attribute in self.last
        assert punctuation.value > self.last[punctuation.attribute]  # rising, never repeated
        self.last[punctuation.attribute] = punctuation.value


def pair_codes(left_ids: npt.NDArray[np.int64], right_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return left_ids.astype(np.int64) * 2**20 + right_ids


def matches(window: Band | Tumbling, left: Tup, right: Tup, n_keys: int) -> bool:
    if left[1 : 1 + n_keys] != right[1 : 1 + n_keys]:
        return False
    if isinstance(window, Band):
        return left[0] - window.r1 <= right[0] <= left[0] + window.r0
    return left[0] // window.d == right[0] // window.d


tuples = st.lists(
    st.tuples(st.integers(-20, 40), st.integers(0, 2), st.integers(0, 1)), min_size=0, max_size=40
)
# A length drawn uniformly first: st.lists alone leaves most examples nearly empty.
many_tuples = st.integers(0, 30).flatmap(
    lambda n: st.lists(
        st.tuples(st.integers(-20, 40), st.integers(0, 2), st.integers(0, 1)), min_size=n, max_size=n
    )
)
windows = st.one_of(
    st.builds(Band, st.integers(0, 8), st.integers(0, 8)),
    st.builds(Tumbling, st.integers(1, 12)),
)


@settings(max_examples=examples(200), deadline=None)
@given(left=tuples, right=tuples, window=windows, n_keys=st.integers(0, 2), data=st.data())
def test_oa_join_equals_nested_loop(
    left: list[Tup], right: list[Tup], window: Band | Tumbling, n_keys: int, data: st.DataObject
) -> None:
    keys = ("a", "b")[:n_keys]
    sides = [JoinSide(COLUMNS[p], ("id", "t", *keys), "t", keys) for p in (0, 1)]
    join = OAJoin(sides[0], sides[1], window)
    checker = Checker()
    join.connect(checker)

    inputs = (left, right)
    pos = [0, 0]  # next tuple to send per port
    bound = [NO_PROGRESS, NO_PROGRESS]  # punctuation sent per port

    def punctuate(port: int) -> None:  # honest: at most the smallest ts still to come on the port
        rest = [r[0] for r in inputs[port][pos[port] :]]
        top = min(rest) if rest else 45
        if top >= bound[port]:
            bound[port] = data.draw(st.integers(max(bound[port], -25), top))
            join.punctuate(Punctuation(bound[port], "t"), port)

    while pos[0] < len(left) or pos[1] < len(right):
        port = data.draw(st.sampled_from([p for p in (0, 1) if pos[p] < len(inputs[p])]))
        rows = inputs[port]
        size = data.draw(st.integers(1, len(rows) - pos[port]))
        chunk = rows[pos[port] : pos[port] + size]
        ids = np.arange(pos[port], pos[port] + size, dtype=np.int64) + 1000 * port
        cols = {"id": ids, "t": np.array([r[0] for r in chunk], np.int64)}
        cols["a"] = np.array([r[1] for r in chunk], np.int64)
        cols["b"] = np.array([r[2] for r in chunk], np.int64)
        cols["other"] = np.zeros(size, np.int64)
        join.process(Batch(cols, size), port)
        pos[port] += size
        for p in (0, 1):
            if data.draw(st.booleans()):
                punctuate(p)
    first = data.draw(st.integers(0, 1))
    for port in (first, 1 - first):
        if data.draw(st.booleans()):
            punctuate(port)
        join.punctuate(Punctuation(END_OF_STREAM, "t"), port)

    expected = sorted(
        i * 2**20 + 1000 + j
        for i, lt in enumerate(left)
        for j, rt in enumerate(right)
        if matches(window, lt, rt, n_keys)
    )
    assert checker.pairs() == expected
    assert checker.last == {"S0.t": END_OF_STREAM, "S1.t": END_OF_STREAM}
    assert join.open_windows() == 0
    assert join.tuples_in == len(left) + len(right)
    assert join.tuples_out == len(expected)


@settings(max_examples=examples(200), deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.tuples(st.integers(0, 2500), st.integers(0, 2500)),
    span=st.integers(1, 3000),
    n_keys=st.integers(0, 2),
    window=st.one_of(
        st.builds(Band, st.integers(0, 300), st.integers(0, 300)), st.builds(Tumbling, st.integers(1, 400))
    ),
)
def test_oa_join_large_batches_equal_nested_loop(
    seed: int, sizes: tuple[int, int], span: int, n_keys: int, window: Band | Tumbling
) -> None:
    """Thousands of disordered tuples: exercises index growth, compaction and buffer growth."""
    rng = np.random.default_rng(seed)
    keys = ("a", "b")[:n_keys]
    join = OAJoin(*(JoinSide(COLUMNS[p], ("id", "t", *keys), "t", keys) for p in (0, 1)), window)
    checker = Checker()
    join.connect(checker)
    streams = []
    for port, n in enumerate(sizes):
        arrival = np.sort(rng.integers(0, span, n))
        ts = arrival - rng.integers(0, 50, n) * (rng.random(n) < 0.3) - span // 2
        cols = {"id": np.arange(n, dtype=np.int64) + 10_000 * port, "t": ts.astype(np.int64)}
        cols["a"] = rng.integers(0, 4, n)
        cols["b"] = rng.integers(0, 2, n)
        cuts = np.sort(rng.integers(0, n + 1, rng.integers(0, 12)))
        streams.append((cols, [0, *cuts.tolist(), n]))
    pending = [1, 1]
    sent = [NO_PROGRESS, NO_PROGRESS]
    while pending[0] < len(streams[0][1]) or pending[1] < len(streams[1][1]):
        live = [p for p in (0, 1) if pending[p] < len(streams[p][1])]
        port = live[int(rng.integers(0, len(live)))]
        cols, cuts = streams[port]
        lo, hi = cuts[pending[port] - 1], cuts[pending[port]]
        pending[port] += 1
        if hi > lo:
            join.process(Batch({c: v[lo:hi] for c, v in cols.items()}, hi - lo), port)
        rest = cols["t"][hi:]
        if rest.size:  # honest and never regressing: the smallest ts to come, or a little less
            sent[port] = max(sent[port], int(rest.min()) - int(rng.integers(0, 3)))
            join.punctuate(Punctuation(sent[port], "t"), port)
    for port in (0, 1):
        join.punctuate(Punctuation(END_OF_STREAM, "t"), port)

    (left, _), (right, _) = streams
    ok = np.ones((sizes[0], sizes[1]), bool)
    for k in keys:
        ok &= left[k][:, None] == right[k][None, :]
    lt, rt = left["t"][:, None], right["t"][None, :]
    if isinstance(window, Band):
        ok &= (lt - window.r1 <= rt) & (rt <= lt + window.r0)
    else:
        ok &= lt // window.d == rt // window.d
    li, ri = np.nonzero(ok)
    assert checker.pairs() == sorted(pair_codes(left["id"][li], right["id"][ri]).tolist())
    assert join.open_windows() == 0


# -- behind punctuation ----------------------------------------------------------------------------------
Held = tuple[int, int, tuple[int, ...]]  # id, ts, keys
Arrival = tuple[int, list[Held], tuple[int, int]]  # port, its tuples, (b0, b1) when they came


def ref_threshold(window: Band | Tumbling, side: int, bounds: tuple[int, int]) -> int:
    """``T_side``: the smallest ts of input ``side`` a tuple of the other at or above its bound meets."""
    other = bounds[1 - side]
    if other in (NO_PROGRESS, END_OF_STREAM):
        return other
    if isinstance(window, Tumbling):
        return other // window.d * window.d
    return other - (window.r0 if side == 0 else window.r1)


def ref_out(window: Band | Tumbling, side: int, bounds: tuple[int, int]) -> int:
    """The output punctuation on input ``side``'s ts column."""
    own = bounds[side]
    if isinstance(window, Tumbling) and own not in (NO_PROGRESS, END_OF_STREAM):
        own = own // window.d * window.d
    return min(own, ref_threshold(window, side, bounds))


def ref_meets(window: Band | Tumbling, left: Held, right: Held) -> bool:
    if left[2] != right[2]:
        return False
    if isinstance(window, Band):
        return left[1] - window.r1 <= right[1] <= left[1] + window.r0
    return left[1] // window.d == right[1] // window.d


def ref_late(window: Band | Tumbling, port: int, ts: int, bounds: tuple[int, int]) -> bool:
    """The rule: the partner range reaches below ``T_other``, or ``ts`` is below ``out_port``."""
    if isinstance(window, Tumbling):
        lowest = ts // window.d * window.d
    else:
        lowest = ts - (window.r1 if port == 0 else window.r0)
    return lowest < ref_threshold(window, 1 - port, bounds) or ts < ref_out(window, port, bounds)


def replay(window: Band | Tumbling, arrivals: list[Arrival]) -> tuple[list[tuple[int, int]], list[int]]:
    """The (left id, right id) pairs and the late ids, tuple by tuple from the punctuation at arrival."""
    held: tuple[list[Held], list[Held]] = ([], [])
    pairs: list[tuple[int, int]] = []
    late: list[int] = []
    for port, batch, bounds in arrivals:
        floor, out = ref_threshold(window, 1 - port, bounds), ref_out(window, port, bounds)
        for x in batch:
            if ref_late(window, port, x[1], bounds):
                late.append(x[0])
            if x[1] < out:
                continue
            for y in held[1 - port]:
                left, right = (x, y) if port == 0 else (y, x)
                if y[1] >= floor and ref_meets(window, left, right):
                    pairs.append((left[0], right[0]))
        held[port].extend(batch)
    return sorted(pairs), late


def wired(
    window: Band | Tumbling | Until, columns: tuple[str, ...], keys: tuple[str, ...]
) -> tuple[OAJoin, Checker, tuple[list[int], list[int]]]:
    """An OA-Join of two inputs carrying ``columns`` and ``keys``, its output into a Checker, and
    the ids of the tuples each input's late sink received."""
    late: tuple[list[int], list[int]] = ([], [])
    sinks = (lambda b: late[0].extend(b["id"].tolist()), lambda b: late[1].extend(b["id"].tolist()))
    sides = [JoinSide(COLUMNS[p], (*columns, *keys), "t", keys) for p in (0, 1)]
    join = OAJoin(sides[0], sides[1], window, sinks)
    checker = Checker()
    join.connect(checker)
    return join, checker, late


def check_nothing_lost(
    window: Band | Tumbling, arrivals: list[Arrival], pairs: list[tuple[int, int]], late: list[int]
) -> None:
    """Every matching pair not emitted has its later tuple in the late stream."""
    when = {x[0]: i for i, (_, batch, _) in enumerate(arrivals) for x in batch}  # id -> its batch
    sides: tuple[list[Held], list[Held]] = ([], [])
    for port, batch, _ in arrivals:
        sides[port].extend(batch)
    emitted, late_ids = set(pairs), set(late)
    for left in sides[0]:
        for right in sides[1]:
            if ref_meets(window, left, right) and (left[0], right[0]) not in emitted:
                later = left if when[left[0]] > when[right[0]] else right
                assert later[0] in late_ids, (left, right)


@settings(max_examples=examples(300), deadline=None)
@given(left=many_tuples, right=many_tuples, window=windows, n_keys=st.integers(0, 2), data=st.data())
def test_oa_join_behind_punctuation_equals_replay_of_the_rule(
    left: list[Tup], right: list[Tup], window: Band | Tumbling, n_keys: int, data: st.DataObject
) -> None:
    join, checker, late = wired(window, ("id", "t"), ("a", "b")[:n_keys])
    inputs = (left, right)
    pos = [0, 0]
    bound = [NO_PROGRESS, NO_PROGRESS]
    arrivals: list[Arrival] = []

    def punctuate(port: int) -> None:  # ahead of the tuples still to come by a random amount
        rest = [r[0] for r in inputs[port][pos[port] :]]
        ahead = (min(rest) if rest else 40) + data.draw(st.integers(-3, 20))
        ended = data.draw(st.integers(0, 15)) == 0  # an input may even end before its last tuples
        bound[port] = END_OF_STREAM if ended else max(bound[port], ahead)
        join.punctuate(Punctuation(bound[port], "t"), port)
        for p in (0, 1):  # the output punctuation published is out_p of the bounds
            assert checker.last[f"S{p}.t"] == ref_out(window, p, (bound[0], bound[1]))

    while pos[0] < len(left) or pos[1] < len(right):
        port = data.draw(st.sampled_from([p for p in (0, 1) if pos[p] < len(inputs[p])]))
        size = data.draw(st.integers(1, len(inputs[port]) - pos[port]))
        chunk = inputs[port][pos[port] : pos[port] + size]
        ids = np.arange(pos[port], pos[port] + size, dtype=np.int64) + 1000 * port
        cols = {"id": ids, "t": np.array([r[0] for r in chunk], np.int64)}
        cols["a"] = np.array([r[1] for r in chunk], np.int64)
        cols["b"] = np.array([r[2] for r in chunk], np.int64)
        join.process(Batch(cols, size, late=any(r[0] < bound[port] for r in chunk)), port)
        held = [(int(i), r[0], r[1 : 1 + n_keys]) for i, r in zip(ids, chunk, strict=True)]
        arrivals.append((port, held, (bound[0], bound[1])))
        pos[port] += size
        for p in data.draw(st.lists(st.sampled_from([0, 1]), max_size=2)):
            if bound[p] < END_OF_STREAM:
                punctuate(p)
    for port in data.draw(st.permutations([0, 1])):
        if bound[port] < END_OF_STREAM:
            bound[port] = END_OF_STREAM
            join.punctuate(Punctuation(END_OF_STREAM, "t"), port)

    pairs, late_ids = replay(window, arrivals)
    behind = [x for port, batch, b in arrivals for x in batch if x[1] < b[port]]
    tally(f"behind: {min(len(behind) // 5 * 5, 20)}+, late: {min(len(late_ids) // 5 * 5, 20)}+")
    assert checker.pairs() == sorted(i * 2**20 + j for i, j in pairs)  # each once, none below out
    assert sorted(late[0] + late[1]) == sorted(late_ids)
    assert all(i < 1000 for i in late[0]) and all(i >= 1000 for i in late[1])
    check_nothing_lost(window, arrivals, pairs, late_ids)
    assert checker.last == {"S0.t": END_OF_STREAM, "S1.t": END_OF_STREAM}
    assert join.open_windows() == 0


# -- through the Engine: late='drop' and late='error' ----------------------------------------------------
JOIN_SCHEMA = {"id": "int64", "k": "int32", "ts": "int64"}
stream_rows = st.integers(0, 25).flatmap(
    lambda n: st.lists(st.tuples(st.integers(0, 2), TIMESTAMPS), min_size=n, max_size=n)
)


@dataclass
class EngineRun:
    arrivals: list[Arrival] = field(default_factory=list)  # applied batches, the progress when they came
    rejected: list[Arrival] = field(default_factory=list)  # batches refused with LateTuple
    pairs: list[tuple[int, int]] = field(default_factory=list)
    windows: list[tuple[int, int]] = field(default_factory=list)  # (window_start, n) of the aggregate
    late: list[int] = field(default_factory=list)  # ids in <query>.late


def run_join(
    sql: str, sources: Sources, events: list[Event], late: str, schema: dict[str, str] = JOIN_SCHEMA
) -> EngineRun:
    """Each batch with the streams' progress before it; no row below an output punctuation."""
    engine = Engine()
    for stream, names in sources.items():
        engine.create_stream(stream, schema, sources=list(names))
    engine.register_query(sql, name="q", late=late)
    out = EngineRun()
    published: dict[str, int] = {}
    for event in events:
        if isinstance(event, Push):
            port = "AB".index(event.stream)
            bounds = (engine.low_watermark("A"), engine.low_watermark("B"))
            held = [(r["id"], r["ts"], (r["k"],)) for r in event.rows]
            try:
                engine.push(event.stream, columns(event.rows, schema), source=event.source)
                out.arrivals.append((port, held, bounds))
            except LateTuple:
                assert late == "error"
                out.rejected.append((port, held, bounds))
        elif isinstance(event, Punct):
            engine.punctuate(event.stream, event.value, source=event.source)
        else:
            engine.close_source(event.stream, event.source)
        for item in engine.poll("q"):
            if isinstance(item, Punctuation):
                assert item.value > published.get(item.attribute, NO_PROGRESS)
                published[item.attribute] = item.value
                continue
            for row in item.to_pylist():
                for name, value in published.items():  # truthful: nothing below what was published
                    assert row[name] >= value, (row, name, value)
                if "n" in row:
                    assert row["revision"] == 0
                    out.windows.append((row["window_start"], row["n"]))
                else:
                    out.pairs.append((row["a"], row["b"]))
    out.late = [row["id"] for row in late_rows(engine, "q")]
    assert engine.stats()["queries"]["q"]["late"] == len(out.late)
    return out


join_queries = st.one_of(
    st.builds(
        lambda r0, r1: (
            Band(r0, r1),
            "SELECT A.id AS a, B.id AS b, A.ts AS ats, B.ts AS bts "
            f"FROM A [RANGE {r0}, WA ts], B [RANGE {r1}, WA ts] WHERE A.k = B.k",
        ),
        st.integers(1, 8),
        st.integers(1, 8),
    ),
    st.builds(
        lambda d: (
            Tumbling(d),
            "SELECT A.id AS a, B.id AS b, A.ts AS ats, B.ts AS bts "
            f"FROM A, B [RANGE TUMBLING {d}, WA ts] WHERE B.k = A.k",
        ),
        st.integers(1, 40),  # wide buckets: behind tuples in a bucket still open
    ),
)
SLIDE = 5  # the aggregate over the join: tumbling windows of SLIDE on A.ts


@pytest.mark.parametrize("late", ["drop", "error"])
@settings(max_examples=examples(120), deadline=None)
@given(query=join_queries, aggregate=st.booleans(), sources=stream_sources(2, max_sources=2), data=st.data())
def test_engine_join_behind_punctuation_drop_and_error(
    late: str, query: tuple[Band | Tumbling, str], aggregate: bool, sources: Sources, data: st.DataObject
) -> None:
    window, sql = query
    if aggregate:  # Q7-2: the pairs the join emits are in time for the aggregate
        sql = f"SELECT count(*) AS n [RANGE {SLIDE}, SLIDE {SLIDE}, WA A.ts] FROM" + sql.split("FROM", 1)[1]
    streams = {
        s: [{"id": 1000 * port + i, "k": k, "ts": ts} for i, (k, ts) in enumerate(data.draw(stream_rows))]
        for port, s in enumerate("AB")
    }
    delivery = st.one_of(
        deliveries(streams, sources, honest=False),
        ahead_deliveries(streams, sources, st.integers(-3, 12), max_batch=4),
    )
    events = data.draw(delivery, label="events")
    run = run_join(sql, sources, events, late)

    pairs, late_ids = replay(window, run.arrivals)
    behind = [x for port, batch, b in run.arrivals for x in batch if x[1] < b[port]]
    tally(f"{late}: behind {min(len(behind), 3)}+, rejected {min(len(run.rejected), 3)}+")
    if late == "error":  # rejected: exactly the batches holding a tuple late by the rule
        assert all(not any(ref_late(window, p, x[1], b) for x in batch) for p, batch, b in run.arrivals)
        assert all(any(ref_late(window, p, x[1], b) for x in batch) for p, batch, b in run.rejected)
        assert late_ids == [] and run.late == []
    else:
        assert run.rejected == []
        assert sorted(run.late) == sorted(late_ids)
        check_nothing_lost(window, run.arrivals, pairs, late_ids)
    if aggregate:
        ts = {x[0]: x[1] for _, batch, _ in run.arrivals for x in batch}
        counts = Counter(ts[a] // SLIDE * SLIDE for a, _ in pairs)
        assert sorted(run.windows) == sorted(counts.items())
    else:
        assert sorted(run.pairs) == pairs


# -- until join: an interval bounded by a column of one input ---------------------------------------------
# x: the tuples of the bounded input, y: the other's; they match when x.ts + low <= y.ts <= x.e + high
# (keys equal), e the bounding column. The rule for tuples behind punctuation (``ts < b`` of their
# input), replayed tuple by tuple from the bounds at each arrival:
# * every behind tuple is late, on both inputs;
# * a behind x takes no part: no pairs, never held; an x in time meets the held y it matches;
# * a y meets the held x it matches if y.ts >= out_y = min(b_y, b_x + low), and if it is behind only
#   those still live (x.e + high >= b_y);
# * the punctuation published on y's column is out_y; on x's min(b_x, oldest), oldest the smallest ts
#   of an x in time that was stored (x.e + high >= b_y and >= x.ts + low when it came) and is live -
#   b_y if that is END_OF_STREAM (the end waits for both inputs') - once it rises above the last one.
UTup = tuple[int, int, int, int]  # ts, key a, key b, e
UHeld = tuple[int, int, tuple[int, ...], int]  # id, ts, keys, e
UArrival = tuple[int, list[UHeld], tuple[int, int]]  # port, its tuples, (b0, b1) when they came
until_tuples = st.integers(0, 30).flatmap(
    lambda n: st.lists(
        st.tuples(st.integers(-20, 40), st.integers(0, 2), st.integers(0, 1), st.integers(-25, 60)),
        min_size=n,
        max_size=n,
    )
)
untils = st.builds(Until, st.integers(0, 1), st.just("e"), st.integers(-6, 6), st.integers(-3, 3))


def saturated(b: int, c: int) -> int:
    return b if b in (NO_PROGRESS, END_OF_STREAM) else b + c


def until_meets(window: Until, x: UHeld, y: UHeld) -> bool:
    return x[2] == y[2] and x[1] + window.low <= y[1] <= x[3] + window.high


def until_replay(window: Until, arrivals: list[UArrival]) -> tuple[list[tuple[int, int]], list[int]]:
    """The (left id, right id) pairs and the late ids under the rule."""
    xs, ys = window.side, 1 - window.side
    held: tuple[list[UHeld], list[UHeld]] = ([], [])
    pairs: list[tuple[int, int]] = []
    late: list[int] = []
    for port, batch, bounds in arrivals:
        bx, by = bounds[xs], bounds[ys]
        for t in batch:
            behind = t[1] < bounds[port]
            if behind:
                late.append(t[0])
            if port == xs and not behind:
                found = [(t[0], y[0]) for y in held[ys] if until_meets(window, t, y)]
            elif port == ys and t[1] >= min(by, saturated(bx, window.low)):
                floor = by if behind else NO_PROGRESS
                found = [
                    (x[0], t[0])
                    for x in held[xs]
                    if until_meets(window, x, t) and x[3] + window.high >= floor
                ]
            else:
                found = []
            pairs += [(a, b) if xs == 0 else (b, a) for a, b in found]
            if port == ys or not behind:
                held[port].append(t)
    return sorted(pairs), late


def until_out(window: Until, arrivals: list[UArrival], bounds: tuple[int, int]) -> dict[int, int]:
    """The output punctuation per input at ``bounds``, after ``arrivals``."""
    xs, ys = window.side, 1 - window.side
    stored = [
        x
        for port, batch, b in arrivals
        if port == xs
        for x in batch
        if x[1] >= b[xs] and x[3] + window.high >= max(b[ys], x[1] + window.low)
    ]
    live = [x[1] for x in stored if x[3] + window.high >= bounds[ys]]
    out_x = min([bounds[xs], *live])
    return {
        xs: bounds[ys] if out_x == END_OF_STREAM else out_x,
        ys: min(bounds[ys], saturated(bounds[xs], window.low)),
    }


@settings(max_examples=examples(300), deadline=None)
@given(
    left=until_tuples,
    right=until_tuples,
    window=untils,
    n_keys=st.integers(0, 2),
    ahead=st.booleans(),
    data=st.data(),
)
def test_until_join_equals_nested_loop_and_replay_of_its_rule(
    left: list[UTup], right: list[UTup], window: Until, n_keys: int, ahead: bool, data: st.DataObject
) -> None:
    """Random batches, interleaving and punctuation: honest (every pair of the nested loop), or
    ahead of the tuples by random amounts, inputs even ending before their last tuples (the pairs
    and late tuples of the rule); the punctuation published is the rule's, exactly."""
    join, checker, late = wired(window, ("id", "t", "e"), ("a", "b")[:n_keys])
    inputs = (left, right)
    pos = [0, 0]
    bound = [NO_PROGRESS, NO_PROGRESS]
    arrivals: list[UArrival] = []
    published = [NO_PROGRESS, NO_PROGRESS]

    def punctuate(port: int, value: int) -> None:
        bound[port] = value
        join.punctuate(Punctuation(value, "t"), port)
        out = until_out(window, arrivals, (bound[0], bound[1]))
        for p in (0, 1):  # the heap's oldest live x included
            published[p] = max(published[p], out[p])
            assert checker.last[f"S{p}.t"] == published[p], (p, out)

    def draw_punctuation(port: int) -> None:
        rest = [r[0] for r in inputs[port][pos[port] :]]
        top = min(rest) if rest else 45
        if not ahead:
            value = data.draw(st.integers(max(bound[port], -25), top)) if top >= bound[port] else NO_PROGRESS
        elif data.draw(st.integers(0, 15)) == 0:
            value = END_OF_STREAM
        else:
            value = top + data.draw(st.integers(-3, 20))
        if value > bound[port]:
            punctuate(port, value)

    while pos[0] < len(left) or pos[1] < len(right):
        port = data.draw(st.sampled_from([p for p in (0, 1) if pos[p] < len(inputs[p])]))
        size = data.draw(st.integers(1, len(inputs[port]) - pos[port]))
        chunk = inputs[port][pos[port] : pos[port] + size]
        ids = np.arange(pos[port], pos[port] + size, dtype=np.int64) + 1000 * port
        cols = {"id": ids, "t": np.array([r[0] for r in chunk], np.int64)}
        for c, name in enumerate(("a", "b", "e")):
            cols[name] = np.array([r[1 + c] for r in chunk], np.int64)
        join.process(Batch(cols, size, late=any(r[0] < bound[port] for r in chunk)), port)
        held = [(int(i), r[0], r[1 : 1 + n_keys], r[3]) for i, r in zip(ids, chunk, strict=True)]
        arrivals.append((port, held, (bound[0], bound[1])))
        pos[port] += size
        for p in data.draw(st.lists(st.sampled_from([0, 1]), max_size=2)):
            if bound[p] < END_OF_STREAM:
                draw_punctuation(p)
    for port in data.draw(st.permutations([0, 1])):
        if bound[port] < END_OF_STREAM:
            punctuate(port, END_OF_STREAM)

    pairs, late_ids = until_replay(window, arrivals)
    behind = {x[0] for port, batch, b in arrivals for x in batch if x[1] < b[port]}
    tally(f"behind: {min(len(behind), 5)}+, pairs: {min(len(pairs) // 5 * 5, 10)}+")
    assert checker.pairs() == sorted(i * 2**20 + j for i, j in pairs)  # each once, none below out
    xs = window.side
    every = [
        (x[0], y[0]) if xs == 0 else (y[0], x[0])
        for _, batch, _ in arrivals
        for x in batch
        if x[0] // 1000 == xs
        for _, other, _ in arrivals
        for y in other
        if y[0] // 1000 != xs and until_meets(window, x, y)
    ]
    if not behind:  # honest: every pair of the nested loop
        assert pairs == sorted(every)
    emitted = set(pairs)  # a pair not emitted has a tuple behind punctuation, which is late
    assert all(p in emitted or set(p) & behind for p in every)
    assert sorted(late[0] + late[1]) == sorted(late_ids) == sorted(behind)
    assert all(i < 1000 for i in late[0]) and all(i >= 1000 for i in late[1])
    assert checker.last == {"S0.t": END_OF_STREAM, "S1.t": END_OF_STREAM}
    assert join.open_windows() == 0


UNTIL_SCHEMA = {"id": "int64", "k": "int32", "ts": "int64", "e": "int64"}
until_rows = st.integers(0, 25).flatmap(
    lambda n: st.lists(st.tuples(st.integers(0, 2), TIMESTAMPS, st.integers(-5, 30)), min_size=n, max_size=n)
)


@pytest.mark.parametrize("late", ["drop", "error"])
@settings(max_examples=examples(120), deadline=None)
@given(window=untils, sources=stream_sources(2, max_sources=2), data=st.data())
def test_engine_until_join_behind_punctuation_drop_and_error(
    late: str, window: Until, sources: Sources, data: st.DataObject
) -> None:
    """As Flink writes it (``B.ts BETWEEN A.ts + low AND A.e + high``): planned to this join, and
    under late='drop' the pairs and late tuples of the rule, under late='error' rejected exactly
    the batches holding a tuple behind punctuation."""
    x, y = "AB"[window.side], "AB"[1 - window.side]

    def plus(c: int) -> str:
        return f"+ {c}" if c >= 0 else f"- {-c}"

    sql = (
        "SELECT A.id AS a, B.id AS b, A.ts AS ats, B.ts AS bts FROM A, B "
        f"WHERE A.k = B.k AND {y}.ts BETWEEN {x}.ts {plus(window.low)} AND {x}.e {plus(window.high)}"
    )
    streams = {
        s: [
            {"id": 1000 * port + i, "k": k, "ts": ts, "e": ts + life}
            for i, (k, ts, life) in enumerate(data.draw(until_rows))
        ]
        for port, s in enumerate("AB")
    }
    ends = {r["id"]: r["e"] for rows in streams.values() for r in rows}
    delivery = st.one_of(
        deliveries(streams, sources, honest=False),
        ahead_deliveries(streams, sources, st.integers(-3, 12), max_batch=4),
    )
    run = run_join(sql, sources, data.draw(delivery, label="events"), late, UNTIL_SCHEMA)
    arrivals = [(p, [(*t, ends[t[0]]) for t in batch], b) for p, batch, b in run.arrivals]
    pairs, late_ids = until_replay(window, arrivals)
    behind = [t for port, batch, b in arrivals for t in batch if t[1] < b[port]]
    tally(f"{late}: behind {min(len(behind), 3)}+, rejected {min(len(run.rejected), 3)}+")
    if late == "error":  # rejected: exactly the batches holding a tuple behind punctuation
        assert not behind
        assert all(any(t[1] < b[p] for t in batch) for p, batch, b in run.rejected)
        assert run.late == []
    else:
        assert run.rejected == []
        assert sorted(run.late) == sorted(late_ids)
    assert sorted(run.pairs) == pairs


@settings(max_examples=examples(150), deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.tuples(st.integers(0, 2500), st.integers(0, 2500)),
    span=st.integers(1, 3000),
    n_keys=st.integers(0, 2),
    window=st.builds(Until, st.integers(0, 1), st.just("e"), st.integers(-100, 100), st.integers(-20, 20)),
    lead=st.sampled_from([0, 0, 5, 60]),
    restore=st.booleans(),
)
def test_until_join_large_batches_equal_replay_of_its_rule(
    seed: int, sizes: tuple[int, int], span: int, n_keys: int, window: Until, lead: int, restore: bool
) -> None:
    """Thousands of disordered tuples, bounds from short to far beyond the ts (a long-lived x
    holds dead ones under it in the heap): index growth, compaction, heap growth and rebuilds;
    punctuation honest (lead 0) or ahead; maybe restored from a snapshot midway."""
    rng = np.random.default_rng(seed)
    keys = ("a", "b")[:n_keys]

    def built() -> OAJoin:
        sides = (JoinSide(COLUMNS[p], ("id", "t", "e", *keys), "t", keys) for p in (0, 1))
        return OAJoin(*sides, window, (lambda b: late.extend(b["id"].tolist()),) * 2)

    late: list[int] = []
    join, checker = built(), Checker()
    join.connect(checker)
    streams = []
    for port, n in enumerate(sizes):
        arrival = np.sort(rng.integers(0, span, n))
        ts = arrival - rng.integers(0, 50, n) * (rng.random(n) < 0.3) - span // 2
        life = np.where(rng.random(n) < 0.05, rng.integers(0, 5 * span + 1, n), rng.integers(-30, 300, n))
        cols = {"id": np.arange(n, dtype=np.int64) + 10_000 * port, "t": ts, "e": ts + life}
        cols["a"] = rng.integers(0, 4, n)
        cols["b"] = rng.integers(0, 2, n)
        cuts = np.sort(rng.integers(0, n + 1, rng.integers(0, 12)))
        streams.append((cols, [0, *cuts.tolist(), n]))
    # the replay: held tuples per input, stored x, expected pairs (as left id * 2**20 + right id)
    xs, low, high = window.side, window.low, window.high
    held: list[list[dict[str, npt.NDArray[np.int64]]]] = [[], []]
    stored: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
    expected: list[npt.NDArray[np.int64]] = []
    behind: list[npt.NDArray[np.int64]] = []
    bound = [NO_PROGRESS, NO_PROGRESS]
    published = [NO_PROGRESS, NO_PROGRESS]

    def replay(port: int, part: dict[str, npt.NDArray[np.int64]]) -> None:
        bx, by = bound[xs], bound[1 - xs]
        late_rows = part["t"] < bound[port]
        behind.append(part["id"][late_rows])
        if port == xs:  # a behind x takes no part; one in time is stored if it can still pair
            part = {c: v[~late_rows] for c, v in part.items()}
            ends = part["e"] + high
            alive = ends >= np.maximum(by, part["t"] + low)
            stored.append((part["t"][alive], ends[alive]))
        else:  # a y below out_y is muted
            held[port].append(part)
            part = {c: v[part["t"] >= min(by, saturated(bx, low))] for c, v in part.items()}
        for other in held[1 - port]:
            x, y = (part, other) if port == xs else (other, part)
            ok = (x["t"][:, None] + low <= y["t"][None, :]) & (y["t"][None, :] <= x["e"][:, None] + high)
            for k in keys:
                ok &= x[k][:, None] == y[k][None, :]
            if port != xs:  # a behind y meets the live x only
                ok &= ~(y["t"][None, :] < by) | (x["e"][:, None] + high >= by)
            xi, yi = np.nonzero(ok)
            left, right = (x["id"][xi], y["id"][yi]) if xs == 0 else (y["id"][yi], x["id"][xi])
            expected.append(pair_codes(left, right))
        if port == xs:
            held[port].append(part)

    def punctuate(port: int, value: int) -> None:
        bound[port] = value
        join.punctuate(Punctuation(value, "t"), port)
        bx, by = bound[xs], bound[1 - xs]
        ts = np.concatenate([np.zeros(0, np.int64), *(t[e >= by] for t, e in stored)])
        out_x = min(bx, int(ts.min())) if ts.size else bx
        published[xs] = max(published[xs], by if out_x == END_OF_STREAM else out_x)
        published[1 - xs] = max(published[1 - xs], min(by, saturated(bx, low)))
        assert checker.last == {f"S{p}.t": published[p] for p in (0, 1)}

    pending, cut = [1, 1], int(rng.integers(0, 20)) if restore else -1
    while pending[0] < len(streams[0][1]) or pending[1] < len(streams[1][1]):
        live = [p for p in (0, 1) if pending[p] < len(streams[p][1])]
        port = live[int(rng.integers(0, len(live)))]
        cols, cuts = streams[port]
        lo, hi = cuts[pending[port] - 1], cuts[pending[port]]
        pending[port] += 1
        if hi > lo:
            part = {c: v[lo:hi] for c, v in cols.items()}
            join.process(Batch(part, hi - lo, late=bool((part["t"] < bound[port]).any())), port)
            replay(port, part)
        rest = cols["t"][hi:]
        value = int(rest.min()) + int(rng.integers(-3, lead + 1)) if rest.size else NO_PROGRESS
        if value > bound[port]:  # honest (lead 0) or ahead of some tuples still to come
            punctuate(port, value)
        cut -= 1
        if cut == 0:  # the join goes on from a snapshot, packed and unpacked
            state = unpack(pack(join.snapshot()))
            join = built()
            join.restore(state)
            join.connect(checker)
    for port in (0, 1):
        if bound[port] < END_OF_STREAM:
            punctuate(port, END_OF_STREAM)
    want = np.concatenate([np.zeros(0, np.int64), *expected])
    assert checker.pairs() == sorted(want.tolist())
    assert sorted(late) == sorted(np.concatenate([np.zeros(0, np.int64), *behind]).tolist())
    assert join.open_windows() == 0
