"""CASE, the scalar functions Flink users write (HOUR, MOD, DATE_FORMAT, SPLIT_INDEX), Nexmark's
UDF COUNT_CHAR (built in) and the aggregate forms count(DISTINCT x), FILTER (WHERE ...) and
aggregates of expressions: how they parse, how they plan, what they refuse, and their values on
chosen edge cases (the property tests compare them with brute force over drawn data)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from lowtide import Engine, QuerySyntaxError, UnsupportedQuery
from lowtide.query import BinaryOp, Case, Column, FuncCall, Literal, parse_query
from lowtide.query.describe import describe
from lowtide.query.description import PlanOptions, ProjectNode
from lowtide.query.functions import DatePattern
from lowtide.schema import Schema
from lowtide.server import messages as msg
from lowtide.server.partitioning import at_front
from lowtide.server.worker_process import Worker
from lowtide.strings import StringPool

SCHEMA = {"k": "string", "v": "int64", "f": "float64", "b": "bool", "url": "string", "ts": "timestamp[ms]"}


def engine(schema: dict[str, str] = SCHEMA) -> Engine:
    e = Engine()
    e.create_stream("S", schema, progressing="ts", sources=["s"])
    return e


def rows_of(e: Engine, query: str) -> list[dict[str, Any]]:
    return [row for item in e.poll(query) if isinstance(item, pa.Table) for row in item.to_pylist()]


def run(sql: str, data: dict[str, list[Any]], schema: dict[str, str] = SCHEMA) -> list[dict[str, Any]]:
    """The rows of ``sql`` over one batch of ``data``; a column it leaves out is null (0, false)."""
    e = engine(schema)
    name = e.register_query(sql)
    n = len(data["ts"])
    blank = {"string": None, "float64": None, "bool": False}
    e.push("S", {c: data.get(c, [blank.get(kind, 0)] * n) for c, kind in schema.items()}, source="s")
    e.close_source("S", "s")
    return rows_of(e, name)


def refusal(sql: str, schema: dict[str, str] = SCHEMA) -> str:
    with pytest.raises(UnsupportedQuery) as info:
        engine(schema).register_query(sql)
    reason = info.value.reason
    assert "\n" not in reason
    return reason


# ---- parsing -------------------------------------------------------------------------------------


def test_case_parses_searched_and_simple() -> None:
    item = parse_query("SELECT CASE WHEN v > 1 THEN 'a' WHEN b THEN 'b' ELSE 'c' END AS x FROM S").select[0]
    assert item.alias == "x"
    assert item.expr == Case(
        ((BinaryOp(">", Column("v"), Literal(1)), Literal("a")), (Column("b"), Literal("b"))), Literal("c")
    )
    simple = parse_query("SELECT case v when 1 then 2 end FROM S").select[0].expr
    assert simple == Case(((BinaryOp("=", Column("v"), Literal(1)), Literal(2)),), None)


def test_case_words_stay_names_where_no_case_can_be() -> None:
    query = parse_query('SELECT "case", end, when, then, else, filter, t.case AS case FROM S AS t')
    assert [i.expr for i in query.select] == [
        Column("case"),
        Column("end"),
        Column("when"),
        Column("then"),
        Column("else"),
        Column("filter"),
        Column("case", "t"),
    ]
    assert query.select[-1].alias == "case"


def test_distinct_and_filter_parse_into_the_call() -> None:
    items = parse_query(
        "SELECT count(DISTINCT k) FILTER (WHERE v < 3), count(*) filter (where b), sum(v * 2) FROM S"
    ).select
    assert items[0].expr == FuncCall("count", (Column("k"),), True, BinaryOp("<", Column("v"), Literal(3)))
    assert items[1].expr.filter == Column("b")  # type: ignore[union-attr]
    assert items[2].expr == FuncCall("sum", (BinaryOp("*", Column("v"), Literal(2)),))
    assert items[0].text == "count(DISTINCT k) FILTER (WHERE v < 3)"


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT sum(DISTINCT v) FROM S", "DISTINCT inside a call is count(DISTINCT x) only"),
        ("SELECT CASE END FROM S", "expected WHEN"),
        ("SELECT CASE WHEN b THEN 1 FROM S", "expected"),
    ],
)
def test_syntax_errors(sql: str, reason: str) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(sql)
    assert reason in info.value.reason


# ---- date patterns -------------------------------------------------------------------------------


def test_date_patterns_and_the_intervals_they_name() -> None:
    day = DatePattern.parse("yyyy-MM-dd")
    assert day.fields == "yMd" and day.interval() == 86_400_000 and day.ordered_within_ms() == float("inf")
    assert DatePattern.parse("yyyy-MM-dd HH:mm").interval() == 60_000
    assert DatePattern.parse("dd.MM.yyyy HH").interval() == 3_600_000  # any order names an hour
    assert DatePattern.parse("yyyy-M-d").interval() == 86_400_000  # unpadded, but cut by text
    assert "read alike" in str(DatePattern.parse("yyyyMd").interval())
    assert "same minute of every day" in str(DatePattern.parse("HH:mm").interval())
    assert "no fixed length" in str(DatePattern.parse("yyyy-MM").interval())
    assert DatePattern.parse("HH:mm").ordered_within_ms() == 86_400_000
    assert DatePattern.parse("mm:ss.SSS").ordered_within_ms() == 3_600_000
    assert DatePattern.parse("dd.MM.yyyy").ordered_within_ms() is None  # out of order
    assert DatePattern.parse("H:mm").ordered_within_ms() is None  # unpadded: '9:00' > '10:00'
    assert DatePattern.parse("yyyy-MM-dd'T'HH").parts[-2] == "T"
    for bad in ("yyyy-MM-dd EEE", "yy", "MMM", "yyyy-MM-dd'", "HH:HH"):
        with pytest.raises(UnsupportedQuery):
            DatePattern.parse(bad)


def test_date_format_writes_java_patterns_in_utc() -> None:
    ts = [-1, 0, 951_782_400_000 + 86_399_999, 253_402_300_799_999]  # before 1970, 2000-02-29, 9999
    out = run(
        "SELECT DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm:ss.SSS') AS a, DATE_FORMAT(ts, 'd/M/yyyy H') AS b, "
        "DATE_FORMAT(ts, '''at'' HH''h''') AS c FROM S",
        {"ts": ts},
    )
    assert [r["a"] for r in out] == [
        "1969-12-31 23:59:59.999",
        "1970-01-01 00:00:00.000",
        "2000-02-29 23:59:59.999",
        "9999-12-31 23:59:59.999",
    ]
    assert [r["b"] for r in out] == ["31/12/1969 23", "1/1/1970 0", "29/2/2000 23", "31/12/9999 23"]
    assert out[1]["c"] == "at 00h"


@pytest.mark.parametrize(("unit", "per_ms"), [("s", 0.001), ("ms", 1), ("us", 1000), ("ns", 1_000_000)])
def test_hour_and_date_format_read_the_column_unit(unit: str, per_ms: float) -> None:
    ms = [-1000, 0, 5 * 3_600_000 + 59 * 60_000, 86_400_000 * 365 + 23 * 3_600_000]
    out = run(
        "SELECT HOUR(t) AS h, DATE_FORMAT(t, 'yyyy-MM-dd HH:mm') AS d FROM S",
        {"t": [int(m * per_ms) for m in ms], "ts": [0] * 4},
        {"t": f"timestamp[{unit}]", "ts": "int64"},
    )
    assert [r["h"] for r in out] == [23, 0, 5, 23]
    assert [r["d"] for r in out] == [
        "1969-12-31 23:59",
        "1970-01-01 00:00",
        "1970-01-01 05:59",
        "1971-01-01 23:00",
    ]


# ---- scalar functions ----------------------------------------------------------------------------


def test_mod_takes_the_dividend_sign_as_flink_does() -> None:
    out = run(
        "SELECT MOD(v, 3) AS m, MOD(f, 2) AS g FROM S",
        {"v": [-7, 7, 0], "f": [-3.5, 3.5, None], "ts": [0] * 3},
    )
    assert [r["m"] for r in out] == [-1, 1, 0]
    assert [r["g"] for r in out] == [-1.5, 1.5, None]


def test_mod_by_a_negative_literal_is_javas_remainder() -> None:
    """``-3`` parses as a minus on 3: a number literal all the same (Java: 7 % -3 == 1)."""
    out = run("SELECT MOD(v, -3) AS m FROM S", {"v": [-7, 7, 0], "ts": [0] * 3})
    assert [r["m"] for r in out] == [-1, 1, 0]


def test_split_index_is_null_where_flink_is() -> None:
    urls = ["https://x.org/a/b/c", "a//b", "/a", "a/", "", None, "no-slash"]
    out = run(
        "SELECT SPLIT_INDEX(url, '/', 0) AS i0, SPLIT_INDEX(url, '/', 1) AS i1, "
        "SPLIT_INDEX(url, '//', 1) AS w FROM S",
        {"url": urls, "ts": [0] * len(urls)},
    )
    assert [r["i0"] for r in out] == ["https:", "a", "", "a", None, None, "no-slash"]
    assert [r["i1"] for r in out] == ["", "", "a", "", None, None, None]
    assert [r["w"] for r in out] == ["x.org/a/b/c", "b", None, None, None, None, None]


@pytest.mark.parametrize("seed", [1, 2])
def test_count_char_counts_as_str_count(seed: int) -> None:
    """COUNT_CHAR over random strings (repeated ones, empty ones, ones without the character, NULL:
    0, as Nexmark's CountChar), of a column and of an expression, against str.count."""
    rng = random.Random(seed)
    words = [None, "", *("".join(rng.choices("cC.%é x", k=rng.randrange(1, 12))) for _ in range(40))]
    k = rng.choices(words, k=300)
    url = rng.choices(words, k=300)
    b = [rng.random() < 0.5 for _ in k]
    out = run(
        "SELECT COUNT_CHAR(k, 'c') AS c, count_char(url, '.') AS dot, Count_Char(k, '%') AS pct, "
        "COUNT_CHAR(url, 'é') AS e, COUNT_CHAR(CASE WHEN b THEN k ELSE url END, 'c') AS either FROM S",
        {"k": k, "url": url, "b": b, "ts": [0] * len(k)},
    )

    def count(s: str | None, char: str) -> int:
        return 0 if s is None else s.count(char)

    assert [(r["c"], r["dot"], r["pct"], r["e"], r["either"]) for r in out] == [
        (count(ki, "c"), count(ui, "."), count(ki, "%"), count(ui, "é"), count(ki if bi else ui, "c"))
        for ki, ui, bi in zip(k, url, b, strict=True)
    ]


def test_case_picks_the_first_when_that_holds() -> None:
    out = run(
        "SELECT CASE WHEN v > 5 THEN 'big' WHEN v > 0 THEN k END AS s, "
        "CASE WHEN b THEN v ELSE 0.5 END AS n, CASE v WHEN 1 THEN TRUE ELSE FALSE END AS one FROM S",
        {"k": ["x", "y", "z"], "v": [9, 1, -1], "b": [True, False, True], "ts": [0] * 3},
    )
    assert [(r["s"], r["n"], r["one"]) for r in out] == [
        ("big", 9.0, False),
        ("y", 0.5, True),
        (None, -1.0, False),
    ]


def test_a_float_literal_makes_the_product_a_float() -> None:
    out = run("SELECT 0.908 * v AS p, -0.5 * v AS q FROM S", {"v": [10, 3], "ts": [0, 0]})
    assert [(r["p"], r["q"]) for r in out] == [(9.08, -5.0), (0.908 * 3, -1.5)]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT CASE WHEN b THEN v END FROM S", "add an ELSE with a value"),
        ("SELECT CASE WHEN b THEN v ELSE 'x' END FROM S", "mixes int64 and string values"),
        ("SELECT CASE WHEN v THEN 1 ELSE 0 END FROM S", "WHEN takes a condition"),
        ("SELECT MOD(v, 0) FROM S", "divisor must not be 0"),
        ("SELECT MOD(v, -0) FROM S", "divisor must not be 0"),
        ("SELECT MOD(k, 2) FROM S", "MOD() takes numbers, not string"),
        ("SELECT HOUR(k) FROM S", "HOUR() takes a timestamp or integer column"),
        ("SELECT DATE_FORMAT(ts, k) FROM S", "pattern of DATE_FORMAT"),
        ("SELECT DATE_FORMAT(ts, 'yyyy-MM-dd EEE') FROM S", "'EEE' is not supported"),
        ("SELECT SPLIT_INDEX(url, '/', -1) FROM S", "a whole number from 0"),
        ("SELECT SPLIT_INDEX(url, '', 1) FROM S", "non-empty string"),
        ("SELECT SPLIT_INDEX(v, '/', 1) FROM S", "splits a string column"),
        ("SELECT COUNT_CHAR(v, 'c') FROM S", "in a string column, not int64: write COUNT_CHAR(s, 'c')"),
        ("SELECT COUNT_CHAR('abc', 'c') FROM S", "not the literal 'abc': write COUNT_CHAR(s, 'c')"),
        ("SELECT COUNT_CHAR(k, 'cc') FROM S", "not the literal 'cc': write COUNT_CHAR(s, 'c')"),
        ("SELECT COUNT_CHAR(k, '') FROM S", "not the literal '': write COUNT_CHAR(s, 'c')"),
        ("SELECT COUNT_CHAR(k, url) FROM S", "not a column or expression: write COUNT_CHAR(s, 'c')"),
        ("SELECT COUNT_CHAR(k) FROM S", "COUNT_CHAR takes 2 arguments: COUNT_CHAR(s, 'c')"),
        ("SELECT HOUR(ts) FILTER (WHERE b) FROM S", "HOUR() is not an aggregate"),
        ("SELECT nope(v) FROM S", "nope()"),
    ],
)
def test_scalar_refusals(sql: str, reason: str) -> None:
    assert reason in refusal(sql)


