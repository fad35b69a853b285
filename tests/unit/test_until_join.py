"""The until join: an interval join bounded by a column of one side, as Nexmark's q4, q6 and q9
write it (``B.dateTime BETWEEN A.dateTime AND A.expires``): planning, the operator's storage and
punctuation, and q4's join over the Nexmark generator against brute force."""

from __future__ import annotations

from collections import Counter
from typing import Any

import nexmark as nx
import numpy as np
import pyarrow as pa
import pytest
from harness import Recorder
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide import Engine, Punctuation, UnsupportedQuery
from lowtide.batch import Batch
from lowtide.operators.join_windows import JoinSide, Until
from lowtide.operators.oa_join import OAJoin
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS

Q4_JOIN = (
    "SELECT A.id, A.category, B.price FROM auction A, bid B "
    "WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires"
)
Q4_JOIN_ON = (  # with both times: the punctuation on them reaches the result
    "SELECT A.id, A.category, B.price, A.`dateTime` AS adt, B.`dateTime` AS bdt FROM bid AS B "
    "JOIN auction AS A ON A.id = B.auction WHERE B.`dateTime` BETWEEN A.`dateTime` AND A.expires"
)


def nexmark_engine() -> Engine:
    engine = Engine()
    for stream, schema in nx.SCHEMAS.items():
        engine.create_stream(stream, schema, progressing="dateTime")
    return engine


def run(sql: str, events: nx.Events, seed: int) -> list[tuple[Any, ...]]:
    """The first three columns of the rows of ``sql`` over the events delivered out of order; no
    row below the punctuation published before it on a time column it selects."""
    engine = nexmark_engine()
    engine.register_query(sql, name="q")
    rows: list[tuple[Any, ...]] = []
    published: dict[str, int] = {}

    def poll() -> None:
        for item in engine.poll("q"):
            if isinstance(item, pa.Table):
                for row in item.to_pylist():
                    assert all(nx.ms(row[name]) >= value for name, value in published.items()), row
                    rows.append(tuple(row.values())[:3])
            else:
                assert isinstance(item, Punctuation) and item.value > published.get(
                    item.attribute, NO_PROGRESS
                )
                published[item.attribute] = item.value

    for stream, batch, progress in nx.deliveries(events, seed):
        engine.push(stream, nx.arrow(stream, batch))
        for name in nx.SCHEMAS:
            engine.punctuate(name, progress)
        poll()
    assert ("adt" in sql) == (set(published) == {"adt", "bdt"})  # the join's punctuation, if selected
    for name in nx.SCHEMAS:
        engine.close_source(name)
    poll()
    assert engine.stats()["queries"]["q"]["open_windows"] == 0
    return rows


def q4_join(events: nx.Events) -> Counter[tuple[Any, ...]]:
    """q4's inner join by its definition: every (auction, bid) of the auction within its life."""
    return Counter(
        (a["id"], a["category"], b["price"])
        for a in events.rows["auction"]
        for b in events.rows["bid"]
        if a["id"] == b["auction"] and a["dateTime"] <= b["dateTime"] <= a["expires"]
    )


@pytest.mark.parametrize("sql", [Q4_JOIN, Q4_JOIN_ON])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), delay=st.sampled_from([0, 700, 4000]))
def test_q4_join_gives_its_definitions_rows_under_any_disorder(sql: str, seed: int, delay: int) -> None:
    events = nx.generate(seed, seconds=24, bids_per_second=10, delay=delay)
    expected = q4_join(events)
    assert sum(expected.values()) > 3  # the events make the join answer something
    assert Counter(run(sql, events, seed)) == expected


def test_explain_shows_the_until_window_whichever_side_is_bounded() -> None:
    engine = nexmark_engine()
    assert (
        "OA-Join until B.dateTime <= A.expires, A.dateTime - 0 <= B.dateTime on A.id = B.auction"
        in engine.explain(Q4_JOIN)
    )
    mirrored = (
        "SELECT A.id FROM bid B, auction A WHERE A.id = B.auction AND B.dateTime >= A.dateTime "
        "- INTERVAL '1' SECOND AND A.expires + INTERVAL '2' SECOND >= B.dateTime"
    )
    plan = engine.explain(mirrored)
    assert "OA-Join until B.dateTime <= A.expires + 2000, A.dateTime - 1000 <= B.dateTime" in plan
    assert "Select B.dateTime >= A.dateTime - INTERVAL '1' s" in plan  # every predicate stays a filter


def test_a_column_bound_needs_a_lower_bound_in_time() -> None:
    engine = nexmark_engine()
    with pytest.raises(UnsupportedQuery, match=r"not bounded in time.*add a lower bound"):
        engine.explain("SELECT A.id FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime <= A.expires")
    with pytest.raises(UnsupportedQuery, match="add an upper bound"):  # a string column bounds nothing
        engine.explain(
            "SELECT A.id FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime >= A.dateTime "
            "AND B.extra <= A.extra"
        )


