"""Smooth emission (§8.3.3, slow flush) delays results, and changes nothing else.

With ``SlowFlush(every, max_windows)`` complete windows leave a few rows per input batch instead
of all at their punctuation. Whatever the delivery: the rows equal the brute-force reference,
each window row comes out once, never before punctuation covers its window, never after an
output punctuation that passed it; output punctuation rises and ends at end of stream.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import key_of, max_finite, run
from hypothesis import event as tally
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import assert_rows_equal, covered, evaluate
from strategies import deliveries, examples, specs, sql_of, stream_sources, time_windows, tuples

from lowtide import END_OF_STREAM, SlowFlush

pytestmark = pytest.mark.property


@settings(max_examples=examples(200), deadline=None)
@given(
    spec=specs(time_windows),
    every=st.sampled_from([1, 2, 7, 1000]),
    max_windows=st.integers(0, 3),
    sources=stream_sources(1),
    data=st.data(),
)
def test_slowly_flushed_windows_equal_reference(
    spec: Any, every: int, max_windows: int, sources: Any, data: Any
) -> None:
    rows = data.draw(tuples(max_size=40), label="tuples")
    events = data.draw(deliveries({"A": rows}, sources), label="events")
    obs = run(spec, sql_of(spec, ["A"]), sources, events, flush=SlowFlush(every, max_windows))
    on_time = [row for row, p in obs.arrivals if row["ts"] >= p]
    assert_rows_equal(obs.rows, evaluate(spec, on_time, progress=max_finite(obs.progress)), spec)
    seen: set[Any] = set()
    for row, call in zip(obs.rows, obs.row_call, strict=True):
        assert row["revision"] == 0
        assert key_of(row, spec) not in seen, "a window row emitted twice"
        seen.add(key_of(row, spec))
        assert covered(spec, row, obs.progress[call], obs.seen[call]), "a row before its punctuation"
    bound, values, out = None, iter(obs.punctuation), iter(obs.rows)
    for kind in obs.kinds:
        if kind == "punct":
            bound = next(values)
        else:
            row = next(out)
            assert bound is None or row["window_end"] >= bound, "a row after punctuation passed it"
    assert all(a < b for a, b in zip(obs.punctuation, obs.punctuation[1:], strict=False))
    assert obs.punctuation and obs.punctuation[-1] == END_OF_STREAM
    held = sum(
        covered(spec, row, obs.progress[call - 1], obs.seen[call - 1])
        for row, call in zip(obs.rows, obs.row_call, strict=True)
        if call
    )
    tally(f"rows held back past their punctuation's call: {held > 0}")