def test_computed_strings_are_pinned() -> None:
    pool = StringPool()
    first = pool.codes(["a", "b", "a"])
    assert first[0] == first[2] != first[1] and pool.codes(["b"])[0] == first[1]
    assert set(pool.pinned(first.tolist())) == set(first.tolist())


# ---- aggregates ----------------------------------------------------------------------------------


def test_group_by_date_format_is_a_tumbling_window_of_its_interval() -> None:
    query = parse_query(
        "SELECT DATE_FORMAT(ts, 'yyyy-MM-dd HH') AS hour, count(*) FROM S "
        "GROUP BY k, DATE_FORMAT(ts, 'yyyy-MM-dd HH')"
    )
    assert query.window is not None and query.window.text == "[RANGE 1 hour, WA ts]"
    assert query.group_by == (Column("k"),)
    assert query.select[0].expr == FuncCall("date_format", (Column("window_start"), Literal("yyyy-MM-dd HH")))


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("HH:mm", "has no year, month, day, so a value stands for the same minute of every day"),
        ("yyyy-MM", "months and years have no fixed length"),
        ("yyyyMd", "read alike"),
    ],
)
def test_group_by_a_date_pattern_that_names_no_interval_is_refused(pattern: str, reason: str) -> None:
    sql = f"SELECT count(*) FROM S GROUP BY DATE_FORMAT(ts, '{pattern}')"
    with pytest.raises(UnsupportedQuery) as info:
        parse_query(sql)
    assert reason in info.value.reason and "\n" not in info.value.reason


