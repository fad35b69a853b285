"""Window semantics of chapter 5: ``wids()``, ``extent()`` bounds and completion by punctuation.

Windows are aligned to 0 of the windowing attribute's domain (docs/design.md, "Windows"), identified
by integer window ids ``w`` (negative ids are windows that start before 0, and are real windows).

* :class:`Sliding` (tumbling when RANGE == SLIDE): ``extent(w) = [w*SLIDE, w*SLIDE + RANGE)``,
  so ``wids(t) = [floor((t - RANGE) / SLIDE) + 1, floor(t / SLIDE) + 1)``. RANGE need not be a
  multiple of SLIDE; with SLIDE > RANGE some tuples fall in no window.
* :class:`Landmark` (RANGE ALL): ``extent(w) = {t : t < (w+1)*SLIDE}``; window ids start at the
  slide of the first tuple. Its rows are slides: ``wids`` tags a tuple with its slide only and the
  aggregate keeps prefixes.
* :class:`Rows` (WA row-num, optionally PA): the sliding definition over arrival positions
  (``rank`` within the partition when partitioned).
* :class:`Whole` (no window: a GROUP BY or a rank over a stream, as Flink runs it): ``extent(0)``
  is every tuple; window 0 is complete at the end of the stream only, its bounds the domain's,
  ``[TIME_MIN, TIME_END)``.
* :class:`Session` (SESSION gap): not aligned and without window ids: a session of a group is a
  maximal run of its sorted values each less than ``gap`` after the previous one (``touching``:
  at most ``gap``, Flink's and Spark's rule), ``[first, last + gap)``. Session Aggregate
  (:mod:`lowtide.operators.session`) keeps them.

A window ``w`` is complete once punctuation ``p >= end(w)``: ``first_open(p)`` is the smallest
window id that punctuation ``p`` does not yet complete. Which tuples are late by it is each kind's
window logic (:mod:`lowtide.operators.window_logic`).

:class:`WindowLimits` bounds the work a window may cause without data to match it: the windows
one tuple belongs to (RANGE/SLIDE, refused when a query is planned) and the windows one step
(a punctuation, an early-results round) emits that hold no tuple of their own (a landmark emits
every slide up to the punctuation: one far-off punctuation would otherwise emit millions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lowtide.errors import ResourceExhausted
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, TIME_END, TIME_MIN

I64 = npt.NDArray[np.int64]
BOUNDS = ("window_start", "window_end")  # the columns a TUMBLE adds (Window Top-N)


def _saturating(q: int) -> int:
    return max(NO_PROGRESS, min(END_OF_STREAM, q))


@dataclass(frozen=True)
class Sliding:
    """``[RANGE range, SLIDE slide, WA attribute]`` in the attribute's units."""

    range: int
    slide: int
    attribute: str

    def wids(self, values: I64) -> tuple[I64, I64]:
        """``[wid_start, wid_end)`` of each value (Eq. 5.3 aligned to 0)."""
        return (values - self.range) // self.slide + 1, values // self.slide + 1

    def first_open(self, punctuation: int) -> int:
        if punctuation >= END_OF_STREAM:
            return END_OF_STREAM
        if punctuation <= NO_PROGRESS:
            return NO_PROGRESS
        return _saturating((punctuation - self.range) // self.slide + 1)

    def bounds(self, wids: I64) -> tuple[I64, I64]:
        start = wids * self.slide
        return start, start + self.range

    def end_of(self, wid: int) -> int:
        return _saturating(wid * self.slide + self.range)

    def describe(self) -> str:
        kind = "tumbling" if self.range == self.slide else "sliding"
        return f"{kind} RANGE {self.range} SLIDE {self.slide} on {self.attribute}"


def pane_of(window: Sliding) -> Sliding:
    """The tumbling window of panes that ``window`` is cut into."""
    pane = math.gcd(window.range, window.slide)
    return Sliding(pane, pane, window.attribute)


@dataclass(frozen=True)
class Landmark:
    """``[RANGE ALL, SLIDE slide, WA attribute]``: rows are slides, windows are prefixes."""

    slide: int
    attribute: str

    def wids(self, values: I64) -> tuple[I64, I64]:
        slides = values // self.slide
        return slides, slides + 1

    def first_open(self, punctuation: int) -> int:
        if punctuation >= END_OF_STREAM:
            return END_OF_STREAM
        if punctuation <= NO_PROGRESS:
            return NO_PROGRESS
        return punctuation // self.slide

    def end_of(self, wid: int) -> int:
        return _saturating((wid + 1) * self.slide)

    def describe(self) -> str:
        return f"landmark RANGE ALL SLIDE {self.slide} on {self.attribute}"


@dataclass(frozen=True)
class Rows:
    """``[RANGE range ROWS, SLIDE slide ROWS, WA row-num(, PA partition)]``."""

    range: int
    slide: int
    partition: tuple[str, ...] = ()

    def wids(self, positions: I64) -> tuple[I64, I64]:
        return (positions - self.range) // self.slide + 1, positions // self.slide + 1

    def first_open(self, rows_seen: int) -> int:
        """Windows below this id hold only positions ``< rows_seen``: they are complete."""
        return (rows_seen - self.range) // self.slide + 1

    def first_open_many(self, rows_seen: I64) -> I64:
        return (rows_seen - self.range) // self.slide + 1

    def bounds(self, wids: I64) -> tuple[I64, I64]:
        start = wids * self.slide
        return start, start + self.range

    def end_of(self, wid: int) -> int:
        return _saturating(wid * self.slide + self.range)

    def describe(self) -> str:
        by = f" PA {', '.join(self.partition)}" if self.partition else ""
        return f"rows RANGE {self.range} SLIDE {self.slide} on row-num{by}"


@dataclass(frozen=True)
class Whole:
    """No window (Flink's unbounded GROUP BY): every tuple is in window 0, which no punctuation
    but the end of the stream completes (a source may punctuate ``TIME_END``, yet a reader of
    this result sees rows at ``window_end`` = ``TIME_END``: only the end closes it)."""

    attribute: str

    def wids(self, values: I64) -> tuple[I64, I64]:
        return np.zeros(values.shape[0], np.int64), np.ones(values.shape[0], np.int64)

    def first_open(self, punctuation: int) -> int:
        if punctuation >= END_OF_STREAM:
            return END_OF_STREAM
        return NO_PROGRESS if punctuation <= NO_PROGRESS else 0

    def bounds(self, wids: I64) -> tuple[I64, I64]:
        return np.full(wids.shape[0], TIME_MIN, np.int64), np.full(wids.shape[0], TIME_END, np.int64)

    def end_of(self, wid: int) -> int:
        """While window 0 is open no result has ``window_end`` below ``TIME_END``."""
        return TIME_END if wid <= 0 else END_OF_STREAM

    def describe(self) -> str:
        return f"the whole stream on {self.attribute}, complete at its end"


@dataclass(frozen=True)
class Session:
    """``[SESSION gap, WA attribute]`` in the attribute's units (no window ids: see above).

    ``touching`` false (the bracket form, the dissertation's rule): a value joins the session of
    the one before it when it is less than ``gap`` after it. True (Flink's ``SESSION`` and Spark's
    ``session_window``): when it is at most ``gap`` after it - each value's window ``[t, t + gap)``
    merges with every one it intersects or touches (Flink's ``TimeWindow.intersects`` is
    ``start <= other.end && end >= other.start``; Spark merges a session whose start is ``<=`` the
    current end). Either way a session is ``[first, last + gap)``.
    """

    gap: int
    attribute: str
    touching: bool = False

    @property
    def reach(self) -> int:
        """How many values at or past a session's ``window_end`` still join it: 0, or 1 when
        ``touching`` (the value at ``window_end``, exactly ``gap`` after its last)."""
        return int(self.touching)

    def describe(self) -> str:
        touching = ", touching: a tuple GAP after the last joins" if self.touching else ""
        return f"session GAP {self.gap} on {self.attribute}{touching}"


Window = Sliding | Landmark | Rows | Whole


@dataclass(frozen=True)
class WindowLimits:
    """``max_windows_per_tuple``: the most windows one tuple may belong to (``ceil(RANGE /
    SLIDE)``); ``max_windows_per_step``: the most windows one punctuation or early-results round
    may make one window operator emit beyond the windows holding tuples (landmark slides)."""

    max_windows_per_tuple: int = 100_000
    max_windows_per_step: int = 1_000_000

    def check_window(self, window: Window) -> None:
        """Refuse a window whose tuples each belong to more windows than the limit."""
        if isinstance(window, Landmark | Whole):
            return  # a tuple is in one slide, or in the one window: its prefixes are emitted per step
        per_tuple = -(-window.range // window.slide)
        if per_tuple > self.max_windows_per_tuple:
            raise ResourceExhausted(
                f"{window.describe()} puts each tuple in {per_tuple} windows (RANGE / SLIDE), over the "
                f"limit max_windows_per_tuple = {self.max_windows_per_tuple}; use a larger SLIDE"
            )

    def check_step(self, window: Window, windows: int, what: str) -> None:
        """Refuse to emit ``windows`` windows in one step (``what`` names the step) past the limit,
        before anything is emitted or allocated."""
        if windows > self.max_windows_per_step:
            raise ResourceExhausted(
                f"{window.describe()}: {what} would emit {windows} windows at once, over "
                f"max_windows_per_step = {self.max_windows_per_step} (punctuation far ahead of the data?)"
            )
