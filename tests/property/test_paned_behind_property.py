"""Paned-WID counts tuples behind punctuation in its windows not yet emitted
(docs/design.md, "Punctuation and lateness").

The sliding windows overlap 4 to 20 times with partial aggregates, so the planner runs them as
Paned-WID: over its own slices when the query reads a UNION, over shareable slices (one reader)
on one stream; several readers are in test_shared_slices_property. Punctuation runs ahead of
some tuples by random amounts. ``drop``: the rows equal the reference over every applied tuple,
each counted in the windows not yet emitted when it came, and the late stream holds exactly the
tuples that missed an emitted window, once (a tuple may do both). ``error``: exactly the batches
holding such a tuple are rejected, and the rows count every accepted tuple.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import (
    behind_expectation,
    check_emission,
    check_late,
    extents,
    run,
)
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Spec, Window, assert_rows_equal, evaluate
from strategies import (
    COMBINABLE,
    deliveries,
    examples,
    overlapping_windows,
    specs,
    sql_of,
    stream_sources,
    tuples,
)

pytestmark = pytest.mark.property

partials = st.lists(st.sampled_from(COMBINABLE), min_size=1, max_size=3)
# Wide slides: a tuple less than a slide behind punctuation may be in no emitted window yet.
wide_slides = st.builds(
    lambda s, k, extra: Window("sliding", s, s * k + extra),
    st.integers(3, 10),
    st.integers(4, 6),
    st.integers(0, 2),
)
one_or_two = stream_sources(1) | stream_sources(2)


def paned_run(spec: Spec, sources: Any, data: Any, late: str) -> Any:
    streams = {s: data.draw(tuples(max_size=30), label=f"tuples {s}") for s in sources}
    events = data.draw(deliveries(streams, sources, honest=False), label="events")
    sql = sql_of(spec, list(sources))
    obs = run(spec, sql, sources, events, late)
    assert "Paned-WID Aggregate" in obs.plan and obs.counts_behind
    return obs


@settings(max_examples=examples(120), deadline=None)
@given(spec=specs(overlapping_windows, aggs=partials), sources=one_or_two, data=st.data())
def test_drop_counts_behind_tuples_in_the_windows_not_yet_emitted(
    spec: Spec, sources: Any, data: Any
) -> None:
    obs = paned_run(spec, sources, data, "drop")
    expected, late = behind_expectation(spec, obs, counts=True)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    check_late(obs, late)


@settings(max_examples=examples(80), deadline=None)
@given(spec=specs(wide_slides, aggs=partials, having=False), sources=one_or_two, data=st.data())
def test_error_rejects_exactly_the_batches_with_a_tuple_in_an_emitted_window(
    spec: Spec, sources: Any, data: Any
) -> None:
    obs = paned_run(spec, sources, data, "error")
    tuples_in = [row for row, _ in obs.arrivals]
    behind = sum(row["ts"] < p for row, p in obs.arrivals)
    tally(f"batches rejected: {min(obs.rejected, 3)}+, behind and accepted: {min(behind, 3)}+")
    assert all(
        all(end > q for _, end in extents(spec, row))
        for row, q in zip(tuples_in, obs.arrival_query_progress, strict=True)
    )
    assert all(
        any(any(end <= q for _, end in extents(spec, r)) for r in rows) for rows, q in obs.rejected_batches
    )
    expected = evaluate(spec, tuples_in)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    assert obs.late == []