def test_aggregates_of_expressions_and_filters_plan_a_project_before_the_aggregate() -> None:
    e = engine()
    plan = e.explain(
        "SELECT k, sum(0.908 * v) AS s, count(*) FILTER (WHERE b) AS n, "
        "count(DISTINCT v) FILTER (WHERE b) AS d [RANGE 10, WA ts] FROM S WHERE v > 0 GROUP BY k"
    )
    lines = plan.splitlines()
    assert lines[1].startswith("1. Select") and lines[2] == "2. Project *, __in0, __in1, __in2, __in3"
    plain = e.explain("SELECT k, sum(v) [RANGE 10, WA ts] FROM S GROUP BY k")
    assert "Project" not in plain  # a plain aggregate computes nothing before it


def test_count_distinct_and_filter_values() -> None:
    out = run(
        "SELECT k, count(DISTINCT v) AS d, count(*) FILTER (WHERE b) AS n, "
        "count(DISTINCT v) FILTER (WHERE b) AS db, "
        "sum(v) FILTER (WHERE v < 0) AS neg, max(f) FILTER (WHERE b) AS mf, avg(v) FILTER (WHERE b) AS av "
        "[RANGE 10, WA ts] FROM S GROUP BY k",
        {
            "k": ["x", "x", "x", "y"],
            "v": [1, 1, 2, 5],
            "f": [0.5, None, 2.5, 1.0],
            "b": [True, False, True, False],
            "ts": [1, 2, 3, 4],
        },
    )
    by_key = {r["k"]: r for r in out}
    assert {n: by_key["x"][n] for n in ("d", "n", "db", "neg", "mf", "av")} == {
        "d": 2,
        "n": 2,
        "db": 2,
        "neg": 0,  # no integer NULL: a sum over no row is 0
        "mf": 2.5,
        "av": 1.5,
    }
    assert (by_key["y"]["n"], by_key["y"]["db"], by_key["y"]["mf"], by_key["y"]["av"]) == (0, 0, None, None)