# -- the operator -----------------------------------------------------------------------------------------
def until(side: int = 0, low: int = 0, high: int = 0) -> tuple[OAJoin, Recorder, list[int]]:
    late: list[int] = []
    sides = [JoinSide(p, ("id", "ts", "e"), "ts", ("k",)) for p in ("X", "Y")]
    if side == 1:
        sides.reverse()
    join = OAJoin(
        sides[0], sides[1], Until(side, "e", low, high), (lambda b: late.extend(b["id"].tolist()),) * 2
    )
    sink = Recorder()
    join.connect(sink)
    return join, sink, late


def batch(**cols: list[int]) -> Batch:
    return Batch({c: np.asarray(v, np.int64) for c, v in cols.items()}, len(next(iter(cols.values()))))


def test_bounded_tuples_are_stored_until_the_other_side_passes_their_bound() -> None:
    join, sink, _ = until()
    join.punctuate(Punctuation(15, "ts"), 1)  # b_y = 15: an x whose e < 15 can meet no future y
    join.process(batch(id=[1, 2, 3, 4], ts=[10, 20, 5, 30], e=[50, 30, 14, 29], k=[0, 0, 0, 0]), 0)
    assert join.open_windows() == 2  # not 3 (e 14 < 15) nor 4 (e 29 < ts 30: it pairs with nothing)
    join.process(batch(id=[10, 11, 12], ts=[25, 31, 9], e=[0, 0, 0], k=[0, 0, 0]), 1)
    assert sorted(sink.rows("X.id", "Y.id")) == [(1, 10), (1, 11), (2, 10)]  # 12: before both (late)
    assert join.threshold(0) == 15 and join.threshold(1) == NO_PROGRESS  # b_x unknown: every y stays


def test_the_bounded_sides_punctuation_follows_its_oldest_live_tuple() -> None:
    join, sink, _ = until(low=2)
    join.process(batch(id=[1, 2, 3], ts=[10, 20, 40], e=[100, 30, 60], k=[0, 1, 0]), 0)
    join.punctuate(Punctuation(50, "ts"), 0)  # b_x = 50
    join.punctuate(Punctuation(25, "ts"), 1)  # b_y = 25: all live, oldest ts 10
    assert [(p.attribute, p.value) for p in sink.punctuations()] == [("X.ts", 10), ("Y.ts", 25)]
    sink.clear()
    join.punctuate(Punctuation(70, "ts"), 1)  # x 2 (e 30) and 3 (e 60) dead, x 1 still live
    assert [(p.attribute, p.value) for p in sink.punctuations()] == [("Y.ts", 52)]  # min(70, 50 + 2)
    sink.clear()
    join.punctuate(Punctuation(101, "ts"), 1)  # x 1 dead too: b_x
    assert [(p.attribute, p.value) for p in sink.punctuations()] == [("X.ts", 50)]
    assert join.open_windows() == 0
    sink.clear()
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 0)  # x ended, none live: y's bound, not the end
    assert [(p.attribute, p.value) for p in sink.punctuations()] == [("X.ts", 101), ("Y.ts", 101)]
    sink.clear()
    join.punctuate(Punctuation(END_OF_STREAM, "ts"), 1)
    assert [(p.attribute, p.value) for p in sink.punctuations()] == [
        ("X.ts", END_OF_STREAM),
        ("Y.ts", END_OF_STREAM),
    ]


def test_behind_punctuation_a_bounded_tuple_takes_no_part_the_other_meets_live_ones() -> None:
    join, sink, late = until(side=1, low=-10)  # the right input (X here) is bounded
    join.process(batch(id=[1, 2], ts=[10, 12], e=[40, 22], k=[0, 0]), 1)
    join.punctuate(Punctuation(30, "ts"), 1)  # b_x = 30
    join.punctuate(Punctuation(25, "ts"), 0)  # b_y = 25: x 2 (e 22) is dead; out_y = min(25, 30 - 10)
    join.process(batch(id=[3], ts=[20], e=[90], k=[0]), 1)  # behind b_x: late, no pair, not stored
    join.process(batch(id=[10, 11, 12], ts=[21, 30, 19], e=[0, 0, 0], k=[0, 0, 0]), 0)  # 10, 12 behind
    assert sorted(sink.rows("X.id", "Y.id")) == [(1, 10), (1, 11)]  # not (2, 10): x 2 is dead
    assert late == [3, 10, 12]  # 12 is below out_y = 20 too: muted, no pair, not stored
    assert join.open_windows() == 3  # x 1, y 10 and y 11 (ts >= T_y = b_x - 10)
