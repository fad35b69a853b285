"""Identifiers as Flink and Spark users write them: backquoted (`dateTime`, a backquote doubled
inside) and table aliases without AS (``FROM bid B``). Each runs the plan, and gives the rows,
of the form lowtide spelled before, and a quote left open is a one-line syntax error."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lowtide import Engine
from lowtide.errors import QuerySyntaxError
from lowtide.query.parser import split_statements

SCHEMA = {"auction": "int64", "weird`name": "int64", "dateTime": "int64"}
PAIRS = [
    (
        'SELECT B.auction, count(*) AS n, sum(B."weird`name") AS w [RANGE 10, WA dateTime] '
        "FROM bid AS B GROUP BY B.auction",
        "SELECT `B`.`auction`, count(*) AS `n`, sum(B.`weird``name`) AS w [RANGE 10, WA `dateTime`] "
        "FROM `bid` B GROUP BY B.`auction`",
    ),
    (
        "SELECT L.auction, R.dateTime FROM bid AS L [RANGE 5, WA dateTime], bid AS R [RANGE 5, WA dateTime] "
        "WHERE L.auction = R.auction",
        "SELECT L.auction, R.dateTime FROM bid L [RANGE 5, WA dateTime], bid R [RANGE 5, WA dateTime] "
        "WHERE L.auction = R.auction",
    ),
]


def run(sql: str) -> tuple[str, list[dict[str, int]]]:
    engine = Engine()
    engine.create_stream("bid", SCHEMA, progressing="dateTime", sources=["s"])
    engine.register_query(sql, name="q")
    engine.push(
        "bid", {"auction": [1, 2, 1, 3, 1], "weird`name": [5, 6, 7, 8, 9], "dateTime": [3, 1, 12, 7, 4]}, "s"
    )
    engine.close_source("bid", "s")
    tables = [item for item in engine.poll("q") if isinstance(item, pa.Table)]
    rows = sorted(pa.concat_tables(tables).to_pylist(), key=repr) if tables else []
    return engine.plan_of("q"), rows


@pytest.mark.parametrize(("written", "flink"), PAIRS, ids=["backquotes", "aliases without AS"])
def test_flink_spellings_of_names_run_as_the_bracket_form(written: str, flink: str) -> None:
    plan, rows = run(written)
    assert rows
    assert run(flink) == (plan, rows)


def test_a_backquote_left_open_is_a_syntax_error_and_splits_no_script() -> None:
    with pytest.raises(QuerySyntaxError, match=r"^line 1, column 8: unterminated quoted identifier$"):
        run("SELECT `auction FROM bid")
    assert split_statements("SELECT `a;b` FROM s; SELECT 1") == ["SELECT `a;b` FROM s", "SELECT 1"]