def test_having_reads_filtered_aggregates_and_formatted_maxima() -> None:
    out = run(
        "SELECT k, count(*) AS n [RANGE 1 day, WA ts] FROM S GROUP BY k "
        "HAVING count(DISTINCT v) FILTER (WHERE b) >= 2 AND max(DATE_FORMAT(ts, 'HH:mm')) = '00:00'",
        {
            "k": ["x", "x", "y", "y", "w", "w"],
            "v": [1, 2, 1, 2, 1, 2],
            "b": [True, True, True, False, True, True],
            "ts": [1, 2, 3, 4, 3_600_000, 3_600_001],
        },
    )  # y has one distinct v where b; w's latest minute is 01:00
    assert [(r["k"], r["n"]) for r in out] == [("x", 2)]


def test_max_of_a_date_format_is_the_format_of_the_max_where_they_agree() -> None:
    day = 86_400_000
    out = run(
        "SELECT max(DATE_FORMAT(ts, 'HH:mm')) AS latest, min(DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm')) AS first "
        "[RANGE 1 day, WA ts] FROM S",
        {"ts": [day + 9 * 3_600_000, day + 23 * 3_600_000 + 59 * 60_000, day + 10 * 3_600_000]},
    )
    assert [(r["latest"], r["first"]) for r in out] == [("23:59", "1970-01-02 09:00")]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT max(k) [RANGE 10, WA ts] FROM S", "max() of a string (k) is not supported"),
        (  # 'HH:mm' repeats within two days: text order is no time order there
            "SELECT max(DATE_FORMAT(ts, 'HH:mm')) [RANGE 2 days, WA ts] FROM S",
            "max() of a string (date_format(ts, 'HH:mm')) is not supported",
        ),
        ("SELECT min(v) FILTER (WHERE b) [RANGE 10, WA ts] FROM S", "write min(1.0 * v) FILTER (...)"),
        ("SELECT count(*) FILTER (WHERE v) [RANGE 10, WA ts] FROM S", "takes a condition"),
        ("SELECT sum(3) [RANGE 10, WA ts] FROM S", "3 is a constant"),
        ("SELECT v + count(*) [RANGE 10, WA ts] FROM S", "v in v + count(*) must be in GROUP BY"),
    ],
)
def test_aggregate_refusals(sql: str, reason: str) -> None:
    assert reason in refusal(sql)


