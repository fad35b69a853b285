"""Each window kind's logic (lowtide.operators.window_logic) against window extents written here
from the definitions (docs/design.md, "Windows" and "Punctuation and lateness"; tests/reference.py
states them too), never from the logic:

* sliding / tumbling: ``extent(w) = [w*SLIDE, w*SLIDE + RANGE)`` for every integer ``w``;
* landmark: ``extent(w) = {t : t < (w+1)*SLIDE}`` (prefixes: a tuple is counted once, in its first
  window, which every later one holds);
* tuple windows: the sliding definition over row numbers;
* the whole stream: one window, every tuple, complete only at the end of the stream;
* a window is complete at punctuation ``p`` iff ``end(w) <= p``; a tuple behind punctuation is
  late iff it lies in some complete window (tuple windows: none is behind until the end of the
  stream, when every one is);
* sessions: a session with members ``s .. l`` is ``[s, l + gap)``; a value joins it iff it lies
  within ``gap`` of a member (strictly less; at most ``gap`` when touching), so it is complete at
  ``p`` iff no value at or above ``p`` joins it; a tuple is late iff its own session is complete
  at the horizon or it joins a session already purged.

Checked: ``open_for`` is the windows whose extent holds each value, ``close_for(p)`` the windows
``p`` completes, ``late_for`` the tuples in a complete window, and what the operators ask at run
time (``missed``, ``still_open``; a session's ``missed`` and ``floor``) the same.
"""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import Window as Spec
from strategies import (
    TS_HI,
    TS_LO,
    examples,
    landmark_windows,
    row_windows,
    session_windows,
    sliding_windows,
    tumbling_windows,
)

from lowtide import END_OF_STREAM, NO_PROGRESS
from lowtide.batch import Batch
from lowtide.operators.window_logic import logic_of
from lowtide.operators.windows import Landmark, Rows, Session, Sliding, Whole, Window
from lowtide.punctuation.model import TIME_END

pytestmark = pytest.mark.property

WHOLE = Spec("whole", 0)
aligned = st.one_of(sliding_windows, tumbling_windows, landmark_windows, row_windows, st.just(WHOLE))
values = st.lists(st.integers(TS_LO, TS_HI), min_size=1, max_size=20)
# Finite punctuations around the values, and the domain's ends and sentinels.
punctuations = st.one_of(
    st.integers(TS_LO - 15, TS_HI + 15), st.sampled_from([NO_PROGRESS, TIME_END, END_OF_STREAM])
)
CANDIDATES = range(TS_LO - 15, TS_HI + 15)  # window ids: every window holding a value is among them


def window_of(spec: Spec) -> Window:
    if spec.kind == "sliding":
        assert spec.range is not None
        return Sliding(spec.range, spec.slide, "ts")
    if spec.kind == "landmark":
        return Landmark(spec.slide, "ts")
    if spec.kind == "rows":
        assert spec.range is not None
        return Rows(spec.range, spec.slide, spec.partition)
    return Whole("ts")


def holds(spec: Spec, w: int, t: int) -> bool:
    """Whether ``extent(w)`` of ``spec`` holds the value ``t`` (see the module)."""
    if spec.kind == "whole":
        return w == 0
    if spec.kind == "landmark":
        return t < (w + 1) * spec.slide
    assert spec.range is not None
    return w * spec.slide <= t < w * spec.slide + spec.range


def complete(spec: Spec, w: int, p: int) -> bool:
    """Whether punctuation ``p`` completes window ``w`` (its end at or before ``p``)."""
    if spec.kind == "whole" or p >= END_OF_STREAM:
        return p >= END_OF_STREAM
    end = (w + 1) * spec.slide if spec.kind == "landmark" else w * spec.slide + (spec.range or 0)
    return end <= p


def windows(spec: Spec, t: int) -> list[int]:
    return [w for w in (CANDIDATES if spec.kind != "whole" else [0]) if holds(spec, w, t)]


def batch_of(ts: list[int]) -> Batch:
    return Batch({"ts": np.array(ts, np.int64)}, len(ts))


