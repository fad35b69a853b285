"""A brute-force evaluator of window aggregates, written from docs/design.md ("Windows" and
"Results and offsets"), not from the engine.

Every window is enumerated from its ``extent()`` and every tuple is tested against it, with plain
Python loops: slow, and obviously right. Inputs are the tuples a query sees, in arrival order
(the order the engine received them, across every stream of a UNION), as dicts.

* sliding / tumbling: ``extent(w) = {t : w*SLIDE <= t.ts < w*SLIDE + RANGE}`` for every integer
  ``w`` (negative too); a row per non-empty (window, group).
* landmark (RANGE ALL): ``extent(w) = {t : t.ts < (w+1)*SLIDE}`` for ``w`` from ``f``, the slide of
  the first tuple, up to the slide of the last tuple or, if later, the last slide that punctuation
  ``progress`` passed (``(w+1)*SLIDE <= progress``); ``window_start = f*SLIDE``.
* tuple windows (row-num): the sliding definition over row numbers 0, 1, ... in arrival order;
  with PA, over the rank of each tuple within its partition (the partition's own row numbers).
* session windows (SESSION gap): per group, its tuples sorted by ts, each joining the session of
  the one before it when less than ``gap`` after it; ``[first ts, last ts + gap)``. Which tuples
  behind punctuation a session aggregate counts: :func:`session_counts`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
END_OF_STREAM = 2**63 - 1
NO_PROGRESS = -(2**63)
CountsIn = Callable[[int, int, int], bool]  # (tuple index, window start, window end) -> does it count
Aggregator = Callable[["Agg", Sequence[Row]], Any]  # an aggregate's value over a group's tuples


@dataclass(frozen=True)
class Agg:
    """``func(column[, param]) AS name``; func is one of the names of the query language."""

    # "count*", count, sum, min, max, avg, var, stddev, median, quantile, count_distinct, heavy_hitters
    func: str
    column: str | None
    name: str
    param: float | None = None


@dataclass(frozen=True)
class Window:
    kind: str  # "sliding" (tumbling when range == slide), "landmark", "rows", "session"
    slide: int  # 0 for session
    range: int | None = None  # None for landmark and session
    attribute: str = "ts"
    partition: tuple[str, ...] = ()  # PA, rows only
    gap: int = 0  # session only


@dataclass(frozen=True)
class Spec:
    window: Window
    group_by: tuple[str, ...] = ()
    aggs: tuple[Agg, ...] = ()
    having: tuple[Agg, str, float] | None = None  # (aggregate, ">" | ">=" | "<", constant)
    keys: tuple[str, ...] = field(default=())  # group columns of a result row: group_by + PA

    def __post_init__(self) -> None:
        keys = self.group_by + tuple(p for p in self.window.partition if p not in self.group_by)
        object.__setattr__(self, "keys", keys)


# -- aggregates -------------------------------------------------------------------------------------
def _present(values: Iterable[Any]) -> list[Any]:
    """SQL aggregates skip nulls (None, or NaN for floats)."""
    return [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def aggregate(agg: Agg, tuples: Sequence[Row]) -> Any:
    if agg.func == "count*":
        return len(tuples)
    assert agg.column is not None
    xs = _present(t[agg.column] for t in tuples)
    if agg.func == "count":
        return len(xs)
    if agg.func == "count_distinct":
        return len(set(xs))
    if agg.func == "heavy_hitters":
        freq = Counter(xs)
        hitters = [x for x, c in freq.items() if c >= (agg.param or 0.0) * len(xs)]
        return sorted(hitters, key=lambda x: (-freq[x], x))
    if not xs:
        return None
    if agg.func == "sum":
        return math.fsum(xs) if isinstance(xs[0], float) else sum(xs)
    if agg.func == "min":
        return min(xs)
    if agg.func == "max":
        return max(xs)
    if agg.func == "avg":
        return math.fsum(xs) / len(xs)
    if agg.func in ("var", "stddev"):
        if len(xs) < 2:
            return None
        var = _sample_variance(xs)
        return math.sqrt(var) if agg.func == "stddev" else var
    if agg.func in ("median", "quantile"):
        return _linear_quantile(xs, 0.5 if agg.func == "median" else float(agg.param or 0.0))
    raise ValueError(agg.func)


def _sample_variance(xs: Sequence[float]) -> float:
    """``sum((x - mean)^2) / (n - 1)``, the two-pass textbook form."""
    mean = math.fsum(xs) / len(xs)
    return math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


def _linear_quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default, Hyndman-Fan type 7):
    ``h = q (n - 1)``, the value at ``floor(h)`` plus the fraction of ``h`` of the step to the next."""
    s = sorted(float(x) for x in xs)
    h = q * (len(s) - 1)
    lo = math.floor(h)
    frac = h - lo
    return s[lo] if frac == 0 else s[lo] + frac * (s[lo + 1] - s[lo])


def _passes(having: tuple[Agg, str, float] | None, tuples: Sequence[Row]) -> bool:
    if having is None:
        return True
    agg, op, const = having
    value = aggregate(agg, tuples)
    if value is None:
        return False  # a comparison with null is not true
    return {">": value > const, ">=": value >= const, "<": value < const}[op]


