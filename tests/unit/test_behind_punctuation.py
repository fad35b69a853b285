"""Behind punctuation is not late (docs/design.md, "Punctuation and lateness"; issue 14): Beam's
fixed-window transcripts.

A tuple below its stream's published punctuation still counts in every window of it not yet
emitted, as Beam and Flink count an element behind the watermark whose window has not fired;
only the part for windows already emitted is late for the query (default policy: drop).

    punctuation   5          11
    ts            |  2 3 7 8  |         window [0, 10): 2, 3, 7, 8
    ------+-------+-----------+----
          0       5          10
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from lowtide import END_OF_STREAM, Engine, LateTuple, Punctuation

FIXED_10 = "SELECT count(*) AS n, sum(v) AS s [RANGE 10, WA ts] FROM A"
SLIDING = "SELECT count(*) AS n, sum(v) AS s [RANGE 10, SLIDE 5, WA ts] FROM A"


def transcript(sql: str, first: int, elements: list[int], second: int, **options: Any) -> Engine:
    engine = Engine()
    engine.create_stream("A", {"v": "int64", "ts": "int64"}, sources=["s"])
    engine.register_query(sql, name="q", **options)
    engine.punctuate("A", first, source="s")
    engine.push("A", {"v": elements, "ts": elements}, source="s")
    engine.punctuate("A", second, source="s")
    return engine


def rows(engine: Engine, query: str = "q") -> list[dict[str, Any]]:
    return [r for t in engine.poll(query) if not hasattr(t, "value") for r in t.to_pylist()]


def test_beam_watermark_5_then_2_3_7_8_then_11_counts_all_four() -> None:
    engine = transcript(FIXED_10, 5, [2, 3, 7, 8], 11)
    assert [(r["window_start"], r["window_end"], r["n"], r["s"], r["revision"]) for r in rows(engine)] == [
        (0, 10, 4, 20, 0)
    ]
    assert rows(engine, "q.late") == []
    stats = engine.stats()
    assert stats["streams"]["A"]["behind"] == 2
    assert stats["queries"]["q"]["late"] == 0


def test_beam_watermark_8_then_2_3_7_then_11_emits_the_window() -> None:
    engine = transcript(FIXED_10, 8, [2, 3, 7], 11)
    assert [(r["window_start"], r["n"], r["s"]) for r in rows(engine)] == [(0, 3, 12)]
    assert rows(engine, "q.late") == []


@pytest.mark.parametrize("late", ["drop", "update"])
def test_only_emitted_windows_see_a_tuple_late(late: str) -> None:
    # [0, 10) is emitted at 11; 4 comes after: late for it (drop: side stream), never counted.
    engine = transcript(FIXED_10, 11, [4, 12], 25, late=late)
    assert [(r["window_start"], r["n"]) for r in rows(engine)] == [(10, 1)]
    assert [r["ts"] for r in rows(engine, "q.late")] == [4]
    assert engine.stats()["queries"]["q"]["late"] == 1


def test_sliding_window_splits_a_tuple_between_emitted_and_open_windows() -> None:
    # Punctuation 11 emits [-5, 5) and [0, 10); 7 still belongs to the open [5, 15).
    engine = Engine()
    engine.create_stream("A", {"v": "int64", "ts": "int64"}, sources=["s"])
    engine.register_query(SLIDING, name="q")
    engine.push("A", {"v": [1], "ts": [1]}, source="s")
    engine.punctuate("A", 11, source="s")
    engine.push("A", {"v": [7], "ts": [7]}, source="s")
    engine.punctuate("A", 30, source="s")
    assert [(r["window_start"], r["n"], r["s"]) for r in rows(engine)] == [
        (-5, 1, 1),
        (0, 1, 1),
        (5, 1, 7),
    ]
    assert [r["ts"] for r in rows(engine, "q.late")] == [7]  # not counted in [0, 10)


def test_error_rejects_only_batches_late_for_the_query() -> None:
    engine = transcript(FIXED_10, 5, [2, 3], 11, late="error")  # behind, [0, 10) open: accepted
    with pytest.raises(LateTuple):
        engine.push("A", {"v": [4, 12], "ts": [4, 12]}, source="s")  # [0, 10) emitted: rejected whole
    engine.push("A", {"v": [12], "ts": [12]}, source="s")
    engine.punctuate("A", 20, source="s")
    assert [(r["window_start"], r["n"], r["s"]) for r in rows(engine)] == [(0, 2, 5), (10, 1, 12)]


def test_error_ignores_a_late_tuple_the_where_drops() -> None:
    """Late for the window, but filtered out before it: nothing of the query needed it."""
    engine = transcript(
        "SELECT count(*) AS n, sum(v) AS s [RANGE 10, WA ts] FROM A WHERE v > 3", 5, [7], 11, late="error"
    )
    engine.push("A", {"v": [2], "ts": [2]}, source="s")  # [0, 10) emitted, but v > 3 drops it
    with pytest.raises(LateTuple):
        engine.push("A", {"v": [4], "ts": [4]}, source="s")  # v > 3 keeps it: late
    engine.punctuate("A", 20, source="s")
    assert [(r["window_start"], r["n"], r["s"]) for r in rows(engine)] == [(0, 1, 7)]


def test_tuple_windows_take_behind_tuples_until_the_stream_ends() -> None:
    """Rows are numbered as they arrive: none is behind a tuple window, under error too, until
    the stream has ended - then every window is emitted and a tuple is late."""
    engine = Engine()
    engine.create_stream("A", {"v": "int64", "ts": "int64"})
    engine.register_query(
        "SELECT count(*) AS n [RANGE 2 ROWS, SLIDE 2 ROWS, WA row-num] FROM A", name="q", late="error"
    )
    engine.punctuate("A", 10, source="a")
    engine.push("A", {"v": [1, 2], "ts": [3, 4]}, source="a")  # behind 10: accepted, numbered 0, 1
    engine.close_source("A", "a")
    with pytest.raises(LateTuple):
        engine.push("A", {"v": [3], "ts": [5]}, source="b")  # a new source after the end: late
    assert [(r["window_start"], r["n"]) for r in rows(engine)] == [(0, 2)]


def test_the_late_side_stream_follows_the_querys_punctuation_to_its_end() -> None:
    """``poll("q.late")``: the late tuples, each query punctuation after them as a marker
    ``q.window_end`` (the unread ones collapsed into the last), the end of stream last."""
    engine = transcript(FIXED_10, 5, [2, 3, 7, 8], 11)
    engine.punctuate("A", 25, source="s")  # two rises, unread: one marker
    assert engine.poll("q.late") == [Punctuation(30, "q.window_end")]  # 20, then 30
    engine.push("A", {"v": [4], "ts": [4]}, source="s")  # [0, 10) was emitted: late
    engine.punctuate("A", 31, source="s")
    engine.close_source("A", "s")
    late = engine.poll("q.late")
    assert [type(item) for item in late] == [pa.Table, Punctuation]
    assert late[0].column("ts").to_pylist() == [4]
    assert late[1] == Punctuation(END_OF_STREAM, "q.window_end")
    engine.push("A", {"v": [1], "ts": [1]}, source="other")  # after the end: counted only
    assert engine.poll("q.late") == [] and engine.stats()["queries"]["q"]["late"] == 2
