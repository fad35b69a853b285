"""Where a query's output waits for its subscribers.

A hub keeps the last ``retained`` items (result tables and punctuation) for subscribers that ask
``from_oldest``, and hands every new item to each live subscriber's queue in order. A subscriber
that falls ``max_backlog`` items behind is cut off with RESOURCE_EXHAUSTED rather than growing the
server's memory without bound. Closing a hub ends every subscription: cleanly (server shutdown,
query dropped) or with the status of a failure (a dead worker, a query over its state limit).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from lowtide.handles import Item


@dataclass(frozen=True)
class Closed:
    """The end of a subscription; ``status`` is None for a clean end."""

    status: str | None = None
    reason: str = ""


Entry = Item | Closed


class Hub:
    def __init__(self, retained: int, max_backlog: int = 100_000) -> None:
        self.retained: deque[Item] = deque(maxlen=retained)
        self.max_backlog = max_backlog
        self.listeners: set[asyncio.Queue[Entry]] = set()
        self.closed: Closed | None = None

    def publish(self, items: list[Item]) -> None:
        if self.closed is not None:
            return
        self.retained.extend(items)
        for queue in list(self.listeners):
            if queue.qsize() + len(items) > self.max_backlog:
                self.listeners.discard(queue)
                queue.put_nowait(Closed("RESOURCE_EXHAUSTED", "subscriber fell too far behind; reconnect"))
                continue
            for item in items:
                queue.put_nowait(item)

    def subscribe(self, from_oldest: bool) -> asyncio.Queue[Entry]:
        queue: asyncio.Queue[Entry] = asyncio.Queue()
        if from_oldest:
            for item in self.retained:
                queue.put_nowait(item)
        if self.closed is not None:
            queue.put_nowait(self.closed)
        else:
            self.listeners.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Entry]) -> None:
        self.listeners.discard(queue)

    def close(self, status: str | None = None, reason: str = "") -> None:
        if self.closed is not None:
            return
        self.closed = Closed(status, reason)
        for queue in self.listeners:
            queue.put_nowait(self.closed)
        self.listeners.clear()
