"""The Engine's contract (docs/design.md, "Data model" to "Interfaces"): the thesis queries, bad
input, punctuation rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from harness import columns
from reference import Agg, Spec, Window, assert_rows_equal, evaluate
from strategies import SCHEMA
from thesis import PACKET, thesis_queries

from lowtide import (
    END_OF_STREAM,
    AlreadyExists,
    Engine,
    InvalidArgument,
    LowtideError,
    NotFound,
    Punctuation,
    QuerySyntaxError,
    RegressingPunctuation,
    SchemaMismatch,
    UnsupportedQuery,
)
from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.bucket import Bucket
from lowtide.operators.meld import Meld
from lowtide.operators.windows import Landmark, Rows, Sliding

PACKET_STREAMS = ["Main", "Main1", "Main2", "Control", "M", "M1", "M2", "A", "B", "C", "D", "packets"]


def thesis_engine() -> Engine:
    engine = Engine()
    for name in PACKET_STREAMS:
        engine.create_stream(name, PACKET, sources=["link"])
    for name in ("S0", "S1"):
        engine.create_stream(name, {**PACKET, "flags": "string"}, sources=["link"])
    return engine


@pytest.mark.parametrize(("label", "sql"), sorted(thesis_queries().items()))
def test_every_thesis_query_registers_explains_and_runs(label: str, sql: str) -> None:
    engine = thesis_engine()
    plan = engine.explain(sql).splitlines()
    assert plan[0].startswith("0. Input") and "Sink" in plan[-1], plan
    q = engine.register_query(sql, name="q")
    packets = {
        "srcIP": ["a", "b", "a"],
        "srcPort": [1, 2, 2],
        "destIP": ["b", "a", "b"],
        "destPort": [2, 1, 1],
    }
    packets |= {"len": [60, 1500, 40], "ts": [1_000, 61_000, 2_000]}
    for name in [*PACKET_STREAMS, "S0", "S1"]:
        extra = {"flags": ["SYN", "SYN_ACK", "SYN"]} if name in ("S0", "S1") else {}
        engine.push(name, {**packets, **extra}, source="link")
        engine.close_source(name, "link")
    items = engine.poll(q)
    assert any(isinstance(i, Punctuation) and i.value == END_OF_STREAM for i in items), label


# -- bad input ----------------------------------------------------------------------------------
SPEC = Spec(Window("sliding", 5, 10), ("k1",), (Agg("count*", None, "n"), Agg("sum", "v", "s")))
SQL = "SELECT k1, count(*) AS n, sum(v) AS s [RANGE 10, SLIDE 5, WA ts] FROM A GROUP BY k1"
ROW = {"k1": "a", "k2": 1, "v": 1, "f": 1.0, "b": False, "ts": 30}
BAD: dict[str, tuple[Callable[[Engine], Any], type[LowtideError]]] = {
    "unknown stream": (lambda e: e.push("Nope", columns([ROW])), NotFound),
    "unknown column": (lambda e: e.push("A", {**columns([ROW]), "zz": [1]}, source="s"), SchemaMismatch),
    "missing column": (
        lambda e: e.push("A", {"k1": ["a"], "v": [1], "f": [1.0], "b": [True], "ts": [30]}, source="s"),
        SchemaMismatch,
    ),
    "type mismatch": (lambda e: e.push("A", {**columns([ROW]), "k2": ["x"]}, source="s"), SchemaMismatch),
    "non-integral ts": (lambda e: e.push("A", {**columns([ROW]), "ts": [30.5]}, source="s"), SchemaMismatch),
    "null int": (lambda e: e.push("A", {**columns([ROW]), "v": [None]}, source="s"), SchemaMismatch),
    "ragged batch": (lambda e: e.push("A", {**columns([ROW]), "v": [1, 2]}, source="s"), SchemaMismatch),
    "missing progressing column": (
        lambda e: e.push("A", {"k1": ["a"], "k2": [1], "v": [1], "f": [1.0], "b": [True]}, source="s"),
        SchemaMismatch,
    ),
    "regressing punctuation": (lambda e: e.punctuate("A", 4, source="s"), RegressingPunctuation),
    "non-integer punctuation": (lambda e: e.punctuate("A", "soon", source="s"), InvalidArgument),
    "unparsable query": (
        lambda e: e.register_query("SELECT count(* [RANGE 10, WA ts] FROM A"),
        QuerySyntaxError,
    ),
    "unknown aggregate": (
        lambda e: e.register_query("SELECT foo(v) [RANGE 10, WA ts] FROM A"),
        UnsupportedQuery,
    ),
    "unknown query column": (
        lambda e: e.register_query("SELECT sum(zz) [RANGE 10, WA ts] FROM A"),
        UnsupportedQuery,
    ),
    "unknown query stream": (
        lambda e: e.register_query("SELECT count(*) [RANGE 10, WA ts] FROM Nope"),
        NotFound,
    ),
    "window on a plain column": (
        lambda e: e.register_query("SELECT count(*) [RANGE 10, WA v] FROM A"),
        UnsupportedQuery,
    ),
    "update on a landmark": (
        lambda e: e.register_query("SELECT count(*) [RANGE ALL, SLIDE 5, WA ts] FROM A", late="update"),
        UnsupportedQuery,
    ),
    "duplicate query": (lambda e: e.register_query(SQL, name="q"), AlreadyExists),
    "duplicate stream": (lambda e: e.create_stream("A", SCHEMA), AlreadyExists),
    "stream without its progressing column": (
        lambda e: e.create_stream("B", {"v": "int32"}),
        InvalidArgument,
    ),
    "push from a closed source": (
        lambda e: (
            e.push("A", columns([]), source="t"),  # an undeclared source joins, sends nothing, closes
            e.close_source("A", "t"),
            e.push("A", columns([ROW]), source="t"),
        ),
        InvalidArgument,
    ),
    "unknown source": (lambda e: e.close_source("A", "nope"), NotFound),
    "unknown query": (lambda e: e.poll("nope"), NotFound),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_rejected_with_a_one_line_reason_and_changes_nothing(case: str) -> None:
    call, error = BAD[case]
    engine = Engine()
    engine.create_stream("A", SCHEMA, sources=["s"])
    q = engine.register_query(SQL, name="q")
    first = [{**ROW, "k1": k, "v": v, "ts": t} for k, v, t in (("a", 1, 3), ("b", 2, 7), ("a", 4, 12))]
    engine.push("A", columns(first), source="s")
    engine.punctuate("A", 5, source="s")
    with pytest.raises(error) as caught:
        call(engine)
    assert type(caught.value) is error and str(caught.value) and "\n" not in str(caught.value)
    second = [{**ROW, "k1": k, "v": v, "ts": t} for k, v, t in (("b", 3, 5), ("c", 5, 14), ("a", 6, 21))]
    engine.push("A", columns(second), source="s")
    engine.close_source("A", "s")
    rows = [r for t in engine.poll(q) if isinstance(t, pa.Table) for r in t.to_pylist()]
    assert_rows_equal(rows, evaluate(SPEC, first + second), SPEC)
    assert engine.stats()["streams"]["A"]["ingested"] == 6


# -- punctuation, operator by operator -----------------------------------------------------------
class Collect(Operator):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Batch] = []
        self.punctuation: list[Punctuation] = []

    def process(self, batch: Batch, port: int = 0) -> None:
        self.batches.append(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.punctuation.append(punctuation)


def test_meld_emits_the_min_of_its_inputs_once_per_rise() -> None:
    meld, out = Meld(3), Collect()
    meld.connect(out)
    for port, value in [(0, 5), (1, 7), (2, 3), (2, 6), (0, 9), (2, 9), (1, 9), (1, 12), (0, 20), (2, 30)]:
        meld.punctuate(Punctuation(value, "ts"), port)
    meld.punctuate(Punctuation(4, "other"), 0)  # another attribute has its own minimum
    assert [p.value for p in out.punctuation if p.attribute == "ts"] == [3, 5, 6, 7, 9, 12]
    assert [p for p in out.punctuation if p.attribute == "other"] == []


@pytest.mark.parametrize(("range_", "slide"), [(10, 5), (7, 3), (3, 7), (5, 5), (1, 1)])
def test_bucket_translates_punctuation_to_the_first_open_window(range_: int, slide: int) -> None:
    bucket, out = Bucket(Sliding(range_, slide, "ts")), Collect()
    bucket.connect(out)
    for p in [-40, -17, -1, 0, 0, 1, 6, 7, 13, 50, 51]:
        before = len(out.punctuation)
        bucket.punctuate(Punctuation(p, "ts"))
        bucket.punctuate(Punctuation(p + 1000, "other"))  # not the window's attribute: ignored
        first_open = min(w for w in range(-100, 100) if w * slide + range_ > p)  # the smallest incomplete
        new = out.punctuation[before:]
        assert all(x.attribute == "wid" for x in new)
        assert [x.value for x in new] in ([first_open], [])
        assert out.punctuation[-1].value == first_open  # emitted now, or already (no repeats)
    values = [x.value for x in out.punctuation]
    assert values == sorted(set(values))
    bucket.punctuate(Punctuation(END_OF_STREAM, "ts"))
    assert out.punctuation[-1] == Punctuation(END_OF_STREAM, "wid")


def test_bucket_punctuates_landmark_slides_and_rows_seen() -> None:
    landmark, out = Bucket(Landmark(5, "ts")), Collect()
    landmark.connect(out)
    for p in (-3, 4, 5, 14):
        landmark.punctuate(Punctuation(p, "ts"))
    assert [x.value for x in out.punctuation] == [-1, 0, 1, 2]  # slide w is complete once (w+1)*5 <= p
    rows, out = Bucket(Rows(4, 2)), Collect()
    rows.connect(out)
    rows.process(Batch({"ts": np.arange(5)}, 5))
    rows.punctuate(Punctuation(100, "ts"))  # tuple windows progress by arrivals, not by ts
    rows.process(Batch({"ts": np.arange(3)}, 3))
    assert [x.value for x in out.punctuation] == [1, 3]  # windows [0,4) done at 5 rows; [2,6), [4,8) at 8
    assert [b["wid_start"].tolist() for b in out.batches] == [[-1, -1, 0, 0, 1], [1, 2, 2]]


@pytest.mark.parametrize(
    ("window", "punctuation", "end"),
    [
        ("[RANGE 10, SLIDE 5, WA ts]", 12, 15),
        ("[RANGE 10, SLIDE 5, WA ts]", 15, 20),
        ("[RANGE 3, SLIDE 7, WA ts]", 4, 10),
        ("[RANGE 4, WA ts]", -5, -4),
        ("[RANGE ALL, SLIDE 5, WA ts]", 12, 15),
    ],
)
def test_aggregate_punctuates_the_end_of_its_first_open_window(
    window: str, punctuation: int, end: int
) -> None:
    engine = Engine()
    engine.create_stream("A", SCHEMA, sources=["s"])
    q = engine.register_query(f"SELECT count(*) {window} FROM A")
    engine.push("A", columns([{**ROW, "ts": t} for t in (-9, 1, 2, 8, 13)]), source="s")
    engine.punctuate("A", punctuation, source="s")
    items = engine.poll(q)
    assert isinstance(items[-1], Punctuation) and items[-1].value == end
    assert all(
        r["window_end"] <= punctuation for t in items[:-1] if isinstance(t, pa.Table) for r in t.to_pylist()
    )
    engine.punctuate("A", punctuation, source="s")  # the same value again: nothing new
    assert engine.poll(q) == []


@pytest.mark.parametrize("unit", ["s", "ms", "us"])
def test_durations_become_units_of_the_timestamp_column(unit: str) -> None:
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000}[unit]
    engine = Engine()
    engine.create_stream("T", {"k": "string", "ts": f"timestamp[{unit}]"}, sources=["s"])
    q = engine.register_query(
        "SELECT k, count(*) AS n [RANGE 1 minute, SLIDE 30 seconds, WA ts] FROM T GROUP BY k"
    )
    seconds = [-5, 0, 45, 70, 200]
    stamps = pa.array(np.array(seconds, dtype="datetime64[s]")).cast(pa.timestamp(unit))
    engine.push("T", {"k": ["a"] * len(seconds), "ts": stamps}, source="s")
    engine.punctuate("T", 100 * per_second, source="s")
    engine.close_source("T", "s")
    rows = [r for t in engine.poll(q) if isinstance(t, pa.Table) for r in t.to_pylist()]
    spec = Spec(Window("sliding", 30 * per_second, 60 * per_second), ("k",), (Agg("count*", None, "n"),))
    assert_rows_equal(rows, evaluate(spec, [{"k": "a", "ts": s * per_second} for s in seconds]), spec)
