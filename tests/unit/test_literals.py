"""The door pins every string literal of a planned query (`lowtide.query.literals`), wherever it
stands in the description: a worker's mirror pool must find each one's code there."""

from __future__ import annotations

from lowtide.query import parse_query
from lowtide.query.describe import describe
from lowtide.query.description import PlanOptions
from lowtide.query.literals import pin_literals
from lowtide.schema import Schema
from lowtide.strings import StringPool

SCHEMA = Schema.of({"k": "string", "u": "string", "v": "int64", "ts": "timestamp[ms]"}, "ts")


def pinned(sql: str) -> set[str]:
    pool = StringPool()
    pin_literals(describe(parse_query(sql), lambda name: SCHEMA, PlanOptions()), pool)
    return set(pool.strings())


def test_every_string_literal_is_pinned_and_nothing_else() -> None:
    sql = (
        "SELECT k, count(CASE WHEN u = 'case-when' THEN 'case-then' ELSE 'case-else' END) AS c, "
        "count(*) FILTER (WHERE u <> 'filter') AS n [RANGE 10, SLIDE 5, WA ts] FROM S "
        "WHERE k != 'where' AND v > 3 OR NOT k = 'nested' GROUP BY k HAVING k <> 'having'"
    )
    assert pinned(sql) == {"case-when", "case-then", "case-else", "filter", "where", "nested", "having"}
    assert pinned("SELECT k, v FROM S WHERE u = 'select' AND v > 1") == {"select"}  # a SelectNode's one field
    assert pinned("SELECT k, v FROM S WHERE v > 1") == set()
