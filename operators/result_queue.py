"""The results of complete windows on their way out, in order, all at once or slowly (§8.3.3).

When punctuation completes windows, an aggregate queues their non-empty cells, then what
follows them: free their state, and the output punctuation past them. Without slow flush the
queue drains at once. With :class:`SlowFlush` the cells leave a few rows per input tuple over
the batches that follow, and the punctuation leaves only after every row queued before it: so
output punctuation still promises that no row of revision 0 below it is to come. At most
``max_windows`` complete windows wait. The cells stay in the operator's state until they are out
(a queued item holds cell addresses, not values), and group ids do not move while any wait
(:attr:`ResultQueue.flushing`).

The queue is part of the aggregate's state (WID Aggregate's and Fused WID's through
:class:`~lowtide.operators.wid_state.WIDState`, Paned-WID's directly): a snapshot holds every
queued item as its arrays and counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from lowtide.errors import CorruptState
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS
from lowtide.snapshot import Field, Keep, State, Stateful, as_array, as_int, as_list, as_str, declare, fields

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SlowFlush:
    """Smooth emission (§8.3.3): complete windows leave at ``every`` input tuples per result row,
    spread over the batches after their punctuation, but never more than ``max_windows``
    windows behind it (OOP needs no order among windows, so nothing else waits for them)."""

    every: int = 1
    max_windows: int = 2


class After(Enum):
    """What follows queued results once they are out: data, so that a snapshot holds it."""

    FREE_WINDOWS = "free windows"  # forget the state of the windows ``freed`` (WID)
    FREE_ROWS = "free rows"  # give the scratch rows ``freed`` back to the slices (Paned-WID)
    PUNCTUATE = "punctuate"  # emit Punctuation(value, "window_end")


@dataclass
class Pending:
    """Results waiting to leave, in order: the cells of complete windows, then what to do once
    they are out (free their state, punctuate past them)."""

    rows: I64
    gids: I64
    wids: I64
    windows: int
    after: After
    freed: I64  # FREE_WINDOWS: window ids; FREE_ROWS: state rows; PUNCTUATE: empty
    value: int = NO_PROGRESS  # PUNCTUATE: the punctuation's value
    done: int = 0


class _Items(Keep):
    """The queued items, each as its arrays, counts and what follows it."""

    _ARRAYS = ("rows", "gids", "wids", "freed")
    _NUMBERS = ("windows", "value", "done")

    def save(self, value: Any) -> State:
        return [
            {
                **{name: getattr(item, name).copy() for name in self._ARRAYS},
                **{name: getattr(item, name) for name in self._NUMBERS},
                "after": item.after.value,
            }
            for item in value
        ]

    def load(self, fresh: Any, state: State, where: str) -> Any:
        queue: deque[Pending] = deque()
        for i, item in enumerate(as_list(state, where)):
            at = f"{where}[{i}]"
            found = fields(item, (*self._ARRAYS, *self._NUMBERS, "after"), at)
            arrays = {name: as_array(found[name], f"{at}.{name}", np.int64, 1) for name in self._ARRAYS}
            numbers = {name: as_int(found[name], f"{at}.{name}") for name in self._NUMBERS}
            after = as_str(found["after"], f"{at}.after")
            if after not in {a.value for a in After}:
                raise CorruptState(
                    f"state of {at}.after is {after[:30]!r}, not one of {[a.value for a in After]}"
                )
            rows, gids, wids, freed = (arrays[name] for name in self._ARRAYS)
            windows, value, done = (numbers[name] for name in self._NUMBERS)
            queue.append(Pending(rows, gids, wids, windows, After(after), freed, value, done))
        return queue


class Outlet(Protocol):
    """The aggregate a queue's results leave from."""

    def emit_cells(self, rows: I64, gids: I64, wids: I64) -> None:
        """Emit the result rows of the cells ``(rows[j], gids[j])`` of windows ``wids``."""

    def emit_progress(self, value: int, attribute: str = "window_end") -> None:
        """Emit output punctuation."""

    def free(self, after: After, freed: I64) -> None:
        """Free what results held once they are out (``FREE_WINDOWS`` or ``FREE_ROWS``)."""


class ResultQueue(Stateful):
    """Cells of complete windows and punctuation, leaving through ``outlet`` in the order queued;
    ``flush`` None: all at once."""

    VERSION = 1
    STATE: ClassVar[Mapping[str, Field]] = declare(items=_Items())

    def __init__(self, outlet: Outlet, flush: SlowFlush | None) -> None:
        self.outlet = outlet
        self.flush = flush
        self.items: deque[Pending] = deque()

    def put(self, cells: tuple[I64, I64, I64], windows: int, after: After, freed: I64) -> None:
        """Queue the cells ``(rows, gids, wids)`` of ``windows`` complete windows, then ``after``
        (with ``freed``); they leave with the next :meth:`punctuate` or slowly."""
        self.items.append(Pending(*cells, windows, after, freed))

    def punctuate(self, value: int) -> None:
        """Punctuate once the windows queued before are out; bound how far behind they are."""
        empty = np.empty(0, np.int64)
        self.items.append(Pending(empty, empty, empty, 0, After.PUNCTUATE, empty, value))
        if self.flush is None or value >= END_OF_STREAM:
            self.drain(None)
            return
        while sum(item.windows for item in self.items) > self.flush.max_windows:
            self.drain(self.items[0].rows.shape[0] - self.items[0].done)

    def flush_some(self, tuples_in: int) -> None:
        """Slow flush: ``tuples_in`` tuples arrived, so this many result rows may leave."""
        if self.items and self.flush is not None:
            self.drain(-(-tuples_in // self.flush.every))

    @property
    def flushing(self) -> bool:
        """Whether result rows are waiting (group ids must stay as they are until they leave)."""
        return any(item.done < item.rows.shape[0] for item in self.items)

    def drain(self, budget: int | None) -> None:
        """Emit queued results in order, at most ``budget`` rows (None: all of them)."""
        while self.items:
            item = self.items[0]
            take = item.rows.shape[0] - item.done
            if budget is not None:
                take = min(take, budget)
                budget -= take
            if take:
                part = slice(item.done, item.done + take)
                self.outlet.emit_cells(item.rows[part], item.gids[part], item.wids[part])
                item.done += take
            if item.done < item.rows.shape[0]:
                return
            self.items.popleft()
            if item.after is After.PUNCTUATE:
                self.outlet.emit_progress(item.value)
            else:
                self.outlet.free(item.after, item.freed)


__all__ = ["After", "Outlet", "Pending", "ResultQueue", "SlowFlush"]
