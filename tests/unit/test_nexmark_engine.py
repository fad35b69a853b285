"""Nexmark's windowed queries, as the nexmark project writes them for Flink SQL, run in the
in-process engine and give what their definitions give (tests/nexmark.py: Flink's semantics,
evaluated by brute force), whatever the disorder, the batch split and the punctuation."""

from __future__ import annotations

import nexmark as nx
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide import Engine, Punctuation


def _run(events: nx.Events, seed: int, numbers: list[int]) -> dict[int, list[dict[str, object]]]:
    engine = Engine()
    for stream, schema in nx.SCHEMAS.items():
        engine.create_stream(stream, schema, progressing="dateTime")
    for n in numbers:
        engine.register_query(nx.query(n), name=f"q{n}")
    got: dict[int, list[dict[str, object]]] = {n: [] for n in numbers}

    def poll() -> None:
        for n in numbers:
            for item in engine.poll(f"q{n}"):
                if isinstance(item, pa.Table):
                    got[n] += item.to_pylist()
                else:
                    assert isinstance(item, Punctuation)

    for stream, rows, progress in nx.deliveries(events, seed):
        engine.push(stream, nx.arrow(stream, rows))
        for name in nx.SCHEMAS:
            engine.punctuate(name, progress)
        poll()
    for name in nx.SCHEMAS:
        engine.close_source(name)
    poll()
    return got


@pytest.mark.parametrize("number", sorted(nx.COLUMNS))
def test_a_nexmark_query_gives_its_definitions_rows(number: int) -> None:
    events = nx.generate(seed=number)
    got = _run(events, number, [number])[number]
    expected = getattr(nx, f"q{number}")(events)
    assert sum(expected.values()) >= 3  # the events make the query answer something (q4: a row per category)
    assert nx.multiset(got, nx.COLUMNS[number]) == expected


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), delay=st.sampled_from([0, 700, 4000]))
def test_nexmark_under_any_disorder(seed: int, delay: int) -> None:
    events = nx.generate(seed, seconds=24, bids_per_second=10, delay=delay)
    got = _run(events, seed, sorted(nx.COLUMNS))
    for number, rows in got.items():
        assert nx.multiset(rows, nx.COLUMNS[number]) == getattr(nx, f"q{number}")(events), number
