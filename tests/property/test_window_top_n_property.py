"""Window Top-N against a brute-force reference, under disorder, batch splits and punctuation.

The reference ranks each (window, partition)'s rows by the definitions - ROW_NUMBER a position in
the ORDER BY order, RANK 1 + the rows strictly before, DENSE_RANK 1 + the distinct values strictly
before - over all rows at once, sharing no code with lowtide. ROW_NUMBER's ties are Flink's to
break as it likes, so its rows are compared as (window, partition, ORDER BY value, rank): which
ranks each value holds; that lowtide breaks them the same way whatever the arrival is checked by
running a second delivery of the same rows. RANK and DENSE_RANK are compared row for row.

Properties, for the operator (fed directly, restored from a snapshot at a drawn step, pruning
often) and for Flink's queries through the engine: each window's top N is emitted exactly once,
never before punctuation covers the window, always once it does, and never below the output
punctuation already emitted.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from harness import Recorder, run
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import Event, deliveries, examples, stream_sources, tuples

from lowtide.batch import Batch
from lowtide.operators.window_top_n import WindowTopN
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.snapshot import pack, unpack

pytestmark = pytest.mark.property

Row = dict[str, Any]
FUNCTIONS = ("row_number", "rank", "dense_rank")


# ---- the reference ------------------------------------------------------------------------------------
def reference(
    rows: list[Row],
    window: Callable[[Row], int],
    partition: Callable[[Row], tuple[Any, ...]],
    value: Callable[[Row], Any],
    function: str,
    limit: int | None,
) -> list[tuple[Row, int]]:
    """Every row with its rank in its (window, partition), by ``value`` ascending (a DESC order
    is a ``value`` that negates), the ranks above ``limit`` left out."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(window(row), *partition(row))].append(row)
    ranked = []
    for members in groups.values():
        members = sorted(members, key=value)  # ties in any order: ROW_NUMBER is compared per value
        for position, row in enumerate(members, 1):
            before = [value(other) for other in members if value(other) < value(row)]
            rank = {"row_number": position, "rank": 1 + len(before), "dense_rank": 1 + len(set(before))}
            if limit is None or rank[function] <= limit:
                ranked.append((row, rank[function]))
    return ranked


