"""Window logic: per window kind, the one rule of which windows a tuple is in, which windows
punctuation completes, and so which tuples behind punctuation are late.

Modelled on bytewax's ``WindowerLogic`` (``open_for`` / ``late_for`` / ``close_for``), in the
dissertation's terms (chapter 5: ``wids()``, ``extent()``; docs/design.md, "Punctuation and
lateness"):

* :meth:`WindowLogic.open_for`: the windows whose extent holds a tuple;
* :meth:`WindowLogic.close_for`: the bound up to which punctuation completes windows;
* :meth:`WindowLogic.late_for`: which tuples behind punctuation a window operator over the window
  can no longer count once its input punctuation is ``p``, as a function of the window and ``p``
  alone - the door's late rule for ``late = error`` (:mod:`lowtide.query.late_rules`) and every
  window operator's ``late_mask`` (:class:`~lowtide.operators.window_operator.WindowOperator`).

Invariant: the door and the operators judge with the same logic. For windows with ids,
``late_for(t, p) = missed(open_for(t), close_for(p))``, and at run time an operator asks
:meth:`WidLogic.missed` and :meth:`WidLogic.still_open` of its tuples' ``[wid_start, wid_end)``
(``open_for``, as Bucket tags them) at its first window not emitted - ``close_for`` of its input
punctuation (the ``wid`` punctuation Bucket sends is ``close_for(p)``), or under allowed
lateness the first window retained. A session's logic judges by its own session and the sessions
of its group already purged (``gone``, the session table's state).

A logic holds no state: the progress it is asked at (first window not emitted, retained, the
session table's ``gone``) is each operator's, in its ``STATE``; so it has no snapshot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import overload

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.windows import Landmark, Rows, Session, Sliding, Whole, Window
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


class WindowLogic(ABC):
    """What a window kind says of tuples and punctuation (see the module)."""

    @abstractmethod
    def open_for(self, values: I64) -> tuple[I64, I64]:
        """The windows of each value (see the subclasses for their form)."""

    @abstractmethod
    def close_for(self, punctuation: int) -> int:
        """The bound up to which ``punctuation`` completes windows (see the subclasses)."""

    @abstractmethod
    def late_for(self, batch: Batch, punctuation: int) -> Mask:
        """Which tuples of ``batch`` (behind punctuation) an operator over the window can no
        longer count once its input punctuation is ``punctuation``."""


class WidLogic(WindowLogic):
    """Windows with ids (:data:`~lowtide.operators.windows.Window`): a tuple is in the windows
    ``[wid_start, wid_end)``, window ``w`` is complete once punctuation passes ``end(w)``, and a
    tuple is late once a window holding it is complete: emitted, it can no longer count it."""

    def __init__(self, window: Window) -> None:
        self.window = window

    def open_for(self, values: I64) -> tuple[I64, I64]:
        """``[wid_start, wid_end)`` of each value: the windows whose extent holds it (``wids()``;
        empty for a value in no window, SLIDE > RANGE)."""
        return self.window.wids(values)

    def close_for(self, punctuation: int) -> int:
        """``first_open(p)``: the windows below it end at or before ``p`` (complete)."""
        return self.window.first_open(punctuation)

    @staticmethod
    def missed(ws: I64, we: I64, first_open: int) -> Mask:
        """Which tuples of windows ``[ws, we)`` lie in a window below ``first_open`` (complete:
        emitted, or under allowed lateness forgotten): late for it. A tuple in no window missed
        none. Windows are ordered by their ends, so the first is the one to ask."""
        missed: Mask = (ws < we) & (ws < first_open)
        return missed

    def still_open(self, ws: I64, we: I64, first_open: int) -> tuple[I64, I64]:
        """The windows ``[ws, we)`` from ``first_open`` on: where a tuple behind punctuation
        still counts, as if it had come in time (an empty range: nowhere)."""
        return np.maximum(ws, first_open), we

    def late_for(self, batch: Batch, punctuation: int) -> Mask:
        """Tuples in some window whose extent ends at or before ``punctuation``."""
        window = self.window
        assert not isinstance(window, Rows)
        values = batch.columns[window.attribute].astype(np.int64, copy=False)
        return self.missed(*self.open_for(values), self.close_for(punctuation))


class LandmarkLogic(WidLogic):
    """RANGE ALL: a tuple is in every window from its slide on (the windows are prefixes);
    ``open_for`` gives that slide, ``[s, s + 1)``, where the aggregate counts it."""

    def still_open(self, ws: I64, we: I64, first_open: int) -> tuple[I64, I64]:
        """A tuple that missed its slide counts in the first open one, which every later window
        holds; at the end of the stream every window is gone."""
        ws = np.maximum(ws, first_open)
        if first_open < END_OF_STREAM:
            we = np.maximum(we, first_open + 1)
        return ws, we


class RowsLogic(WidLogic):
    """Tuple windows (``WA row-num``): rows are numbered as they arrive, so the values are row
    numbers and the punctuation is the rows seen (Bucket's progress of them)."""

    def late_for(self, batch: Batch, punctuation: int) -> Mask:
        """No row is behind a tuple window until the end of the stream; then every one is (its
        row number, which a rule of punctuation alone does not know, is past every window)."""
        return np.full(batch.n, punctuation >= END_OF_STREAM, np.bool_)


class SessionLogic(WindowLogic):
    """Session windows (:class:`~lowtide.operators.windows.Session`): not aligned, so which
    session a tuple counts in is state (:class:`~lowtide.operators.session_table.SessionTable`
    sessionizes). ``r`` is the window's ``reach`` (1 when ``touching``, else 0)."""

    def __init__(self, window: Session) -> None:
        self.window = window

    def open_for(self, values: I64) -> tuple[I64, I64]:
        """Each value's own session ``[t, t + gap)``: the session it starts alone, which the
        session it joins, starts or merges holds."""
        return values, values + self.window.gap

    def close_for(self, punctuation: int) -> int:
        """The largest ``window_end`` of a session complete at ``punctuation``: no value at or
        above it can join one ending at ``e`` iff ``e + r <= p``; every session at the end."""
        if punctuation >= END_OF_STREAM:
            return punctuation
        return max(NO_PROGRESS, punctuation - self.window.reach)

    def floor(self, horizon: int) -> int:
        """The smallest value whose own session is not complete at ``horizon``."""
        return max(NO_PROGRESS, self.close_for(horizon) - self.window.gap + 1)

    def joins_gone(self, values: I64 | int, gone: I64) -> Mask:
        """Whether each value would have joined its group's purged sessions, the largest end
        of which is ``gone``: exact for values at or above the floor of the horizon they were
        purged at - a purged ``[s, e)`` has ``s <= e - gap`` below such a value ``t``, so ``t``
        joins it iff ``t < e + r``."""
        reach = self.window.reach
        joins: Mask = gone > np.maximum(values, NO_PROGRESS + reach) - reach
        return joins

    def missed(self, values: I64, gone: I64, horizon: int) -> Mask:
        """Which values (of groups whose purged sessions end at most at ``gone``) the session
        aggregate can no longer count with its sessions purged at ``horizon``: their own session
        is complete there (all it would join is purged or emitted), or they join a purged one."""
        own_end = self.open_for(values)[1]
        late: Mask = (own_end <= self.close_for(horizon)) | self.joins_gone(values, gone)
        return late

    def late_for(self, batch: Batch, punctuation: int) -> Mask:
        """Every tuple (behind punctuation): whether one joins a purged session depends on
        ``gone``, which the door, judging batches before any worker sees them, does not have. So
        under ``error`` a batch with a tuple behind punctuation is rejected; under ``drop`` the
        rule only makes the Inputs forward such tuples, and the aggregate asks :meth:`missed`."""
        return np.ones(batch.n, np.bool_)


@overload
def logic_of(window: Session) -> SessionLogic: ...


@overload
def logic_of(window: Window) -> WidLogic: ...


def logic_of(window: Window | Session) -> WindowLogic:
    """The logic of ``window``'s kind."""
    if isinstance(window, Session):
        return SessionLogic(window)
    if isinstance(window, Landmark):
        return LandmarkLogic(window)
    if isinstance(window, Rows):
        return RowsLogic(window)
    assert isinstance(window, Sliding | Whole)
    return WidLogic(window)


__all__ = ["LandmarkLogic", "Mask", "RowsLogic", "SessionLogic", "WidLogic", "WindowLogic", "logic_of"]
