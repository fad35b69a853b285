"""Flink SQL as its users write it (docs/design.md, "Flink SQL"): JOIN ... ON, derived tables,
interval and window joins bounded by their predicates, BETWEEN, INTERVAL arithmetic, SELECT * and
x.*, window bounds under another name, Flink's result column names; and the one-line refusals."""

from __future__ import annotations

import nexmark as nx
import pyarrow as pa
import pytest

from lowtide import END_OF_STREAM, Engine, Limits, Punctuation
from lowtide.errors import InvalidArgument, ResourceExhausted, UnsupportedQuery
from lowtide.query import parse_query
from lowtide.query.ast import BinaryOp, Column, Literal, UnaryOp

PACKET = {"k": "int64", "v": "int64", "ts": "timestamp[ms]"}


def engine() -> Engine:
    e = Engine()
    for name in ("S0", "S1"):
        e.create_stream(name, PACKET)
    return e


def rows(e: Engine, query: str) -> list[dict[str, object]]:
    return [r for item in e.poll(query) if isinstance(item, pa.Table) for r in item.to_pylist()]


def test_join_on_plans_as_the_comma_form() -> None:
    e = engine()
    bracket = (
        "SELECT S0.k, S1.v FROM S0 [RANGE 5 s, WA ts], S1 [RANGE 5 s, WA ts] WHERE S0.k = S1.k AND S1.v > 2"
    )
    joined = (
        "SELECT S0.k, S1.v FROM S0 [RANGE 5 s, WA ts] INNER JOIN S1 [RANGE 5 s, WA ts] ON S0.k = S1.k "
        "WHERE S1.v > 2"
    )
    assert e.explain(joined) == e.explain(bracket).replace("S0.k, S1.v", "k, v")


def test_between_is_inclusive_and_not_between_negates_it() -> None:
    where = parse_query("SELECT k FROM S0 WHERE v BETWEEN 1 AND 3").where
    assert where == BinaryOp(
        "AND", BinaryOp(">=", Column("v"), Literal(1)), BinaryOp("<=", Column("v"), Literal(3))
    )
    negated = parse_query("SELECT k FROM S0 WHERE v NOT BETWEEN 1 AND 3").where
    assert negated == UnaryOp("NOT", where)


def test_an_interval_join_is_bounded_by_its_between() -> None:
    e = engine()
    sql = (
        "SELECT A.k, B.v FROM S0 A JOIN S1 B ON A.k = B.k "
        "WHERE B.ts BETWEEN A.ts - INTERVAL '2' SECOND AND A.ts + INTERVAL '1' SECOND"
    )
    assert "OA-Join band A.ts - 2000 <= B.ts <= A.ts + 1000 on A.k = B.k" in e.explain(sql)
    e.register_query(sql, name="j")
    e.push("S0", {"k": [1, 1], "v": [0, 0], "ts": [10_000, 20_000]})
    e.push("S1", {"k": [1, 1, 1, 1], "v": [1, 2, 3, 4], "ts": [8_000, 7_999, 11_000, 11_001]})
    for name in ("S0", "S1"):
        e.close_source(name)
    assert sorted(r["v"] for r in rows(e, "j")) == [1, 3]  # 8000 and 11000: both ends included


def test_a_join_without_a_time_bound_is_refused_naming_one() -> None:
    with pytest.raises(
        UnsupportedQuery, match=r"not bounded in time.*add a bound to ON or WHERE, e\.g\. B\.ts BETWEEN"
    ):
        engine().register_query("SELECT A.k FROM S0 A JOIN S1 B ON A.k = B.k")
    with pytest.raises(UnsupportedQuery, match="add an upper bound"):
        engine().register_query("SELECT A.k FROM S0 A JOIN S1 B ON A.k = B.k AND B.ts >= A.ts")


def test_an_outer_join_is_refused_in_one_line() -> None:
    with pytest.raises(UnsupportedQuery, match="LEFT JOIN is not supported: lowtide's joins are inner joins"):
        parse_query("SELECT A.k FROM S0 A LEFT OUTER JOIN S1 B ON A.k = B.k")
    with pytest.raises(UnsupportedQuery, match=r"FOR SYSTEM_TIME AS OF \(Flink's lookup join"):
        parse_query("SELECT A.k FROM S0 A JOIN S1 FOR SYSTEM_TIME AS OF A.ts AS B ON A.k = B.k")


WINDOWED = (
    "SELECT k, count(*) AS n, window_start AS ws, window_end AS we "
    "FROM TABLE(TUMBLE(TABLE {s}, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY k, window_start, window_end"
)


