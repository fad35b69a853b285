"""Runs a delivery (strategies.py) through an Engine, polling after every call.

Beside the engine it keeps its own model of progress - per source the last punctuation (closed:
+inf), per stream the monotone minimum over its declared sources, per query the minimum over its
streams - and checks that the engine publishes exactly that. Every polled row is recorded with
the call after which it appeared and the progress at that moment, so tests can check when rows
came out, not only what came out.

:class:`Recorder` is the sink of the operator-level tests: what one operator emits, in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from hypothesis import event as tally
from reference import Row, Spec, Window, covered, first_open_end, session_counts, session_punctuation
from strategies import SCHEMA, Close, Event, Punct, Push, Sources

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine, LateTuple, Punctuation
from lowtide.batch import Batch
from lowtide.operators.base import Operator


class Recorder(Operator):
    """Records the batches and punctuation an operator emits, in arrival order."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Batch | Punctuation] = []

    def process(self, batch: Batch, port: int = 0) -> None:
        self.items.append(batch)

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        self.items.append(punctuation)

    def rows(self, *names: str) -> list[tuple[Any, ...]]:
        """The named columns of every batch, row by row, in arrival order."""
        out: list[tuple[Any, ...]] = []
        for item in self.items:
            if isinstance(item, Batch):
                cols = [
                    item[n].to_pylist() if isinstance(item[n], pa.Array) else item[n].tolist() for n in names
                ]
                out += zip(*cols, strict=True)
        return out

    def punctuations(self) -> list[Punctuation]:
        return [item for item in self.items if isinstance(item, Punctuation)]

    def clear(self) -> None:
        self.items.clear()


def columns(rows: Sequence[Row], schema: dict[str, str] = SCHEMA) -> dict[str, Any]:
    return {name: [r[name] for r in rows] for name in schema}


@dataclass
class Model:
    """Progress as docs/design.md, "Data model" defines it, computed without the engine."""

    sources: Sources
    declared: bool = True  # else a source joins the minimum when it first speaks
    punct: dict[tuple[str, str], int] = field(default_factory=dict)
    progress: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.declared:
            self.punct = {(s, src): NO_PROGRESS for s, names in self.sources.items() for src in names}
        self.progress = dict.fromkeys(self.sources, NO_PROGRESS)

    def raise_to(self, stream: str, source: str, value: int) -> None:
        self.punct[(stream, source)] = max(self.punct.get((stream, source), NO_PROGRESS), value)
        low = min(v for (s, _), v in self.punct.items() if s == stream)
        self.progress[stream] = max(self.progress[stream], low)


@dataclass
class Observed:
    rows: list[Row] = field(default_factory=list)  # every polled row, in emission order
    row_call: list[int] = field(default_factory=list)  # the call after which each row appeared
    kinds: list[str] = field(default_factory=list)  # "row" / "punct" per item, in order
    punctuation: list[int] = field(default_factory=list)
    punct_call: list[int] = field(default_factory=list)
    progress: list[int] = field(default_factory=list)  # query input progress after each call
    seen: list[dict[tuple[Any, ...], int]] = field(default_factory=list)  # rows per partition, per call
    arrivals: list[tuple[Row, int]] = field(default_factory=list)  # applied tuple, its stream's progress
    arrival_query_progress: list[int] = field(default_factory=list)  # the query's (Meld) progress then
    arrival_call: list[int] = field(default_factory=list)  # the call that applied each tuple
    late: list[Row] = field(default_factory=list)  # the query's late side stream
    rejected: int = 0  # batches refused with LateTuple
    rejected_batches: list[tuple[tuple[Row, ...], int]] = field(
        default_factory=list
    )  # and the query's progress
    stats: dict[str, Any] = field(default_factory=dict)  # engine.stats() at the end
    counts_behind: bool = False  # the query's plan counts tuples behind punctuation (counts_behind)
    plan: str = ""  # the operators the query ran (Engine.plan_of)


def make_engine(sources: Sources, clock: Any = None, flush: Any = None, **stream_options: Any) -> Engine:
    engine = Engine(clock=clock, flush=flush)
    for stream, names in sources.items():
        engine.create_stream(stream, SCHEMA, progressing="ts", sources=list(names), **stream_options)
    return engine


