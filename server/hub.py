"""Where a query's output waits for its subscribers, each item numbered by its output offset.

Every item (result table or punctuation) a query emits gets the next offset, 0, 1, 2, ...; the
query's output is replayable (see :mod:`lowtide.server.ordered_meld`), so after a recovery an offset
names the same rows as before. A hub keeps one log of items in offset order; each subscription
reads it at its own offset (nothing is copied per subscriber). Closing a hub ends every
subscription after what it has not read yet: cleanly (server shutdown, query dropped) or with
the status of a failure (a query over its state limit).

The end-of-stream punctuation (value ``END_OF_STREAM``: every input of the query closed) is the
last item a hub takes: the query's output has *ended* at the offset after it. A subscription
that has read it, or that starts at or past that offset (``from_offset``, or from now), ends at
once, cleanly (gRPC status OK), as one does on a closed hub; nothing published later is kept.

Memory is bounded in bytes (docs/design.md, "Bounded memory"). An item weighs the Arrow buffers it
keeps alive (:func:`item_bytes`), so a slice is charged for its whole buffers: what it pins, not
what it shows.

* **Retention**: the newest items, at most ``retained_items`` of them and at most
  ``retained_bytes`` together; older ones are evicted at once (an item bigger than
  ``retained_bytes`` is never retained). ``Subscribe`` may start at any retained offset.
* **A subscription** holds the item it is sending (the send waits on gRPC flow control, so a
  reader that stops leaves its handler parked on that item, charged at its size: it stays alive
  while it is sent) and what was published since it subscribed that it has not taken. It may
  always hold one item, whatever its size (so a result bigger than the limit still reaches a
  reader that keeps up); once what it holds past that oldest item exceeds
  ``max_subscriber_bytes``, it ends at once with ``RESOURCE_EXHAUSTED``:
  its next entry is the end, none of its backlog comes first (the log forgets what only it held),
  and the reason names the offset to resume from - still retained if ``retained_bytes`` exceeds
  ``max_subscriber_bytes`` by what is published before it comes back. The retained items a
  subscription replays are not charged (they are retained anyway); one that stalls during the
  replay keeps at most ``retained_bytes`` of them alive past their eviction.
* **Every subscription together** (:class:`SendBudget`): an item goes out one message at a time
  (a wide table one slice at a time, serialized when its turn comes), so a parked handler holds
  one message beside the item; the messages being sent stay within
  ``max_subscriber_bytes_total``, and the subscription whose next message would pass it ends
  with ``RESOURCE_EXHAUSTED`` naming that item's offset to resume from.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from lowtide.errors import CorruptState, InvalidArgument, OutOfRange, PermissionDenied, ResourceExhausted
from lowtide.handles import Item
from lowtide.names import shown
from lowtide.punctuation.model import END_OF_STREAM, Punctuation

# What one log entry costs beside its buffers (the entry, its offset, a punctuation object): a
# backlog of punctuation alone is bounded too.
ENTRY_BYTES = 128
MAX_READERS = 64  # readers whose committed offset a query keeps for each token
MAX_READER_NAME = 256


def item_bytes(item: Item) -> int:
    """The bytes ``item`` keeps alive: its Arrow buffers (whole, even if sliced) plus an entry."""
    if isinstance(item, pa.Table):
        return int(item.get_total_buffer_size()) + ENTRY_BYTES
    return ENTRY_BYTES


@dataclass(frozen=True)
class Closed:
    """The end of a subscription; ``status`` is None for a clean end."""

    status: str | None = None
    reason: str = ""


Entry = tuple[int, Item] | Closed


@dataclass(frozen=True)
class Logged:
    offset: int
    item: Item
    nbytes: int
    before: int  # bytes of every item published before this one: a range's bytes are a difference


class Log:
    """Entries appended at the end and forgotten from the front, each reached by its position in
    O(1) (a deque walks its blocks to reach the middle, where a replaying subscriber reads). A
    forgotten slot is cleared at once, so nothing forgotten stays alive; the list is compacted
    once mostly cleared (amortized O(1) per entry)."""

    def __init__(self) -> None:
        self._entries: list[Logged | None] = []
        self._head = 0  # slots before it are forgotten

    def __len__(self) -> int:
        return len(self._entries) - self._head

    def __getitem__(self, index: int) -> Logged:
        entry = self._entries[self._head + index] if 0 <= index < len(self) else None
        if entry is None:
            raise IndexError(f"no log entry at position {index} of {len(self)}")
        return entry

    def __iter__(self) -> Iterator[Logged]:
        return (self[i] for i in range(len(self)))

    def append(self, entry: Logged) -> None:
        self._entries.append(entry)

    def popleft(self) -> None:
        self._entries[self._head] = None
        self._head += 1
        if self._head >= 1024 and 2 * self._head >= len(self._entries):
            del self._entries[: self._head]
            self._head = 0


class HubSubscription:
    """One subscriber's place in its hub's log: ``cursor`` is the next offset it takes."""

    def __init__(self, hub: Hub, cursor: int) -> None:
        self.hub = hub
        self.cursor = cursor
        self.live_from = hub.next_offset  # below: a replay of retained items, not charged
        self.in_flight = 0  # bytes of the item taken last: it is being sent until the next take
        self.cut: Closed | None = None
        self._ready = asyncio.Event()

    async def next(self) -> Entry:
        """The next ``(offset, item)``, or the end; taking one means the one before was sent."""
        self.in_flight = 0
        while True:
            if self.cut is not None:
                return self.cut
            hub = self.hub
            if self.cursor < hub.next_offset:
                logged = hub.log[self.cursor - hub.first_logged]
                self.cursor += 1
                self.in_flight = logged.nbytes
                return logged.offset, logged.item
            if hub.closed is not None:
                return hub.closed
            if hub.ended:
                return Closed()
            self._ready.clear()
            await self._ready.wait()

    def behind(self) -> int:
        """Bytes the server holds for this subscriber alone past the oldest item it holds: the
        live items it has not taken and the one it is sending, less the oldest of them."""
        hub = self.hub
        start = max(self.cursor, self.live_from)
        if start >= hub.next_offset:
            return 0
        first = hub.log[start - hub.first_logged]
        waiting = hub.published_bytes - first.before
        return waiting if self.in_flight else waiting - first.nbytes

    def wake(self) -> None:
        self._ready.set()


class SendBudget:
    """The serialized result messages all subscriptions of the server are sending at once, within
    ``max_subscriber_bytes_total``. A subscription serializes one message at a time and holds it
    until gRPC has sent it: a reader that stops keeps one message alive, and many of them would
    add up without this bound. A subscription whose next message does not fit is the one cut
    (``take`` answers False): the ones already sending go on."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size

    def cut(self, offset: int) -> ResourceExhausted:
        """The end of a subscription whose message at ``offset`` did not fit."""
        return ResourceExhausted(
            f"subscribers are being sent more than max_subscriber_bytes_total ({self.limit} bytes) "
            f"of results at once; resume with from_offset={offset}"
        )