def test_select_items_over_aggregates_and_the_window() -> None:
    out = run(
        "SELECT k, count(*) - count(f) AS nulls, sum(v) * 2 + 1 AS twice, "
        "DATE_FORMAT(window_end, 'HH:mm:ss.SSS') AS e [RANGE 10, WA ts] FROM S GROUP BY k",
        {"k": ["x", "x"], "v": [1, 2], "f": [None, 1.0], "ts": [1, 2]},
    )
    assert [(r["nulls"], r["twice"], r["e"]) for r in out] == [(1, 7, "00:00:00.010")]


@pytest.mark.parametrize(
    ("window", "items", "operator"),
    [
        (
            "[RANGE 8, SLIDE 2, WA ts]",
            "sum(v) FILTER (WHERE b) AS s, count(*) FILTER (WHERE b) AS n",
            "Paned-WID",
        ),
        ("[RANGE 8, SLIDE 4, WA ts]", "count(DISTINCT v) FILTER (WHERE b) AS d", "AdaptWID"),
        ("[RANGE 8, WA ts]", "sum(v) FILTER (WHERE b) AS s, count(DISTINCT v) FILTER (WHERE b) AS d", "WID"),
        (
            "[SESSION 5, WA ts]",
            "sum(v) FILTER (WHERE b) AS s, count(DISTINCT v) FILTER (WHERE b) AS d",
            "Session",
        ),
        (
            "[RANGE 100, RATTR ts, SLIDE 6 ROWS, SATTR row-num]",
            "sum(v) FILTER (WHERE b) AS s, count(*) FILTER (WHERE b) AS n, "
            "count(DISTINCT v) FILTER (WHERE b) AS d",
            "Slide-by-tuple",
        ),
    ],
)
def test_a_filter_feeds_every_aggregate_operator(window: str, items: str, operator: str) -> None:
    """Each operator reads a FILTER's bool column: only the rows where it holds count."""
    sql = f"SELECT {items} {window} FROM S"
    assert f"{operator} Aggregate" in engine().explain(sql)
    out = run(sql, {"v": [1, 2, 3, 3, 5, 6], "b": [True, False] * 3, "ts": [1, 2, 3, 4, 5, 6]})
    whole = [r for r in out if r["window_start"] <= 1 and r["window_end"] > 6]  # windows of every row
    assert whole
    for row in whole:  # b holds for v = 1, 3, 5
        assert {row.get("s", 9), row.get("n", 3), row.get("d", 3)} == {9, 3}, row


