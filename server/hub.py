"""Where a query's output waits for its subscribers, each item numbered by its output offset.

Every item (result table or punctuation) a query emits gets the next offset, 0, 1, 2, ...; the
query's output is replayable (see :mod:`lowtide.server.melding`), so after a recovery an offset
names the same rows as before. A hub keeps the last ``retained`` items for subscribers that start
from the oldest or from an offset, and hands every new item to each live subscriber's queue in
order. A subscriber that falls ``max_backlog`` items behind is cut off with RESOURCE_EXHAUSTED
rather than growing the server's memory without bound. Closing a hub ends every subscription:
cleanly (server shutdown, query dropped) or with the status of a failure (a query over its state
limit).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from lowtide.errors import OutOfRange
from lowtide.handles import Item


@dataclass(frozen=True)
class Closed:
    """The end of a subscription; ``status`` is None for a clean end."""

    status: str | None = None
    reason: str = ""


Entry = tuple[int, Item] | Closed


class Hub:
    def __init__(self, retained: int, max_backlog: int = 100_000) -> None:
        self.retained: deque[tuple[int, Item]] = deque(maxlen=retained)
        self.max_backlog = max_backlog
        self.listeners: dict[asyncio.Queue[Entry], int] = {}  # queue -> first offset it wants
        self.closed: Closed | None = None
        self.next_offset = 0  # the offset the next new item gets
        self.remade = 0  # items a recovery emits again before new ones come: already delivered

    def publish(self, items: list[Item]) -> None:
        if self.closed is not None:
            return
        skip = min(self.remade, len(items))
        self.remade -= skip
        numbered = [(self.next_offset + i, item) for i, item in enumerate(items[skip:])]
        if not numbered:
            return
        self.next_offset += len(numbered)
        self.retained.extend(numbered)
        for queue, start in list(self.listeners.items()):
            wanted = [entry for entry in numbered if entry[0] >= start]
            if queue.qsize() + len(wanted) > self.max_backlog:
                del self.listeners[queue]
                queue.put_nowait(Closed("RESOURCE_EXHAUSTED", "subscriber fell too far behind; reconnect"))
                continue
            for entry in wanted:
                queue.put_nowait(entry)

    def subscribe(self, from_oldest: bool, from_offset: int | None = None) -> asyncio.Queue[Entry]:
        """A queue of ``(offset, item)`` entries: from ``from_offset``, else from the oldest retained
        item (``from_oldest``), else from the next new item."""
        if from_offset is None:
            from_offset = self.retained[0][0] if from_oldest and self.retained else self.next_offset
        oldest = self.retained[0][0] if self.retained else self.next_offset
        if from_offset < oldest:
            raise OutOfRange(
                f"offset {from_offset} is no longer retained: the oldest is {oldest} (retained_items)"
            )
        queue: asyncio.Queue[Entry] = asyncio.Queue()
        for entry in self.retained:
            if entry[0] >= from_offset:
                queue.put_nowait(entry)
        if self.closed is not None:
            queue.put_nowait(self.closed)
        else:
            self.listeners[queue] = from_offset
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Entry]) -> None:
        self.listeners.pop(queue, None)

    def close(self, status: str | None = None, reason: str = "") -> None:
        if self.closed is not None:
            return
        self.closed = Closed(status, reason)
        for queue in self.listeners:
            queue.put_nowait(self.closed)
        self.listeners.clear()
