"""An unknown stream or query names the closest one and the ones there are (issue 22, item 10)."""

from __future__ import annotations

import pytest

from lowtide import Engine, NotFound
from lowtide.names import LISTED, unknown, visible_names

SCHEMA = {"k": "string", "ts": "int64"}
COUNT = "SELECT count(*) AS n [RANGE 10, SLIDE 10, WA ts] FROM {}"


@pytest.fixture
def engine() -> Engine:
    made = Engine()
    for name in ("Main", "Main1", "Main2", "Control"):
        made.create_stream(name, SCHEMA)
    made.register_query(COUNT.format("Main"), name="packets")
    return made


def test_an_unknown_stream_suggests_the_closest_and_lists_the_streams(engine: Engine) -> None:
    streams = "streams: Control, Main, Main1, Main2"
    with pytest.raises(NotFound) as pushed:
        engine.push("Mian", {"k": ["a"], "ts": [1]})
    assert str(pushed.value) == f"unknown stream 'Mian' (did you mean 'Main'?); {streams}"
    with pytest.raises(NotFound) as dropped:
        engine.drop_stream("Contrl")
    assert str(dropped.value) == f"unknown stream 'Contrl' (did you mean 'Control'?); {streams}"
    # FROM also reads query results: they are named there.
    with pytest.raises(NotFound) as planned:
        engine.register_query(COUNT.format("Mian"))
    assert str(planned.value) == f"unknown stream 'Mian' (did you mean 'Main'?); {streams}, packets"


def test_an_unknown_query_suggests_the_closest_and_lists_the_queries(engine: Engine) -> None:
    with pytest.raises(NotFound) as polled:
        engine.poll("packet")
    assert str(polled.value) == "unknown query 'packet' (did you mean 'packets'?); queries: packets"
    with pytest.raises(NotFound) as dropped:
        engine.drop_query("zzz")
    assert str(dropped.value) == "unknown query 'zzz'; queries: packets"
    with pytest.raises(NotFound, match=r"^unknown query 'q'; there are no queries$"):
        Engine().poll("q")


def test_the_list_is_bounded_and_filtered_by_what_the_caller_sees() -> None:
    names = [f"s{i:02}" for i in range(LISTED + 5)]
    reason = str(unknown("stream", "s99", names))
    assert reason.endswith(f"{', '.join(names[:LISTED])} and 5 more"), reason
    # A hidden name is neither suggested nor listed (a scoped token learns nothing of it).
    assert str(unknown("stream", "Secre", ["Main", "Secret"])).startswith(
        "unknown stream 'Secre' (did you mean 'Secret'?)"
    )
    token = visible_names.set(lambda kind, name: name != "Secret")
    try:
        assert str(unknown("stream", "Secre", ["Main", "Secret"])) == "unknown stream 'Secre'; streams: Main"
        assert (
            str(unknown("stream", "Secre", ["Secret"])) == "unknown stream 'Secre'"
        )  # none seen: none named
    finally:
        visible_names.reset(token)
