"""The query parser: the dissertation's queries (tests/data/thesis.sql) and the error messages."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from thesis import THESIS_SQL, thesis_queries

from lowtide.errors import LowtideError, QuerySyntaxError, UnsupportedQuery
from lowtide.query import (
    BinaryOp,
    Column,
    Duration,
    FromStream,
    FromUnion,
    FuncCall,
    Literal,
    QueryTree,
    Rank,
    RowCount,
    RowNum,
    Star,
    UnaryOp,
    parse_query,
    split_statements,
)
from lowtide.query.parser import REMEMBERED_CHARS


@pytest.fixture(scope="module")
def thesis() -> dict[str, QueryTree]:
    return {label: parse_query(sql) for label, sql in thesis_queries().items()}


def syntax_error(sql: str) -> QuerySyntaxError:
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(sql)
    return info.value


# ---- the dissertation's queries -------------------------------------------------------------------


def test_every_thesis_statement_parses() -> None:
    statements = split_statements(THESIS_SQL.read_text())
    assert len(statements) == len(thesis_queries()) == 23
    for sql in statements:
        assert parse_query(sql).text == sql


def test_q1_1_sliding_window(thesis: dict[str, QueryTree]) -> None:
    q = thesis["Q1-1"]
    assert q.window is not None
    assert q.window.range == Duration(10, "min")
    assert q.window.slide == Duration(1, "min")
    assert q.window.wa == Column("ts")
    assert q.window.text == "[RANGE 10 minutes, SLIDE 1 minute, WA ts]"
    assert [item.text for item in q.select] == ["srcIP", "count(*)"]
    assert q.select[1].expr == FuncCall("count", (Star(),))
    assert q.from_ == (FromStream("M"),)
    assert q.group_by == (Column("srcIP"),)


def test_q5_2_partitioned_tuple_window(thesis: dict[str, QueryTree]) -> None:
    window = thesis["Q5-2"].window
    assert window is not None
    assert (window.range, window.slide, window.wa) == (RowCount(1000), RowCount(10), RowNum())
    assert window.pa == (Column("srcIP"),)


def test_q5_4_landmark(thesis: dict[str, QueryTree]) -> None:
    window = thesis["Q5-4"].window
    assert window is not None
    assert window.range_all and window.range is None
    assert window.slide == Duration(1, "min")


def test_q5_5_and_q5_6_slide_by_tuple(thesis: dict[str, QueryTree]) -> None:
    q5_5, q5_6 = thesis["Q5-5"].window, thesis["Q5-6"].window
    assert q5_5 is not None and q5_6 is not None
    assert (q5_5.rattr, q5_5.slide, q5_5.sattr) == (Column("ts"), RowCount(1), RowNum())
    assert (q5_6.rattr, q5_6.slide, q5_6.sattr) == (Column("ts"), RowCount(5), Rank(Column("ts")))


def test_q5_7_window_on_the_last_join_input(thesis: dict[str, QueryTree]) -> None:
    q = thesis["Q5-7"]
    assert q.window is None and q.is_join
    first, second = q.from_
    assert first == FromStream("Main1")
    assert isinstance(second, FromStream) and second.window is not None
    assert second.window.tumbling and second.window.range == Duration(5, "min")
    assert second.window.wa == Column("ts")
    assert q.where == BinaryOp("=", Column("srcIP", "Main1"), Column("destIP", "Main2"))
    assert [item.text for item in q.select][-1] == "Main2.ts"


def test_q5_8_band_join_has_two_windows(thesis: dict[str, QueryTree]) -> None:
    ranges = [item.window.range for item in thesis["Q5-8"].from_ if item.window is not None]
    assert ranges == [Duration(3, "min"), Duration(2, "min")]


def test_q6_4_select_item_text(thesis: dict[str, QueryTree]) -> None:
    (item,) = thesis["Q6-4"].select
    assert item.text == item.name == "heavy_hitters(srcIP, 0.05)"
    assert item.expr == FuncCall("heavy_hitters", (Column("srcIP"), Literal(0.05)))


def test_q6_8_nested_unions_keep_their_nesting(thesis: dict[str, QueryTree]) -> None:
    (union,) = thesis["Q6-8"].from_
    inner = FromUnion((FromStream("Main1"), FromStream("Control")))
    assert union == FromUnion((FromStream("Main2"), inner))
    assert isinstance(union, FromUnion) and union.streams == ("Main2", "Main1", "Control")
    assert thesis["Q6-8"].window is not None and thesis["Q6-8"].window.range == Duration(10, "s")


def test_q7_1_qualified_wa_and_string_literals(thesis: dict[str, QueryTree]) -> None:
    q = thesis["Q7-1"]
    assert q.window is not None and q.window.wa == Column("ts", "S0")
    assert q.window.wa.text == "S0.ts"
    assert all(item.window is not None and item.window.wa == Column("ts") for item in q.from_)
    assert q.group_by == (Column("ts", "S0"), Column("ts", "S1"))
    assert q.where is not None and isinstance(q.where, BinaryOp)
    assert q.where.right == BinaryOp("=", Column("flags", "S1"), Literal("SYN_ACK"))


def test_q8_3_aliases_on_unions(thesis: dict[str, QueryTree]) -> None:
    left, right = thesis["Q8-3"].from_
    assert left == FromUnion((FromStream("A"), FromStream("B")), alias="M1")
    assert isinstance(right, FromUnion) and right.alias == "M2" and right.streams == ("C", "D")
    assert right.window is not None and right.window.tumbling and right.window.range == Duration(10, "s")


def test_q8_5_bare_union_chain(thesis: dict[str, QueryTree]) -> None:
    assert thesis["Q8-5"].from_ == (FromUnion((FromStream("M1"), FromStream("M2"), FromStream("C"))),)
    assert thesis["Q1-2"].from_ == (
        FromUnion((FromStream("Control"), FromStream("Main1"), FromStream("Main2"))),
    )


# ---- the language ---------------------------------------------------------------------------------


def where(predicate: str) -> object:
    return parse_query(f"SELECT a FROM M WHERE {predicate}").where


def test_precedence() -> None:
    a, b, c = Column("a"), Column("b"), Column("c")
    assert where("a OR b AND c") == BinaryOp("OR", a, BinaryOp("AND", b, c))
    assert where("NOT a = 1 AND b") == BinaryOp("AND", UnaryOp("NOT", BinaryOp("=", a, Literal(1))), b)
    assert where("a + b * c > 2") == BinaryOp(">", BinaryOp("+", a, BinaryOp("*", b, c)), Literal(2))
    assert where("a - b - c = 0") == BinaryOp("=", BinaryOp("-", BinaryOp("-", a, b), c), Literal(0))
    assert where("(a + b) % c <> -a") == BinaryOp(
        "!=", BinaryOp("%", BinaryOp("+", a, b), c), UnaryOp("-", a)
    )


def test_hyphen_is_subtraction_outside_windows() -> None:
    q = parse_query("SELECT len-1, row-num FROM M")
    assert q.select[0].expr == BinaryOp("-", Column("len"), Literal(1))
    assert q.select[0].text == "len-1"
    assert q.select[1].expr == BinaryOp("-", Column("row"), Column("num"))


def test_literals() -> None:
    q = parse_query("SELECT 5, 0.05, 1e3, 'it''s', TRUE, false, Null FROM M")
    assert [item.expr for item in q.select] == [
        Literal(5),
        Literal(0.05),
        Literal(1000.0),
        Literal("it's"),
        Literal(True),
        Literal(False),
        Literal(None),
    ]
    assert isinstance(q.select[0].expr, Literal) and type(q.select[0].expr.value) is int


def test_distinct_having_aliases_and_case() -> None:
    q = parse_query(
        'select distinct srcIP as Source, COUNT(*) AS "packet count" [range 1 MINUTE, slide 1 Min, wattr ts] '
        "from packets AS p group by srcIP having count(*) >= 10 and sum(len) > 0"
    )
    assert q.distinct
    assert [(item.alias, item.text, item.name) for item in q.select] == [
        ("Source", "srcIP", "Source"),
        ("packet count", "COUNT(*)", "packet count"),
    ]
    assert q.select[1].expr == FuncCall("count", (Star(),))
    assert q.window is not None and q.window.wa == Column("ts")
    assert q.window.range == q.window.slide == Duration(1, "min")
    assert q.from_ == (FromStream("packets", alias="p"),)
    assert isinstance(q.having, BinaryOp) and q.having.op == "AND"
    assert not parse_query("SELECT a FROM M").distinct


def test_from_window_and_alias_in_either_order() -> None:
    one = parse_query("SELECT a FROM S [RANGE 2 s, WA ts] AS x").from_[0]
    two = parse_query("SELECT a FROM S AS x [RANGE 2 s, WA ts]").from_[0]
    assert one == two and one.alias == "x" and one.window is not None


def test_window_params_in_any_order_with_a_pa_list() -> None:
    q = parse_query("SELECT a [PA srcIP, S.destIP, WA row-num, SLIDE 1 row, RANGE 5 ROWS] FROM S")
    assert q.window is not None
    assert q.window.pa == (Column("srcIP"), Column("destIP", "S"))
    assert (q.window.range, q.window.slide, q.window.wa) == (RowCount(5), RowCount(1), RowNum())


@pytest.mark.parametrize(
    ("written", "duration"),
    [
        ("250 ms", Duration(250, "ms")),
        ("2 milliseconds", Duration(2, "ms")),
        ("10s", Duration(10, "s")),
        ("3 SECS", Duration(3, "s")),
        ("1.5 mins", Duration(1.5, "min")),
        ("1 hour", Duration(1, "h")),
        ("2 h", Duration(2, "h")),
        ("7 days", Duration(7, "day")),
        ("600", Duration(600, None)),
    ],
)
def test_duration_units(written: str, duration: Duration) -> None:
    q = parse_query(f"SELECT a [RANGE {written}] FROM M")
    assert q.window is not None and q.window.range == duration


def test_soft_keywords_and_quoted_identifiers() -> None:
    q = parse_query('SELECT min(range), rows, "from" FROM "my stream"')
    assert [item.expr for item in q.select] == [
        FuncCall("min", (Column("range"),)),
        Column("rows"),
        Column("from"),
    ]
    assert q.from_ == (FromStream("my stream"),)


def test_comments_and_trailing_semicolon() -> None:
    q = parse_query("-- counts\nSELECT a -- the column\nFROM M;")
    assert q.text == "SELECT a -- the column\nFROM M"


def test_split_statements() -> None:
    script = "SELECT 'a;b' FROM M; -- x; y\n;SELECT \"c;d\" FROM N;;  "
    assert split_statements(script) == ["SELECT 'a;b' FROM M", 'SELECT "c;d" FROM N']
    assert split_statements("-- nothing\n ; ") == []


# ---- errors ---------------------------------------------------------------------------------------


def test_misspelt_keyword_names_what_was_expected() -> None:
    error = syntax_error("SELECT srcIP, count(*) [RANGE 10 minutes] FORM M")
    assert (error.line, error.column) == (1, 43)
    assert error.reason == "line 1, column 43: unexpected 'FORM'; expected FROM"


def test_missing_comma_lists_the_alternatives() -> None:
    error = syntax_error("SELECT srcIP count(*) FROM M")
    assert (error.line, error.column) == (1, 14)
    assert "unexpected 'count'; expected AND, AS, BETWEEN, FROM, NOT, OR, ','" in error.reason


def test_misspelt_window_param() -> None:
    error = syntax_error("SELECT a [RANGE 1 minute, SLID 1 minute] FROM M")
    assert error.column == 27
    assert error.reason.endswith(
        "unexpected 'SLID'; expected EMIT, PA, RANGE, RATTR, SATTR, SESSION, SLIDE, WA, ..."
    )


def test_error_positions_across_lines() -> None:
    error = syntax_error("SELECT a\nFROM M\nWHERE a = = 1")
    assert (error.line, error.column) == (3, 11)
    assert "unexpected '='" in error.reason
    error = syntax_error("SELECT a FROM M GROUP srcIP")
    assert error.reason.endswith("unexpected 'srcIP'; expected BY")


def test_reserved_word_where_a_name_belongs() -> None:
    assert "unexpected 'FROM'; expected CASE, FALSE, NOT" in syntax_error("SELECT a, FROM M").reason


def test_unexpected_end_of_query() -> None:
    error = syntax_error("SELECT a FROM M WHERE")
    assert (error.line, error.column) == (1, 22)
    assert "unexpected end of query; expected" in error.reason and "identifier" in error.reason


def test_unknown_duration_unit() -> None:
    error = syntax_error("SELECT a [RANGE 10 minuts] FROM M")
    assert error.column == 20
    assert "unknown duration unit 'minuts'" in error.reason


def test_duplicate_window_param() -> None:
    error = syntax_error("SELECT a [RANGE 1 minute, SLIDE 1 s, RANGE 2 minutes] FROM M")
    assert error.column == 38 and "window parameter RANGE given twice" in error.reason
    assert "WATTR given twice" in syntax_error("SELECT a FROM M [WA ts, WATTR ts]").reason


def test_unterminated_literals() -> None:
    error = syntax_error("SELECT a FROM M WHERE f = 'SYN")
    assert error.column == 27 and error.reason.endswith("unterminated string literal")
    assert syntax_error('SELECT "a FROM M').reason.endswith("unterminated quoted identifier")


@pytest.mark.parametrize("sql", ["", "   ", "-- just a comment\n", ";"])
def test_empty_query(sql: str) -> None:
    assert syntax_error(sql).reason == "line 1, column 1: empty query"


def test_other_rejections() -> None:
    assert "whole number" in syntax_error("SELECT a [RANGE 1.5 rows] FROM M").reason
    assert "count only" in syntax_error("SELECT sum(*) FROM M").reason
    assert "unexpected character '#'" in syntax_error("SELECT a # b FROM M").reason
    assert "expected end of query" in syntax_error("SELECT a FROM M; SELECT b FROM M").reason
    with pytest.raises(UnsupportedQuery, match="got 3"):
        parse_query("SELECT a FROM A, B, C")


FUZZ_TEXT = (
    "SELECT FROM WHERE GROUP BY HAVING AS AND NOT UNION [ ] ( ) , ; . * - = <> RANGE SLIDE WA PA "
    "SATTR rank row-num ROWS ALL TUMBLING 10 1.5 'x' ' \" ts S0 count min minutes -- # é"
)
WORDS = FUZZ_TEXT.split()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=20))
def test_only_lowtide_errors_escape(words: list[str]) -> None:
    try:
        parse_query(" ".join(words))
    except LowtideError as error:
        assert "\n" not in str(error)


# ---- the parse memo -------------------------------------------------------------------------------

# Between them: every node type a returned tree holds (FILTER, CASE, window tables, a join of a
# derived table, BETWEEN, a rank, a windowed UNION with SATTR rank).
VARIED = [
    "SELECT k, count(*) FILTER (WHERE v > 1) AS n, CASE k WHEN 'a' THEN 1 ELSE -2 END AS c "
    "FROM S [RANGE 1 minute, SLIDE 10 s, WA ts, PA k] GROUP BY k HAVING sum(v) >= 2.5",
    "SELECT window_start AS w, k, max(v) FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) "
    "GROUP BY window_start, window_end, k",
    "SELECT A.k, B.v FROM S0 A JOIN (SELECT k, v, ts FROM S1 WHERE NOT v BETWEEN 1 AND 3) B ON A.k = B.k",
    "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC) AS r "
    "FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE))) WHERE r <= 3",
    "SELECT a, count(DISTINCT b) FROM (M1 UNION M2) [RANGE 10 rows, SATTR rank(ts), WA row-num] GROUP BY a",
]


def _mutable_parts(node: object) -> list[str]:
    """What under ``node`` is neither a frozen dataclass, a tuple nor an immutable scalar."""
    found, stack = [], [node]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, str | int | float):
            continue
        if isinstance(item, tuple):
            stack.extend(item)
        elif dataclasses.is_dataclass(item) and type(item).__dataclass_params__.frozen:  # type: ignore[union-attr]
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        else:
            found.append(type(item).__name__)
    return found


def test_a_tree_is_immutable_end_to_end() -> None:
    # What makes handing one tree to every reader of a text safe.
    for sql in [*thesis_queries().values(), *VARIED]:
        assert _mutable_parts(parse_query(sql)) == [], sql


def test_a_text_parses_once() -> None:
    sql = "SELECT a, count(*) FROM M [RANGE 5 minutes, WA ts] GROUP BY a -- memo"
    first = parse_query(sql)
    assert parse_query(sql) is first
    assert parse_query(sql.replace("5", "6")) is not first
    assert parse_query(sql.replace("5", "6")) != first
    padded = sql + " " * REMEMBERED_CHARS  # too long to keep: parsed anew each time
    assert parse_query(padded) == first
    assert parse_query(padded) is not parse_query(padded)


def test_an_error_is_raised_anew_each_time() -> None:
    sql = "SELECT a FROM M WHERE -- memo"
    first, second = syntax_error(sql), syntax_error(sql)
    assert first is not second
    assert str(first) == str(second)
    assert "unexpected end of query; expected" in first.reason
    for _ in range(2):
        with pytest.raises(UnsupportedQuery, match="got 3"):
            parse_query("SELECT a FROM A, B, C -- memo")
