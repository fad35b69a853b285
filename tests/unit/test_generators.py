"""Punctuation generators, granularity, derived streams and the demo, through the Engine."""

from __future__ import annotations

import pytest

from lowtide import Engine, InvalidArgument, ManualClock, Punctuation
from lowtide.punctuation.generators import Generator, parse_duration_ms

SCHEMA = {"k": "string", "v": "int64", "ts": "timestamp[ms]"}
TUMBLING = "SELECT k, count(*) AS n [RANGE 10 ms, SLIDE 10 ms, WA ts] FROM S GROUP BY k"


def punctuations(items: list[object]) -> list[int]:
    return [item.value for item in items if isinstance(item, Punctuation)]


def rows(items: list[object]) -> list[dict[str, object]]:
    return [row for item in items if not isinstance(item, Punctuation) for row in item.to_pylist()]  # type: ignore[attr-defined]


def test_ordered_progress_is_the_largest_value_seen() -> None:
    eng = Engine()
    eng.create_stream("S", SCHEMA, punctuation="ordered")
    q = eng.register_query(TUMBLING)
    eng.push("S", {"k": ["a", "a"], "v": [1, 2], "ts": [3, 12]})
    out = eng.poll(q)
    assert rows(out) == [{"window_start": 0, "window_end": 10, "k": "a", "n": 1, "revision": 0}]
    assert punctuations(out) == [20]


def test_bounded_slack_holds_windows_back() -> None:
    eng = Engine()
    eng.create_stream("S", SCHEMA, punctuation="bounded:5")
    q = eng.register_query(TUMBLING)
    eng.push("S", {"k": ["a"], "v": [1], "ts": [12]})
    # 12 - 5 = 7, floored to the slide: progress 0 closes nothing; the first open window ends at 10.
    assert eng.poll(q) == [Punctuation(10)]
    eng.push("S", {"k": ["a"], "v": [1], "ts": [25]})  # progress 20 closes [10, 20)
    assert rows(eng.poll(q)) == [{"window_start": 10, "window_end": 20, "k": "a", "n": 1, "revision": 0}]
    eng.push("S", {"k": ["b"], "v": [1], "ts": [9]})  # below progress 20: late
    assert eng.list_queries()[0]["late_tuples"] == 1
    assert [r["k"] for r in rows(eng.poll(q.name + ".late"))] == ["b"]


def test_heartbeat_advances_through_a_lull_on_the_manual_clock() -> None:
    clock = ManualClock(start=100.0)
    eng = Engine(clock=clock)
    eng.create_stream("S", SCHEMA, punctuation="heartbeat:1s,2s")
    q = eng.register_query(TUMBLING)
    eng.push("S", {"k": ["a"], "v": [1], "ts": [97_000]})
    eng.poll(q)
    clock.advance(5.0)  # 105 s of wall time: the heartbeat promises 103 s
    out = eng.poll(q)
    assert rows(out) == [{"window_start": 97_000, "window_end": 97_010, "k": "a", "n": 1, "revision": 0}]
    assert punctuations(out) == [103_010]  # progress 103 000: the first open window ends at 103 010


def test_generated_punctuation_is_no_finer_than_the_slides_in_use() -> None:
    eng = Engine()
    eng.create_stream("S", SCHEMA, punctuation="ordered")
    eng.register_query("SELECT count(*) [RANGE 40 ms, SLIDE 20 ms, WA ts] FROM S")
    eng.register_query("SELECT count(*) [RANGE 30 ms, SLIDE 30 ms, WA ts] FROM S")
    eng.push("S", {"k": ["a"], "v": [1], "ts": [47]})
    assert eng.list_streams()[0]["low_watermark"] == 40  # floored to gcd(20, 30) = 10


def test_a_query_reads_another_query_by_name() -> None:
    eng = Engine()
    eng.create_stream("S", SCHEMA)
    eng.register_query(TUMBLING, name="per_key")
    q = eng.register_query(
        "SELECT sum(n) AS total, max(n) AS top [RANGE 20 ms, SLIDE 20 ms, WA window_end] FROM per_key"
    )
    eng.push("S", {"k": ["a", "a", "b", "c"], "v": [0, 0, 0, 0], "ts": [1, 2, 11, 12]})
    eng.punctuate("S", 45)  # per_key emits window_end 10 (a: 2) and 20 (b: 1, c: 1), punctuates 50
    assert rows(eng.poll(q)) == [
        {"window_start": 0, "window_end": 20, "total": 2, "top": 2, "revision": 0},
        {"window_start": 20, "window_end": 40, "total": 2, "top": 1, "revision": 0},
    ]


def test_generator_specs() -> None:
    assert Generator.parse("bounded:2s", unit_ms=1.0).slack == 2000
    assert Generator.parse("bounded:7", unit_ms=1000.0).slack == 7
    beat = Generator.parse("heartbeat:500ms,1min", unit_ms=1.0)
    assert (beat.period_ms, beat.skew) == (500.0, 60_000)
    assert parse_duration_ms("1.5s") == 1500.0
    for bad in ("sometimes", "bounded", "heartbeat:1s", "heartbeat:0s,1s"):
        with pytest.raises(InvalidArgument):
            Generator.parse(bad, unit_ms=1.0)


def test_demo_runs_and_summarises() -> None:
    from rich.console import Console

    from lowtide.clients.demos.in_process import run

    console = Console(file=open("/dev/null", "w"), width=120)  # noqa: SIM115
    summary = run(seconds=70, rate=2_000, console=console)
    assert summary["tuples"] > 0 and summary["windows"] > 60
    assert summary["late"] == 0  # the demo's punctuation is honest