# -- windows ----------------------------------------------------------------------------------------
def _floor_div(a: int, b: int) -> int:
    return a // b  # Python's // floors, also for negative a


def _sliding_windows(
    window: Window, positions: Sequence[int], counts_in: CountsIn | None = None
) -> list[tuple[int, int, list[int]]]:
    """(start, end, member indexes) of every non-empty window of the sliding definition."""
    assert window.range is not None
    # The windows holding some position (w * slide <= p < w * slide + range), however far apart
    # the positions lie: the definition is walked only where it can give rows.
    candidates = {
        w
        for p in positions
        for w in range(_floor_div(p - window.range, window.slide) + 1, _floor_div(p, window.slide) + 1)
    }
    out = []
    for w in sorted(candidates):
        start, end = w * window.slide, w * window.slide + window.range
        members = [
            i
            for i, p in enumerate(positions)
            if start <= p < end and (counts_in is None or counts_in(i, start, end))
        ]
        if members:
            out.append((start, end, members))
    return out


def _landmark_windows(
    window: Window, ts: Sequence[int], progress: int | None, counts_in: CountsIn | None = None
) -> list[tuple[int, int, list[int]]]:
    """``counts_in``: tuple ``i`` counts from the first window ``w >= its slide`` it is told to
    (later ones all hold it); ``f`` is the earliest window any tuple counts in."""
    if not ts:
        return []
    slides: list[int | None] = [_floor_div(t, window.slide) for t in ts]
    if counts_in is not None:
        for i, w in enumerate(slides):
            if not counts_in(i, NO_PROGRESS, END_OF_STREAM):
                slides[i] = None  # it counts in no window at all
                continue
            while not counts_in(i, w * window.slide, (w + 1) * window.slide):
                w += 1
            slides[i] = w
    counted = [s for s in slides if s is not None]
    if not counted:
        return []
    first, last = min(counted), max(counted)
    if progress is not None:
        last = max(last, _floor_div(progress, window.slide) - 1)
    out = []
    for w in range(first, last + 1):
        end = (w + 1) * window.slide
        out.append((first * window.slide, end, [i for i, s in enumerate(slides) if s is not None and s <= w]))
    return out


def sessions_of(gap: int, ts: Sequence[int]) -> list[tuple[int, int, list[int]]]:
    """(start, end, member indexes) of the sessions of one group's values ``ts``."""
    out: list[tuple[int, int, list[int]]] = []
    last = 0
    for i in sorted(range(len(ts)), key=lambda i: ts[i]):
        if out and ts[i] - last < gap:
            out[-1][2].append(i)
        else:
            out.append((ts[i], 0, [i]))
        last = ts[i]
    return [(start, ts[members[-1]] + gap, members) for start, _, members in out]


def session_counts(spec: Spec, arrivals: Sequence[tuple[Row, int]], lateness: int = 0) -> list[bool]:
    """Whether a session aggregate counts each tuple, given in arrival order with its query's
    progress ``p`` then (docs/design.md, "Punctuation and lateness"; ``lateness``: L under
    ``update``, else 0). Sessions ending at or below ``p - L`` are gone (emitted and dropped, or out
    of retention): those of the tuples counted before it. A tuple ``t`` counts iff its own session
    ``[t, t + gap)`` ends above ``p - L`` and it is at or above the end of every gone session of its
    group (one it would have joined). Before any progress every tuple counts."""
    window = spec.window
    counted: list[Row] = []
    out: list[bool] = []
    for row, p in arrivals:
        t = row[window.attribute]
        key = tuple(row[k] for k in spec.keys)
        mine = [r[window.attribute] for r in counted if tuple(r[k] for k in spec.keys) == key]
        gone = [end for _, end, _ in sessions_of(window.gap, mine) if end <= p - lateness]
        counts = p <= -(2**63) or (t + window.gap > p - lateness and all(t >= end for end in gone))
        out.append(counts)
        if counts:
            counted.append(row)
    return out


def _by_key(spec: Spec, tuples: Sequence[Row]) -> dict[tuple[Any, ...], list[Row]]:
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for t in tuples:
        groups.setdefault(tuple(t[k] for k in spec.keys), []).append(t)
    return groups


def session_punctuation(spec: Spec, tuples: Sequence[Row], progress: int, floor: int) -> int | None:
    """The output punctuation a session aggregate owes after punctuation ``progress``, having
    counted ``tuples``: the smallest end of a session not complete yet, or of one a tuple still
    to come (at or above ``floor``) would start; None before any progress."""
    if progress >= END_OF_STREAM:
        return END_OF_STREAM
    if progress <= -(2**63):
        return None
    window = spec.window
    ends = [
        end
        for members in _by_key(spec, tuples).values()
        for _, end, _ in sessions_of(window.gap, [t[window.attribute] for t in members])
        if end > progress
    ]
    return min([*ends, floor + window.gap])


