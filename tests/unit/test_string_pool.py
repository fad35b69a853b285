"""The string pool holds what is used, within its limits, and lets go of what dropped streams held
(lowtide.strings): sizes are measured on the pool itself (entries), never as RSS."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lowtide import Engine, Limits, Punctuation
from lowtide.errors import CorruptState, LateTuple, ResourceExhausted
from lowtide.snapshot import pack, unpack
from lowtide.strings import NULL_CODE, StringPool, cost

WINDOW = "[RANGE 10, SLIDE 10, WA ts]"


def engine(**limits: int) -> Engine:
    made = Engine(limits=Limits(**limits))
    made.create_stream("S", {"k": "string", "tag": "string", "v": "int64", "ts": "int64"})
    return made


def batch(ks: list[Any], ts: list[int], tags: list[Any] | None = None) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(ks, pa.string()),
            "tag": pa.array(tags if tags is not None else [f"t{t}" for t in ts], pa.string()),
            "v": pa.array([1] * len(ts), pa.int64()),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def rows_of(items: list[Any]) -> list[dict[str, Any]]:
    """The rows of the tables among ``items`` (without an aggregate's revision number)."""
    rows = [row for item in items if isinstance(item, pa.Table) for row in item.to_pylist()]
    return [{k: v for k, v in row.items() if k != "revision"} for row in rows]


def test_a_dictionary_column_interns_only_the_entries_its_rows_use() -> None:
    eng = engine()
    eng.register_query(f"SELECT k, count(*) AS n {WINDOW} FROM S GROUP BY k", name="q", late="drop")
    dictionary = pa.array([f"entry-{i}" for i in range(1_000_000)])
    one_row = pa.DictionaryArray.from_arrays(pa.array([765_432], pa.int32()), dictionary)
    data = batch(["x"], [1]).set_column(0, "k", one_row)
    eng.push("S", data)
    assert len(eng.pool) == 1  # the one entry a row uses, not the million
    assert eng.pool.bytes == cost("entry-765432")  # its object and entry
    eng.punctuate("S", 10)
    assert rows_of(eng.poll("q")) == [{"window_start": 0, "window_end": 10, "k": "entry-765432", "n": 1}]


def test_a_dictionary_with_nulls_and_unused_entries_codes_rows_right() -> None:
    pool = StringPool()
    column = pa.DictionaryArray.from_arrays(pa.array([2, None, 0, 2], pa.int8()), pa.array(["a", "b", "c"]))
    codes = pool.encode({"k": column}, "S")["k"]
    assert len(pool) == 2 and pool.decode(codes).to_pylist() == ["c", None, "a", "c"]
    assert codes[1] == NULL_CODE


def test_a_string_column_no_query_reads_interns_nothing_but_late_rows_keep_their_strings() -> None:
    eng = engine()
    eng.register_query(f"SELECT k, sum(v) AS total {WINDOW} FROM S GROUP BY k", name="q", late="drop")
    eng.push("S", batch(["a", "b"], [1, 2], tags=[f"unique-{i}" for i in range(2)]))
    assert set(eng.pool._codes) == {"a", "b"}  # tag: no query reads it
    eng.punctuate("S", 10)
    eng.push("S", batch(["a", "c"], [3, 12], tags=["late-tag", "on-time-tag"]))  # ts 3: late for q
    late = rows_of(eng.poll("q.late"))
    assert late == [{"k": "a", "tag": "late-tag", "v": 1, "ts": 3}]  # the late side stream's raw row
    assert "late-tag" in eng.pool._codes and "on-time-tag" not in eng.pool._codes
    # A query registered later reads tag: the tuples after it are coded whole.
    eng.register_query(f"SELECT tag, count(*) AS n {WINDOW} FROM S GROUP BY tag", name="r")
    eng.push("S", batch(["a"], [15], tags=["read-now"]))
    eng.punctuate("S", 20)
    assert {r["tag"] for r in rows_of(eng.poll("r"))} == {"read-now"}  # r came after the on-time row
    assert "read-now" in eng.pool._codes


def test_a_projection_reads_the_columns_it_names() -> None:
    eng = engine()
    eng.register_query("SELECT tag, ts FROM S", name="some")
    eng.push("S", batch(["a"], [1], tags=["t"]))
    assert set(eng.pool._codes) == {"t"}
    assert rows_of(eng.poll("some")) == [{"tag": "t", "ts": 1}]


def test_the_pool_limit_rejects_a_batch_whole() -> None:
    eng = engine(max_strings=5)
    eng.register_query("SELECT k, tag, ts FROM S", name="q")
    eng.push("S", batch(["a", "b"], [1, 2], tags=["a", "c"]))  # a, b, c
    with pytest.raises(ResourceExhausted, match=r"adds 3 strings to the 3 stream 'S' added.*max_strings"):
        eng.push("S", batch(["d", "e"], [3, 4], tags=["f", "a"]))
    assert set(eng.pool._codes) == {"a", "b", "c"}  # nothing of it added ...
    assert eng.stats()["streams"]["S"]["ingested"] == 2  # ... or applied
    eng.push("S", batch(["d", "e"], [3, 4], tags=["a", "b"]))  # two new: at the limit
    small = engine(max_string_bytes=cost("abc") + cost("def") - 1)  # the bytes they take in memory
    small.register_query("SELECT k, tag, ts FROM S", name="q")
    size = cost("abc") + cost("def")
    with pytest.raises(ResourceExhausted, match=rf"adds {size} bytes of strings to the 0 .*max_string_bytes"):
        small.push("S", batch(["abc"], [1], tags=["def"]))
    assert len(small.pool) == 0
    assert len(rows_of(eng.poll("q"))) == 4


def test_dropping_a_stream_frees_what_only_it_held() -> None:
    eng = engine()
    eng.create_stream("T", {"k": "string", "ts": "int64"})
    eng.register_query(f"SELECT k, count(*) AS n {WINDOW} FROM S WHERE k != 'lit' GROUP BY k", name="qs")
    eng.register_query(f"SELECT k, count(*) AS n {WINDOW} FROM T GROUP BY k", name="qt")
    eng.push("S", batch(["x", "y"], [1, 2]))
    eng.push("T", pa.table({"k": ["y", "z"], "ts": pa.array([1, 2], pa.int64())}))
    kept = {s: eng.pool._codes[s] for s in ("y", "z", "lit")}
    eng.drop_query("qs")
    eng.drop_stream("S")
    assert set(eng.pool._codes) == {"y", "z", "lit"}  # y: T holds it too; lit: a query's literal
    assert {s: eng.pool._codes[s] for s in kept} == kept
    eng.push("T", pa.table({"k": ["new", "y"], "ts": pa.array([3, 4], pa.int64())}))
    assert eng.pool._codes["new"] < max(kept.values())  # a freed code given out again
    eng.punctuate("T", 10)
    assert sorted((r["k"], r["n"]) for r in rows_of(eng.poll("qt"))) == [("new", 1), ("y", 2), ("z", 1)]
    eng.drop_query("qt")
    eng.drop_stream("T")
    assert set(eng.pool._codes) == {"lit"} and eng.pool.bytes == cost("lit")


def test_streams_sharing_a_holder_bit_free_with_the_last_of_them() -> None:
    pool = StringPool()
    assert pool.encode({}, "no strings") == {} and "no strings" not in pool._bits
    for i in range(70):  # 63 bits: some streams share one
        pool.encode({"k": pa.array(["shared", f"own-{i}"])}, f"s{i}")
    for i in range(69):
        pool.release(f"s{i}")
        assert "shared" in pool._codes
    pool.release("s69")
    assert len(pool) == 0 and pool.bytes == 0


def test_a_snapshot_restores_codes_holders_and_holes() -> None:
    pool = StringPool()
    pool.encode({"k": pa.array(["a", "b", "c"])}, "S")
    pool.encode({"k": pa.array(["c", "d"])}, "T")
    pool.code("lit")
    pool.release("S")  # frees a and b: holes at codes 0 and 1
    restored = StringPool()
    restored.restore(unpack(pack({"strings": pool.snapshot()}))["strings"])  # type: ignore[index]
    assert restored._codes == pool._codes and restored.bytes == pool.bytes
    assert restored.encode({"k": pa.array(["e"])}, "U")["k"].tolist() == [0]  # a hole, reused
    restored.release("T")
    assert set(restored._codes) == {"lit", "e"}


def test_a_snapshot_of_the_first_format_loads_pinned_and_a_damaged_one_is_refused() -> None:
    old = {"offsets": np.array([0, 1, 3], np.int64), "bytes": np.frombuffer(b"abc", np.uint8).copy()}
    pool = StringPool()
    pool.restore(old)
    assert pool._codes == {"a": 0, "bc": 1}
    pool.release("S")
    assert len(pool) == 2  # no holder known: kept for the engine's life, as before
    damaged = StringPool()
    damaged.encode({"k": pa.array(["a", "b"])}, "S")
    state = damaged.snapshot()
    state["codes"] = np.array([0, 0], np.int64)  # type: ignore[index]
    with pytest.raises(CorruptState, match="appears twice"):
        StringPool().restore(state)


def test_a_mirror_follows_adds_and_releases() -> None:
    front, mirror = StringPool(mirrored=True), StringPool()
    front.encode({"k": pa.array(["a", "b"])}, "S")
    front.encode({"k": pa.array(["c"])}, "T")
    codes = front.take_unsent()
    mirror.adopt(codes, front.values(codes))
    freed = front.release("S")
    mirror.forget(freed.tolist())
    front.encode({"k": pa.array(["d"])}, "T")
    codes = front.take_unsent()
    mirror.adopt(codes, front.values(codes))
    assert mirror._codes == front._codes
    batch_codes = front.encode({"k": pa.array(["d", "c"])}, "T")["k"]
    assert mirror.decode(batch_codes).to_pylist() == ["d", "c"]


def test_late_rows_of_an_unread_column_under_update_show_their_strings() -> None:
    eng = engine()
    eng.register_query(f"SELECT count(*) AS n {WINDOW} FROM S", name="q", late="update", allowed_lateness=0)
    eng.punctuate("S", 10)
    eng.push("S", batch(["gone"], [5], tags=["late"]))
    assert rows_of(eng.poll("q.late")) == [{"k": "gone", "tag": "late", "v": 1, "ts": 5}]
    assert [i for i in eng.poll("q") if isinstance(i, Punctuation)]


# -- strings enter the pool as their batch applies (issue 30, item 5) ------------------------------
def two_streams(**limits: int) -> Engine:
    made = engine(**limits)
    made.create_stream("T", {"k": "string", "ts": "int64"})
    made.register_query(f"SELECT k, count(*) AS n {WINDOW} FROM S GROUP BY k", name="qs")
    made.register_query(f"SELECT k, count(*) AS n {WINDOW} FROM T GROUP BY k", name="qt")
    return made


def on_t(ks: list[str], ts: list[int]) -> pa.Table:
    return pa.table({"k": pa.array(ks, pa.string()), "ts": pa.array(ts, pa.int64())})


def test_a_batch_checked_but_never_applied_or_refused_adds_no_string() -> None:
    eng = two_streams()
    eng.register_query(f"SELECT k, count(*) AS n {WINDOW} FROM T GROUP BY k", name="strict", late="error")
    # A multi-part call cut short: its parts were admitted and checked, never applied.
    parts = [eng.admit("S", batch([f"cut-{i}"], [1])) for i in range(3)]
    eng.check_batch("S", parts)
    assert len(eng.pool) == 0 and eng.pool.charged("S") == (0, 0)
    eng.punctuate("T", 20)
    with pytest.raises(LateTuple):  # refused whole: its strings stay out too
        eng.push("T", on_t(["refused-late", "refused-on-time"], [5, 25]))
    assert len(eng.pool) == 0
    eng.push("S", batch(["kept"], [2], tags=["unread"]))
    assert set(eng.pool.strings()) == {"kept"} and eng.pool.charged("S") == (1, cost("kept"))


def test_each_stream_is_charged_for_the_strings_it_adds() -> None:
    eng = two_streams(max_strings=3)
    eng.push("S", batch(["a", "b", "c"], [1, 2, 3]))
    with pytest.raises(ResourceExhausted, match="stream 'S'"):
        eng.push("S", batch(["d"], [4]))
    eng.push("T", on_t(["a", "x", "y", "z"], [1, 2, 3, 4]))  # a: S's, not charged to T again
    assert eng.pool.charged("S") == (3, sum(map(cost, "abc")))
    assert eng.pool.charged("T") == (3, sum(map(cost, "xyz")))
    eng.drop_query("qs")
    eng.drop_stream("S")  # a stays (T holds it), charged to no stream; b and c go
    assert set(eng.pool.strings()) == {"a", "x", "y", "z"} and eng.pool.charged("T")[0] == 3
    eng.punctuate("T", 10)
    assert sorted(r["k"] for r in rows_of(eng.poll("qt"))) == ["a", "x", "y", "z"]


def test_codes_follow_the_order_batches_apply_in_as_a_replay_gives_them() -> None:
    """Two calls check batches with new strings, one shared ("y"), and apply in the other order
    (the journal's): codes are given out as they apply, so replaying the log gives the same."""
    live = two_streams()
    first = live.check_batch("S", [live.admit("S", batch(["x", "y"], [1, 2]))])
    second = live.check_batch("T", [live.admit("T", on_t(["y", "z"], [1, 2]))], "p")
    live.push_admitted("T", second, "p")
    live.push_admitted("S", first)
    replay = two_streams()
    replay.push("T", on_t(["y", "z"], [1, 2]), "p")
    replay.push("S", batch(["x", "y"], [1, 2]))
    assert live.pool.strings() == replay.pool.strings() == {"y": 0, "z": 1, "x": 2}
    assert live.pool.charged("T") == (2, cost("y") + cost("z"))  # y: T's batch added it
    assert live.pool.charged("S") == (1, cost("x"))
    for target in (live, replay):
        target.punctuate("S", 10)
    assert rows_of(live.poll("qs")) == rows_of(replay.poll("qs"))


def test_a_streams_limit_holds_for_batches_checked_before_either_applied() -> None:
    """Two batches of one stream, each within its limit when checked: the one applied second is
    refused whole if together they pass it, unless the first added its strings already (the
    epoch does not move for strings added: the pool checks again what is still new)."""
    eng = two_streams(max_strings=3)
    first = eng.check_batch("S", [eng.admit("S", batch(["a", "b"], [1, 2]))])
    second = eng.check_batch("S", [eng.admit("S", batch(["c", "d"], [3, 4]))], "p")
    again = eng.check_batch("S", [eng.admit("S", batch(["a", "b"], [5, 6]))], "q")
    eng.push_admitted("S", first)
    with pytest.raises(ResourceExhausted, match="adds 2 strings to the 2 stream 'S' added"):
        eng.push_admitted("S", second, "p")
    eng.push_admitted("S", again, "q")  # nothing new any more
    assert set(eng.pool.strings()) == {"a", "b"} and eng.pool.charged("S") == (2, cost("a") + cost("b"))
    assert eng.stats()["streams"]["S"]["ingested"] == 4


def test_late_tuples_are_judged_on_provisional_codes() -> None:
    """A strict query's WHERE compares codes; a string new to the pool has none until its batch
    applies, and compares unequal to every literal and held string meanwhile."""
    eng = engine()
    where = f"SELECT count(*) AS n {WINDOW} FROM S WHERE k = 'hit' AND tag != k GROUP BY k"
    eng.register_query(where.replace(" GROUP BY k", ""), name="strict", late="error")
    eng.push("S", batch(["hit", "other"], [12, 13]))
    eng.punctuate("S", 10)  # windows [0, 10) emitted: tuples below 10 are late
    eng.push("S", batch(["brand-new", "hit"], [5, 6], tags=["x", "hit"]))  # the WHERE drops both
    with pytest.raises(LateTuple, match="1 tuple"):
        eng.push("S", batch(["hit", "brand-new-2"], [5, 6], tags=["new-tag", "y"]))
    assert "brand-new-2" not in eng.pool.strings() and "new-tag" not in eng.pool.strings()


def test_a_snapshot_keeps_what_each_stream_is_charged_for() -> None:
    pool = StringPool()
    pool.encode({"k": pa.array(["a", "b"])}, "S")
    pool.encode({"k": pa.array(["b", "c"])}, "T")
    pool.code("lit")
    restored = StringPool()
    restored.restore(unpack(pack({"strings": pool.snapshot()}))["strings"])  # type: ignore[index]
    assert (
        [restored.charged(s) for s in "ST"]
        == [pool.charged(s) for s in "ST"]
        == [
            (2, cost("a") + cost("b")),
            (1, cost("c")),
        ]
    )
    assert restored.bytes == pool.bytes == sum(map(cost, ["a", "b", "c", "lit"]))
    older = pool.snapshot()
    older["format"] = 2  # type: ignore[index]
    del older["owners"], older["owner_ids"]  # type: ignore[attr-defined]
    before = StringPool()
    before.restore(older)
    assert before.strings() == pool.strings() and before.charged("S") == (0, 0)  # charged to none


def test_a_mirror_of_literals_alone_learns_a_string_pinned_later() -> None:
    front = StringPool(mirrored=True)
    front.encode({"k": pa.array(["a", "b"])}, "S")
    assert front.pinned(front.take_unsent()) == []  # streams' strings: not for a literals' mirror
    code = front.code("a")  # a query's literal, held already
    assert front.pinned(front.take_unsent()) == [code]


def test_the_strings_a_checkpoint_records_come_back_under_their_codes() -> None:
    """While a server's checkpoint waits, its front makes strings (codes), which results sent to
    workers again after a restore hold: restored over the door's snapshot, each has its code;
    the holes after the snapshot's last code are free again."""
    front = StringPool(mirrored=True)
    front.encode({"k": pa.array(["a", "b", "c"])}, "S")
    front.release("S")  # holes at 0 to 2
    front.encode({"k": pa.array(["x", "y"])}, "T")
    front.codes(["pinned before"])
    snapshot = unpack(pack({"s": front.snapshot()}))["s"]  # type: ignore[index]
    front.recording = []
    front.encode({"k": pa.array(["later"])}, "T")  # a batch after the barrier: replayed
    made = front.codes(["x", "2020-01-01", "pinned before", "2020-01-01", "12:00"])
    assert sorted(front.recording) == sorted({int(made[0]), int(made[1]), int(made[4])})
    front.take_unsent()
    held = unpack(pack({"h": front.held(front.recording)}))["h"]  # type: ignore[index]
    restored = StringPool(mirrored=True)
    restored.restore(snapshot)
    restored.pin_held(held)
    for value, code in zip(["x", "2020-01-01", "pinned before", "12:00"], made[[0, 1, 2, 4]], strict=True):
        assert restored.strings()[value] == code
    assert restored.pinned([int(c) for c in made]) == [int(c) for c in made]
    assert set(restored.pinned(restored.take_unsent())) == {int(c) for c in made}  # for the mirrors
    assert restored.codes(["2020-01-01"])[0] == made[1]
    later = front.strings()["later"]  # its batch applies again after the restore
    fresh = restored.encode({"k": pa.array(["n1", "n2"])}, "T")["k"].tolist()
    assert fresh[0] == later and fresh[1] not in front.strings().values()  # its hole, then a new code
    clash = StringPool()
    clash.restore(snapshot)
    clash.encode({"k": pa.array(["o1", "o2"])}, "U")  # takes a code the recording gave another string
    with pytest.raises(CorruptState, match="is not code"):
        clash.pin_held(held)


def test_a_mirror_gives_no_code_out() -> None:
    with pytest.raises(RuntimeError, match="gives no code out"):
        StringPool(mirror=True).codes(["a"])
