"""Behind punctuation is not late, as properties (docs/design.md, "Punctuation and lateness";
issue 14).

Punctuation runs ahead of some tuples by random amounts (``honest=False`` deliveries). Under
``drop``: the results equal the brute-force reference over every applied tuple, each counted in
the windows not yet emitted when it came (the query's progress then below the window's end);
each tuple that missed an emitted window is in ``<query>.late`` once and counted there; output
punctuation stays truthful (no row at revision 0 below one already published) and moves as
without behind tuples. The stream counts every tuple behind its punctuation.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import behind_expectation, check_emission, check_late, run
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Spec, assert_rows_equal
from strategies import deliveries, examples, specs, sql_of, stream_sources, time_windows, tuples

pytestmark = pytest.mark.property


def behind_run(spec: Spec, sources: Any, data: Any, late: str) -> tuple[Any, bool]:
    streams = {s: data.draw(tuples(max_size=25), label=f"tuples {s}") for s in sources}
    events = data.draw(deliveries(streams, sources, honest=False), label="events")
    sql = sql_of(spec, list(sources))
    obs = run(spec, sql, sources, events, late)
    return obs, obs.counts_behind


@settings(max_examples=examples(200), deadline=None)
@given(spec=specs(time_windows), sources=stream_sources(2), data=st.data())
def test_drop_counts_behind_tuples_in_every_window_not_yet_emitted(
    spec: Spec, sources: Any, data: Any
) -> None:
    obs, counts = behind_run(spec, sources, data, "drop")
    expected, late = behind_expectation(spec, obs, counts)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    check_late(obs, late)
    behind = [row for row, p in obs.arrivals if row["ts"] < p]
    assert sum(s["behind"] for s in obs.stats["streams"].values()) == len(behind)
