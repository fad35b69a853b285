"""The hub bounds in bytes what it holds (docs/design.md, "Bounded memory"): the retention
(``retained_items`` and ``retained_bytes``, oldest evicted) and each subscription
(``max_subscriber_bytes``: past it the subscription ends with RESOURCE_EXHAUSTED at once, its
backlog released, naming the offset to resume from); every other subscriber gets everything in
order. A reader name belongs to the token that first committed it, and each token keeps at most
MAX_READERS names of a query."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.errors import CorruptState, OutOfRange, PermissionDenied, ResourceExhausted
from lowtide.punctuation.model import END_OF_STREAM, Punctuation
from lowtide.server.hub import ENTRY_BYTES, MAX_READERS, Closed, Hub, HubSubscription, Log, Logged, item_bytes

T = TypeVar("T")
KIB = 1024


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def table(kib: int, tag: int = 0) -> pa.Table:
    """A one-column table of ``kib`` KiB of buffers (``tag`` tells tables apart)."""
    return pa.table({"v": pa.array(np.full(kib * KIB // 8, tag, np.int64))})


def taken(entry: object) -> int:
    assert isinstance(entry, tuple), entry
    offset: int = entry[0]
    return offset


async def take(subscription: HubSubscription, n: int) -> list[int]:
    return [taken(await subscription.next()) for _ in range(n)]


def test_an_item_weighs_its_buffers_whole() -> None:
    data = table(64)
    assert item_bytes(data) == 64 * KIB + ENTRY_BYTES
    assert item_bytes(data.slice(0, 1)) == item_bytes(data)  # a slice pins its whole buffers
    assert item_bytes(Punctuation(5, "ts")) == ENTRY_BYTES


def test_the_log_reaches_every_position_across_compactions() -> None:
    log = Log()
    marks = [Punctuation(i, "ts") for i in range(5000)]
    for i, mark in enumerate(marks):
        log.append(Logged(i, mark, ENTRY_BYTES, i * ENTRY_BYTES))
    for forgotten in range(1, 4001):
        log.popleft()
        assert log[0].offset == forgotten and log[len(log) - 1].offset == 4999
    assert len(log) == 1000 and [e.offset for e in log] == list(range(4000, 5000))
    assert log[500].item is marks[4500]
    with pytest.raises(IndexError):
        log[1000]


def test_retention_is_bounded_in_bytes_and_in_items() -> None:
    hub = Hub(retained_items=100, retained_bytes=10 * (64 * KIB + ENTRY_BYTES), max_subscriber_bytes=1 << 30)
    hub.publish([table(64, i) for i in range(25)])
    assert [offset for offset, _ in hub.retained] == list(range(15, 25))  # the newest 10 fit
    assert len(hub.log) == 10  # the evicted are released, not only hidden
    with pytest.raises(
        OutOfRange, match=r"offset 14 is no longer retained: the oldest is 15 \(retained_items"
    ):
        hub.subscribe(False, 14)
    hub.publish([Punctuation(i, "ts") for i in range(200)])  # small items: the item count binds
    assert [offset for offset, _ in hub.retained] == list(range(125, 225))


def test_an_item_bigger_than_the_retention_is_not_retained() -> None:
    hub = Hub(retained_items=100, retained_bytes=32 * KIB, max_subscriber_bytes=1 << 30)
    hub.publish([table(8), table(64), Punctuation(1, "ts")])
    assert [offset for offset, _ in hub.retained] == [2]
    assert run(take(hub.subscribe(True), 1)) == [2]


def test_a_stalled_subscriber_is_cut_at_once_and_everyone_else_goes_on() -> None:
    async def scenario() -> None:
        hub = Hub(retained_items=1000, retained_bytes=1 << 30, max_subscriber_bytes=256 * KIB)
        stalled, reader = hub.subscribe(False), hub.subscribe(False)
        got: list[int] = []
        for i in range(10):
            hub.publish([table(64, i), Punctuation(i, "ts")])
            got += await take(reader, 2)  # the reader keeps up: never cut
        assert got == list(range(20))
        end = await stalled.next()  # the end comes first, before any of its backlog
        assert isinstance(end, Closed) and end.status == "RESOURCE_EXHAUSTED"
        assert end.reason == (
            f"subscriber fell more than max_subscriber_bytes ({256 * KIB} bytes) behind; "
            "resume with from_offset=0"
        )
        assert await stalled.next() == end
        assert stalled not in hub.listeners
        # It resumes from the offset named, while retained.
        again = hub.subscribe(False, 0)
        assert await take(again, 20) == list(range(20))

    run(scenario())


def test_a_cut_releases_the_backlog_beyond_the_retention() -> None:
    hub = Hub(retained_items=2, retained_bytes=1 << 30, max_subscriber_bytes=256 * KIB)
    stalled = hub.subscribe(False)
    hub.publish([table(64, i) for i in range(3)])
    assert len(hub.log) == 3  # the subscriber holds the evicted offset 0
    hub.publish([table(64, 3), table(64, 4)])  # 5 x 64 KiB > 256 KiB: cut
    assert isinstance(run(stalled.next()), Closed)
    assert [e.offset for e in hub.log] == [3, 4]  # only the retention is left


def test_the_item_being_sent_counts_and_one_item_is_always_allowed() -> None:
    async def scenario() -> None:
        hub = Hub(retained_items=10, retained_bytes=1 << 30, max_subscriber_bytes=100 * KIB)
        subscription = hub.subscribe(False)
        hub.publish([table(512), Punctuation(1, "ts")])  # bigger than the limit, but one item
        assert await take(subscription, 1) == [0]
        assert subscription.behind() == ENTRY_BYTES  # the table is being sent: past it, the punctuation
        hub.publish([table(512)])  # while the first is still being sent: 512 KiB past it
        end = await subscription.next()
        assert isinstance(end, Closed) and "from_offset=1" in end.reason

        keeps_up = hub.subscribe(False)
        for i in range(5):
            waiting = asyncio.ensure_future(keeps_up.next())  # asking for the next: the one before was sent
            await asyncio.sleep(0)
            hub.publish([table(512, i), Punctuation(i, "ts")])
            assert taken(await waiting) == 3 + 2 * i
            assert taken(await keeps_up.next()) == 4 + 2 * i

    run(scenario())


def test_a_replay_of_the_retention_is_not_charged() -> None:
    async def scenario() -> None:
        hub = Hub(retained_items=100, retained_bytes=1 << 30, max_subscriber_bytes=256 * KIB)
        hub.publish([table(64, i) for i in range(20)])  # 1.25 MiB retained
        late = hub.subscribe(True)
        hub.publish([table(64, 20)])  # one live item behind: within the limit
        assert await take(late, 21) == list(range(21))

    run(scenario())


def test_a_clean_close_comes_after_the_backlog_and_a_failure_names_its_status() -> None:
    async def scenario() -> None:
        hub = Hub(retained_items=10, retained_bytes=1 << 30, max_subscriber_bytes=1 << 20)
        subscription = hub.subscribe(False)
        waiting = asyncio.ensure_future(subscription.next())
        await asyncio.sleep(0)
        hub.publish([Punctuation(1, "ts")])
        assert taken(await waiting) == 0  # a waiting subscriber wakes on publish
        hub.publish([Punctuation(2, "ts")])
        hub.close("ABORTED", "worker died")
        assert await take(subscription, 1) == [1]
        assert await subscription.next() == Closed("ABORTED", "worker died")
        assert await take(hub.subscribe(True), 2) == [0, 1]  # after the end: the retained, then it

    run(scenario())


def test_the_end_of_stream_ends_every_subscription_after_it_and_nothing_follows_it() -> None:
    """A subscription that has read the end-of-stream punctuation, or starts at or past it (from
    now, from an offset), ends cleanly at once; what is published after the end is not kept."""

    async def scenario() -> None:
        hub = Hub(retained_items=10, retained_bytes=1 << 30, max_subscriber_bytes=1 << 20)
        live = hub.subscribe(False, 1)  # waiting for offset 1: the end-of-stream punctuation
        waiting = asyncio.ensure_future(live.next())
        await asyncio.sleep(0)
        hub.publish([Punctuation(1, "ts"), Punctuation(END_OF_STREAM, "ts")])
        assert taken(await waiting) == 1
        assert await asyncio.wait_for(live.next(), 60) == Closed()  # not waiting for more
        hub.publish([Punctuation(END_OF_STREAM, "ts"), table(1)])  # after the end: dropped
        assert hub.next_offset == 2
        assert await take(hub.subscribe(True), 2) == [0, 1]
        for late in (hub.subscribe(False), hub.subscribe(True, 2), hub.subscribe(True, 9)):
            assert await asyncio.wait_for(late.next(), 60) == Closed()

    run(scenario())


def test_restore_takes_retained_entries_that_end_at_the_next_offset() -> None:
    hub = Hub(retained_items=2, retained_bytes=1 << 30, max_subscriber_bytes=1 << 20)
    hub.restore(10, [(7, Punctuation(7, "ts")), (8, Punctuation(8, "ts")), (9, Punctuation(9, "ts"))])
    assert [offset for offset, _ in hub.retained] == [8, 9] and hub.next_offset == 10
    with pytest.raises(CorruptState, match="do not end at offset 10"):
        Hub(2, 1 << 30, 1 << 20).restore(10, [(7, Punctuation(7, "ts")), (9, Punctuation(9, "ts"))])


def test_a_reader_name_belongs_to_its_first_token_and_each_token_keeps_its_own_names() -> None:
    hub = Hub(retained_items=8, retained_bytes=1 << 20, max_subscriber_bytes=1 << 20)
    hub.publish([Punctuation(10, "ts"), Punctuation(20, "ts")])
    hub.commit_reader("spark", 1, owner="token #2")
    with pytest.raises(PermissionDenied, match=r"^reader 'spark' was named by another token"):
        hub.commit_reader("spark", 2, owner="token #3")
    hub.commit_reader("spark", 2)  # an admin (no owner) may move any name
    hub.commit_reader("spark", 2, owner="token #2")
    assert hub.readers == {"spark": 2} and hub.owners == {"spark": "token #2"}
    for number in range(MAX_READERS):  # one token takes as many names as a query keeps for it
        hub.commit_reader(f"hog-{number}", 0, owner="token #3")
    with pytest.raises(ResourceExhausted, match=f"at most {MAX_READERS} readers for each token$"):
        hub.commit_reader("hog-more", 0, owner="token #3")
    hub.commit_reader("other-job", 0, owner="token #2")  # the others still name theirs
    for number in range(MAX_READERS):  # admins (or everyone, without tokens) share theirs
        hub.commit_reader(f"admin-{number}", 0)
    with pytest.raises(ResourceExhausted, match=f"at most {MAX_READERS} readers$"):
        hub.commit_reader("admin-more", 0)
    assert len(hub.readers) == 2 * MAX_READERS + 2  # spark, other-job, the hogs' and the admins'


# One step: publish some items (their sizes in KiB, 0: a punctuation), or let subscriber i take n.
Step = tuple[str, int, list[int]]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.just(0), st.lists(st.integers(0, 96), min_size=1, max_size=4)),
        st.tuples(st.just("take"), st.integers(0, 2), st.lists(st.just(0), min_size=1, max_size=6)),
    ),
    max_size=40,
)


@settings(derandomize=True, deadline=None, max_examples=150)
@given(
    steps=STEPS, limit_kib=st.integers(1, 300), retained=st.integers(0, 12), retained_kib=st.integers(0, 400)
)
def test_bounds_hold_and_every_subscriber_not_cut_gets_every_offset_once(
    steps: list[Step], limit_kib: int, retained: int, retained_kib: int
) -> None:
    async def scenario() -> None:
        hub = Hub(retained, retained_kib * KIB, limit_kib * KIB)
        subscriptions = [hub.subscribe(False) for _ in range(3)]
        seen: list[list[int]] = [[] for _ in subscriptions]
        ended: list[Closed | None] = [None for _ in subscriptions]
        for step, who, sizes in steps:
            if step == "publish":
                hub.publish([table(kib) if kib else Punctuation(1, "ts") for kib in sizes])
                assert all(s.behind() <= limit_kib * KIB for s in hub.listeners)
                retained_items = [item for _, item in hub.retained]
                assert len(retained_items) <= retained
                assert sum(item_bytes(item) for item in retained_items) <= retained_kib * KIB
                # The log holds the retention and what the subscribers still need, nothing else.
                needed = min([hub.retained_from, *(s.cursor for s in hub.listeners)])
                assert hub.first_logged == needed
            elif ended[who] is None:
                for _ in sizes:
                    if hub.next_offset <= subscriptions[who].cursor and subscriptions[who].cut is None:
                        break  # nothing to take: next() would wait
                    entry = await subscriptions[who].next()
                    if isinstance(entry, Closed):
                        ended[who] = entry
                        break
                    seen[who].append(entry[0])
        for offsets, end in zip(seen, ended, strict=True):
            assert offsets == list(range(len(offsets)))  # in order, no gap, no duplicate
            if end is not None:
                assert end.status == "RESOURCE_EXHAUSTED" and f"from_offset={len(offsets)}" in end.reason

    run(scenario())


def test_many_punctuations_alone_are_bounded_too() -> None:
    hub = Hub(retained_items=0, retained_bytes=0, max_subscriber_bytes=100 * ENTRY_BYTES)
    stalled = hub.subscribe(False)
    for _ in range(10):
        hub.publish([Punctuation(i, "ts") for i in range(20)])
    assert isinstance(run(stalled.next()), Closed)
    assert len(hub.log) == 0