@settings(max_examples=examples(300), deadline=None)
@given(spec=aligned, ts=values, p=punctuations, first_open=st.integers(TS_LO - 15, TS_HI + 15))
def test_aligned_logic_is_the_windows_definition(spec: Spec, ts: list[int], p: int, first_open: int) -> None:
    logic = logic_of(window_of(spec))
    ws, we = logic.open_for(np.array(ts, np.int64))
    for t, start, end in zip(ts, ws.tolist(), we.tolist(), strict=True):
        held = windows(spec, t)
        if spec.kind == "landmark":  # counted once, in its first window: every later one holds it
            assert (start, end) == (held[0], held[0] + 1) and held == [w for w in CANDIDATES if w >= start]
        else:
            assert list(range(start, end)) == held
    # close_for(p): the windows below it are exactly those p completes
    q = logic.close_for(p)
    ids = CANDIDATES if spec.kind != "whole" else [0]
    assert [w < q for w in ids] == [complete(spec, w, p) for w in ids]
    # late_for: a tuple in some complete window (tuple windows: every one, at the end only)
    late = logic.late_for(batch_of(ts), p).tolist()
    if spec.kind == "rows":
        assert late == [p >= END_OF_STREAM] * len(ts)
    else:
        assert late == [any(complete(spec, w, p) for w in windows(spec, t)) for t in ts]
    # at run time, below the operator's first window not emitted: missed, and where it still counts
    missed = logic.missed(ws, we, first_open).tolist()
    assert missed == [any(w < first_open for w in windows(spec, t)) for t in ts]
    open_ws, open_we = logic.still_open(ws, we, first_open)
    for t, start, end in zip(ts, open_ws.tolist(), open_we.tolist(), strict=True):
        still = [w for w in windows(spec, t) if w >= first_open]
        if spec.kind == "landmark":  # in the first window not emitted, which every later one holds
            assert (start, end) == (still[0], still[0] + 1)
        else:
            assert list(range(start, end)) == still


def joins(v: int, first: int, last: int, gap: int, touching: bool) -> bool:
    """Whether value ``v`` joins a session whose members run from ``first`` to ``last`` (each
    less than ``gap`` after the one before; at most ``gap`` when touching)."""
    near = (lambda d: d <= gap) if touching else (lambda d: d < gap)
    return first <= v <= last or near(abs(v - first)) or near(abs(v - last))


def session_complete(first: int, last: int, gap: int, touching: bool, p: int) -> bool:
    """No value at or above ``p`` joins the session (values past ``last + gap`` cannot)."""
    if p >= END_OF_STREAM:
        return True
    return not any(joins(v, first, last, gap, touching) for v in range(p, max(p, last) + gap + 2))


sessions = st.builds(lambda spec, touching: Session(spec.gap, "ts", touching), session_windows, st.booleans())
finite = st.integers(TS_LO - 15, TS_HI + 15)


@settings(max_examples=examples(300), deadline=None)
@given(
    window=sessions,
    ts=values,
    p=st.one_of(finite, st.just(END_OF_STREAM)),
    purged=st.tuples(st.integers(TS_LO, TS_HI), st.integers(0, 10)),
    lead=st.integers(-1, 16),
)
def test_session_logic_is_the_sessions_definition(
    window: Session, ts: list[int], p: int, purged: tuple[int, int], lead: int
) -> None:
    logic, gap, touching = logic_of(window), window.gap, window.touching
    starts, ends = logic.open_for(np.array(ts, np.int64))
    assert starts.tolist() == ts and ends.tolist() == [t + gap for t in ts]  # a value's own session
    # close_for(p): the sessions ending at or below it are exactly those p completes
    q = logic.close_for(p)
    for last in range(TS_LO - gap - 2, TS_HI + 2):
        assert (last + gap <= q) == session_complete(last, last, gap, touching, p)
    # punctuation alone: every tuple behind it may join a session already purged, so all are late
    behind = [t for t in ts if t < p]
    assert logic.late_for(batch_of(ts), p).all()
    for t in behind:
        assert any(
            session_complete(last, last, gap, touching, p) and joins(t, last, last, gap, touching)
            for last in range(t - gap - 1, t + 1)
        )
    # at run time, at a horizon about the end of a session of the group (``first`` .. ``last``),
    # purged if it is complete there: a value is late iff its own session is complete or it joins
    # the purged one; values about the purged session's edges too
    first, width = purged
    last = first + width
    horizon = last + gap + lead
    near = [last + gap + d for d in range(-2, 4)] + [first - gap + d for d in range(-2, 3)]
    if not session_complete(first, last, gap, touching, horizon):
        last = first = NO_PROGRESS  # no session of the group purged yet
    gone = NO_PROGRESS if last == NO_PROGRESS else last + gap
    expected = [
        session_complete(t, t, gap, touching, horizon)
        or (last != NO_PROGRESS and joins(t, first, last, gap, touching))
        for t in ts + near
    ]
    missed = logic.missed(np.array(ts + near, np.int64), np.full(len(ts + near), gone, np.int64), horizon)
    assert missed.tolist() == expected
    # floor: the smallest value whose own session the horizon does not complete
    floor = next(
        t for t in range(horizon - gap - 3, horizon + 2) if not session_complete(t, t, gap, touching, horizon)
    )
    assert logic.floor(horizon) == floor


def test_every_window_kind_is_drawn() -> None:
    """A window kind added to operators.windows fails here until the tests above draw it."""
    drawn = {type(window_of(Spec(kind, 2, 3))) for kind in ("sliding", "landmark", "rows", "whole")}
    assert drawn == set(get_args(Window))