def test_a_window_bound_under_another_name_is_a_column_of_that_name() -> None:
    e = engine()
    e.register_query(WINDOWED.format(s="S0"), name="w")
    e.push("S0", {"k": [1, 1, 2], "v": [0, 0, 0], "ts": [1_000, 2_000, 12_000]})
    e.close_source("S0")
    got = rows(e, "w")
    assert [list(r) for r in got[:1]] == [["window_start", "window_end", "k", "n", "ws", "we", "revision"]]
    assert {(r["k"], r["n"], r["ws"], r["we"]) for r in got} == {(1, 2, 0, 10_000), (2, 1, 10_000, 20_000)}


def test_a_window_join_of_derived_tables_runs_as_parts_of_its_query() -> None:
    e = engine()
    sql = (
        f"SELECT L.k, L.n, R.n AS m, L.ws FROM ({WINDOWED.format(s='S0')}) L "
        f"JOIN ({WINDOWED.format(s='S1')}) AS R ON L.k = R.k AND L.ws = R.ws AND L.we = R.we"
    )
    plan = e.explain(sql)
    assert plan.startswith("query~1:\n0. Input S0") and "\nquery:\n0. Input query~1\n1. Input query~2" in plan
    assert "OA-Join band L.window_end - 0 <= R.window_end <= L.window_end + 0" in plan
    e.register_query(sql, name="j")
    assert [q["name"] for q in e.list_queries()] == ["j"]
    assert [q["columns"] for q in e.list_queries()] == [["k", "n", "m", "ws"]]
    e.push("S0", {"k": [1, 1, 2], "v": [0, 0, 0], "ts": [1_000, 2_000, 12_000]})
    e.push("S1", {"k": [1, 2, 2], "v": [0, 0, 0], "ts": [3_000, 5_000, 15_000]})
    for name in ("S0", "S1"):
        e.close_source(name)
    assert rows(e, "j") == [{"k": 1, "n": 2, "m": 1, "ws": 0}, {"k": 2, "n": 1, "m": 1, "ws": 10_000}]
    with pytest.raises(InvalidArgument, match="'j~1' runs a derived table of query 'j'; drop 'j'"):
        e.drop_query("j~1")
    e.drop_query("j")
    e.register_query(sql, name="j")  # its parts went with it


def test_a_query_and_its_derived_tables_count_against_max_queries() -> None:
    e = Engine(limits=Limits(max_queries=2))
    e.create_stream("S0", PACKET)
    with pytest.raises(ResourceExhausted, match="at most 2 queries, and 'j' runs as 3"):
        e.register_query(
            f"SELECT L.k FROM ({WINDOWED.format(s='S0')}) L JOIN ({WINDOWED.format(s='S0')}) R "
            "ON L.we = R.we",
            name="j",
        )
    assert e.list_queries() == []


def test_a_derived_table_without_a_time_column_is_refused() -> None:
    with pytest.raises(UnsupportedQuery, match=r"derived table \(SELECT k, v FROM S0\) has no time column"):
        engine().register_query("SELECT X.k FROM (SELECT k, v FROM S0) X")


def test_star_and_qualified_star() -> None:
    e = engine()
    e.register_query("SELECT * FROM S0", name="all")
    e.register_query(
        "SELECT B.* FROM S0 A JOIN S1 B ON A.k = B.k AND A.ts BETWEEN B.ts AND B.ts + INTERVAL '1' SECOND",
        name="right",
    )
    assert [q["columns"] for q in e.list_queries()] == [["k", "v", "ts"], ["k", "v", "ts"]]
    with pytest.raises(UnsupportedQuery, match=r"C\.\* names no input"):
        e.explain("SELECT C.* FROM S0 A JOIN S1 B ON A.k = B.k AND A.ts BETWEEN B.ts AND B.ts")


def test_flink_names_a_qualified_column_by_its_name_the_bracket_form_by_its_text() -> None:
    flink = parse_query("SELECT B.k, count(*) AS n FROM S0 B GROUP BY B.k, TUMBLE(B.ts, INTERVAL '1' SECOND)")
    assert [item.name for item in flink.select] == ["k", "n"]
    bracket = parse_query("SELECT B.k, count(*) AS n [RANGE 1 s, WA ts] FROM S0 AS B GROUP BY B.k")
    assert [item.name for item in bracket.select] == ["B.k", "n"]


