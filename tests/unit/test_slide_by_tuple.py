"""Slide-by-tuple Aggregate (§5.1.5, §6.1.4): Figure 6-5, Q5-5, Q5-6, duplicates, punctuation, state."""

from __future__ import annotations

from typing import Any

import numpy as np
from harness import Recorder

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.slide_by_tuple import SlideByTupleAggregate
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.schema import ColumnType

INT = ColumnType("int64")
FLOAT = ColumnType("float64")
COUNT = AggregateCall(AggFunc.COUNT_STAR, None, None, None, "count(*)")


def puncts(sink: Recorder) -> list[int]:
    return [p.value for p in sink.punctuations()]


def make(
    r: int, n: int, by_rank: bool, calls: tuple[AggregateCall, ...], groups: tuple[str, ...] = (), **kw: Any
) -> tuple[SlideByTupleAggregate, Recorder]:
    types = kw.pop("types", (INT,) * len(groups))
    columns = ("window_start", "window_end", *groups, *(c.output for c in calls), "revision")
    op = SlideByTupleAggregate(r, "ts", n, by_rank, groups, types, calls, columns, **kw)
    sink = Recorder()
    op.connect(sink)
    return op, sink


def send(op: SlideByTupleAggregate, **cols: Any) -> None:
    arrays = {k: np.asarray(v, np.float64 if k == "x" or k == "f" else np.int64) for k, v in cols.items()}
    op.process(Batch(arrays, len(cols["ts"])))


def test_figure_6_5_count_with_out_of_order_t5() -> None:
    # RANGE i = 10 on A (here ts); s1 < s5 < s2 < s3 < s4, t5 arrives last (out of order).
    op, sink = make(10, 1, False, (COUNT,))
    for s in (10, 15, 18, 23):  # t1..t4 (Figure 6-5 (a)-(d))
        send(op, ts=[s])
    send(op, ts=[12])  # t5 (e)
    op.punctuate(Punctuation(16, "ts"))  # future A values are greater than s2 = 15
    # The start bins of t1, t5 and t2 are emitted with the figure's counts 1, 2, 3.
    assert sink.rows("window_end", "count(*)") == [(11, 1), (13, 2), (16, 3)]
    assert sink.rows("window_start") == [(1,), (3,), (6,)]
    assert puncts(sink) == [16]
    sink.clear()
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    # Ss3 = (8, 18] holds t1, t5, t2, t3; Ss4 = (13, 23] holds t2, t3, t4 (the figure's 3).
    assert sink.rows("window_end", "count(*)") == [(19, 4), (24, 3)]
    assert puncts(sink) == [END_OF_STREAM]


def test_q5_5_max_length_slide_one_row() -> None:
    max_len = AggregateCall(AggFunc.MAX, "len", INT, None, "max(len)")
    op, sink = make(300000, 1, False, (max_len,))
    send(op, ts=[0, 100000, 250000, 50000], len=[40, 1500, 60, 900])
    op.punctuate(Punctuation(300000, "ts"))
    assert sink.rows("window_end", "max(len)") == [(1, 40), (50001, 900), (100001, 1500), (250001, 1500)]
    sink.clear()
    send(op, ts=[400000, 360000], len=[80, 100])
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    assert sink.rows("window_start", "window_end", "max(len)") == [
        (60001, 360001, 1500),
        (100001, 400001, 100),
    ]
    assert all(item["max(len)"].dtype == np.int64 for item in sink.items if isinstance(item, Batch))
    assert op.describe() == "Slide-by-tuple Aggregate max(len) RANGE 300000 on ts, SLIDE 1 rows by row-num"


def test_q5_6_count_slide_five_rows_by_rank() -> None:
    op, sink = make(4, 5, True, (COUNT,))
    send(op, ts=[3, 1, 7, 5, 2, 9])
    op.punctuate(Punctuation(4, "ts"))  # ranks 1..3 final: no window yet
    assert sink.rows("window_end") == [] and puncts(sink) == [4]
    assert op.open_windows() == 1  # six tuples seen, rank 5 among them
    send(op, ts=[4, 8, 6, 10, 12, 11])
    op.punctuate(Punctuation(6, "ts"))  # rank 5 is ts 5: extent (1, 5]
    assert sink.rows("window_end", "count(*)") == [(6, 4)]
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))  # rank 10 is ts 10: extent (6, 10]
    assert sink.rows("window_end", "count(*)") == [(6, 4), (11, 4)]
    assert "SLIDE 5 rows by rank(ts)" in op.describe()


def test_duplicate_ra_values_define_one_window() -> None:
    op, sink = make(3, 2, False, (COUNT,), ("g",))
    send(op, ts=[5, 5, 3, 5], g=[1, 2, 1, 1])  # arrivals 2 and 4 both define window 5
    assert op.open_windows() == 1
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    assert sink.rows("window_end", "g", "count(*)") == [(6, 1, 3), (6, 2, 1)]
    # By rank: ranks 2 and 4 are both ts 5 (ties by arrival), still one window.
    op, sink = make(1, 2, True, (COUNT,))
    send(op, ts=[5, 5, 5, 5, 5])
    op.punctuate(Punctuation(6, "ts"))
    assert sink.rows("window_end", "count(*)") == [(6, 5)]