@pytest.mark.parametrize(
    ("sql", "shipped"),
    [
        ("SELECT DATE_FORMAT(ts, 'HH:mm') AS m, v FROM S", ["ts", "v"]),
        ("SELECT SPLIT_INDEX(url, '/', 1) AS p FROM S", ["url"]),
        ("SELECT COUNT_CHAR(url, 'c') AS n, v FROM S", ["url", "v"]),
        (
            "SELECT k, DATE_FORMAT(window_start, 'yyyy-MM-dd') AS d, max(DATE_FORMAT(ts, 'HH:mm')) AS m "
            "FROM S GROUP BY k, DATE_FORMAT(ts, 'yyyy-MM-dd')",
            ["window_start", "window_end", "k", "__agg_0", "revision"],
        ),
        ("SELECT CASE WHEN b THEN 'y' ELSE 'n' END AS c, HOUR(ts) AS h, MOD(v, 2) AS m FROM S", None),
    ],
)
def test_a_server_runs_the_last_project_that_makes_strings_at_its_front(
    sql: str, shipped: list[str] | None
) -> None:
    """A worker's pool mirrors the front's and gives no code out (and holds no stream's text): a
    last Project that makes strings, or reads them, runs at the front, its workers' graph ends
    with the columns it reads (and builds on a mirror); other queries, CASE's literals too, run
    whole in the workers."""
    schema = Schema.of(SCHEMA, "ts")
    description = describe(parse_query(sql), lambda name: schema, PlanOptions())
    workers, front = at_front(description)
    if shipped is None:
        assert front is None and workers == description
        return
    assert front == description.nodes[-1].kind and workers.nodes[:-1] == description.nodes[:-1]
    last = workers.nodes[-1].kind
    assert isinstance(last, ProjectNode) and last.columns == tuple((c, c) for c in shipped)

    class Outbound:
        def send(self, message: Any, arrays: Any = None) -> None:
            pytest.fail(f"the worker answered {message}")  # a Failed, say

    worker = Worker(Outbound())
    worker.pool.adopt([0, 1], ["y", "n"])  # the front's codes of the literals, sent before
    assert worker.handle(msg.RegisterMessage("q", workers), {}) and "q" in worker.queries


@pytest.mark.parametrize(
    ("sql", "place"),
    [
        ("SELECT v FROM S WHERE DATE_FORMAT(ts, 'HH') = '12'", "in WHERE"),
        ("SELECT count(*) AS n [RANGE 10, WA ts] FROM S WHERE SPLIT_INDEX(url, '/', 1) = 'a'", "in WHERE"),
        ("SELECT count(DISTINCT SPLIT_INDEX(url, '/', 1)) AS n [RANGE 10, WA ts] FROM S", "argument"),
        (
            "SELECT count(*) FILTER (WHERE SPLIT_INDEX(url, '/', 1) = 'a') AS n [RANGE 10, WA ts] FROM S",
            "FILTER",
        ),
        ("SELECT max(ts) AS m [RANGE 10, WA ts] FROM S HAVING DATE_FORMAT(max(ts), 'HH') = '12'", "HAVING"),
        ("SELECT DISTINCT SPLIT_INDEX(url, '/', 1) AS p, ts FROM S", "SELECT DISTINCT"),
        ("SELECT v FROM S WHERE COUNT_CHAR(url, 'c') > 1", "in WHERE would read strings"),
        ("SELECT sum(COUNT_CHAR(url, 'c')) AS n [RANGE 10, WA ts] FROM S", "argument"),
    ],
)
def test_a_server_refuses_strings_made_in_its_workers(sql: str, place: str) -> None:
    """Elsewhere than in the last Project a string would be made (or read) in a worker: refused in
    one line, naming the derived table that makes it at the front."""
    schema = Schema.of(SCHEMA, "ts")
    description = describe(parse_query(sql), lambda name: schema, PlanOptions())
    with pytest.raises(UnsupportedQuery, match="derived table") as refused:
        at_front(description)
    assert place in str(refused.value) and "\n" not in str(refused.value)