def run(
    spec: Spec | None,
    sql: str,
    sources: Sources,
    events: Sequence[Event],
    late: str = "drop",
    allowed_lateness: int | None = None,
    partition: tuple[str, ...] = (),
    declared: bool = True,
    flush: Any = None,
) -> Observed:
    engine = make_engine(sources if declared else {s: () for s in sources}, flush=flush)
    name = engine.register_query(sql, name="q", late=late, allowed_lateness=allowed_lateness)
    model = Model(sources, declared)
    obs = Observed(counts_behind=plan_counts_behind(engine, name), plan=engine.plan_of(name))
    seen: dict[tuple[Any, ...], int] = {}
    del spec
    for call, event in enumerate(events):
        if isinstance(event, Push):
            progress = model.progress[event.stream]
            is_late = [r["ts"] < progress for r in event.rows]
            rejected = False
            if late == "error" and any(is_late):
                # Behind punctuation, yet late only where the query cannot count them
                # (docs/design.md, "Punctuation and lateness").
                try:
                    engine.push(event.stream, columns(event.rows), source=event.source)
                except LateTuple as exc:
                    assert "\n" not in str(exc)
                    obs.rejected += 1
                    obs.rejected_batches.append((event.rows, min(model.progress.values())))
                    rejected = True
            else:
                engine.push(event.stream, columns(event.rows), source=event.source)
            if not rejected:
                model.raise_to(event.stream, event.source, NO_PROGRESS)  # joins the minimum
                for row in event.rows:
                    obs.arrivals.append((row, progress))
                    obs.arrival_query_progress.append(min(model.progress.values()))
                    obs.arrival_call.append(call)
                    # Tuple windows number every row they get: none is behind them
                    # (docs/design.md, "Punctuation and lateness").
                    part = tuple(row[p] for p in partition)
                    seen[part] = seen.get(part, 0) + 1
        elif isinstance(event, Punct):
            engine.punctuate(event.stream, event.value, source=event.source)
            model.raise_to(event.stream, event.source, event.value)
        elif isinstance(event, Close) and (event.stream, event.source) not in model.punct:
            pass  # an undeclared source that never spoke is no source of the stream (close: NotFound)
        elif isinstance(event, Close):
            engine.close_source(event.stream, event.source)
            model.raise_to(event.stream, event.source, END_OF_STREAM)
        published = {s["name"]: s["low_watermark"] for s in engine.list_streams()}
        assert published == model.progress, (published, model.progress)
        obs.progress.append(min(model.progress.values()))
        obs.seen.append(dict(seen))
        for item in engine.poll(name):
            if isinstance(item, Punctuation):
                assert item.attribute in ("window_end", "ts")  # a result's time, or the input's kept
                obs.kinds.append("punct")
                obs.punctuation.append(item.value)
                obs.punct_call.append(call)
            else:
                assert isinstance(item, pa.Table) and item.num_rows > 0
                for row in item.to_pylist():
                    obs.kinds.append("row")
                    obs.rows.append(row)
                    obs.row_call.append(call)
    obs.late += late_rows(engine, name)
    obs.stats = engine.stats()
    return obs


def polled(engine: Engine, query: str) -> tuple[list[dict[str, Any]], list[int]]:
    """Rows and output punctuation values a poll returns."""
    rows: list[dict[str, Any]] = []
    punctuation: list[int] = []
    for item in engine.poll(query):
        if isinstance(item, Punctuation):
            punctuation.append(item.value)
        else:
            assert isinstance(item, pa.Table)
            rows += item.to_pylist()
    return rows, punctuation


def late_rows(engine: Engine, query: str) -> list[dict[str, Any]]:
    """The rows ``poll("<query>.late")`` returns, without its markers of the query's punctuation."""
    return [
        row for item in engine.poll(f"{query}.late") if isinstance(item, pa.Table) for row in item.to_pylist()
    ]


def max_finite(values: Sequence[int]) -> int | None:
    finite = [v for v in values if NO_PROGRESS < v < END_OF_STREAM]
    return max(finite) if finite else None


def key_of(row: Row, spec: Spec) -> tuple[Any, ...]:
    return (row["window_start"], row["window_end"], *(row[k] for k in spec.keys))