def test_end_of_stream_flushes_and_punctuation_never_regresses() -> None:
    op, sink = make(5, 1, False, (COUNT,))
    send(op, ts=[10, 20, 30])
    for p in (10, 10, 5, 12, 11):
        op.punctuate(Punctuation(p, "ts"))
    op.punctuate(Punctuation(100, "other"))
    assert puncts(sink) == [10, 12]
    assert sink.rows("window_end") == [(11,)]
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    assert puncts(sink) == [10, 12, END_OF_STREAM]
    assert sink.rows("window_end", "count(*)") == [(11, 1), (21, 1), (31, 1)]
    assert op.open_windows() == 0


def test_holistic_algebraic_float_keys_and_having() -> None:
    calls = (
        AggregateCall(AggFunc.AVG, "x", FLOAT, None, "avg(x)"),
        AggregateCall(AggFunc.STDDEV, "x", FLOAT, None, "stddev(x)"),
        AggregateCall(AggFunc.COUNT, "x", FLOAT, None, "count(x)"),
        AggregateCall(AggFunc.COUNT_DISTINCT, "v", INT, None, "cd(v)"),
        AggregateCall(AggFunc.HEAVY_HITTERS, "v", INT, 0.5, "hh(v)"),
        AggregateCall(AggFunc.QUANTILE, "x", FLOAT, 0.25, "q(x)"),
    )
    op, sink = make(10, 2, False, calls, ("f",), types=(FLOAT,), having=lambda c: c["count(x)"] >= 1)
    nan = float("nan")
    send(
        op,
        ts=[1, 2, 3, 4, 5, 6],
        f=[0.5, 0.5, 0.5, 1.5, 1.5, 0.5],
        x=[1, 2, nan, nan, 3, 4],
        v=[7, 7, 8, 9, 9, 7],
    )
    op.punctuate(Punctuation(END_OF_STREAM, "ts"))
    rows = sink.rows("window_end", "f", "avg(x)", "count(x)", "cd(v)", "hh(v)", "q(x)")
    # Windows 2, 4, 6 (every second arrival); f = 1.5 has no non-null x before ts 5: filtered.
    assert rows == [
        (3, 0.5, 1.5, 2, 1, [7], 1.25),
        (5, 0.5, 1.5, 2, 2, [7], 1.25),
        (7, 0.5, 7 / 3, 3, 2, [7], 1.5),
        (7, 1.5, 3.0, 1, 1, [9], 3.0),
    ]
    stddev = sink.rows("stddev(x)")
    assert np.isclose(stddev[0][0], np.std([1, 2], ddof=1)) and np.isclose(
        stddev[2][0], np.std([1, 2, 4], ddof=1)
    )
    assert np.isnan(stddev[3][0])


def brute_counts(
    ts: np.ndarray, g: np.ndarray, v: np.ndarray, r: int, n: int
) -> dict[tuple[int, int], tuple[int, int]]:
    """(count, min(v)) per window and group: a window ends at every n-th arrival's ts and holds
    every tuple with ts in (end - r, end]. The tuples sorted by ts once make each window one
    slice (a mask over all 60 000 per window and group took seconds)."""
    order = np.argsort(ts, kind="stable")
    by_ts, g, v = ts[order], g[order], v[order]
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for w in np.unique(ts[n - 1 :: n]).tolist():
        first, end = np.searchsorted(by_ts, [w - r, w], side="right")
        groups, values = g[first:end], v[first:end]
        for group in np.unique(groups).tolist():
            cell = values[groups == group]
            out[(w, group)] = (int(cell.size), int(cell.min()))
    return out


def test_long_stream_state_is_bounded_and_groups_are_compacted() -> None:
    rng = np.random.default_rng(7)
    calls = (COUNT, AggregateCall(AggFunc.MIN, "v", INT, None, "min(v)"))
    op, sink = make(50, 7, False, calls, ("g",))
    total, chunk, slack = 60000, 1000, 30
    ts = np.arange(total) // 2 + rng.integers(0, slack, total)  # band disorder
    g = np.arange(total) // 4 + rng.integers(0, 3, total)  # key churn: 15000 groups, ~50 live at a time
    v = rng.integers(-1000, 1000, total)
    sizes = []
    for start in range(0, total, chunk):
        send(op, ts=ts[start : start + chunk], g=g[start : start + chunk], v=v[start : start + chunk])
        rest = ts[start + chunk :]
        op.punctuate(Punctuation(int(rest.min()) if rest.size else END_OF_STREAM, "ts"))
        sizes.append((op._store.n, len(op.groups), op.state_bytes()))
    got = {(w - 1, grp): (c, m) for w, grp, c, m in sink.rows("window_end", "g", "count(*)", "min(v)")}
    assert got == brute_counts(ts, g, v, 50, 7)
    assert max(s[0] for s in sizes[5:]) < 12000  # live: ~(50 + slack) ts units * 2 tuples; + dead half
    assert max(s[1] for s in sizes) <= 8192 and sizes[-1][1] < 4096  # group table compacted
    assert max(s[2] for s in sizes[20:]) < 4 * max(s[2] for s in sizes[5:20])
    assert puncts(sink)[-1] == END_OF_STREAM and op.open_windows() == 0


def test_null_strings_are_not_counted() -> None:
    from lowtide import Engine

    eng = Engine()
    eng.create_stream("A", {"k": "string", "ts": "int64"})
    q = eng.register_query(
        "SELECT count(k) AS c, count_distinct(k) AS d [RANGE 10, RATTR ts, SLIDE 1 row, SATTR row-num] FROM A"
    )
    eng.push("A", {"k": [None, "x"], "ts": [1, 2]})
    eng.punctuate("A", 5)
    rows = eng.poll(q)[0].to_pylist()
    assert [(r["c"], r["d"]) for r in rows] == [(0, 0), (1, 1)]
