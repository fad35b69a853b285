"""The outbox both transports keep per worker, alone: order, calls, backpressure, idleness; and
the posting half of the transport protocol they inherit over it (``Outboxes``).

Every wait here is on the outbox's own events: the tests yield to the event loop
(``asyncio.sleep(0)``, one turn) and never wait for time to pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.server import messages as msg
from lowtide.server.outbox import Outbox, Outboxes


def columns(nbytes: int) -> dict[str, np.ndarray[Any, Any]]:
    return {"k": np.zeros(nbytes, dtype=np.uint8)}


async def turns(n: int = 20) -> None:
    """Let every task that can run, run (n turns of the loop): no time passes."""
    for _ in range(n):
        await asyncio.sleep(0)


async def pending(future: asyncio.Future[Any]) -> bool:
    """Whether it still waits once every task that can run has run."""
    await turns()
    return not future.done()


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """The coroutines a suspended task is in, outermost first."""
    names = []
    awaited: Any = task.get_coro()
    while asyncio.iscoroutine(awaited):
        names.append(awaited.cr_code.co_qualname)
        awaited = awaited.cr_await
    return names


class CountedOutbox(Outbox):
    """Counts how often the idle and room conditions are asked: a poller would ask at every turn."""

    asked = 0

    @property
    def busy(self) -> bool:
        self.asked += 1
        return super().busy

    @property
    def full(self) -> bool:
        self.asked += 1
        return super().full


@dataclass
class Handle:
    outbox: Outbox


class Pool(Outboxes):
    """A transport's posting half over these outboxes, one a worker."""

    def __init__(self, *outboxes: Outbox) -> None:
        self.size = len(outboxes)
        self.handles = [Handle(outbox) for outbox in outboxes]


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_calls_take_messages_in_order_until_their_columns_reach_the_call_size() -> None:
    async def test() -> None:
        outbox = Outbox(max_queued_bytes=1000)
        for i in range(5):
            outbox.post(msg.SyncMessage(i), columns(30))
        assert outbox.waiting_bytes == 150 and outbox.queued_bytes == 150
        assert [m for m, _ in outbox.take()] == [msg.SyncMessage(0)]  # one message a call
        assert [m for m, _ in outbox.take(50)] == [msg.SyncMessage(1), msg.SyncMessage(2)]  # 30 < 50, then 60
        assert outbox.on_way == 2 and outbox.waiting_bytes == 60
        assert outbox.queued_bytes == 150  # taken is not answered
        outbox.answered()
        assert outbox.queued_bytes == 120 and outbox.on_way == 1  # the oldest call: 30
        assert [m for m, _ in outbox.take(1000)] == [msg.SyncMessage(3), msg.SyncMessage(4)]

    run(test)


def test_a_message_without_columns_still_makes_a_call() -> None:
    async def test() -> None:
        outbox = Outbox(max_queued_bytes=0)
        outbox.post(msg.SyncMessage(1))
        assert not outbox.full
        assert outbox.take(1 << 20) == [(msg.SyncMessage(1), None)]
        assert outbox.busy
        outbox.answered()
        assert not outbox.busy

    run(test)


def test_backpressure_blocks_past_the_limit_and_resumes_once_answered() -> None:
    async def test() -> None:
        outbox = CountedOutbox(max_queued_bytes=100)
        pool = Pool(outbox)
        pool.post(0, msg.SyncMessage(0), columns(60))
        await pool.wait_for_room()  # 60: room, at once
        pool.post(0, msg.SyncMessage(1), columns(60))
        assert outbox.full
        room = asyncio.ensure_future(pool.wait_for_room())
        assert await pending(room)
        outbox.take()  # on its way still counts
        assert await pending(room)
        asked = outbox.asked
        await turns()
        assert outbox.asked == asked  # waiting on the event, not asking again
        assert awaiting(room)[-2:] == ["Outbox.room", "Event.wait"]
        outbox.answered()  # 60 left: at the limit or below
        assert not await pending(room)

    run(test)


def test_room_waits_for_every_outbox_and_a_closed_one_has_room() -> None:
    async def test() -> None:
        first, second = Outbox(max_queued_bytes=10), Outbox(max_queued_bytes=10)
        first.post(msg.SyncMessage(0), columns(20))
        second.post(msg.SyncMessage(0), columns(20))
        room = asyncio.ensure_future(Pool(first, second).wait_for_room())
        first.take()
        first.answered()
        assert await pending(room)  # the second is still full
        second.close()  # its worker is gone: what it held is dropped
        assert not await pending(room) and second.queued_bytes == 0

    run(test)


def test_idle_returns_at_once_when_empty() -> None:
    async def test() -> None:
        outbox = Outbox(max_queued_bytes=100)
        await outbox.idle()
        await Pool(outbox).idle()

    run(test)


def test_idle_waits_on_the_event_until_the_last_call_is_answered() -> None:
    async def test() -> None:
        outbox = CountedOutbox(max_queued_bytes=100)
        pool = Pool(outbox)
        pool.broadcast(msg.SyncMessage(0))
        pool.broadcast(msg.SyncMessage(1))
        idle = asyncio.ensure_future(pool.idle())
        assert await pending(idle)
        asked = outbox.asked
        await turns(100)
        assert outbox.asked == asked  # no poll: nothing asked while nothing changed
        assert awaiting(idle)[-2:] == ["Outbox.idle", "Event.wait"]
        outbox.take()
        outbox.take()
        assert await pending(idle)  # empty, but two calls on their way
        outbox.answered()
        assert await pending(idle)
        outbox.answered()
        assert not await pending(idle)

    run(test)


def test_idle_reads_the_handles_again_after_each_wait() -> None:
    async def test() -> None:
        pool = Pool(Outbox(max_queued_bytes=100))
        pool.post(0, msg.SyncMessage(0))
        idle = asyncio.ensure_future(pool.idle())
        await turns()
        pool.handles[0].outbox.close()  # its worker died; the one started again has a new outbox
        pool.handles[0] = Handle(Outbox(max_queued_bytes=100))
        pool.post(0, msg.SyncMessage(1))
        assert await pending(idle)  # the closed outbox woke it: the new one is waited for
        pool.handles[0].outbox.take()
        pool.handles[0].outbox.answered()
        assert not await pending(idle)

    run(test)


def test_the_pump_waits_for_a_post_or_an_answer() -> None:
    async def test() -> None:
        outbox = Outbox(max_queued_bytes=100)
        due = asyncio.ensure_future(outbox.wait_for(lambda: bool(outbox.messages)))
        assert await pending(due)
        outbox.post(msg.SyncMessage(0))
        assert not await pending(due)
        outbox.take()
        after_answer = asyncio.ensure_future(outbox.wait_for(lambda: outbox.on_way == 0))
        assert await pending(after_answer)
        outbox.answered()
        assert not await pending(after_answer)

    run(test)


def test_a_closed_outbox_takes_nothing_more() -> None:
    async def test() -> None:
        outbox = Outbox(max_queued_bytes=100)
        outbox.post(msg.SyncMessage(0), columns(200))
        outbox.take()
        outbox.close()
        outbox.post(msg.SyncMessage(1), columns(200))
        assert not outbox.busy and not outbox.full and outbox.queued_bytes == 0
        await outbox.idle()
        await outbox.room()

    run(test)
