"""Window Top-N: ROW_NUMBER() / RANK() / DENSE_RANK() OVER (...) parsed, planned, refused, run.

The results over many deliveries are tests/property/test_window_top_n_property.py's; here the
grammar, the plans (`explain`), every refusal's one line, and the operator's ranks on hand-made
rows (ties, NaN, DESC, negative times, a snapshot restored mid-window).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from harness import Recorder, polled

from lowtide import Engine
from lowtide.batch import Batch
from lowtide.errors import QuerySyntaxError, UnsupportedQuery
from lowtide.operators.placement import Split
from lowtide.operators.window_top_n import WindowTopN
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.query import Column, FromStream, parse_query
from lowtide.query.ast import RankCall, SortKey
from lowtide.snapshot import pack, unpack

BID = {"item": "string", "price": "float64", "supplier": "int64", "bidtime": "timestamp[ms]"}
TUMBLE = "TABLE(TUMBLE(TABLE bid, DESCRIPTOR(bidtime), INTERVAL '10' MINUTES))"
# Flink's documented Window Top-N, over a window table.
FLINK = (
    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) "
    f"AS rownum FROM {TUMBLE}) WHERE rownum <= 3"
)
# ... and over a window aggregate's result.
FLINK_AGGREGATE = (
    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) "
    "AS rownum FROM (SELECT window_start, window_end, supplier, SUM(price) AS price, COUNT(*) AS cnt "
    f"FROM {TUMBLE} GROUP BY window_start, window_end, supplier)) WHERE rownum <= 3"
)


def engine() -> Engine:
    e = Engine()
    e.create_stream("bid", BID, progressing="bidtime")
    return e


def bids(rows: list[tuple[str, float, int, int]]) -> pa.Table:
    """(item, price, supplier, minute) rows."""
    return pa.table(
        {
            "item": [r[0] for r in rows],
            "price": [r[1] for r in rows],
            "supplier": [r[2] for r in rows],
            "bidtime": pa.array([r[3] * 60_000 for r in rows], pa.timestamp("ms")),
        }
    )


def refused(sql: str) -> str:
    with pytest.raises(UnsupportedQuery) as info:
        engine().register_query(sql)
    reason = info.value.reason
    assert "\n" not in reason
    return reason


# ---- grammar ---------------------------------------------------------------------------------------


def test_a_rank_parses_into_its_partition_and_order() -> None:
    q = parse_query("SELECT a, RANK() OVER (PARTITION BY w, k ORDER BY x DESC, y ASC, z) AS r FROM s")
    rank = q.select[1].expr
    assert rank == RankCall(
        "rank",
        (Column("w"), Column("k")),
        (SortKey(Column("x"), True), SortKey(Column("y")), SortKey(Column("z"))),
    )
    assert q.select[1].alias == "r"
    assert parse_query("SELECT dense_rank() over (partition by w order by x) FROM s").select[0].expr == (
        RankCall("dense_rank", (Column("w"),), (SortKey(Column("x")),))
    )


def test_the_window_words_stay_names() -> None:
    q = parse_query("SELECT order, partition, over, asc, desc FROM s WHERE order = 1 GROUP BY partition")
    assert [item.expr for item in q.select] == [
        Column(n) for n in ("order", "partition", "over", "asc", "desc")
    ]
    for alias in ("order", "asc", "desc", "partition", "over"):
        assert parse_query(f"SELECT a FROM s {alias}").from_ == (FromStream("s", alias=alias),)
    assert parse_query("SELECT rank(x) FROM s").select[0].text == "rank(x)"  # a call, without OVER


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT sum(x) OVER (PARTITION BY w ORDER BY x) FROM s", "OVER takes ROW_NUMBER(), RANK() or"),
        ("SELECT ROW_NUMBER(x) OVER (PARTITION BY w ORDER BY x) FROM s", "ROW_NUMBER(...) OVER (...) is not"),
        ("SELECT ROW_NUMBER() OVER (PARTITION w ORDER BY x) FROM s", "expected BY"),
        ("SELECT ROW_NUMBER() OVER (PARTITION BY w ORDER BY) FROM s", "unexpected ')'"),
    ],
)
def test_over_syntax_errors(sql: str, reason: str) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(sql)
    assert reason in info.value.reason


# ---- plans -----------------------------------------------------------------------------------------


def test_the_flink_example_plans_a_window_top_n_keeping_three() -> None:
    plan = engine().explain(FLINK)
    assert (
        "1. Window Top-N over TUMBLE 600000 on bidtime, row_number() per window_start, window_end by "
        "price DESC as rownum, keeps ranks <= 3" in plan
    )
    assert "Select rownum <= 3" in plan  # the outer filter stays: it keeps what it kept


@pytest.mark.parametrize(
    ("where", "keeps"),
    [
        ("rownum <= 3", 3),
        ("rownum < 3", 2),
        ("rownum = 1", 1),
        ("3 >= rownum AND supplier > 0", 3),
        ("rownum BETWEEN 2 AND 4", 4),
        ("t.rownum <= 2 AND rownum <= 5", 2),
        ("rownum <= 0", 0),
    ],
)
def test_the_outer_filter_bounds_the_ranks_kept(where: str, keeps: int) -> None:
    inner = (
        "SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) "
        f"AS rownum FROM {TUMBLE}"
    )
    assert f"keeps ranks <= {keeps}" in engine().explain(f"SELECT * FROM ({inner}) AS t WHERE {where}")


@pytest.mark.parametrize("where", ["rownum <= 3 OR price > 1", "rownum > 3", "price <= 3", "rownum <= price"])
def test_a_filter_that_keeps_other_ranks_is_not_pushed(where: str) -> None:
    inner = (
        "SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) "
        f"AS rownum FROM {TUMBLE}"
    )
    assert "keeps ranks" not in engine().explain(f"SELECT * FROM ({inner}) WHERE {where}")


def test_a_window_aggregate_then_its_top_n() -> None:
    plan = engine().explain(FLINK_AGGREGATE)
    assert "row_number() per window_start, window_end by price DESC as rownum, keeps ranks <= 3" in plan
    assert "over TUMBLE" not in plan  # the aggregate's result is windowed already


def test_the_bracket_tumbling_window_is_the_same_plan() -> None:
    spelled = "SELECT *, RANK() OVER (PARTITION BY window_end ORDER BY price) AS r FROM " + TUMBLE
    bracket = (
        "SELECT *, RANK() OVER (PARTITION BY window_end ORDER BY price) AS r "
        "[RANGE 10 minutes, WA bidtime] FROM bid"
    )
    assert engine().explain(spelled) == engine().explain(bracket)


# ---- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        (
            "SELECT *, ROW_NUMBER() OVER (PARTITION BY window_end ORDER BY price) AS r FROM "
            "TABLE(HOP(TABLE bid, DESCRIPTOR(bidtime), INTERVAL '1' MINUTE, INTERVAL '10' MINUTES))",
            "ranks the rows of TABLE(TUMBLE(...)), not of TABLE(HOP(...))",
        ),
        (
            "SELECT *, ROW_NUMBER() OVER (PARTITION BY window_end ORDER BY price) AS r FROM "
            "TABLE(SESSION(TABLE bid, DESCRIPTOR(bidtime), INTERVAL '1' MINUTE))",
            "not of TABLE(SESSION(...))",
        ),
        (
            "SELECT * FROM TABLE(HOP(TABLE bid, DESCRIPTOR(bidtime), INTERVAL '1' MINUTE, "
            "INTERVAL '10' MINUTES))",
            "needs GROUP BY window_start, window_end",
        ),
        (
            f"SELECT *, ROW_NUMBER() OVER (PARTITION BY window_end) AS r FROM {TUMBLE}",
            "ROW_NUMBER() OVER (...) needs ORDER BY",
        ),
        (
            f"SELECT *, ROW_NUMBER() OVER (PARTITION BY window_end ORDER BY item) AS r FROM {TUMBLE}",
            "is a string",
        ),
        (
            f"SELECT *, ROW_NUMBER() OVER (PARTITION BY window_end ORDER BY price * 2) AS r FROM {TUMBLE}",
            "takes columns in PARTITION BY and ORDER BY, not price * 2",
        ),
        (
            f"SELECT * FROM {TUMBLE} WHERE ROW_NUMBER() OVER (PARTITION BY window_end ORDER BY price) <= 3",
            "is a select item of its own",
        ),
        (
            f"SELECT 1 + RANK() OVER (PARTITION BY window_end ORDER BY price) AS r FROM {TUMBLE}",
            "is a select item of its own",
        ),
        (
            f"SELECT RANK() OVER (PARTITION BY window_end ORDER BY RANK() OVER (ORDER BY price)) "
            f"FROM {TUMBLE}",
            "is a select item of its own",
        ),
        (
            f"SELECT RANK() OVER (PARTITION BY window_end ORDER BY price) AS a, "
            f"RANK() OVER (PARTITION BY window_end ORDER BY price) AS b FROM {TUMBLE}",
            "got 2 OVER (...) items",
        ),
        (
            f"SELECT window_start, window_end, supplier, sum(price) AS s, "
            f"RANK() OVER (PARTITION BY window_end ORDER BY supplier) AS r FROM {TUMBLE} "
            "GROUP BY window_start, window_end, supplier",
            "ranks rows, not groups",
        ),
        (
            "SELECT *, RANK() OVER (PARTITION BY window_end ORDER BY price) AS r "
            "[RANGE 10 minutes, SLIDE 1 minute, WA bidtime] FROM bid",
            "ranks the rows of a tumbling window",
        ),
    ],
)
def test_refusals(sql: str, reason: str) -> None:
    assert reason in refused(sql)


def test_late_update_is_refused() -> None:
    with pytest.raises(UnsupportedQuery) as info:
        engine().register_query(FLINK, late="update")
    assert "late='update'" in info.value.reason and "\n" not in info.value.reason


# ---- results ---------------------------------------------------------------------------------------


def test_the_flink_example_ranks_each_window_at_its_punctuation() -> None:
    e = engine()
    q = e.register_query(FLINK)
    e.push(
        "bid",
        bids(
            [
                *[("A", 4.0, 1, 8), ("B", 2.0, 2, 9), ("C", 5.0, 1, 12), ("D", 3.0, 2, 11)],
                *[("E", 1.0, 1, 13), ("F", 6.0, 1, 9), ("G", 4.5, 2, 14), ("H", 2.0, 2, 15)],
                *[("I", 5.5, 2, 17), ("J", 3.0, 1, 20)],
            ]
        ),
    )
    e.punctuate("bid", 10 * 60_000 - 1)
    assert polled(e, q) == ([], [600_000])  # the first window holds a row at 9:59 and before
    e.punctuate("bid", 15 * 60_000)
    rows, punctuation = polled(e, q)
    assert [(r["price"], r["rownum"], r["window_start"], r["window_end"]) for r in rows] == [
        (6.0, 1, 0, 600_000),
        (4.0, 2, 0, 600_000),
        (2.0, 3, 0, 600_000),
    ]
    assert punctuation == [1_200_000]
    e.close_source("bid")
    rows, punctuation = polled(e, q)
    assert [(r["price"], r["rownum"], r["window_end"]) for r in rows] == [
        (5.5, 1, 1_200_000),
        (5.0, 2, 1_200_000),
        (4.5, 3, 1_200_000),
        (3.0, 1, 1_800_000),
    ]
    assert punctuation == [END_OF_STREAM]


def test_a_window_aggregate_then_its_top_n_results() -> None:
    e = engine()
    q = e.register_query(FLINK_AGGREGATE)
    e.push(
        "bid",
        bids([("A", 4.0, 1, 1), ("B", 2.0, 2, 2), ("C", 1.0, 3, 3), ("D", 3.0, 2, 4), ("E", 9.0, 4, 11)]),
    )
    e.close_source("bid")
    rows, _ = polled(e, q)
    assert [(r["window_end"], r["supplier"], r["price"], r["cnt"], r["rownum"]) for r in rows] == [
        (600_000, 2, 5.0, 2, 1),
        (600_000, 1, 4.0, 1, 2),
        (600_000, 3, 1.0, 1, 3),
        (1_200_000, 4, 9.0, 1, 1),
    ]


# ---- the operator ----------------------------------------------------------------------------------


def batch(**columns: list[Any]) -> Batch:
    arrays = {name: np.asarray(values) for name, values in columns.items()}
    return Batch(arrays, len(next(iter(arrays.values()))))


def ranked(op: WindowTopN, *batches: Batch, until: int = END_OF_STREAM) -> list[tuple[Any, ...]]:
    out = Recorder()
    op.connect(out)
    for b in batches:
        op.process(b)
    op.punctuate(Punctuation(until, op.attribute))
    return out.rows(op.key, "k", "x", "id", "r")


@pytest.mark.parametrize(
    ("function", "ranks"),
    [("row_number", [1, 2, 3, 4, 5]), ("rank", [1, 2, 2, 4, 5]), ("dense_rank", [1, 2, 2, 3, 4])],
)
def test_ties_rank_as_the_function_says(function: str, ranks: list[int]) -> None:
    op = WindowTopN(function, ("we",), (("x", True),), "r", "we")
    rows = ranked(op, batch(we=[10] * 5, k=[0] * 5, x=[1.0, 5.0, 3.0, 3.0, math.nan], id=[4, 0, 2, 1, 3]))
    assert [r[4] for r in rows] == ranks
    assert [r[3] for r in rows] == [0, 1, 2, 4, 3]  # NaN last under DESC; the tie of 3.0 by id


def test_partitions_and_windows_rank_apart_and_negative_times_floor() -> None:
    op = WindowTopN("row_number", ("window_start", "k"), (("x", False),), "r", "ts", tumble=5)
    out = Recorder()
    op.connect(out)
    op.process(batch(ts=[-1, -5, -6, 0, 4], k=[1, 1, 1, 1, 2], x=[3, 2, 1, 9, 9], id=[0, 1, 2, 3, 4]))
    op.punctuate(Punctuation(-1, "ts"))  # the window [-5, 0) holds -1: not complete
    assert out.rows("id") == [(2,)] and out.punctuations() == [Punctuation(0, "window_end")]
    op.punctuate(Punctuation(0, "ts"))
    assert out.rows("id", "window_start", "r")[1:] == [(1, -5, 1), (0, -5, 2)]
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    assert out.rows("id", "k", "r")[3:] == [(3, 1, 1), (4, 2, 1)]
    assert out.punctuations()[-1] == Punctuation(END_OF_STREAM, "window_end")


def test_a_limit_prunes_what_can_never_rank_and_the_result_is_the_same() -> None:
    rows = batch(we=[10] * 8 + [20] * 4, k=[0] * 12, x=list(range(12)), id=list(range(12)))
    pruned = WindowTopN("row_number", ("we",), (("x", True),), "r", "we", limit=2, prune_at=1)
    whole = WindowTopN("row_number", ("we",), (("x", True),), "r", "we")
    parts = [rows.select(np.arange(i, i + 1)) for i in range(12)]
    assert ranked(pruned, *parts) == [r for r in ranked(whole, rows) if r[4] <= 2]
    assert pruned.state_bytes() == 0
    kept = WindowTopN("row_number", ("we",), (("x", True),), "r", "we", limit=2, prune_at=1)
    for part in parts:
        kept.process(part)
    assert kept.state_bytes() <= 2 * (2 + 2) * 4 * 8  # twice the top of each window, 4 columns


def test_a_snapshot_restores_mid_window() -> None:
    first = batch(we=[10, 10, 20], k=[0, 1, 0], x=[1, 2, 3], id=[0, 1, 2])
    second = batch(we=[10, 20], k=[0, 0], x=[5, 1], id=[3, 4])
    make = lambda: WindowTopN("rank", ("we", "k"), (("x", True),), "r", "we", limit=1, prune_at=1)  # noqa: E731
    whole = make()
    expected = ranked(whole, first, second)
    a = make()
    a.process(first)
    b = make()
    b.restore(unpack(pack(a.snapshot())))
    assert ranked(b, second) == expected


def test_placement_is_by_the_partition_columns_the_input_has() -> None:
    assert WindowTopN.placement_for(("window_start", "k"), None).keys == (("window_start", "k"),)
    assert WindowTopN.placement_for(("window_start", "k"), 5).keys == (("k",),)
    assert WindowTopN.placement_for(("window_start", "window_end"), 5).split is Split.ONE_WORKER