def test_an_interval_counts_in_the_units_of_the_column_it_meets() -> None:
    e = Engine()
    e.create_stream("U", {"k": "int64", "ts": "timestamp[us]"})
    e.register_query("SELECT k FROM U WHERE ts >= INTERVAL '1' SECOND + ts - INTERVAL '1' SECOND", name="q")
    with pytest.raises(
        UnsupportedQuery, match="INTERVAL is added to or compared with a timestamp or integer"
    ):
        e.register_query("SELECT k FROM U WHERE INTERVAL '1' SECOND > 0.5", name="bad")


def test_a_derived_tables_late_tuples_are_its_querys() -> None:
    e = engine()
    e.register_query(f"SELECT X.k, X.n FROM ({WINDOWED.format(s='S0')}) X WHERE X.n > 0", name="j")
    e.push("S0", {"k": [1], "v": [0], "ts": [15_000]})
    e.punctuate("S0", 12_000)
    e.push("S0", {"k": [2], "v": [7], "ts": [3_000]})  # its window [0, 10 s) has passed
    late = [r for item in e.poll("j.late") if isinstance(item, pa.Table) for r in item.to_pylist()]
    assert [(r["k"], r["v"]) for r in late] == [(2, 7)]
    assert e.list_queries()[0]["late_tuples"] == 1


def test_a_group_windows_bound_under_an_alias_is_a_column() -> None:
    e = engine()
    e.register_query(
        "SELECT k, TUMBLE_START(ts, INTERVAL '1' MINUTE) AS wstart, count(*) AS n "
        "FROM S0 GROUP BY k, TUMBLE(ts, INTERVAL '1' MINUTE)",
        name="q",
    )
    assert e.list_queries()[0]["columns"] == ["window_start", "window_end", "k", "wstart", "n", "revision"]
    with pytest.raises(UnsupportedQuery, match="INTERVAL"):
        e.register_query(
            "SELECT count(*) FROM S0 GROUP BY k, TUMBLE(ts, INTERVAL '1' MINUTE) "
            "HAVING sum(INTERVAL '1' MINUTE) > 1",
            name="h",
        )


def test_no_other_query_reads_a_derived_tables_part() -> None:
    e = engine()
    e.register_query(f"SELECT X.k, X.n, X.we FROM ({WINDOWED.format(s='S0')}) X", name="j")
    with pytest.raises(UnsupportedQuery, match="'j~1' runs a derived table of query 'j': read 'j'"):
        e.register_query('SELECT k, n FROM "j~1"', name="reader")


@pytest.mark.parametrize(
    ("number", "reason"),
    [
        (3, "this join is not bounded in time"),
        (6, "AVG(...) OVER (... ROWS BETWEEN ...), Flink's over aggregation"),
        (13, "FOR SYSTEM_TIME AS OF (Flink's lookup join, on processing time) is not supported"),
        (20, "this join is not bounded in time"),
    ],
)
def test_what_nexmark_writes_and_lowtide_cannot_run_is_refused_in_one_line(number: int, reason: str) -> None:
    e = Engine()
    for stream, schema in nx.SCHEMAS.items():
        e.create_stream(stream, schema, progressing="dateTime")
    with pytest.raises(UnsupportedQuery) as refused:
        e.register_query(nx.query(number), name="q")
    assert reason in refused.value.reason and "\n" not in refused.value.reason


@pytest.mark.parametrize("number", [0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19, 22])
def test_the_rest_of_nexmark_registers_as_written(number: int) -> None:
    e = Engine()
    for stream, schema in nx.SCHEMAS.items():
        e.create_stream(stream, schema, progressing="dateTime")
    e.register_query(nx.query(number), name="q")


def test_a_failed_derived_table_fails_its_query() -> None:
    e = Engine(limits=Limits(max_windows_per_step=5))
    e.create_stream("S", PACKET)
    e.register_query(
        "SELECT n, window_end AS we FROM (SELECT count(*) AS n [RANGE ALL, SLIDE 1 s, WA ts] FROM S) D "
        "WHERE n > 0",
        name="q",
    )
    e.push("S", {"k": [1], "v": [1], "ts": [500]})
    e.punctuate("S", 100_000)
    with pytest.raises(ResourceExhausted, match="query 'q' failed"):
        e.poll("q")


def test_derived_tables_take_no_late_update_and_name_their_query() -> None:
    e = engine()
    with pytest.raises(UnsupportedQuery, match="late='update' revises a derived table's windows"):
        e.register_query(f"SELECT X.k FROM ({WINDOWED.format(s='S0')}) X", name="u", late="update")
    e.register_query(f"SELECT X.k, X.we FROM ({WINDOWED.format(s='S0')}) X", name="j")
    assert e.inputs_of("j") == ["S0"]  # what j.late holds rows of
    with pytest.raises(InvalidArgument, match="stream 'S0' is read by query 'j'"):
        e.drop_stream("S0")


