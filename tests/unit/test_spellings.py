"""Spark's and Flink's window syntax: other spellings of the bracket form (lowtide/query/spellings.py).

Each spelling parses into the query its bracket form gives, so ``explain`` prints the same graph
and the engine gives the same rows; what the bracket form cannot say is refused with one line
naming the bracket form to write instead.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide import Engine, LowtideError, QuerySyntaxError, UnsupportedQuery
from lowtide.operators.windows import Session
from lowtide.query import Column, Duration, FuncCall, parse_query

SCHEMA = {"k": "string", "v": "int64", "ts": "timestamp[ms]"}
ONE_MINUTE = "INTERVAL '1' MINUTE"
# The session spellings below: the bracket form's session, but merging sessions that touch.
STRICT, TOUCHING = Session(30_000, "ts"), Session(30_000, "ts", touching=True)

# (spelling, its bracket form): the bracket form written as the spelling's window text reads.
SPELLINGS = [
    pytest.param(
        "SELECT window.start, window.end, k, count(*) FROM S "
        "GROUP BY window(ts, '10 seconds', '1 second'), k",
        "SELECT k, count(*) [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S GROUP BY k",
        id="spark-sliding",
    ),
    pytest.param(
        "SELECT window, k, sum(v) AS total FROM S GROUP BY k, window(ts, '10 seconds')",
        "SELECT k, sum(v) AS total [RANGE 10 seconds, WA ts] FROM S GROUP BY k",
        id="spark-tumbling-struct",
    ),
    pytest.param(
        "SELECT window.start AS window_start, k, count(*) FROM S "
        "GROUP BY window(ts, 'INTERVAL 1 minute', '20 seconds', '0 seconds'), k",
        "SELECT k, count(*) [RANGE 1 minute, SLIDE 20 seconds, WA ts] FROM S GROUP BY k",
        id="spark-zero-start-time",
    ),
    pytest.param(
        "SELECT session_window.start, session_window.end, k, count(*) FROM S "
        "GROUP BY session_window(ts, '30 seconds'), k",
        "SELECT k, count(*) [SESSION 30 seconds, WA ts] FROM S GROUP BY k",
        id="spark-session",
    ),
    pytest.param(
        f"SELECT TUMBLE_START(ts, {ONE_MINUTE}), TUMBLE_END(ts, {ONE_MINUTE}), k, count(*) "
        f"FROM S GROUP BY TUMBLE(ts, {ONE_MINUTE}), k",
        "SELECT k, count(*) [RANGE 1 minute, WA ts] FROM S GROUP BY k",
        id="flink-tumble",
    ),
    pytest.param(
        "SELECT k, HOP_END(ts, INTERVAL '1' SECOND, INTERVAL '10' SECOND) AS window_end, avg(v) "
        "FROM S WHERE v > 2 GROUP BY HOP(ts, INTERVAL '1' SECOND, INTERVAL '10' SECOND), k "
        "HAVING count(*) > 1",
        "SELECT k, avg(v) [RANGE 10 seconds, SLIDE 1 second, WA ts] FROM S WHERE v > 2 GROUP BY k "
        "HAVING count(*) > 1",
        id="flink-hop",
    ),
    pytest.param(
        "SELECT k, SESSION_START(ts, INTERVAL '30' SECOND), count(*) FROM S "
        "GROUP BY SESSION(ts, INTERVAL '30' SECOND), k",
        "SELECT k, count(*) [SESSION 30 seconds, WA ts] FROM S GROUP BY k",
        id="flink-session",
    ),
    pytest.param(
        "SELECT window_start, window_end, k, count(*) "
        "FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '10' MINUTES)) "
        "GROUP BY window_start, window_end, k",
        "SELECT k, count(*) [RANGE 10 minutes, WA ts] FROM S GROUP BY k",
        id="flink-tvf-tumble",
    ),
    pytest.param(
        "SELECT k, window_end, min(v) FROM TABLE(HOP(TABLE S, DESCRIPTOR(ts), INTERVAL '5' SECONDS, "
        "INTERVAL '1' MINUTE)) AS t GROUP BY k, window_start, window_end",
        "SELECT k, min(v) [RANGE 1 minute, SLIDE 5 seconds, WA ts] FROM S AS t GROUP BY k",
        id="flink-tvf-hop",
    ),
    pytest.param(
        "SELECT window_start, window_end, count(*) FROM TABLE(SESSION(TABLE S, DESCRIPTOR(ts), "
        "INTERVAL '30' SECONDS)) GROUP BY window_start, window_end",
        "SELECT count(*) [SESSION 30 seconds, WA ts] FROM S",
        id="flink-tvf-session",
    ),
]


def engine() -> Engine:
    eng = Engine()
    eng.create_stream("S", SCHEMA, sources=["a", "b"])
    return eng


def outcome(call: Any) -> Any:
    """What ``call()`` gives, or its error: a spelling must fail exactly as its bracket form."""
    try:
        return call()
    except LowtideError as error:
        return f"{type(error).__name__}: {error}"


def rows(sql: str) -> Any:
    """The result rows of ``sql`` over out-of-order tuples from two sources, sorted."""
    eng = engine()
    name = eng.register_query(sql, name="q")
    rng = np.random.default_rng(13)
    for i in range(6):
        n = 200
        ts = rng.integers(i * 20_000, i * 20_000 + 60_000, n)
        batch = {"k": rng.choice(["a", "b", "c"], n).tolist(), "v": rng.integers(0, 10, n), "ts": ts}
        source = "ab"[i % 2]
        eng.push("S", batch, source=source)
        eng.punctuate("S", i * 20_000, source=source)
    eng.close_source("S", "a")
    eng.close_source("S", "b")
    tables = [item for item in eng.poll(name) if isinstance(item, pa.Table)]
    table = pa.concat_tables(tables)
    return table.column_names, sorted(tuple(row.values()) for row in table.to_pylist())


@pytest.mark.parametrize(("spelling", "bracket"), SPELLINGS)
def test_a_spelling_is_its_bracket_form(spelling: str, bracket: str) -> None:
    written, expected = parse_query(spelling), parse_query(bracket)
    assert expected.window is not None and not expected.window.touching
    if expected.window.session is not None:  # Spark's and Flink's sessions merge when they touch
        expected = replace(expected, window=replace(expected.window, touching=True))
    assert written.window == expected.window
    assert replace(written, text="") == replace(expected, text="")
    assert written.text == spelling


@pytest.mark.parametrize(("spelling", "bracket"), SPELLINGS)
def test_explain_prints_the_same_graph(spelling: str, bracket: str) -> None:
    expected = outcome(lambda: engine().explain(bracket))
    if STRICT.describe() in expected:  # but that the spelling's sessions touch, and it says so
        expected = expected.replace(STRICT.describe(), TOUCHING.describe())
    assert outcome(lambda: engine().explain(spelling)) == expected


@pytest.mark.parametrize(("spelling", "bracket"), SPELLINGS)
def test_the_same_rows(spelling: str, bracket: str) -> None:
    assert outcome(lambda: rows(spelling)) == outcome(lambda: rows(bracket))


def test_the_rows_are_real() -> None:
    names, found = rows("SELECT k, count(*) FROM S GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE), k")
    assert names == ["window_start", "window_end", "k", "count(*)", "revision"]
    assert sum(row[3] for row in found) == 6 * 200
    assert {row[1] - row[0] for row in found} == {60_000}


# ---- intervals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "duration"),
    [
        ("'10 seconds'", Duration(10, "s")),
        ("'1 second'", Duration(1, "s")),
        ("'1 minute'", Duration(1, "min")),
        ("'500 milliseconds'", Duration(500, "ms")),
        ("'INTERVAL 10 SECONDS'", Duration(10, "s")),
        ("'interval 2 hours'", Duration(2, "h")),
        ("'1 hour 30 minutes'", Duration(90, "min")),
        ("'1 week'", Duration(7, "day")),
        ("'1.5 seconds'", Duration(1.5, "s")),
        ("'250 microseconds'", Duration(0.25, "ms")),
        ("'10s'", Duration(10, "s")),
        ("INTERVAL '10' SECOND", Duration(10, "s")),
        ("INTERVAL '10' MINUTES", Duration(10, "min")),
        ("interval '1' hour", Duration(1, "h")),
        ("INTERVAL '2' DAY", Duration(2, "day")),
        ("INTERVAL 10 SECONDS", Duration(10, "s")),
        ("INTERVAL '10 seconds'", Duration(10, "s")),
    ],
)
def test_intervals(written: str, duration: Duration) -> None:
    window = parse_query(f"SELECT count(*) FROM S GROUP BY window(ts, {written})").window
    assert window is not None and window.range == duration and window.wa == Column("ts")


def test_the_window_text_is_the_bracket_form() -> None:
    def text(group: str) -> str:
        window = parse_query(f"SELECT count(*) FROM S GROUP BY {group}").window
        assert window is not None
        return window.text

    assert text("window(S.ts, '1.5 seconds', '500 milliseconds')") == (
        "[RANGE 1.5 seconds, SLIDE 500 milliseconds, WA S.ts]"
    )
    assert text("TUMBLE(\"event time\", INTERVAL '1' DAY)") == '[RANGE 1 day, WA "event time"]'
    assert text("session_window(ts, '1 hour')") == "[SESSION 1 hour, WA ts]"


# ---- what stays as it was ------------------------------------------------------------------------


def test_window_words_stay_column_names() -> None:
    q = parse_query(
        "SELECT window, session, interval, table, window.start, min(range) [RANGE 1 minute, WA ts] "
        "FROM S GROUP BY window, session, interval, table, window.start"
    )
    assert [item.expr for item in q.select][:5] == [
        Column("window"),
        Column("session"),
        Column("interval"),
        Column("table"),
        Column("start", "window"),
    ]
    assert q.select[5].expr == FuncCall("min", (Column("range"),))
    assert parse_query("SELECT sum(interval) FROM S").select[0].expr == FuncCall("sum", (Column("interval"),))


def test_a_missing_comma_between_arguments() -> None:
    for sql, column, found in [
        ("SELECT count(x y) FROM S", 16, "'y'"),
        ("SELECT quantile(len 0.5) FROM S", 21, "'0.5'"),
        ("SELECT f(a 'x') FROM S", 12, "\"'x'\""),
    ]:
        with pytest.raises(QuerySyntaxError) as info:
            parse_query(sql)
        assert info.value.column == column
        assert info.value.reason.endswith(f"unexpected {found}; expected ',', ')' or an operator")


def test_expected_tokens_after_a_name_in_arguments_list_no_values() -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query("SELECT count(x FROM S")
    assert "unexpected 'FROM'; expected AND, BETWEEN, NOT, OR, ')', ','" in info.value.reason
    assert "identifier" not in info.value.reason and "number" not in info.value.reason
    assert "string" not in info.value.reason and "number" not in info.value.reason


# ---- refusals ------------------------------------------------------------------------------------

TVF = "FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE))"
REFUSALS = [
    (
        "SELECT k, count(*) FROM S GROUP BY window(ts, '10 seconds', '1 second', '5 seconds'), k",
        "startTime of window(...) has no bracket form: lowtide's windows start at multiples of their "
        "slide from 0; without it, write [RANGE 10 seconds, SLIDE 1 second, WA ts] after the select list",
    ),
    (
        "SELECT k, count(*) [RANGE 1 minute, WA ts] FROM S GROUP BY window(ts, '10 seconds'), k",
        "two windows, [RANGE 1 minute, WA ts] and window(...) in GROUP BY: keep one, "
        "e.g. write [RANGE 10 seconds, WA ts] after the select list",
    ),
    (
        f"SELECT count(*) [RANGE 1 minute, WA ts] {TVF} GROUP BY window_start, window_end",
        "and TABLE(TUMBLE(...)) in FROM: keep one, e.g. write [RANGE 1 minute, WA ts] after the select list",
    ),
    (
        "SELECT count(*) FROM S GROUP BY window(ts, '10 seconds'), session_window(ts, '1 minute')",
        "GROUP BY has two windows, [RANGE 10 seconds, WA ts] and [SESSION 1 minute, WA ts]",
    ),
    (
        "SELECT window(ts, '10 seconds'), count(*) FROM S",
        "window(...) goes in GROUP BY: GROUP BY window(...), ..., or write [RANGE 10 seconds, WA ts] "
        "after the select list",
    ),
    (
        "SELECT window(ts, '1 minute'), count(*) FROM S GROUP BY window(ts, '10 seconds')",
        "window(...) goes in GROUP BY",
    ),
    ("SELECT count(*) FROM S WHERE v > 0 AND hop(ts, 1) = 3", "HOP(...) takes 3 to 4 arguments"),
    (
        "SELECT count(*) FROM S GROUP BY window(ts, v)",
        "must be a constant interval such as '10 seconds', not v",
    ),
    (
        "SELECT count(*) FROM S GROUP BY window(ts, 10)",
        "must be a constant interval such as '10 seconds', not 10",
    ),
    ("SELECT count(*) FROM S GROUP BY window(v + 1, '10 seconds')", "windows on a column"),
    ("SELECT count(*) FROM S GROUP BY window(ts, '1 month')", "months and years have no fixed length"),
    ("SELECT count(*) FROM S GROUP BY window(ts, 'ten seconds')", "is not an interval such as '10 seconds'"),
    ("SELECT count(*) FROM S GROUP BY window(ts)", "window(...) takes 2 to 4 arguments"),
    (
        "SELECT count(*) FROM S GROUP BY session_window(ts, v * 2)",
        "written in brackets as [SESSION g, WA ts]",
    ),
    (
        f"SELECT count(*) FROM S GROUP BY TUMBLE(ts, {ONE_MINUTE}, INTERVAL '10' SECOND)",
        "the alignment time of TUMBLE(...) has no bracket form",
    ),
    (
        "SELECT count(*) FROM TABLE(CUMULATE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE, "
        "INTERVAL '1' HOUR)) GROUP BY window_start, window_end",
        "no cumulating window (CUMULATE): the nearest, the landmark window "
        "[RANGE ALL, SLIDE 1 minute, WA ts], grows by 1 minute like it but never restarts every 1 hour",
    ),
    (
        f"SELECT count(*) FROM S GROUP BY CUMULATE(ts, {ONE_MINUTE}, INTERVAL '1' HOUR)",
        "no cumulating window",
    ),
    (
        "SELECT count(*) FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE, INTERVAL '5' "
        "SECOND)) GROUP BY window_start, window_end",
        "the offset of TUMBLE(...) has no bracket form",
    ),
    (f"SELECT k, count(*) {TVF} GROUP BY k", "needs GROUP BY window_start, window_end"),
    (f"SELECT k {TVF}", "needs GROUP BY window_start, window_end"),
    (f"SELECT window_time, count(*) {TVF} GROUP BY window_start, window_end", "window_time is not"),
    (f"SELECT count(*) {TVF}, T GROUP BY window_start, window_end", "must be all of FROM"),
    (
        "SELECT count(*) FROM TABLE(TUMBLE(TABLE S, ts, INTERVAL '1' MINUTE)) "
        "GROUP BY window_start, window_end",
        "the second argument of TUMBLE() is DESCRIPTOR(ts)",
    ),
    ("SELECT count(*) FROM TABLE(S)", "TABLE() in FROM takes a window function"),
    (
        f"SELECT TUMBLE_END(ts, INTERVAL '2' MINUTE), count(*) FROM S GROUP BY TUMBLE(ts, {ONE_MINUTE})",
        "TUMBLE_END() takes the arguments of GROUP BY TUMBLE(...)",
    ),
    (
        f"SELECT HOP_START(ts, {ONE_MINUTE}, {ONE_MINUTE}), count(*) "
        f"FROM S GROUP BY TUMBLE(ts, {ONE_MINUTE})",
        "HOP_START() needs GROUP BY HOP(...)",
    ),
    (
        f"SELECT TUMBLE_ROWTIME(ts, {ONE_MINUTE}), count(*) FROM S GROUP BY TUMBLE(ts, {ONE_MINUTE})",
        "TUMBLE_ROWTIME() is not a lowtide column",
    ),
    (
        f"SELECT TUMBLE_PROCTIME(ts, {ONE_MINUTE}), count(*) FROM S GROUP BY TUMBLE(ts, {ONE_MINUTE})",
        "event time only",
    ),
    ("SELECT window.start FROM S GROUP BY window(ts, '10 seconds')", "select a group column or an aggregate"),
    ("SELECT count(*) FROM S WHERE window.end > 3 GROUP BY window(ts, '1 second')", "cannot be in WHERE"),
    ("SELECT count(*) FROM S GROUP BY window(ts, '1 second') HAVING window > 3", "window is two columns"),
    (
        "SELECT window AS w, count(*) FROM S GROUP BY window(ts, '1 second')",
        "window is two columns, window_start and window_end: select window.start AS ... and window.end AS",
    ),
    ("SELECT count(*) FROM S GROUP BY window(ts, '1 second'), window.start", "cannot be in GROUP BY"),
    ("SELECT count(*) FROM S GROUP BY f(TABLE S)", "TABLE S is an argument of a window table function"),
]


@pytest.mark.parametrize(("sql", "reason"), REFUSALS)
def test_refusals(sql: str, reason: str) -> None:
    with pytest.raises(UnsupportedQuery) as info:
        parse_query(sql)
    assert reason in info.value.reason
    assert "\n" not in info.value.reason


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT count(*) FROM f(S)", "a function in FROM is a window table of Flink"),
        ("SELECT count(*) FROM S GROUP BY window(ts, INTERVAL 10)", "INTERVAL 10 needs a unit"),
        ("SELECT count(*) FROM S GROUP BY window(ts, INTERVAL 'ten' SECOND)", "the amount must be a number"),
        ("SELECT count(*) FROM S GROUP BY window(ts, INTERVAL '1' fortnight)", "units are ms, s, min, h"),
    ],
)
def test_syntax_errors(sql: str, reason: str) -> None:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(sql)
    assert reason in info.value.reason


def test_having_reads_a_bound_as_its_column() -> None:
    q = parse_query("SELECT count(*) FROM S GROUP BY window(ts, '1 second') HAVING window.end > 3000")
    r = parse_query("SELECT count(*) [RANGE 1 second, WA ts] FROM S HAVING window_end > 3000")
    assert q.having == r.having
    assert outcome(lambda: rows(q.text)) == outcome(lambda: rows(r.text))


FUZZ_TEXT = (
    "SELECT FROM GROUP BY HAVING WHERE AS , ( ) ( ) . * count(*) k ts window session_window TUMBLE HOP "
    "SESSION CUMULATE TUMBLE_START HOP_END TABLE DESCRIPTOR INTERVAL '1' '10 seconds' 10 MINUTE SECOND "
    "window_start window_end window.start [RANGE 1 s, WA ts] S"
)
WORDS = FUZZ_TEXT.split()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=24))
def test_only_lowtide_errors_escape(words: list[str]) -> None:
    try:
        parse_query(" ".join(words))
    except LowtideError as error:
        assert "\n" not in str(error)
