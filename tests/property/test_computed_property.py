"""Aggregates with FILTER (WHERE ...), count(DISTINCT x), aggregates of expressions and select
items over aggregates, and the scalar functions (CASE, HOUR, MOD, DATE_FORMAT, SPLIT_INDEX),
against brute force written here in plain Python over the tuples.

The aggregate forms run in every kind of window, grouped or not, fed by any delivery (sources
interleaving, disorder, batches of any size, punctuation anywhere it is honest), and behind
punctuation; windows and groups come from tests/reference.py, each value from the oracles below.
The scalar functions run over rows far apart in time, split into batches at random (they compute
once per distinct value of a batch).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from harness import check_emission, max_finite, run
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Agg, Row, Spec, Window, assert_rows_equal, evaluate
from strategies import (
    any_window,
    deliveries,
    examples,
    group_bys,
    overlapping_windows,
    session_windows,
    stream_sources,
    time_windows,
    tuples,
    window_sql,
)

from lowtide import Engine

pytestmark = pytest.mark.property


def _present(values: Sequence[Any]) -> list[Any]:
    return [x for x in values if x is not None]


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def _heavy(xs: Sequence[Any], share: float) -> list[Any]:
    freq = Counter(xs)
    return sorted((x for x, c in freq.items() if c >= share * len(xs)), key=lambda x: (-freq[x], x))


def _fmod(a: int, b: int) -> int:
    """Java's remainder: the sign of the dividend."""
    return (abs(a) % abs(b)) * (1 if a >= 0 else -1)


# (select item, its value over a group's tuples); a result of no row is None (NULL), but counts
# are 0 and an integer sum is 0: lowtide has no integer NULL.
Oracle = Callable[[Sequence[Row]], Any]
CONSTRUCTS: list[tuple[str, Oracle]] = [
    ("count(*) FILTER (WHERE v > 5)", lambda rs: sum(r["v"] > 5 for r in rs)),
    ("count(f) FILTER (WHERE b)", lambda rs: sum(r["b"] and r["f"] is not None for r in rs)),
    ("count(k1) FILTER (WHERE v < 10)", lambda rs: sum(r["v"] < 10 and r["k1"] is not None for r in rs)),
    ("sum(v) FILTER (WHERE k1 = 'a')", lambda rs: sum(r["v"] for r in rs if r["k1"] == "a")),
    (
        "sum(f) FILTER (WHERE v % 2 = 0)",
        lambda rs: math.fsum(xs) if (xs := _present([r["f"] for r in rs if r["v"] % 2 == 0])) else None,
    ),
    (
        "min(f) FILTER (WHERE k2 >= 1)",
        lambda rs: min(_present([r["f"] for r in rs if r["k2"] >= 1]), default=None),
    ),
    (
        "max(f) FILTER (WHERE NOT b)",
        lambda rs: max(_present([r["f"] for r in rs if not r["b"]]), default=None),
    ),
    ("avg(v) FILTER (WHERE b)", lambda rs: _mean([r["v"] for r in rs if r["b"]])),
    (
        "var(v) FILTER (WHERE k2 <> 0)",
        lambda rs: (
            float(statistics.variance(xs)) if len(xs := [r["v"] for r in rs if r["k2"] != 0]) > 1 else None
        ),
    ),
    ("count(DISTINCT k1)", lambda rs: len(set(_present([r["k1"] for r in rs])))),
    ("count(DISTINCT v) FILTER (WHERE f > 0)", lambda rs: len({r["v"] for r in rs if (r["f"] or 0) > 0})),
    (
        "count(DISTINCT k1) FILTER (WHERE v >= 3)",
        lambda rs: len(set(_present([r["k1"] for r in rs if r["v"] >= 3]))),
    ),
    ("count(DISTINCT f) FILTER (WHERE b)", lambda rs: len(set(_present([r["f"] for r in rs if r["b"]])))),
    (
        "median(v) FILTER (WHERE b)",
        lambda rs: float(statistics.median(xs)) if (xs := [r["v"] for r in rs if r["b"]]) else None,
    ),
    (
        "heavy_hitters(k2, 0.5) FILTER (WHERE v > 0)",
        lambda rs: _heavy([r["k2"] for r in rs if r["v"] > 0], 0.5),
    ),
    ("sum(v * 2 + k2)", lambda rs: sum(r["v"] * 2 + r["k2"] for r in rs)),
    ("max(v - k2)", lambda rs: max(r["v"] - r["k2"] for r in rs)),
    ("avg(CASE WHEN b THEN v ELSE 0 END)", lambda rs: _mean([r["v"] if r["b"] else 0 for r in rs])),
    ("sum(CASE WHEN k1 = 'a' THEN 1 ELSE 0 END)", lambda rs: sum(r["k1"] == "a" for r in rs)),
    ("count(DISTINCT MOD(v, 3))", lambda rs: len({_fmod(r["v"], 3) for r in rs})),
    ("count(*) - count(f)", lambda rs: sum(r["f"] is None for r in rs)),
    (
        "sum(v) FILTER (WHERE b) * 2 + max(k2)",
        lambda rs: 2 * sum(r["v"] for r in rs if r["b"]) + max(r["k2"] for r in rs),
    ),
]