def check_emission(obs: Observed, spec: Spec, expected: Sequence[Row]) -> None:
    """Properties (c)-(f): once at revision 0, never before and always once punctuation covers."""
    first_call: dict[tuple[Any, ...], int] = {}
    for row, call in zip(obs.rows, obs.row_call, strict=True):
        assert row["revision"] == 0, row
        key = key_of(row, spec)
        assert key not in first_call, f"window row {key} emitted twice"
        first_call[key] = call
        assert covered(spec, row, obs.progress[call], obs.seen[call]), (
            f"{key} emitted after call {call} at progress {obs.progress[call]}"
        )
    bound = NO_PROGRESS  # rows at revision 0 never below an earlier output punctuation
    values = iter(obs.punctuation)
    rows = iter(obs.rows)
    for kind in obs.kinds:
        if kind == "punct":
            bound = next(values)
        else:
            row = next(rows)
            assert row["window_end"] >= bound, f"{key_of(row, spec)} after output punctuation {bound}"
    assert all(a < b for a, b in zip(obs.punctuation, obs.punctuation[1:], strict=False)), obs.punctuation
    if obs.progress[-1] == END_OF_STREAM:  # every source closed (undeclared ones may never speak)
        assert obs.punctuation and obs.punctuation[-1] == END_OF_STREAM
    promised = None  # the output punctuation after each call: the end of the first open window
    values = iter(zip(obs.punctuation, obs.punct_call, strict=True))
    pending = next(values, None)
    owed = session_owed(obs, spec) if spec.window.kind == "session" else None
    for call, progress in enumerate(obs.progress):
        while pending is not None and pending[1] == call:
            promised, pending = pending[0], next(values, None)
        rows_seen = sum(obs.seen[call].values())
        want = owed[call] if owed is not None else first_open_end(spec.window, progress, rows_seen)
        assert promised == want, f"output punctuation {promised} after call {call}, expected {want}"
    for row in expected:  # every covered window is out by the call that covered it
        key = key_of(row, spec)
        due = next(
            (i for i in range(len(obs.progress)) if covered(spec, row, obs.progress[i], obs.seen[i])), None
        )
        assert due is not None, f"{key} never covered"
        assert key in first_call and first_call[key] <= due, (
            f"{key} due after call {due}, got {first_call.get(key)}"
        )


def session_owed(obs: Observed, spec: Spec) -> list[int | None]:
    """The output punctuation a session aggregate owes after each call (``drop``): it moves only
    when the query's progress ``p`` does, to the reference's value over the tuples counted so
    far, a later tuple counting from ``p - gap + 1`` on (:func:`reference.session_counts`)."""
    rows = [row for row, _ in obs.arrivals]
    counts = session_counts(spec, list(zip(rows, obs.arrival_query_progress, strict=True)))
    owed: list[int | None] = []
    last = NO_PROGRESS
    for call, progress in enumerate(obs.progress):
        if progress == last:
            owed.append(owed[-1] if owed else None)
            continue
        last = progress
        counted = [row for row, at, c in zip(rows, obs.arrival_call, counts, strict=True) if at <= call and c]
        owed.append(session_punctuation(spec, counted, progress, progress - spec.window.gap + 1))
    return owed


def check_query(
    spec: Spec,
    sources: Sources,
    data: Any,
    tumbling_form: int = 0,
    max_size: int = 25,
    scale: int = 1,
    declared: bool = True,
) -> Observed:
    """Draw data and a delivery, run the query and check (a) and (c)-(f) against the reference.

    ``scale`` multiplies every ts (pass a window scaled alike): far apart values, same windows.
    """
    from strategies import deliveries, tuples

    streams = {s: data.draw(tuples(max_size=max_size), label=f"tuples {s}") for s in sources}
    streams = {s: [{**r, "ts": r["ts"] * scale} for r in rows] for s, rows in streams.items()}
    events = data.draw(deliveries(streams, sources), label="events")
    obs = check_delivery(spec, sources, events, tumbling_form, declared)
    on_time = sum(row["ts"] >= p for row, p in obs.arrivals)
    tally(f"tuples: {min(on_time // 10 * 10, 40)}+, rows out: {min(len(obs.rows) // 20 * 20, 60)}+")
    return obs


def check_delivery(
    spec: Spec, sources: Sources, events: Sequence[Event], tumbling_form: int = 0, declared: bool = True
) -> Observed:
    """Run the query over one delivery and check (a) and (c)-(f) against the reference."""
    from reference import assert_rows_equal, evaluate
    from strategies import sql_of

    partition = spec.window.partition if spec.window.kind == "rows" else ()
    sql = sql_of(spec, list(sources), tumbling_form)
    obs = run(spec, sql, sources, events, partition=partition, declared=declared)
    on_time = [row for row, p in obs.arrivals if row["ts"] >= p]  # all of them when sources are declared
    if len(on_time) == len(obs.arrivals):
        expected = evaluate(spec, on_time, progress=max_finite(obs.progress))
        late: list[Row] = []
    else:  # an undeclared source joined behind punctuation: late only for emitted windows
        # (docs/design.md, "Punctuation and lateness")
        expected, late = behind_expectation(spec, obs, obs.counts_behind)
    assert_rows_equal(obs.rows, expected, spec)
    check_emission(obs, spec, expected)
    check_late(obs, late)
    assert not declared or obs.late == []
    return obs