def test_a_query_without_time_columns_ends_its_late_stream() -> None:
    e = engine()
    e.register_query(
        "SELECT A.k, B.v FROM S0 A JOIN S1 B ON A.k = B.k AND B.ts BETWEEN A.ts AND A.ts", name="j"
    )
    for name in ("S0", "S1"):
        e.push(name, {"k": [1], "v": [1], "ts": [1_000]})
        e.close_source(name)
    assert [item.value for item in e.poll("j.late") if isinstance(item, Punctuation)][-1] == END_OF_STREAM


def test_an_unselected_group_column_claims_no_alignment() -> None:
    e = engine()
    e.register_query(
        f"SELECT max(n) AS we FROM ({WINDOWED.format(s='S0')}) D GROUP BY we",
        name="m",
    )
    assert dict(e.query("m").description.aligned) == {"window_end": 0, "window_start": -1}


@pytest.mark.parametrize(
    "window", ["TUMBLE(ts, INTERVAL '10' SECOND)", "SESSION(ts, INTERVAL '10' SECOND)", None]
)
def test_a_result_column_named_final_is_the_querys(window: str | None) -> None:
    """``final`` is the early results' column only under EMIT EVERY: q4 names its maximum so."""
    e = engine()
    group = f"k, {window}" if window else "k"
    e.register_query(f"SELECT k, max(v) AS final FROM S0 GROUP BY {group}", name="q")
    e.push("S0", {"k": [1, 1, 2], "v": [5, 9, 4], "ts": [1_000, 2_000, 3_000]})
    e.close_source("S0")
    assert sorted((r["k"], r["final"]) for r in rows(e, "q")) == [(1, 9), (2, 4)]


def test_a_group_by_without_a_window_answers_when_the_stream_ends() -> None:
    """Flink's unbounded GROUP BY: the whole stream is one window, complete only at its end
    (punctuation past every tuple completes nothing); a tuple behind punctuation still counts."""
    e = engine()
    sql = "SELECT k, count(*) AS n FROM S0 GROUP BY k"
    assert "Bucket the whole stream on ts, complete at its end" in e.explain(sql)
    e.register_query(sql, name="q")
    e.push("S0", {"k": [1, 1, 2], "v": [0, 0, 0], "ts": [1_000, 2_000, 3_000]})
    e.punctuate("S0", 50_000)
    e.push("S0", {"k": [2], "v": [0], "ts": [1_500]})  # behind punctuation
    assert rows(e, "q") == []
    e.close_source("S0")
    got = rows(e, "q")
    assert sorted((r["k"], r["n"]) for r in got) == [(1, 2), (2, 2)]
    assert {(r["window_start"], r["window_end"]) for r in got} == {(-(2**62), 2**62)}


@pytest.mark.parametrize(
    "bound",
    [
        "B.ts BETWEEN A.ts - INTERVAL '9999999999' DAY AND A.ts",
        "B.ts BETWEEN A.ts AND A.ts + 300000000000000000",
        "B.ts BETWEEN A.ts AND A.v + 300000000000000000",  # an interval bounded by a column
    ],
)
def test_a_join_bound_past_the_largest_extent_is_refused(bound: str) -> None:
    with pytest.raises(UnsupportedQuery) as refused:
        engine().register_query(f"SELECT A.k FROM S0 A JOIN S1 B ON A.k = B.k WHERE {bound}")
    assert "over the limit of 2^58 units" in refused.value.reason


def test_a_condition_reading_both_sides_inside_case_stays_after_the_join() -> None:
    """Its columns are found inside CASE too: pushed down to A's side, B.v was unknown there."""
    e = engine()
    sql = (
        "SELECT A.k, B.v FROM S0 A JOIN S1 B ON A.k = B.k WHERE B.ts BETWEEN A.ts AND A.ts + 5 "
        "AND A.v > CASE WHEN B.v > 0 THEN 1 ELSE 0 END"
    )
    e.register_query(sql, name="j")
    e.push("S0", {"k": [1, 1], "v": [1, 2], "ts": [10, 20]})
    e.push("S1", {"k": [1, 1], "v": [5, -5], "ts": [12, 22]})
    e.close_source("S0")
    e.close_source("S1")
    # A(v=1)/B(v=5): 1 > 1 no; A(v=1,ts=10) meets B(ts=12) only; A(v=2,ts=20) meets B(v=-5): 2 > 0
    assert sorted((r["k"], r["v"]) for r in rows(e, "j")) == [(1, -5)]
