"""Queries over no window - Flink's unbounded GROUP BY and Top-N, answered as the stream ends -
against a brute-force reference, under disorder, batch splits, sources and punctuation, honest or
running ahead of the data.

The reference groups (or ranks) every tuple of the stream at once, sharing no code with lowtide:
no tuple is late for the whole stream, whatever the punctuation said, so every one counts. The
properties: nothing is emitted before every source has closed, and then every group (every
partition's top) exactly once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from harness import run
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import Event, deliveries, examples, stream_sources, tuples

from lowtide import END_OF_STREAM

pytestmark = pytest.mark.property

Row = dict[str, Any]


def _nothing_before_the_end(obs: Any) -> None:
    assert all(p < END_OF_STREAM for p in obs.progress[:-1])
    ended = obs.progress.index(END_OF_STREAM) if END_OF_STREAM in obs.progress else len(obs.progress)
    assert all(call >= ended for call in obs.row_call)
    assert obs.punctuation[-1] == END_OF_STREAM


@settings(max_examples=examples(120), deadline=None)
@given(sources=stream_sources(1, max_sources=2), honest=st.booleans(), data=st.data())
def test_a_group_by_without_a_window_is_over_the_whole_stream(
    sources: Any, honest: bool, data: st.DataObject
) -> None:
    rows = data.draw(tuples(max_size=30), label="rows")
    events: list[Event] = data.draw(deliveries({"A": rows}, sources, honest=honest), label="delivery")
    obs = run(
        None, "SELECT k2, count(*) AS n, sum(v) AS s, max(ts) AS last FROM A GROUP BY k2", sources, events
    )
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row["k2"]].append(row)
    expected = Counter(
        (k2, len(members), sum(r["v"] for r in members), max(r["ts"] for r in members))
        for k2, members in groups.items()
    )
    assert Counter((r["k2"], r["n"], r["s"], r["last"]) for r in obs.rows) == expected
    _nothing_before_the_end(obs)


@settings(max_examples=examples(120), deadline=None)
@given(
    sources=stream_sources(1, max_sources=2),
    honest=st.booleans(),
    limit=st.integers(1, 3),
    descending=st.booleans(),
    data=st.data(),
)
def test_a_top_n_without_a_window_ranks_the_whole_stream(
    sources: Any, honest: bool, limit: int, descending: bool, data: st.DataObject
) -> None:
    """ROW_NUMBER per k2 by v, then ts: Flink breaks remaining ties as it likes, so rows are
    compared by what decides their rank (k2, v, ts) and the rank each such value holds."""
    rows = data.draw(tuples(max_size=30), label="rows")
    events: list[Event] = data.draw(deliveries({"A": rows}, sources, honest=honest), label="delivery")
    order = "v DESC, ts" if descending else "v, ts"
    sql = (
        f"SELECT k2, v, ts, r FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k2 ORDER BY {order}) AS r "
        f"FROM A) WHERE r <= {limit}"
    )
    obs = run(None, sql, sources, events)
    by_k2: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in rows:
        by_k2[row["k2"]].append((-row["v"] if descending else row["v"], row["ts"]))
    expected: Counter[tuple[int, int, int, int]] = Counter()
    for k2, values in by_k2.items():
        for rank, (v, ts) in enumerate(sorted(values)[:limit], 1):
            expected[(k2, -v if descending else v, ts, rank)] += 1
    assert Counter((r["k2"], r["v"], r["ts"], r["r"]) for r in obs.rows) == expected
    _nothing_before_the_end(obs)
