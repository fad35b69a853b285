"""Hypothesis strategies: small streams, their deliveries to the engine, and window queries.

A *delivery* is the list of engine calls that feeds some tuples to some streams: which source
sends each tuple, in what order (sorted, band-disordered or shuffled per source), in what batches,
how the sources interleave, where each source punctuates and when it closes. Honest punctuation
never exceeds the smallest ts its source will still send and never regresses; with
``honest=False`` punctuation may run ahead of the data, which makes late tuples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from reference import Agg, Row, Spec, Window

SCHEMA = {"k1": "string", "k2": "int32", "v": "int32", "f": "float64", "b": "bool", "ts": "int64"}
TS_LO, TS_HI = -20, 60
NO_PROGRESS = -(2**63)
QUICK = os.environ.get("LOWTIDE_QUICK") == "1"  # make quick: the editing loop's shorter run


def examples(n: int) -> int:
    """A property's number of examples: ``n``; under ``make quick`` a quarter (at least 10)."""
    return max(10, n // 4) if QUICK else n


TIMESTAMPS = st.integers(TS_LO, TS_HI)
keys1 = st.one_of(st.sampled_from(["a", "b", "c"]), st.sampled_from([None, "b"]))  # null strings too
keys2 = st.integers(-1, 2)
floats = st.one_of(st.none(), st.integers(-40, 80).map(lambda k: k / 4))  # exact in binary: exact sums


@st.composite
def rows(draw: Any, ts: st.SearchStrategy[int] = TIMESTAMPS) -> Row:
    return {
        "k1": draw(keys1),
        "k2": draw(keys2),
        "v": draw(st.integers(-5, 20)),
        "f": draw(floats),
        "b": draw(st.booleans()),
        "ts": draw(ts),
    }


def tuples(max_size: int = 30, min_size: int = 0) -> st.SearchStrategy[list[Row]]:
    """A length drawn uniformly first: st.lists alone leaves most examples nearly empty."""
    sizes = st.integers(min_size, max_size)
    return sizes.flatmap(lambda n: st.lists(rows(), min_size=n, max_size=n))


# -- deliveries ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Push:
    stream: str
    source: str
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Punct:
    stream: str
    source: str
    value: int


@dataclass(frozen=True)
class Close:
    stream: str
    source: str


Event = Push | Punct | Close
Sources = dict[str, tuple[str, ...]]

orders = st.sampled_from(["sorted", "band", "shuffled"])


@st.composite
def arrival_order(draw: Any, queue: list[Row]) -> list[Row]:
    """Sorted by ts, disordered within a band of ts, or any permutation."""
    kind = draw(orders)
    if kind == "shuffled":
        return list(draw(st.permutations(queue)))
    band = draw(st.integers(0, 15)) if kind == "band" else 0
    jitter = [draw(st.integers(0, band)) for _ in queue]
    return [r for _, r in sorted(zip(jitter, queue, strict=True), key=lambda p: p[1]["ts"] + p[0])]


@st.composite
def ahead_deliveries(
    draw: Any, data: dict[str, list[Row]], sources: Sources, lead: st.SearchStrategy[int], max_batch: int = 6
) -> list[Event]:
    """Every source sends its tuples in any order (sorted, disordered in a band, shuffled), in
    batches of 1 to ``max_batch``, the sources interleaving; after a batch some sources punctuate
    at the smallest ts they will still send plus a lead drawn from ``lead`` (never going back):
    punctuation runs ahead of some tuples by random amounts, so they arrive behind it."""
    queues: dict[tuple[str, str], list[Row]] = {(s, src): [] for s, names in sources.items() for src in names}
    for stream, items in data.items():
        for row in items:
            queues[(stream, draw(st.sampled_from(sources[stream])))].append(row)
    queues = {key: draw(arrival_order(queue)) for key, queue in queues.items()}
    punct = dict.fromkeys(queues, NO_PROGRESS)
    events: list[Event] = []
    while any(queues.values()):
        key = draw(st.sampled_from([k for k, queue in queues.items() if queue]))
        size = draw(st.integers(1, min(max_batch, len(queues[key]))))
        events.append(Push(*key, tuple(queues[key][:size])))
        queues[key] = queues[key][size:]
        for other in [key] * draw(st.integers(0, 1)) + draw(
            st.lists(st.sampled_from(list(queues)), max_size=2)
        ):
            value = min((r["ts"] for r in queues[other]), default=TS_HI) + draw(lead)
            if value > punct[other]:
                punct[other] = value
                events.append(Punct(*other, value))
    return events + [Close(*key) for key in draw(st.permutations(list(queues)))]


@st.composite
def deliveries(
    draw: Any, data: dict[str, list[Row]], sources: Sources, honest: bool = True, max_batch: int = 6
) -> list[Event]:
    """Engine calls sending ``data`` (stream -> tuples) from ``sources``, closing every source."""
    queues: dict[tuple[str, str], list[Row]] = {(s, src): [] for s, names in sources.items() for src in names}
    for stream, items in data.items():
        for row in items:
            queues[(stream, draw(st.sampled_from(sources[stream])))].append(row)
    queues = {key: draw(arrival_order(q)) for key, q in queues.items()}
    punct = dict.fromkeys(queues, NO_PROGRESS)
    events: list[Event] = []

    def punctuate(key: tuple[str, str]) -> None:
        rest = queues[key]
        top = min(r["ts"] for r in rest) if rest and honest else TS_HI + 10
        lo = max(punct[key], TS_LO - 5)
        if lo <= top:
            punct[key] = draw(st.one_of(st.just(top), st.integers(lo, top)))  # the edge is the test
            events.append(Punct(*key, punct[key]))

    open_keys = list(queues)
    while any(queues[k] for k in open_keys):
        key = draw(st.sampled_from([k for k in open_keys if queues[k]]))
        size = draw(st.integers(1, min(max_batch, len(queues[key]))))
        events.append(Push(*key, tuple(queues[key][:size])))
        queues[key] = queues[key][size:]
        for other in draw(st.lists(st.sampled_from(open_keys), max_size=2)):
            punctuate(other)
        if not queues[key] and draw(st.integers(0, 3)) == 0:
            open_keys.remove(key)
            events.append(Close(*key))
    for key in draw(st.permutations(open_keys)):
        if draw(st.booleans()):
            punctuate(key)
        events.append(Close(*key))
    return events


def stream_sources(n_streams: int, max_sources: int = 3) -> st.SearchStrategy[Sources]:
    names = ["A", "B", "C"][:n_streams]
    return st.tuples(*[st.integers(1, max_sources) for _ in names]).map(
        lambda counts: {
            s: tuple(f"{s.lower()}{i}" for i in range(c)) for s, c in zip(names, counts, strict=True)
        }
    )


# -- queries -----------------------------------------------------------------------------------------
AGGREGATES = [
    Agg("count*", None, ""),
    Agg("count", "f", ""),
    Agg("count", "k1", ""),
    Agg("sum", "v", ""),
    Agg("sum", "f", ""),
    Agg("min", "v", ""),
    Agg("max", "f", ""),
    Agg("avg", "v", ""),
    Agg("avg", "f", ""),
    Agg("var", "v", ""),
    Agg("stddev", "f", ""),
    Agg("median", "v", ""),
    Agg("median", "f", ""),
    Agg("quantile", "v", "", 0.25),
    Agg("quantile", "f", "", 0.9),
    Agg("count_distinct", "k1", ""),
    Agg("count_distinct", "f", ""),
    Agg("heavy_hitters", "k1", "", 0.3),
    Agg("heavy_hitters", "v", "", 0.5),
    Agg("heavy_hitters", "f", "", 0.25),
    Agg("min", "f", ""),
    Agg("max", "v", ""),
    Agg("var", "f", ""),
    Agg("stddev", "v", ""),
    Agg("quantile", "v", "", 0.0),
    Agg("quantile", "f", "", 1.0),
    Agg("count_distinct", "v", ""),
    Agg("sum", "b", ""),
    Agg("avg", "b", ""),
    Agg("max", "b", ""),
    Agg("count_distinct", "b", ""),
    Agg("heavy_hitters", "b", "", 0.4),
]
HOLISTIC = {"median", "quantile", "count_distinct", "heavy_hitters"}
COMBINABLE = [a for a in AGGREGATES if a.func not in HOLISTIC]  # partials that merge
HAVINGS = [
    (Agg("count*", None, "_h"), ">", 1),
    (Agg("sum", "v", "_h"), ">=", 10),
    (Agg("max", "v", "_h"), "<", 15),
]


def agg_sql(agg: Agg) -> str:
    if agg.func == "count*":
        return "count(*)"
    param = f", {agg.param}" if agg.func in ("quantile", "heavy_hitters") else ""
    return f"{agg.func}({agg.column}{param})"


def window_sql(w: Window, tumbling_form: int = 0) -> str:
    if w.kind == "session":
        return f"[SESSION {w.gap}, WA ts]"
    if w.kind == "landmark":
        return f"[RANGE ALL, SLIDE {w.slide}, WA ts]"
    if w.kind == "rows":
        pa = f", PA {', '.join(w.partition)}" if w.partition else ""
        return f"[RANGE {w.range} rows, SLIDE {w.slide} rows, WA row-num{pa}]"
    if w.range == w.slide and tumbling_form:
        return f"[RANGE TUMBLING {w.range}, WA ts]" if tumbling_form == 1 else f"[RANGE {w.range}, WA ts]"
    return f"[RANGE {w.range}, SLIDE {w.slide}, WA ts]"


def sql_of(spec: Spec, streams: list[str], tumbling_form: int = 0) -> str:
    items = [*spec.keys, *(f"{agg_sql(a)} AS {a.name}" for a in spec.aggs)]
    text = (
        f"SELECT {', '.join(items)} {window_sql(spec.window, tumbling_form)} FROM {' UNION '.join(streams)}"
    )
    if spec.group_by:
        text += f" GROUP BY {', '.join(spec.group_by)}"
    if spec.having is not None:
        agg, op, const = spec.having
        text += f" HAVING {agg_sql(agg)} {op} {const}"
    return text


sizes = st.integers(1, 12)
sliding_windows = st.builds(lambda r, s: Window("sliding", s, r), sizes, sizes)
tumbling_windows = sizes.map(lambda r: Window("sliding", r, r))
landmark_windows = st.integers(1, 10).map(lambda s: Window("landmark", s))
row_windows = st.builds(
    lambda r, s, pa: Window("rows", s, r, "row-num", pa),
    st.integers(1, 6),
    st.integers(1, 6),
    st.sampled_from([(), (), ("k1",), ("k2",), ("k1", "k2")]),
)
# Windows overlapping 4 to 20 times (Paned-WID's ground), RANGE not always a multiple of SLIDE.
overlapping_windows = st.builds(
    lambda s, k, extra: Window("sliding", s, s * k + extra),
    st.integers(1, 4),
    st.integers(4, 20),
    st.integers(0, 3),
)
time_windows = st.one_of(sliding_windows, tumbling_windows)
session_windows = st.integers(1, 15).map(lambda gap: Window("session", 0, gap=gap))
any_window = st.one_of(sliding_windows, tumbling_windows, landmark_windows, row_windows)
group_bys = st.sampled_from([(), ("k1",), ("k2",), ("k1", "k2"), ("k2", "k1"), ("b", "k1")])


@st.composite
def specs(
    draw: Any,
    windows: st.SearchStrategy[Window] = any_window,
    aggs: st.SearchStrategy[list[Agg]] | None = None,
    having: bool = True,
) -> Spec:
    window = draw(windows)
    group_by = draw(group_bys)
    if window.partition:  # PA columns are group columns already
        group_by = tuple(g for g in group_by if g not in window.partition)
    chosen = draw(aggs if aggs is not None else st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=4))
    named = tuple(Agg(a.func, a.column, f"a{i}", a.param) for i, a in enumerate(chosen))
    cond = draw(st.one_of(st.none(), st.sampled_from(HAVINGS))) if having else None
    return Spec(window, group_by, named, cond)