def ident(row: Row) -> tuple[Any, ...]:
    return (row["k1"], row["k2"], row["v"], row["f"], row["ts"])


def counts_behind(sql: str, sources: Sources) -> bool:
    """Whether the query's plan counts tuples behind punctuation in its open windows
    (docs/design.md, "Punctuation and lateness"): its Inputs pass them on to the window operator,
    which decides where they are late; the other plans (no window, slide-by-tuple) take each of them
    as late."""
    engine = make_engine(sources)
    return plan_counts_behind(engine, engine.register_query(sql, name="probe"))


def plan_counts_behind(engine: Engine, query: str) -> bool:
    """:func:`counts_behind` of a query registered on ``engine`` (no late policy changes it)."""
    return all(op.late_rule is not None for _, op in engine.runner.plan(query).inputs)


def behind_expectation(spec: Spec, obs: Observed, counts: bool) -> tuple[list[Row], list[Row]]:
    """The rows and the late side stream of ``drop`` over every applied tuple: a tuple counts
    in each of its windows not yet emitted when it came (its query's progress then below the
    window's end) and is late once if it missed one; ``counts`` false: behind means late.
    Tuple windows number rows as they arrive: no tuple is behind them. Sessions: a tuple counts
    unless it would have joined a session emitted (:func:`reference.session_counts`)."""
    from reference import evaluate

    arrivals, query = obs.arrivals, obs.arrival_query_progress
    if not counts:
        on_time = [row for row, p in arrivals if row["ts"] >= p]
        return evaluate(spec, on_time, progress=max_finite(obs.progress)), [
            row for row, p in arrivals if row["ts"] < p
        ]
    tuples = [row for row, _ in arrivals]
    progress = max_finite(obs.progress)
    if spec.window.kind == "rows":  # numbered as they come: late only in a window, once the stream ended
        in_window = in_row_window(spec.window, tuples)
        late = [
            row
            for row, q, inside in zip(tuples, query, in_window, strict=True)
            if inside and q >= END_OF_STREAM
        ]
        return evaluate(spec, [row for row, q in zip(tuples, query, strict=True) if q < END_OF_STREAM]), late
    if spec.window.kind == "session":
        judged = session_counts(spec, list(zip(tuples, query, strict=True)))
        late = [row for row, c in zip(tuples, judged, strict=True) if not c]
        return evaluate(spec, [row for row, c in zip(tuples, judged, strict=True) if c]), late
    expected = evaluate(spec, tuples, progress=progress, counts_in=lambda i, start, end: end > query[i])
    late = [
        row for row, q in zip(tuples, query, strict=True) if any(end <= q for _, end in extents(spec, row))
    ]
    return expected, late


def in_row_window(window: Window, tuples: Sequence[Row]) -> list[bool]:
    """Whether each tuple, numbered in arrival order within its partition, falls in some window
    of ``[RANGE r ROWS, SLIDE s ROWS]``: with SLIDE > RANGE the positions between windows do not."""
    assert window.range is not None
    numbered: Counter[tuple[Any, ...]] = Counter()
    inside: list[bool] = []
    for row in tuples:
        part = tuple(row[p] for p in window.partition)
        inside.append(numbered[part] % window.slide < window.range)
        numbered[part] += 1
    return inside


def extents(spec: Spec, row: Row) -> list[tuple[int, int]]:
    """The time windows ``[start, end)`` holding ``row``, tried one by one (a landmark's:
    its own slide's, the first; the later ones end later)."""
    window = spec.window
    ts = row[window.attribute]
    if window.kind == "landmark":
        first = ts // window.slide
        return [(first * window.slide, (first + 1) * window.slide)]
    assert window.range is not None
    candidates = range((ts - window.range) // window.slide - 1, ts // window.slide + 2)
    spans = [(w * window.slide, w * window.slide + window.range) for w in candidates]
    return [(start, end) for start, end in spans if start <= ts < end]


def check_late(obs: Observed, late: Sequence[Row]) -> None:
    """The late side stream holds exactly ``late`` but for the tuples that came after it ended
    with the query (an undeclared source that speaks once every other one closed): the counter
    counts them all."""
    ended = Counter(
        ident(row)
        for (row, _), query in zip(obs.arrivals, obs.arrival_query_progress, strict=True)
        if query >= END_OF_STREAM
    )
    assert Counter(map(ident, obs.late)) == Counter(map(ident, late)) - ended
    assert obs.stats["queries"]["q"]["late"] == len(late)