@st.composite
def filtered_specs(draw: Any, windows: st.SearchStrategy[Window]) -> tuple[Spec, str, dict[str, Oracle]]:
    """A query of 1 to 4 constructs: its spec (windows and groups for the reference), its SQL and
    each output's oracle."""
    window = draw(windows)
    group_by = tuple(g for g in draw(group_bys) if g not in window.partition)
    chosen = draw(st.lists(st.sampled_from(range(len(CONSTRUCTS))), min_size=1, max_size=4, unique=True))
    spec = Spec(window, group_by, tuple(Agg("oracle", None, f"a{i}") for i in chosen))
    items = [*spec.keys, *(f"{CONSTRUCTS[i][0]} AS a{i}" for i in chosen)]
    sql = f"SELECT {', '.join(items)} {window_sql(window)} FROM A"
    if group_by:
        sql += f" GROUP BY {', '.join(group_by)}"
    return spec, sql, {f"a{i}": CONSTRUCTS[i][1] for i in chosen}


def _oracle(oracles: dict[str, Oracle]) -> Callable[[Agg, Sequence[Row]], Any]:
    return lambda agg, rows: oracles[agg.name](rows)


@settings(max_examples=examples(250), deadline=None)
@given(
    query=filtered_specs(st.one_of(any_window, session_windows, overlapping_windows)),
    sources=stream_sources(1),
    data=st.data(),
)
def test_filtered_distinct_and_computed_aggregates_equal_brute_force(
    query: tuple[Spec, str, dict[str, Oracle]], sources: Any, data: Any
) -> None:
    spec, sql, oracles = query
    streams = {s: data.draw(tuples(max_size=25), label=f"tuples {s}") for s in sources}
    events = data.draw(deliveries(streams, sources), label="events")
    partition = spec.window.partition if spec.window.kind == "rows" else ()
    obs = run(spec, sql, sources, events, partition=partition)
    assert all(row["ts"] >= p for row, p in obs.arrivals)  # declared sources, honest punctuation
    expected = evaluate(
        spec,
        [row for row, _ in obs.arrivals],
        progress=max_finite(obs.progress),
        aggregate_of=_oracle(oracles),
    )
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    assert obs.late == []


@settings(max_examples=examples(120), deadline=None)
@given(query=filtered_specs(time_windows), sources=stream_sources(1, max_sources=2), data=st.data())
def test_behind_punctuation_they_count_in_the_windows_still_open(
    query: tuple[Spec, str, dict[str, Oracle]], sources: Any, data: Any
) -> None:
    """Undeclared sources join behind punctuation: the columns computed before the aggregate
    leave its rows the input's, so it counts each such tuple in its windows not yet emitted."""
    spec, sql, oracles = query
    streams = {s: data.draw(tuples(max_size=25), label=f"tuples {s}") for s in sources}
    events = data.draw(deliveries(streams, sources), label="events")
    obs = run(spec, sql, sources, events, declared=False)
    tuples_in = [row for row, _ in obs.arrivals]
    at = obs.arrival_query_progress
    expected = evaluate(
        spec,
        tuples_in,
        progress=max_finite(obs.progress),
        counts_in=lambda i, start, end: end > at[i],
        aggregate_of=_oracle(oracles),
    )
    assert_rows_equal(obs.rows, expected, spec)