def _group(
    spec: Spec, tuples: Sequence[Row], start: int, end: int, aggregate_of: Aggregator = aggregate
) -> list[Row]:
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for t in tuples:
        groups.setdefault(tuple(t[k] for k in spec.keys), []).append(t)
    rows = []
    for key, members in groups.items():
        if not _passes(spec.having, members):
            continue
        row: Row = {"window_start": start, "window_end": end}
        row.update(zip(spec.keys, key, strict=True))
        for agg in spec.aggs:
            row[agg.name] = aggregate_of(agg, members)
        rows.append(row)
    return rows


def evaluate(
    spec: Spec,
    tuples: Sequence[Row],
    progress: int | None = None,
    counts_in: CountsIn | None = None,
    aggregate_of: Aggregator = aggregate,
) -> list[Row]:
    """Expected result rows (revision 0) of ``spec`` over ``tuples`` in arrival order.

    ``progress``: for landmark windows, the largest finite punctuation the query saw (windows are
    emitted up to it); ignored by the other windows. ``counts_in``: for sliding and landmark windows,
    whether tuple ``i`` counts in the window ``[start, end)`` it falls in (tuples behind
    punctuation, late tuples under ``update``). ``aggregate_of``: the value of an aggregate over a
    group's tuples (another oracle than :func:`aggregate`; HAVING keeps :func:`aggregate`).
    """
    window = spec.window
    rows: list[Row] = []
    if window.kind == "sliding":
        for start, end, members in _sliding_windows(window, [t[window.attribute] for t in tuples], counts_in):
            rows += _group(spec, [tuples[i] for i in members], start, end, aggregate_of)
    elif window.kind == "landmark":
        landmarks = _landmark_windows(window, [t[window.attribute] for t in tuples], progress, counts_in)
        for start, end, members in landmarks:
            rows += _group(spec, [tuples[i] for i in members], start, end, aggregate_of)
    elif window.kind == "session":
        for members in _by_key(spec, tuples).values():
            for start, end, index in sessions_of(window.gap, [t[window.attribute] for t in members]):
                rows += _group(spec, [members[i] for i in index], start, end, aggregate_of)
    elif window.kind == "rows":
        partitions: dict[tuple[Any, ...], list[Row]] = {}
        for t in tuples:  # each partition numbers its own rows from 0, in arrival order
            partitions.setdefault(tuple(t[p] for p in window.partition), []).append(t)
        for part in partitions.values():
            for start, end, members in _sliding_windows(window, list(range(len(part)))):
                rows += _group(spec, [part[i] for i in members], start, end, aggregate_of)
    else:
        raise ValueError(window.kind)
    return rows


def covered(spec: Spec, row: Row, progress: int, rows_seen: dict[tuple[Any, ...], int]) -> bool:
    """Does punctuation cover ``row``'s window? Time windows: ``window_end <= progress``; tuple
    windows: ``window_end <=`` the rows its partition has seen, or every source has closed."""
    if spec.window.kind != "rows" or progress >= END_OF_STREAM:
        return bool(row["window_end"] <= progress)
    part = tuple(row[p] for p in spec.window.partition)
    return bool(row["window_end"] <= rows_seen.get(part, 0))


def first_open_end(window: Window, progress: int, rows_seen: int) -> int | None:
    """The output punctuation an aggregate owes: the end of its first window not yet complete
    (None: nothing promised yet). Time windows complete at ``end <= progress``, tuple windows
    at ``end <= rows seen``; a partitioned tuple window can promise nothing before the end,
    since a partition not seen yet starts at row 0."""
    if progress >= END_OF_STREAM:
        return END_OF_STREAM
    if window.kind == "rows":
        if window.partition or rows_seen == 0:
            return None
        progress = rows_seen
    elif progress <= -(2**63):
        return None
    w = progress // window.slide - (window.range or 0) // window.slide - 2  # below the answer
    end = (
        (lambda w: (w + 1) * window.slide)
        if window.kind == "landmark"
        else (lambda w: w * window.slide + (window.range or 0))
    )
    while end(w) <= progress:
        w += 1
    return end(w)


# -- comparison -------------------------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is None and b is None
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def canonical(rows: Iterable[Row], keys: Sequence[str]) -> dict[tuple[Any, ...], Row]:
    """Rows by (window_start, window_end, *keys); a duplicate key is an error."""
    out: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        key = (row["window_start"], row["window_end"], *(row[k] for k in keys))
        assert key not in out, f"row {key} emitted twice"
        out[key] = row
    return out


def assert_rows_equal(actual: Iterable[Row], expected: Iterable[Row], spec: Spec) -> None:
    got, want = canonical(actual, spec.keys), canonical(expected, spec.keys)
    missing = sorted(set(want) - set(got), key=repr)
    extra = sorted(set(got) - set(want), key=repr)
    assert not missing and not extra, f"missing windows {missing[:5]}, unexpected windows {extra[:5]}"
    for key, row in want.items():
        for agg in spec.aggs:
            assert _same(got[key][agg.name], row[agg.name]), (
                key,
                agg.name,
                got[key][agg.name],
                row[agg.name],
            )
