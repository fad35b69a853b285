"""A join of one query's results with another's (the issue's example: counts per auction per
sliding window joined with their maximum per window). Its WA on ``b.window_start`` was taken for
``b.window_end`` (the result stream's progressing attribute) without a word, and the join gave
no rows: now refused with one line, and the form it asks for gives every matching pair, against
a join written here over the two queries' own rows."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

from lowtide import Engine
from lowtide.errors import UnsupportedQuery

COUNTS = "SELECT auction, count(*) AS n [RANGE 4, SLIDE 2, WA ts] FROM bid GROUP BY auction"
TOP = "SELECT max(n) AS top [RANGE 2, WA window_end] FROM a"
AS_WRITTEN = (
    "SELECT a.auction, a.n, b.top FROM a [RANGE 1, WA window_end], b [RANGE 1, WA window_start] "
    "WHERE a.window_end = b.window_start"
)
# b's windows are 2 wide: b.window_start = b.window_end - 2, so a band of 2 holds every pair.
REWRITTEN = (
    "SELECT a.auction, a.n, b.top FROM a [RANGE 2, WA window_end], b [RANGE 2, WA window_end] "
    "WHERE a.window_end = b.window_start"
)


def engine() -> Engine:
    e = Engine()
    e.create_stream("bid", {"auction": "int64", "ts": "int64"}, sources=["s"])
    e.register_query(COUNTS, name="a")
    e.register_query(TOP, name="b")
    return e


def feed(e: Engine) -> None:
    rng = random.Random(7)
    rows = [(rng.randrange(5), rng.randrange(60)) for _ in range(400)]
    rng.shuffle(rows)
    for at in range(0, len(rows), 37):
        chunk = rows[at : at + 37]
        e.push("bid", {"auction": [r[0] for r in chunk], "ts": [r[1] for r in chunk]}, "s")
    e.close_source("bid", "s")


def table(items: list[object]) -> list[dict[str, int]]:
    tables = [item for item in items if isinstance(item, pa.Table)]
    return pa.concat_tables(tables).to_pylist() if tables else []


def test_a_window_on_a_column_that_does_not_progress_is_refused_in_one_line() -> None:
    with pytest.raises(UnsupportedQuery) as refusal:
        engine().register_query(AS_WRITTEN, name="j")
    assert str(refusal.value) == (
        "the join's window on b is on window_start, but b's rows progress on window_end (its "
        "punctuation): write WA window_end, with a RANGE that holds the pairs, and compare "
        "window_start in WHERE"
    )


def test_the_join_of_two_queries_results_gives_every_matching_pair() -> None:
    e = engine()
    e.register_query(REWRITTEN, name="j")
    feed(e)
    a, b = table(e.poll("a")), table(e.poll("b"))
    want = Counter(
        (x["auction"], x["n"], y["top"]) for x in a for y in b if x["window_end"] == y["window_start"]
    )
    got = Counter((r["a.auction"], r["a.n"], r["b.top"]) for r in table(e.poll("j")))
    assert sum(want.values()) > 20  # the example holds matches
    assert got == want