# ---- the operator -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """One WindowTopN: over a query result (key ``we``, aligned ``ws``) or over TUMBLE (key the
    window_end it adds from ``ts``)."""

    function: str
    limit: int | None
    tumble: int | None
    size: int
    descending: bool
    by_k: bool  # PARTITION BY the window and k, or the window alone
    prune_at: int

    def operator(self) -> WindowTopN:
        start = "window_start" if self.tumble else "ws"
        partition = (start, "k") if self.by_k else (start,)
        attribute = "ts" if self.tumble else "we"
        order = (("x", self.descending),)
        return WindowTopN(
            self.function, partition, order, "r", attribute, self.limit, self.tumble, self.prune_at
        )

    def end(self, row: Row) -> int:
        return (row["ts"] // self.size + 1) * self.size  # the window's end, written independently

    def attribute(self, row: Row) -> int:
        return row["ts"] if self.tumble else self.end(row)

    def covered(self, row: Row, punctuation: int) -> bool:
        """Whether punctuation ``punctuation`` (on the input's attribute) completes ``row``'s window."""
        if self.tumble:
            return self.end(row) <= punctuation  # every ts of the window is below it
        return self.end(row) < punctuation


setups = st.builds(
    Setup,
    function=st.sampled_from(FUNCTIONS),
    limit=st.one_of(st.none(), st.integers(0, 3)),
    tumble=st.booleans(),
    size=st.sampled_from([3, 5]),
    descending=st.booleans(),
    by_k=st.booleans(),
    prune_at=st.integers(1, 6),
).map(
    lambda s: Setup(
        s.function, s.limit, s.size if s.tumble else None, s.size, s.descending, s.by_k, s.prune_at
    )
)

operator_rows = st.lists(
    st.fixed_dictionaries({"ts": st.integers(-12, 30), "k": st.integers(0, 2), "x": st.integers(0, 4)}),
    max_size=40,
).map(lambda rows: [{**row, "id": i} for i, row in enumerate(rows)])


@st.composite
def operator_deliveries(draw: Any, rows: list[Row], setup: Setup) -> list[list[Row] | int]:
    """Batches in any order and split; after a batch, maybe punctuation on the input's attribute,
    at most the smallest value still to come (honest), never going back; at last END_OF_STREAM."""
    queue = list(draw(st.permutations(rows)))
    events: list[list[Row] | int] = []
    last = NO_PROGRESS
    while queue:
        size = draw(st.integers(1, min(6, len(queue))))
        events.append(queue[:size])
        queue = queue[size:]
        if draw(st.booleans()):
            top = min((setup.attribute(r) for r in queue), default=40)
            low = max(last, -20)
            if low <= top:
                last = draw(st.one_of(st.just(top), st.integers(low, top)))
                events.append(last)
    return [*events, END_OF_STREAM]


def as_batch(rows: list[Row], setup: Setup) -> Batch:
    columns = {
        "ts": np.array([r["ts"] for r in rows], np.int64),
        "k": np.array([r["k"] for r in rows], np.int64),
        "x": np.array([r["x"] for r in rows], np.int64),
        "id": np.array([r["id"] for r in rows], np.int64),
    }
    if not setup.tumble:  # a query result: its window's bounds are columns already
        columns["we"] = np.array([setup.end(r) for r in rows], np.int64)
        columns["ws"] = columns["we"] - setup.size
    return Batch(columns, len(rows))


def ranks_held(setup: Setup, pairs: list[tuple[Row, int]]) -> Counter[tuple[Any, ...]]:
    """What must match: (window, partition, ORDER BY value, rank) for ROW_NUMBER, whose ties
    hold fixed ranks in some order; (row, rank) for RANK and DENSE_RANK."""
    if setup.function == "row_number":
        return Counter((setup.end(r), r["k"] if setup.by_k else 0, r["x"], rank) for r, rank in pairs)
    return Counter((r["id"], rank) for r, rank in pairs)


def drive(
    setup: Setup, events: list[list[Row] | int], rows: list[Row], cut: int | None
) -> list[tuple[int, int]]:
    """Run ``events`` and return the (id, rank) emitted; at step ``cut`` the operator is snapshot,
    packed and restored into a new one that goes on. After every step, what came out is exactly
    the reference's rows of the windows the punctuation so far covers (so each row exactly once,
    never before its window is covered, all of them once it is), and no row comes below the
    output punctuation already emitted."""

    def value(row: Row) -> int:
        return -row["x"] if setup.descending else row["x"]

    def partition(row: Row) -> tuple[Any, ...]:
        return (row["k"],) if setup.by_k else ()

    expected = reference(rows, setup.end, partition, value, setup.function, setup.limit)
    op, out = setup.operator(), Recorder()
    op.connect(out)
    emitted: list[tuple[int, int]] = []
    output_punctuation = NO_PROGRESS
    punctuation = NO_PROGRESS
    for step, event in enumerate(events):
        if step == cut:
            restored, out = setup.operator(), Recorder()
            restored.restore(unpack(pack(op.snapshot())))
            restored.connect(out)
            op = restored
        if isinstance(event, int):
            punctuation = event
            op.punctuate(Punctuation(event, op.attribute))
        else:
            op.process(as_batch(event, setup))
        for item in out.items:
            if isinstance(item, Punctuation):
                assert item.attribute == ("window_end" if setup.tumble else "we")
                assert item.value > output_punctuation
                output_punctuation = item.value
                continue
            for id_, rank, key in zip(
                item["id"].tolist(), item["r"].tolist(), item[op.key].tolist(), strict=True
            ):
                assert key == setup.end(rows[id_]) and key >= output_punctuation
                emitted.append((id_, rank))
        out.clear()
        covered = [(row, rank) for row, rank in expected if setup.covered(row, punctuation)]
        assert ranks_held(setup, [(rows[i], rank) for i, rank in emitted]) == ranks_held(setup, covered)
    assert output_punctuation == END_OF_STREAM
    return emitted


@settings(max_examples=examples(300), deadline=None)
@given(setup=setups, rows=operator_rows, data=st.data())
def test_operator_emits_each_windows_top_exactly_once_when_covered(
    setup: Setup, rows: list[Row], data: st.DataObject
) -> None:
    events = data.draw(operator_deliveries(rows, setup), label="delivery")
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(events) - 1)), label="cut")
    emitted = drive(setup, events, rows, cut)
    assert len({id_ for id_, _ in emitted}) == len(emitted)  # no row twice
    # Ties broken alike whatever the arrival, the batches and the punctuation: the same rows.
    again = drive(setup, data.draw(operator_deliveries(rows, setup), label="another delivery"), rows, None)
    assert sorted(again) == sorted(emitted)


# ---- Flink's queries through the engine -------------------------------------------------------------
SIZE_MS = {3: "INTERVAL '3' MILLISECOND", 5: "INTERVAL '5' MILLISECOND"}


@dataclass(frozen=True)
class FlinkTopN:
    function: str
    limit: int
    size: int
    descending: bool
    by_k2: bool

    def sql(self) -> str:
        partition = "window_start, window_end" + (", k2" if self.by_k2 else "")
        order = "v DESC" if self.descending else "v"
        table = f"TABLE(TUMBLE(TABLE A, DESCRIPTOR(ts), {SIZE_MS[self.size]}))"
        return (
            f"SELECT * FROM (SELECT *, {self.function.upper()}() OVER (PARTITION BY {partition} ORDER BY "
            f"{order}) AS rownum FROM {table}) WHERE rownum <= {self.limit}"
        )

    def end(self, row: Row) -> int:
        return (row["ts"] // self.size + 1) * self.size


flink_top_ns = st.builds(
    FlinkTopN,
    function=st.sampled_from(FUNCTIONS),
    limit=st.integers(1, 3),
    size=st.sampled_from([3, 5]),
    descending=st.booleans(),
    by_k2=st.booleans(),
)


COLUMNS = ("k1", "k2", "v", "f", "b", "ts")


def plain(row: Row, names: tuple[str, ...] = COLUMNS) -> tuple[Any, ...]:
    """A row's ``names`` as comparable values: a float's NULL (NaN) as None."""
    return tuple(None if isinstance(row[n], float) and math.isnan(row[n]) else row[n] for n in names)


@settings(max_examples=examples(150), deadline=None)
@given(top=flink_top_ns, sources=stream_sources(1, max_sources=2), data=st.data())
def test_flink_window_top_n_equals_the_reference(top: FlinkTopN, sources: Any, data: st.DataObject) -> None:
    rows = data.draw(tuples(max_size=30), label="rows")
    honest = data.draw(st.booleans(), label="honest")
    events: list[Event] = data.draw(deliveries({"A": rows}, sources, honest=honest), label="delivery")
    obs = run(None, top.sql(), sources, events)
    on_time = [row for row, progress in obs.arrivals if row["ts"] >= progress]  # the rest are late

    def value(row: Row) -> int:
        v: int = row["v"]
        return -v if top.descending else v

    def partition(row: Row) -> tuple[Any, ...]:
        return (row["k2"],) if top.by_k2 else ()

    def held(pairs: list[tuple[Row, int]]) -> Counter[tuple[Any, ...]]:
        if top.function == "row_number":  # ties hold fixed ranks, in some order
            return Counter((top.end(r), *partition(r), r["v"], rank) for r, rank in pairs)
        return Counter((*plain(r), rank) for r, rank in pairs)

    expected = reference(on_time, top.end, partition, value, top.function, top.limit)
    got = [(row, row["rownum"]) for row in obs.rows]
    for row, _ in got:
        assert (row["window_start"], row["window_end"]) == (top.end(row) - top.size, top.end(row))
    assert Counter(plain(row) for row, _ in got) <= Counter(plain(row) for row in on_time)  # real rows
    for call, progress in enumerate(obs.progress):  # exactly the windows covered so far
        out = [(row, rank) for (row, rank), c in zip(got, obs.row_call, strict=True) if c <= call]
        assert held(out) == held([(row, rank) for row, rank in expected if top.end(row) <= progress])
    assert obs.punctuation[-1] == END_OF_STREAM and obs.punctuation == sorted(set(obs.punctuation))


@settings(max_examples=examples(100), deadline=None)
@given(
    limit=st.integers(1, 3),
    size=st.sampled_from([3, 5]),
    sources=stream_sources(1, max_sources=2),
    data=st.data(),
)
def test_top_n_of_a_window_aggregate_equals_the_reference(
    limit: int, size: int, sources: Any, data: st.DataObject
) -> None:
    """Flink's Window Top-N after a window aggregate: the derived table's rows, one per (window,
    k2), ordered by count then k2, so that no two tie."""
    rows = data.draw(tuples(max_size=30), label="rows")
    events: list[Event] = data.draw(deliveries({"A": rows}, sources), label="delivery")
    table = f"TABLE(TUMBLE(TABLE A, DESCRIPTOR(ts), {SIZE_MS[size]}))"
    sql = (
        "SELECT window_end, k2, n, rownum FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, "
        f"window_end ORDER BY n DESC, k2) AS rownum FROM (SELECT window_start, window_end, k2, count(*) AS n "
        f"FROM {table} GROUP BY window_start, window_end, k2)) WHERE rownum <= {limit}"
    )
    obs = run(None, sql, sources, events)
    counts = Counter(((r["ts"] // size + 1) * size, r["k2"]) for r in rows)
    groups = [{"window_end": end, "k2": k2, "n": n} for (end, k2), n in counts.items()]
    expected = reference(
        groups, lambda g: g["window_end"], lambda g: (), lambda g: (-g["n"], g["k2"]), "row_number", limit
    )
    names = ("window_end", "k2", "n", "rownum")
    for call, progress in enumerate(obs.progress):  # exactly the windows covered so far
        out = [row for row, c in zip(obs.rows, obs.row_call, strict=True) if c <= call]
        due = [{**g, "rownum": rank} for g, rank in expected if g["window_end"] <= progress]
        assert Counter(plain(r, names) for r in out) == Counter(plain(r, names) for r in due)
