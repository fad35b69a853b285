"""Nexmark's q2, q10, q14, q15, q16, q17 and q22 - selection, DATE_FORMAT, CASE and HOUR, the
UDF count_char (built in), the statistics reports of count(*) FILTER and count(DISTINCT x)
FILTER grouped by day, SPLIT_INDEX - as the nexmark project writes them for Flink SQL
(tests/data/nexmark), run in the in-process engine over bids of several days in disorder, in
batches of any size, and compared with references written here in plain Python from Flink's
definitions.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import nexmark as nx
import pyarrow as pa
import pytest
from test_door import door_over_objects

from lowtide import Engine
from lowtide.door import Door

QUERIES = Path(__file__).parents[1] / "data" / "nexmark"
SCHEMA = nx.SCHEMAS["bid"]
BASE = 1_577_836_800_000 - 3 * 3_600_000  # 2019-12-31 21:00 UTC: the bids cross midnights
SPAN = 3 * 86_400_000
DELAY = 20 * 60_000  # a bid arrives up to 20 minutes after its time
ARROW = pa.schema(
    [(c, {"int64": pa.int64(), "string": pa.string()}.get(t, pa.timestamp("ms"))) for c, t in SCHEMA.items()]
)
Row = dict[str, Any]


def flink_query(number: int) -> str:
    return (QUERIES / f"q{number}.sql").read_text(encoding="utf-8")


def bids(seed: int, n: int = 600) -> list[Row]:
    rng = random.Random(seed)
    # q14's bounds on 0.908 * price sit between 1101321 and 1101322, 55066079 and 55066080.
    prices = [5, 9_999, 10_000, 999_999, 1_000_000, 1_101_321, 1_101_322, 55_066_079, 55_066_080]
    urls = [
        "https://www.nexmark.com/a/b/c/item.htm?query=1",
        "https://www.nexmark.com/x//y",
        "short/path",
        "",
    ]
    return [
        {
            "auction": rng.choice([123, 246, 1000, 1001, rng.randrange(1, 5000)]),
            "bidder": rng.randrange(1, 12),
            "price": rng.choice([rng.choice(prices), rng.randrange(1, 60_000_000)]),
            "channel": rng.choice(["apple", "google", "baidu"]),
            "url": rng.choice([*urls, f"https://www.nexmark.com/{rng.randrange(9)}/{rng.randrange(9)}/item"]),
            "dateTime": BASE + rng.randrange(SPAN),
            # q14 counts its c's: none in many, C is another letter.
            "extra": "".join(rng.choices("abcC", k=rng.randrange(7))),
        }
        for _ in range(n)
    ]


def run(numbers: list[int], rows: list[Row], seed: int) -> dict[int, list[Row]]:
    """Every query over ``rows``: arriving up to DELAY late, in batches of 1 to 50, punctuated
    after each batch at the arrival time less DELAY (honest: no later bid is older)."""
    got = deliver(Engine(), {f"q{n}": flink_query(n) for n in numbers}, rows, seed)
    return {n: got[f"q{n}"] for n in numbers}


def deliver(
    target: Engine | Door[Any], queries: dict[str, str], rows: list[Row], seed: int
) -> dict[str, list[Row]]:
    """The rows of ``queries`` (by name, in order) over ``rows``, delivered as :func:`run` says."""
    rng = random.Random(seed)
    target.create_stream("bid", SCHEMA, progressing="dateTime", sources=["gen"])
    for name, sql in queries.items():
        target.register_query(sql, name=name)
    arriving = sorted(((r["dateTime"] + rng.randrange(DELAY), i) for i, r in enumerate(rows)))
    got: dict[str, list[Row]] = {name: [] for name in queries}
    at = 0
    while at < len(arriving):
        batch = arriving[at : at + rng.randrange(1, 51)]
        at += len(batch)
        table = pa.Table.from_pylist([rows[i] for _, i in batch], schema=ARROW)
        target.push("bid", table, source="gen")
        target.punctuate("bid", batch[-1][0] - DELAY, source="gen")
        for name in queries:
            got[name] += _rows(target, name)
    target.close_source("bid", "gen")
    for name in queries:
        got[name] += _rows(target, name)
    return got


def _rows(engine: Engine | Door[Any], query: str) -> list[Row]:
    return [row for item in engine.poll(query) if isinstance(item, pa.Table) for row in item.to_pylist()]


# ---- the references: Flink's definitions, in plain Python -----------------------------------------


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _day(ms: int) -> str:
    return _when(ms).strftime("%Y-%m-%d")


def _split(url: str, i: int) -> str | None:
    pieces = url.split("/") if url else []
    return pieces[i] if i < len(pieces) else None


def _stats(group: list[Row]) -> tuple[int, ...]:
    """q15's and q16's counts: bids, bidders and auctions, all and in each price rank."""
    ranks = [
        lambda p: True,
        lambda p: p < 10_000,
        lambda p: 10_000 <= p < 1_000_000,
        lambda p: p >= 1_000_000,
    ]
    bids_ = tuple(sum(rank(r["price"]) for r in group) for rank in ranks)
    bidders = tuple(len({r["bidder"] for r in group if rank(r["price"])}) for rank in ranks)
    auctions = tuple(len({r["auction"] for r in group if rank(r["price"])}) for rank in ranks)
    return bids_ + bidders + auctions


def _by(rows: list[Row], *key: Any) -> dict[tuple[Any, ...], list[Row]]:
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        groups.setdefault(tuple(k(r) for k in key), []).append(r)
    return groups


def expected(number: int, rows: list[Row]) -> Counter[tuple[Any, ...]]:
    if number == 2:
        return Counter((r["auction"], r["price"]) for r in rows if r["auction"] % 123 == 0)
    if number == 10:
        return Counter(
            (r["auction"], r["bidder"], r["price"], r["dateTime"], r["extra"], _day(r["dateTime"]),
             _when(r["dateTime"]).strftime("%H:%M"))
            for r in rows
        )  # fmt: skip
    if number == 14:
        out: Counter[tuple[Any, ...]] = Counter()
        for r in rows:
            price = Fraction(908, 1000) * r["price"]  # Flink's DECIMAL: exact
            if not 1_000_000 < price < 50_000_000:
                continue
            hour = _when(r["dateTime"]).hour
            kind = "dayTime" if 8 <= hour <= 18 else "nightTime" if hour <= 6 or hour >= 20 else "otherTime"
            row = (r["auction"], r["bidder"], round(float(price), 6), kind, r["dateTime"], r["extra"])
            out[(*row, r["extra"].count("c"))] += 1  # c_counts: nexmark's CountChar
        return out
    if number == 15:
        return Counter((day, *_stats(g)) for (day,), g in _by(rows, lambda r: _day(r["dateTime"])).items())
    if number == 16:
        groups = _by(rows, lambda r: r["channel"], lambda r: _day(r["dateTime"]))
        return Counter(
            (channel, day, max(_when(r["dateTime"]).strftime("%H:%M") for r in g), *_stats(g))
            for (channel, day), g in groups.items()
        )  # max of the strings, as Flink compares them
    if number == 17:
        groups = _by(rows, lambda r: r["auction"], lambda r: _day(r["dateTime"]))
        out = Counter()
        for (auction, day), g in groups.items():
            prices = [r["price"] for r in g]
            ranked = _stats(g)[:4]
            out[
                (
                    auction,
                    day,
                    *ranked,
                    min(prices),
                    max(prices),
                    round(sum(prices) / len(prices), 6),
                    sum(prices),
                )
            ] += 1
        return out
    assert number == 22
    return Counter(
        (r["auction"], r["bidder"], r["price"], r["channel"], *(_split(r["url"], i) for i in (3, 4, 5)))
        for r in rows
    )


def _ms(value: Any) -> Any:
    if isinstance(value, datetime):
        return int(value.replace(tzinfo=UTC).timestamp() * 1000)
    return round(value, 6) if isinstance(value, float) else value


def observed(number: int, got: list[Row]) -> Counter[tuple[Any, ...]]:
    """The result rows as tuples of their select items, in order (a window's bounds and the
    revision left out: Flink's rows have none)."""
    internal = {"window_start", "window_end", "revision"}
    return Counter(tuple(_ms(v) for k, v in row.items() if k not in internal) for row in got)


NUMBERS = [2, 10, 14, 15, 16, 17, 22]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_nexmark_queries_of_functions_and_filtered_aggregates_give_flinks_rows(seed: int) -> None:
    rows = bids(seed)
    got = run(NUMBERS, rows, seed)
    for number in NUMBERS:
        want = expected(number, rows)
        assert sum(want.values()) > 3, number  # the bids make the query answer something
        assert observed(number, got[number]) == want, number


def test_q16_minute_is_the_latest_of_the_day_in_text_order() -> None:
    """max(DATE_FORMAT(dateTime, 'HH:mm')) orders the minutes as text, as Flink does: not as the
    codes of strings that came in first (23:00 here, then 01:00 and 12:00)."""
    day = 1_577_836_800_000
    template = bids(0, 1)[0]
    rows = [{**template, "dateTime": day + hours * 3_600_000} for hours in (23, 1, 12)]
    engine = Engine()
    engine.create_stream("bid", SCHEMA, progressing="dateTime", sources=["gen"])
    engine.register_query("SELECT DATE_FORMAT(`dateTime`, 'HH:mm') AS m FROM bid", name="minutes")
    engine.register_query(flink_query(16), name="q16")
    engine.push("bid", pa.Table.from_pylist(rows, schema=ARROW), source="gen")
    engine.close_source("bid", "gen")
    assert [r["m"] for r in _rows(engine, "minutes")] == ["23:00", "01:00", "12:00"]
    assert [(r["day"], r["minute"]) for r in _rows(engine, "q16")] == [("2020-01-01", "23:00")]


# Queries reading the strings the others make: grouped by q16's day, by a derived table's piece of
# the URL (across workers, by the codes of strings made at the front), and filtered on them.
READERS = {
    "days": "SELECT day, count(*) AS channels, sum(total_bids) AS bids FROM q16 GROUP BY window_end, day",
    "dirs": "SELECT dir, count(*) AS n [RANGE 1 day, WA dateTime] FROM (SELECT SPLIT_INDEX(url, '/', 3) "
    "AS dir, `dateTime` FROM bid) AS d WHERE dir <> 'c' GROUP BY dir",
}


@pytest.mark.parametrize("workers", [1, 3])
def test_through_a_server_the_strings_are_made_at_its_front(workers: int) -> None:
    """Through the server's runner, over workers that are objects in this process
    (tests/unit/test_door.py), a last Project that makes strings, or reads them (q14's
    count_char), runs at the front: every query's rows, and those of the queries reading its
    strings, are the engine's."""
    rows = bids(4)
    queries = {**{f"q{n}": flink_query(n) for n in (10, 14, 15, 16, 17, 22)}, **READERS}
    server = deliver(door_over_objects(workers), queries, rows, seed=4)
    engine = deliver(Engine(), queries, rows, seed=4)
    for name in queries:
        assert len(engine[name]) > 3, name  # the data makes the query answer something
        assert Counter(map(_key, server[name])) == Counter(map(_key, engine[name])), name
    assert observed(16, server["q16"]) == expected(16, rows)
    assert observed(14, server["q14"]) == expected(14, rows)


def _key(row: Row) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(row.items()))
