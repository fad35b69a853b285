"""Engine-level behaviour of slices shared across queries: explain, late tuples, dropping."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from harness import late_rows

from lowtide import Engine

SCHEMA = {"k": "int64", "v": "int64", "ts": "int64"}


def sql(range_: int, slide: int = 1, where: str = "") -> str:
    window = f"[RANGE {range_}, SLIDE {slide}, WA ts]"
    return f"SELECT k, count(*) AS n, sum(v) AS s {window} FROM S {where} GROUP BY k"


def rows(engine: Engine, query: str) -> list[dict[str, int]]:
    return [r for item in engine.poll(query) if isinstance(item, pa.Table) for r in item.to_pylist()]


def batch(ts: list[int], k: int = 1) -> dict[str, np.ndarray]:
    return {"k": np.full(len(ts), k), "v": np.ones(len(ts), np.int64), "ts": np.array(ts)}


def test_explain_shows_which_queries_read_the_slices() -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    assert "Shared Slices of 5 by k: each tuple" in engine.explain(sql(20, 5))
    engine.register_query(sql(20, 5), name="a")
    assert "Shared Slices of 5 by k, shared with 1 query" in engine.explain(sql(40, 10))
    # Slices of 5 do not tile panes of 1; another filter feeds other slices.
    assert "Shared Slices of 1 by k: each tuple" in engine.explain(sql(8))
    assert "shared with" not in engine.explain(sql(40, 10, where="WHERE v > 0"))
    engine.register_query(sql(40, 10), name="b")
    assert "shared with 2 queries" in engine.explain(sql(60, 15))


def late(engine: Engine, query: str) -> list[int]:
    return [r["ts"] for r in late_rows(engine, query)]


def test_a_tuple_behind_punctuation_is_late_only_for_the_readers_whose_window_it_missed() -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    engine.register_query(sql(4), name="a")  # windows [w, w + 4)
    engine.register_query(sql(16, 4), name="b")  # windows [4w, 4w + 16), on the same slices
    assert "shared with 2 queries" in engine.explain(sql(4))
    engine.punctuate("S", 10)
    engine.push("S", batch([3, 9, 12]))
    # 3 missed windows of both and counts in b's open [-4, 12), [0, 16); 9 missed a's [6, 10) only.
    assert late(engine, "a") == [3, 9] and late(engine, "b") == [3]
    engine.close_source("S")
    assert {r["window_start"]: r["n"] for r in rows(engine, "a")} == {7: 1, 8: 1, 9: 2, 10: 1, 11: 1, 12: 1}
    assert {r["window_start"]: r["n"] for r in rows(engine, "b")} == {-4: 2, 0: 3, 4: 2, 8: 2, 12: 1}


def test_a_tuple_behind_punctuation_counts_in_the_windows_the_running_window_slides_to() -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    engine.register_query(sql(4), name="a")
    engine.push("S", batch(list(range(8))))
    for p in range(4, 9):  # one window at a time: the running window slides to [4, 8)
        engine.punctuate("S", p)
    engine.push("S", batch([6]))  # in [4, 8) (emitted: late) and in [5, 9), [6, 10) (open)
    assert late(engine, "a") == [6]
    engine.punctuate("S", 9)  # [5, 9): the running window minus slice 4, plus slice 8
    engine.punctuate("S", 10)
    counts = {r["window_start"]: r["n"] for r in rows(engine, "a")}
    assert counts[4] == 4 and counts[5] == 4 and counts[6] == 3


def test_dropping_a_reader_leaves_the_others_and_the_last_takes_the_slices_down() -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    engine.register_query(sql(4), name="a")
    engine.push("S", batch([0, 1, 2]))
    engine.register_query(sql(4), name="b")  # joins after three tuples: it does not count them
    engine.push("S", batch([1, 3]))
    engine.drop_query("a")
    engine.punctuate("S", 4)
    first = [r for r in rows(engine, "b") if r["window_start"] == 0]
    assert first == [{"window_start": 0, "window_end": 4, "k": 1, "n": 2, "s": 2, "revision": 0}]
    engine.drop_query("b")
    assert "shared with" not in engine.explain(sql(4))
    engine.register_query(sql(4), name="c")
    engine.push("S", batch([5]))
    engine.close_source("S")
    assert [(r["window_start"], r["n"]) for r in rows(engine, "c")] == [(2, 1), (3, 1), (4, 1), (5, 1)]


def test_a_holistic_query_reads_slices_another_keeps_and_its_log_goes_with_it() -> None:
    engine = Engine()
    engine.create_stream("S", SCHEMA)
    median = "SELECT k, median(v) AS m [RANGE 8, SLIDE 2, WA ts] FROM S GROUP BY k"
    assert "AdaptWID" in engine.explain(median)  # alone: no slices to read
    engine.register_query(sql(8, 2), name="counts")
    assert "Paned-WID" in engine.explain(median) and "shared with 1 query" in engine.explain(median)
    engine.register_query(median, name="m")
    engine.push("S", {"k": np.ones(4, np.int64), "v": np.array([5, 1, 9, 2]), "ts": np.array([0, 1, 3, 9])})
    engine.punctuate("S", 8)
    medians = {r["window_start"]: r["m"] for r in rows(engine, "m")}
    assert medians == {-6: 3.0, -4: 5.0, -2: 5.0, 0: 5.0}  # ts 9 is in no complete window
    slices = engine.runner.plan("counts").reader.slices  # type: ignore[union-attr]
    assert list(slices.cells.logs) == ["v"]
    engine.drop_query("m")
    assert not slices.cells.logs  # no reader of the values is left: tuples stop logging them