class Hub:
    def __init__(self, retained_items: int, retained_bytes: int, max_subscriber_bytes: int) -> None:
        self.retained_items = retained_items
        self.retained_bytes = retained_bytes
        self.max_subscriber_bytes = max_subscriber_bytes
        self.log = Log()  # offsets first_logged .. next_offset - 1, no gap
        self.retained_from = 0  # the oldest retained offset (next_offset: none)
        self.published_bytes = 0  # bytes of every item ever published: Logged.before of the next
        self.listeners: set[HubSubscription] = set()
        self.closed: Closed | None = None
        self.ended = False  # the end-of-stream punctuation is in: nothing comes after it
        self.next_offset = 0  # the offset the next new item gets
        self.readers: dict[str, int] = {}  # each reader's committed offset (CommitOffset)
        self.owners: dict[str, str | None] = {}  # the token that first committed each (commit_reader)
        self.remade = 0  # items a recovery emits again before new ones come: already delivered

    @property
    def first_logged(self) -> int:
        return self.next_offset - len(self.log)

    @property
    def retained(self) -> list[tuple[int, Item]]:
        """The retained ``(offset, item)`` entries, oldest first."""
        return [
            (e.offset, e.item)
            for e in itertools.islice(self.log, self.retained_from - self.first_logged, None)
        ]

    def publish(self, items: list[Item]) -> None:
        if self.closed is not None or self.ended:
            return
        skip = min(self.remade, len(items))
        self.remade -= skip
        if skip == len(items):
            return
        for item in items[skip:]:
            if not self.ended:
                self._append(item)
        self._evict()
        for subscription in list(self.listeners):
            if subscription.behind() > self.max_subscriber_bytes:
                self.listeners.discard(subscription)
                subscription.cut = Closed(
                    "RESOURCE_EXHAUSTED",
                    f"subscriber fell more than max_subscriber_bytes ({self.max_subscriber_bytes} bytes) "
                    f"behind; resume with from_offset={subscription.cursor}",
                )
            subscription.wake()
        self._trim()

    def commit_reader(self, reader: str, offset: int, owner: str | None = None) -> None:
        """``reader`` has processed every item below ``offset``: kept (never lowered) for the
        lag ListQueries and the metrics show. In memory: a restarted server learns it again at
        the reader's next commit.

        The name belongs to the token that first committed under it (``owner``: its identity;
        None for an admin token or a server without tokens, which may commit under any name):
        another token may not move it. Each owner keeps at most ``MAX_READERS`` names a query,
        so one token cannot take every name there is."""
        if not reader or len(reader) > MAX_READER_NAME or not reader.isprintable():
            raise InvalidArgument(
                f"a reader needs a name of 1 to {MAX_READER_NAME} printable characters, got {shown(reader)}"
            )
        if reader in self.owners and owner is not None and self.owners[reader] != owner:
            raise PermissionDenied(
                f"reader {shown(reader)} was named by another token: "
                "commit under a reader name of this token's own"
            )
        if not 0 <= offset <= self.next_offset:
            raise OutOfRange(f"offset {offset} is not one the query emitted: 0 to {self.next_offset}")
        if reader not in self.owners:
            if sum(1 for named in self.owners.values() if named == owner) >= MAX_READERS:
                each = "" if owner is None else " for each token"
                raise ResourceExhausted(f"the query keeps the offsets of at most {MAX_READERS} readers{each}")
            self.owners[reader] = owner
        self.readers[reader] = max(offset, self.readers.get(reader, 0))

    def restore(self, next_offset: int, retained: list[tuple[int, Item]]) -> None:
        """A new hub takes a checkpoint's retained entries, which end at ``next_offset - 1``."""
        first = next_offset - len(retained)
        if [offset for offset, _ in retained] != list(range(first, next_offset)):
            raise CorruptState(
                f"the retained results of a query do not end at offset {next_offset} without a gap"
            )
        self.next_offset = self.retained_from = first
        for _, item in retained:
            self._append(item)
        self._evict()
        self._trim()

    def subscribe(self, from_oldest: bool, from_offset: int | None = None) -> HubSubscription:
        """Entries from ``from_offset``, else from the oldest retained item (``from_oldest``), else
        from the next new item."""
        if from_offset is None:
            from_offset = self.retained_from if from_oldest else self.next_offset
        if from_offset < self.retained_from:
            raise OutOfRange(
                f"offset {from_offset} is no longer retained: the oldest is {self.retained_from} "
                "(retained_items, retained_bytes)"
            )
        subscription = HubSubscription(self, from_offset)
        self.listeners.add(subscription)
        return subscription

    def unsubscribe(self, subscription: HubSubscription) -> None:
        self.listeners.discard(subscription)
        self._trim()

    def close(self, status: str | None = None, reason: str = "") -> None:
        if self.closed is not None:
            return
        self.closed = Closed(status, reason)
        for subscription in self.listeners:
            subscription.wake()

    def _append(self, item: Item) -> None:
        nbytes = item_bytes(item)
        self.log.append(Logged(self.next_offset, item, nbytes, self.published_bytes))
        self.next_offset += 1
        self.published_bytes += nbytes
        if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
            self.ended = True

    def _evict(self) -> None:
        """Retention keeps the newest items within ``retained_items`` and ``retained_bytes``."""
        while self.retained_from < self.next_offset and (
            self.next_offset - self.retained_from > self.retained_items
            or self.published_bytes - self.log[self.retained_from - self.first_logged].before
            > self.retained_bytes
        ):
            self.retained_from += 1

    def _trim(self) -> None:
        """Forget what neither the retention nor a subscriber still needs."""
        keep = min([self.retained_from, *(s.cursor for s in self.listeners)])
        while self.log and self.log[0].offset < keep:
            self.log.popleft()