# ---- scalar functions ----------------------------------------------------------------------------

# Java patterns and the text each gives, written with Python's datetime.
PATTERNS: dict[str, Callable[[datetime], str]] = {
    "yyyy-MM-dd": lambda d: f"{d.year:04d}-{d.month:02d}-{d.day:02d}",
    "HH:mm": lambda d: f"{d.hour:02d}:{d.minute:02d}",
    "yyyy-MM-dd HH:mm:ss.SSS": lambda d: (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d} {d.hour:02d}:{d.minute:02d}:{d.second:02d}."
        f"{d.microsecond // 1000:03d}"
    ),
    "d/M/yyyy H:m:s": lambda d: f"{d.day}/{d.month}/{d.year:04d} {d.hour}:{d.minute}:{d.second}",
    "yyyy'T'HH 'o''clock'": lambda d: f"{d.year:04d}T{d.hour:02d} o'clock",
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FIRST, LAST = -62_135_596_800_000, 253_402_300_799_999  # 0001-01-01 .. 9999-12-31, in ms


def _split_index(s: str | None, sep: str, i: int) -> str | None:
    """Flink's SPLIT_INDEX: every piece kept; NULL for a NULL or empty string or no such piece."""
    if not s:
        return None
    pieces = s.split(sep)
    return pieces[i] if i < len(pieces) else None


@st.composite
def function_rows(draw: Any) -> list[Row]:
    n = draw(st.integers(1, 40))
    near = st.integers(-3 * 86_400_000, 3 * 86_400_000)  # days around the epoch: values repeat
    times = st.one_of(near, st.integers(FIRST, LAST), st.sampled_from([FIRST, LAST, 0, -1, 951_782_400_000]))
    strings = st.one_of(st.none(), st.text(alphabet="ab/", max_size=8))
    return [
        {
            "id": i,
            "ts": draw(times),
            "v": draw(st.integers(-(2**40), 2**40)),
            "d": draw(st.integers(-50, 50).filter(lambda x: x != 0)),
            "s": draw(strings),
        }
        for i in range(n)
    ]


@settings(max_examples=examples(200), deadline=None)
@given(
    rows=function_rows(),
    pattern=st.sampled_from(sorted(PATTERNS)),
    sep=st.sampled_from(["/", "a/", "//", "b"]),
    index=st.integers(0, 4),
    cuts=st.lists(st.integers(1, 39), max_size=5),
)
def test_scalar_functions_equal_brute_force(
    rows: list[Row], pattern: str, sep: str, index: int, cuts: list[int]
) -> None:
    engine = Engine()
    schema = {"id": "int64", "ts": "timestamp[ms]", "v": "int64", "d": "int64", "s": "string"}
    engine.create_stream("S", schema, progressing="id", sources=["x"])
    literal = pattern.replace("'", "''")
    query = engine.register_query(
        f"SELECT id, HOUR(ts) AS h, DATE_FORMAT(ts, '{literal}') AS t, MOD(v, d) AS m, "
        f"SPLIT_INDEX(s, '{sep}', {index}) AS p, "
        "CASE WHEN HOUR(ts) < 6 THEN 'night' WHEN MOD(v, d) > 0 THEN s ELSE 'other' END AS c FROM S"
    )
    bounds = [0, *sorted({c for c in cuts if c < len(rows)}), len(rows)]
    for a, b in itertools.pairwise(bounds):
        engine.push("S", {c: [r[c] for r in rows[a:b]] for c in schema}, source="x")
    engine.close_source("S", "x")
    got = {r["id"]: r for item in engine.poll(query) if isinstance(item, pa.Table) for r in item.to_pylist()}
    assert sorted(got) == [r["id"] for r in rows]
    for row in rows:
        when = EPOCH + timedelta(milliseconds=row["ts"])
        mod = _fmod(row["v"], row["d"])
        case = "night" if when.hour < 6 else row["s"] if mod > 0 else "other"
        want = {
            "h": when.hour,
            "t": PATTERNS[pattern](when),
            "m": mod,
            "p": _split_index(row["s"], sep, index),
            "c": case,
        }
        assert {k: got[row["id"]][k] for k in want} == want, row
