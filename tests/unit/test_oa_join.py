"""OA-Join (Figures 7-1 and 7-2): matching, storage, purging and individual punctuation."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import pytest
from harness import Recorder, late_rows

from lowtide import Engine, LateTuple
from lowtide.batch import Batch
from lowtide.operators.join_windows import Band, JoinSide, Tumbling
from lowtide.operators.oa_join import OAJoin
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation


def pairs(sink: Recorder, *names: str) -> list[tuple[Any, ...]]:
    return sorted(sink.rows(*names))


def puncts(sink: Recorder) -> list[tuple[str, int]]:
    return [(p.attribute, p.value) for p in sink.punctuations()]


def side(prefix: str, keys: tuple[str, ...] = ("k",), extra: tuple[str, ...] = ()) -> JoinSide:
    return JoinSide(prefix, ("id", "ts", *keys, *extra), "ts", keys)


def batch(**cols: Any) -> Batch:
    arrays = {name: np.asarray(values, dtype=np.int64) for name, values in cols.items()}
    n = len(next(iter(arrays.values())))
    return Batch(arrays, n)


def make(window: Band | Tumbling, keys: tuple[str, ...] = ("k",)) -> tuple[OAJoin, Recorder]:
    join = OAJoin(side("S0", keys), side("S1", keys), window)
    sink = Recorder()
    join.connect(sink)
    return join, sink


def test_band_matches_inclusive_ends_in_either_arrival_order() -> None:
    for left_first in (True, False):
        join, sink = make(Band(r0=3, r1=2))
        left = batch(id=[1], ts=[10], k=[7])
        right = batch(id=[10, 11, 12, 13, 14], ts=[7, 8, 13, 14, 10], k=[7, 7, 7, 7, 8])
        order = [(left, 0), (right, 1)] if left_first else [(right, 1), (left, 0)]
        for b, port in order:
            join.process(b, port)
        # 10 - 2 <= r.ts <= 10 + 3, same key: ts 8 and 13 (both ends), not 7, 14 or key 8
        assert pairs(sink, "S0.id", "S1.id") == [(1, 11), (1, 12)]
        assert join.tuples_in == 6 and join.tuples_out == 2


def test_output_columns_order_and_dtypes_extra_columns_ignored() -> None:
    left = JoinSide("A", ("ts", "f"), "ts", ("k",))
    right = JoinSide("B", ("g", "ts"), "ts", ("k",))
    join = OAJoin(left, right, Band(5, 5))
    sink = Recorder()
    join.connect(sink)
    join.process(
        Batch({"ts": np.array([1]), "k": np.array([3]), "f": np.array([1.5]), "zz": np.array([9])}, 1)
    )
    join.process(Batch({"ts": np.array([2]), "k": np.array([3]), "g": np.array([4], np.int32)}, 1), 1)
    out = sink.items[0]
    assert isinstance(out, Batch)
    assert list(out.columns) == ["A.ts", "A.f", "B.g", "B.ts"]
    assert out["A.f"].dtype == np.float64 and out["B.g"].dtype == np.int32
    assert out["A.f"].tolist() == [1.5] and out["B.g"].tolist() == [4]


def test_tuple_that_can_no_longer_match_is_not_stored() -> None:
    join, sink = make(Band(r0=3, r1=2))
    join.punctuate(Punctuation(100, "ts"), 1)  # b1 = 100: left tuples need ts >= 97
    join.process(batch(id=[1, 2, 3], ts=[96, 97, 150], k=[0, 0, 0]), 0)
    assert join.open_windows() == 2
    join.punctuate(Punctuation(50, "ts"), 0)  # b0 = 50: right tuples need ts >= 48
    join.process(batch(id=[10, 11], ts=[47, 100], k=[0, 0]), 1)
    # right 47 meets no stored left (needs [44, 49]) and is dropped; right 100 meets left 97
    assert pairs(sink, "S0.id", "S1.id") == [(2, 11)]
    assert join.open_windows() == 3


def test_tuple_not_stored_still_probes() -> None:
    join, sink = make(Band(r0=3, r1=2))
    join.process(batch(id=[10], ts=[100], k=[0]), 1)
    join.punctuate(Punctuation(200, "ts"), 1)  # future left tuples need ts >= 197 to be stored
    join.process(batch(id=[1], ts=[99], k=[0]), 0)  # not stored but matches the stored right
    assert pairs(sink, "S0.id", "S1.id") == [(1, 10)]
    assert join.open_windows() == 1  # only the right tuple (b0 is still NO_PROGRESS)


def test_tumbling_store_predicate() -> None:
    join, _ = make(Tumbling(10))
    join.punctuate(Punctuation(25, "ts"), 1)  # right is in bucket 2: left needs bucket >= 2
    join.process(batch(id=[1, 2, 3], ts=[19, 20, 29], k=[0, 0, 0]), 0)
    assert join.open_windows() == 2


def test_purge_on_punctuation_shrinks_state() -> None:
    join, _ = make(Band(r0=3, r1=2))
    n = 5000
    ts = np.arange(n)
    join.process(batch(id=ts, ts=ts, k=ts % 7), 0)
    join.process(batch(id=ts, ts=ts, k=ts % 7), 1)
    assert join.open_windows() == 2 * n
    full = join.state_bytes()
    join.punctuate(Punctuation(4003, "ts"), 1)  # left tuples with ts + 3 < 4003 go: 4000 of 5000
    assert join.open_windows() == n + 1000
    assert 0 < join.state_bytes() < full
    join.punctuate(Punctuation(2002, "ts"), 0)  # right tuples with ts + 2 < 2002 go: 2000
    assert join.open_windows() == 1000 + 3000
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 0)
    assert join.open_windows() == 1000  # nothing more from the left: the right store empties
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 1)
    assert join.open_windows() == 0
    assert join.state_bytes() < full // 10


def test_tumbling_purge_at_next_bucket() -> None:
    join, _ = make(Tumbling(10))
    join.process(batch(id=range(40), ts=range(40), k=[0] * 40), 0)
    join.punctuate(Punctuation(29, "ts"), 1)  # bucket 2 still open: buckets 0 and 1 go
    assert join.open_windows() == 20
    join.punctuate(Punctuation(30, "ts"), 1)
    assert join.open_windows() == 10


def test_band_output_punctuation() -> None:
    join, sink = make(Band(r0=3, r1=2))
    join.punctuate(Punctuation(100, "ts"), 0)  # left: min(100, -inf - 3), right: min(-inf, 98)
    assert puncts(sink) == []
    join.punctuate(Punctuation(50, "ts"), 1)
    assert puncts(sink) == [("S0.ts", 47), ("S1.ts", 50)]
    sink.clear()
    join.punctuate(Punctuation(60, "ts"), 1)
    assert puncts(sink) == [("S0.ts", 57), ("S1.ts", 60)]
    sink.clear()
    join.punctuate(Punctuation(60, "ts"), 1)  # no advance: nothing repeated
    join.punctuate(Punctuation(101, "ts"), 0)  # left min(101, 57) unchanged; right min(60, 99)
    assert puncts(sink) == []
    join.punctuate(Punctuation(200, "ts"), 1)
    assert puncts(sink) == [("S0.ts", 101), ("S1.ts", 99)]
    sink.clear()
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 1)  # right over: left bound is b0
    assert puncts(sink) == []  # left min(b0, +inf) = 101 and right min(+inf, b0 - 2) = 99: no change
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 0)
    assert puncts(sink) == [("S0.ts", END_OF_STREAM), ("S1.ts", END_OF_STREAM)]


def test_band_output_punctuation_saturates_near_domain_ends() -> None:
    join, sink = make(Band(r0=10, r1=10))
    join.punctuate(Punctuation(NO_PROGRESS + 3, "ts"), 1)
    join.punctuate(Punctuation(NO_PROGRESS + 5, "ts"), 0)  # b - 10 clamps to NO_PROGRESS
    assert puncts(sink) == []
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 0)
    # left: min(+inf, NO_PROGRESS + 3 - 10 -> NO_PROGRESS) stays unpublished; right: min(b1, +inf)
    assert puncts(sink) == [("S1.ts", NO_PROGRESS + 3)]


def test_tumbling_output_punctuation_and_negative_bounds() -> None:
    """Both columns: the start of the first bucket still open on either input."""
    join, sink = make(Tumbling(10))
    join.punctuate(Punctuation(-15, "ts"), 0)
    join.punctuate(Punctuation(-1, "ts"), 1)  # min(floor(-15/10)*10 = -20, floor(-1/10)*10 = -10)
    assert puncts(sink) == [("S0.ts", -20), ("S1.ts", -20)]
    sink.clear()
    join.punctuate(Punctuation(37, "ts"), 0)  # min(30, -10)
    assert puncts(sink) == [("S0.ts", -10), ("S1.ts", -10)]
    sink.clear()
    join.punctuate(Punctuation(39, "ts"), 0)  # same bucket: nothing new
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 1)  # right over: the left's open bucket, 30
    assert puncts(sink) == [("S0.ts", 30), ("S1.ts", 30)]
    sink.clear()
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 0)
    assert puncts(sink) == [("S0.ts", END_OF_STREAM), ("S1.ts", END_OF_STREAM)]


def test_tumbling_negative_timestamps_use_floor_buckets() -> None:
    join, sink = make(Tumbling(10))
    join.process(batch(id=[1, 2, 3, 4], ts=[-1, -10, -11, 0], k=[0, 0, 0, 0]), 0)
    join.process(batch(id=[10, 11, 12], ts=[-5, -20, 9], k=[0, 0, 0]), 1)
    # buckets: -1 -> -1, -10 -> -1, -11 -> -2, 0 -> 0; -5 -> -1, -20 -> -2, 9 -> 0
    assert pairs(sink, "S0.id", "S1.id") == [(1, 10), (2, 10), (3, 11), (4, 12)]


def test_multi_key_equality() -> None:
    keys = ("a", "b")
    join, sink = make(Band(5, 5), keys)
    join.process(batch(id=[1, 2, 3, 4], ts=[0] * 4, a=[1, 1, 2, 2], b=[1, 2, 1, 2]), 0)
    join.process(batch(id=[10, 11, 12], ts=[1] * 3, a=[1, 2, 2], b=[2, 1, 3]), 1)
    assert pairs(sink, "S0.id", "S1.id") == [(2, 10), (3, 11)]
    assert pairs(sink, "S0.a", "S0.b", "S1.a", "S1.b") == [(1, 2, 1, 2), (2, 1, 2, 1)]


def test_no_keys_matches_every_pair_in_band() -> None:
    join, sink = make(Band(r0=1, r1=0), ())
    join.process(batch(id=[1, 2], ts=[10, 20]), 0)
    join.process(batch(id=[10, 11, 12, 13], ts=[9, 10, 11, 21]), 1)
    assert pairs(sink, "S0.id", "S1.id") == [(1, 11), (1, 12), (2, 13)]


def test_large_fanout_grows_output() -> None:
    join, sink = make(Tumbling(1000), ())
    join.process(batch(id=range(3000), ts=np.arange(3000) % 1000), 0)
    join.process(batch(id=range(2000), ts=np.arange(2000) % 1000), 1)
    assert len(pairs(sink, "S0.id", "S1.id")) == 3000 * 2000


def test_describe_and_validation() -> None:
    left = JoinSide("S0", ("srcIP", "ts"), "ts", ("srcIP",))
    right = JoinSide("S1", ("destIP", "ts"), "ts", ("destIP",))
    assert (
        OAJoin(left, right, Band(180000, 120000)).describe()
        == "OA-Join band S0.ts - 120000 <= S1.ts <= S0.ts + 180000 on S0.srcIP = S1.destIP"
    )
    assert OAJoin(side("A", ()), side("B", ()), Tumbling(5)).describe() == (
        "OA-Join tumbling A.ts // 5 = B.ts // 5"
    )
    with pytest.raises(ValueError):
        OAJoin(left, side("S1", ("a", "b")), Band(1, 1))
    with pytest.raises(ValueError):
        OAJoin(left, right, Band(-1, 1))
    with pytest.raises(ValueError):
        OAJoin(left, right, Tumbling(0))
    with pytest.raises(ValueError):
        OAJoin(left, JoinSide("S0", ("ts",), "ts", ("destIP",)), Band(1, 1))


def make_with_late(window: Band | Tumbling) -> tuple[OAJoin, Recorder, list[list[int]]]:
    late: list[list[int]] = [[], []]
    sinks = (lambda b: late[0].extend(b["id"].tolist()), lambda b: late[1].extend(b["id"].tolist()))
    join = OAJoin(side("S0"), side("S1"), window, sinks)
    sink = Recorder()
    join.connect(sink)
    return join, sink, late


def test_band_behind_tuple_meets_held_partners_and_is_late_once() -> None:
    join, sink, late = make_with_late(Band(r0=3, r1=2))
    join.process(batch(id=[10, 11, 12], ts=[40, 47, 49], k=[0, 0, 0]), 1)
    join.punctuate(Punctuation(50, "ts"), 0)  # T1 = 48: right 40 and 47 purgeable
    join.punctuate(Punctuation(45, "ts"), 1)  # out0 = min(50, 45 - 3) = 42
    # left 47 behind 50 needs right ts in [45, 50]: 47 may be gone (below T1), so it is late,
    # yet it meets 49, which is held; left 41 is below out0 = 42: late, no pair at all
    join.process(batch(id=[1, 2], ts=[47, 41], k=[0, 0]), 0)
    assert pairs(sink, "S0.id", "S1.id") == [(1, 12)]
    assert late == [[1, 2], []]
    assert join.late_mask(0, np.array([47, 41, 50]), (50, 45)).tolist() == [True, True, False]


def test_band_results_do_not_depend_on_compaction() -> None:
    for rest, compacted in ((9, False), (0, True)):  # under a quarter purgeable, or most of it
        join, sink, late = make_with_late(Band(r0=0, r1=5))
        ts = [5, 7, 8] + [rest] * 9
        join.process(batch(id=range(12), ts=ts, k=[0] * 12), 1)
        join.punctuate(Punctuation(12, "ts"), 0)  # T1 = 7: right 5 (and 0) purgeable
        assert join.open_windows() == (2 if compacted else 12)  # 7, 8 held either way
        join.process(batch(id=[1], ts=[8], k=[0]), 0)  # behind: needs right [3, 8]; 5 may be gone
        assert pairs(sink, "S1.ts") == [(7,), (8,)]
        assert late == [[1], []]


def test_tumbling_behind_tuple_in_an_open_bucket_is_in_time() -> None:
    join, sink, late = make_with_late(Tumbling(10))
    join.process(batch(id=[10, 11], ts=[31, 22], k=[0, 0]), 1)
    join.punctuate(Punctuation(36, "ts"), 0)
    join.punctuate(Punctuation(33, "ts"), 1)  # both in bucket 3: punctuation 30 on both columns
    assert puncts(sink) == [("S0.ts", 30), ("S1.ts", 30)]
    join.process(batch(id=[1, 2], ts=[30, 25], k=[0, 0]), 0)  # behind 36; 30's bucket is open
    assert pairs(sink, "S0.id", "S1.id") == [(1, 10)]
    assert late == [[2], []]  # 25: bucket 2 is gone (partner 22 maybe purged)
    assert join.open_windows() == 2  # right 31 and left 30 (stored: a right 33..39 may come)


def test_tumbling_late_tuple_still_meets_partners_of_its_bucket_to_come() -> None:
    join, sink, late = make_with_late(Tumbling(10))
    join.process(batch(id=[10], ts=[11], k=[0]), 1)  # stored while b0 is NO_PROGRESS
    join.punctuate(Punctuation(35, "ts"), 0)  # T1 = 30: right 11 purgeable
    join.punctuate(Punctuation(5, "ts"), 1)  # out = min(30, 0) = 0; T0 = 0
    join.process(batch(id=[1], ts=[15], k=[0]), 0)  # bucket 1 < 3: late; stored (15 >= T0)
    assert late == [[1], []] and pairs(sink, "S0.id", "S1.id") == []
    join.process(batch(id=[11], ts=[12], k=[0]), 1)  # in time: meets the stored late tuple
    assert pairs(sink, "S0.id", "S1.id") == [(1, 11)]
    assert late == [[1], []]


def test_engine_union_side_is_behind_only_below_its_meld() -> None:
    """A side that is a UNION has bound min over its streams: a tuple behind its own stream yet
    not behind that minimum is in time for the join (late='error' accepts it, drop pairs it)."""
    for late in ("error", "drop"):
        engine = Engine()
        for name in ("A", "C", "B"):
            engine.create_stream(name, {"id": "int64", "k": "int32", "ts": "int64"}, sources=["s"])
        q = engine.register_query(
            "SELECT x.id AS a, B.id AS b FROM (A UNION C) AS x [RANGE 2, WA ts], B [RANGE 2, WA ts] "
            "WHERE x.k = B.k",
            late=late,
        )
        engine.push("B", {"id": [100], "k": [0], "ts": [20]}, source="s")
        engine.punctuate("A", 30, source="s")
        engine.punctuate("C", 19, source="s")  # x's bound: 19
        engine.punctuate("B", 10, source="s")
        engine.push("A", {"id": [1], "k": [0], "ts": [21]}, source="s")  # behind A (30), not x (19)
        with pytest.raises(LateTuple) if late == "error" else nullcontext():
            engine.push("C", {"id": [2], "k": [0], "ts": [18]}, source="s")  # behind x: late
        rows = [r for t in engine.poll(q) if not isinstance(t, Punctuation) for r in t.to_pylist()]
        late_ids = [r["id"] for r in late_rows(engine, q)]
        # 18 still meets B 20 (held: T1 = 19 - 2 = 17) under drop, and is late once
        assert sorted((r["a"], r["b"]) for r in rows) == (
            [(1, 100)] if late == "error" else [(1, 100), (2, 100)]
        )
        assert late_ids == ([] if late == "error" else [2])


def test_engine_error_ignores_a_late_tuple_its_side_where_drops() -> None:
    """late='error' judges only the tuples a side's pushed-down WHERE keeps: one it drops is
    late for nothing of the query."""
    engine = Engine()
    for name in ("A", "B"):
        engine.create_stream(name, {"id": "int64", "k": "int32", "ts": "int64"}, sources=["s"])
    q = engine.register_query(
        "SELECT A.id AS a, B.id AS b FROM A [RANGE 2, WA ts], B [RANGE 2, WA ts] "
        "WHERE A.k = B.k AND A.id < 5",
        late="error",
    )
    engine.punctuate("A", 30, source="s")
    engine.punctuate("B", 30, source="s")
    engine.push("A", {"id": [7], "k": [0], "ts": [10]}, source="s")  # late, but A.id < 5 drops it
    with pytest.raises(LateTuple):
        engine.push("A", {"id": [1], "k": [0], "ts": [10]}, source="s")  # kept: late
    engine.push("A", {"id": [2], "k": [0], "ts": [31]}, source="s")
    engine.push("B", {"id": [100], "k": [0], "ts": [32]}, source="s")
    rows = [r for t in engine.poll(q) if not isinstance(t, Punctuation) for r in t.to_pylist()]
    assert [(r["a"], r["b"]) for r in rows] == [(2, 100)]
