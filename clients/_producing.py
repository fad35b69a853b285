"""The bookkeeping both producers share: checks, the current call's messages, rejections and
results. No I/O and no locks here: :mod:`lowtide.clients.client` runs the calls.

A producer sends over one Ingest call at a time and keeps every message of the current call
(:class:`CallLog`) until the server has answered it. The server answers a call only when it ends
and stops a call at the first message it rejects, whole: the messages before it were applied,
the ones after it were never read. Its trailing metadata says which message (``lowtide-message``,
0 being the call's header) and what the call applied before it (``lowtide-applied``). So on a
rejection the producer keeps the error (named after the batch, punctuation or close it concerns)
for its next call to raise, and sends the messages after the rejected one again on a new call:
nothing is applied twice, and later sends go through. A call that fails without naming a message
(the connection broke, the call's deadline passed, the server stopped) leaves what it carried
unknown: the error says which sends those were, and they are not sent again.

A call is ended and a new one begun every CALL_MAX_BYTES or CALL_MAX_MESSAGES (never inside a
batch in parts), so what a producer keeps stays bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lowtide import errors
from lowtide.clients._batching import Batcher, Outgoing, prepare, punctuation_value
from lowtide.clients._checks import Contract, RowCheck
from lowtide.clients._wire import IngestResult, translate
from lowtide.errors import InvalidArgument, LowtideError, ServerError
from lowtide.punctuation.model import NO_PROGRESS, check_punctuation_value
from lowtide.schema import to_arrow_table

CALL_MAX_BYTES = 64 << 20
CALL_MAX_MESSAGES = 4096
MESSAGE_KEY = "lowtide-message"
APPLIED_KEY = "lowtide-applied"


@dataclass
class CallLog:
    """The messages of one Ingest call, the header first, until the server answers it."""

    entries: list[Outgoing] = field(default_factory=list)
    nbytes: int = 0

    def add(self, entry: Outgoing) -> None:
        self.entries.append(entry)
        self.nbytes += entry.nbytes

    def full(self) -> bool:
        """Time to end this call (at the end of a unit: never inside a batch in parts)."""
        if not self.entries or not self.entries[-1].last:
            return False
        return self.nbytes >= CALL_MAX_BYTES or len(self.entries) >= CALL_MAX_MESSAGES


class ProducerCore:
    """One producer's state apart from its I/O (see the module docstring)."""

    def __init__(self, target: str, stream: str, source: str, max_batch_rows: int, linger_s: float) -> None:
        self.target = target
        self.batcher = Batcher(stream, source, max_batch_rows, linger_s)
        self.contract: Contract | None = None
        self.sends = 0  # sends accepted so far: "send #n" in error messages
        self.punctuations = 0
        self.last_punctuation: int | None = None  # this producer's, as queued
        self.pending: deque[LowtideError] = deque()  # rejections for the next calls to raise
        self.closed = False  # the server applied this producer's close()
        self.ended = False  # closed or cancelled: no further sends
        self._tuples = self._batches = self._duplicates = 0
        self._low_watermark: int | None = None
        self.answered = False  # some call of this producer has ended

    @property
    def stream(self) -> str:
        return self.batcher.stream

    @property
    def source(self) -> str:
        return self.batcher.source

    def open(self, streams: list[dict[str, Any]]) -> None:
        """Take the stream's schema and the source's punctuation (``Client.list_streams()``)."""
        self.contract = Contract.of(streams, self.stream, self.source)
        self.batcher.row_check = RowCheck(self.contract.schema)

    # -- checks and messages (the caller holds the producer's lock) ----------------------------
    def usable(self) -> None:
        if self.ended:
            state = "closed" if self.closed else "cancelled"
            raise InvalidArgument(
                f"the producer of source {self.source!r} on stream {self.stream!r} is {state}"
            )

    def prepare(self, data: Any, batch_id: int | None) -> pa.Table | Mapping[str, Any]:
        """A send's data, checked against the schema where that needs no lock (tables)."""
        prepared = prepare(data) if batch_id is None else to_arrow_table(data)
        if isinstance(prepared, pa.Table) and self.contract is not None:
            self.contract.check_table(prepared)
        return prepared

    def send(self, prepared: pa.Table | Mapping[str, Any], batch_id: int | None) -> list[Outgoing]:
        self.usable()
        number = self.sends + 1  # counts the sends accepted: one that raises here takes none
        if batch_id is None:
            due = self.batcher.add(prepared, number)
        else:
            assert isinstance(prepared, pa.Table)
            due = self.batcher.add_batch(prepared, batch_id, number)
        self.sends = number
        self._take_batcher_errors()
        return due

    def punctuate(self, value: Any) -> list[Outgoing]:
        self.usable()
        checked = punctuation_value(value)
        if self.contract is not None:
            last = NO_PROGRESS if self.last_punctuation is None else self.last_punctuation
            self.contract.check_punctuation(checked, last)
        elif self.last_punctuation is not None and checked < self.last_punctuation:
            raise errors.RegressingPunctuation(
                f"punctuation {checked} of source {self.source!r} goes back from {self.last_punctuation}"
            )
        check_punctuation_value(checked, self.stream)
        self.punctuations += 1
        self.last_punctuation = checked
        due = self.batcher.punctuation(checked, self.punctuations)
        self._take_batcher_errors()
        return due

    def flush(self) -> list[Outgoing]:
        due = self.batcher.flush()
        self._take_batcher_errors()
        return due

    def close(self) -> list[Outgoing]:
        self.usable()
        due = self.batcher.close()
        self._take_batcher_errors()
        return due

    def _take_batcher_errors(self) -> None:
        if self.batcher.errors:
            self.pending.extend(self.batcher.errors)
            self.batcher.errors.clear()

    def raise_pending(self) -> None:
        """Raise the oldest rejection not raised yet (the others wait for the next calls)."""
        if self.pending:
            raise self.pending.popleft()

    # -- the server's answers -------------------------------------------------------------------
    def succeeded(self, log: CallLog, response: Any) -> None:
        """A call ended well: everything in it was applied."""
        self._applied(log.entries[1:])
        self._add(int(response.tuples), int(response.batches), int(response.duplicates))
        self._low_watermark = int(response.low_watermark)

    def failed(self, log: CallLog, exc: Exception) -> list[Outgoing]:
        """A call failed: keep its error for the next call to raise; returns what to send again."""
        error = translate(exc, self.target)
        index, applied = _failure_metadata(exc)
        entries = log.entries
        self.answered = True
        if index is None or not 0 < index < len(entries):
            carried = entries[1:]
            if index == 0:  # the call's start (the stream, the source): nothing of it was applied
                note = f"{_describe(carried)} not applied" if carried else ""
            else:
                note = f"{_describe(carried)} may or may not have been applied" if carried else ""
            self.pending.append(_renamed(error, f"{error}; {note}" if note else str(error)))
            return []
        unit = entries[index].unit
        start = index
        while start > 1 and entries[start - 1].unit == unit:
            start -= 1
        end = index + 1
        while end < len(entries) and entries[end].unit == unit:
            end += 1
        before = entries[1:start]
        self._applied(before)
        if applied is not None:
            self._add(*applied)
        else:  # an older server: count what came before (replays cannot be told apart)
            units = {e.unit for e in before if e.kind == "batch"}
            self._add(sum(e.rows for e in before if e.kind == "batch"), len(units), 0)
        self.pending.append(_renamed(error, f"{entries[start].what} was rejected: {error}"))
        return entries[end:]

    def _applied(self, entries: list[Outgoing]) -> None:
        self.answered = True
        if any(e.kind == "close" for e in entries):
            self.closed = True

    def _add(self, tuples: int, batches: int, duplicates: int) -> None:
        self._tuples += tuples
        self._batches += batches
        self._duplicates += duplicates

    @property
    def result(self) -> IngestResult | None:
        """What the server applied from all this producer's calls so far (None before any answer)."""
        if not self.answered:
            return None
        low = self._low_watermark if self._low_watermark is not None else NO_PROGRESS
        return IngestResult(self._tuples, self._batches, self._duplicates, low)


def _failure_metadata(exc: Exception) -> tuple[int | None, tuple[int, int, int] | None]:
    """The rejected message's index and what the call applied before it, from trailing metadata."""
    rpc: Any = exc
    try:
        metadata = rpc.trailing_metadata() or ()
    except (AttributeError, TypeError):
        return None, None
    index: int | None = None
    applied: tuple[int, int, int] | None = None
    for key, value in metadata:
        text = value.decode() if isinstance(value, bytes) else str(value)
        try:
            if key == MESSAGE_KEY:
                index = int(text)
            elif key == APPLIED_KEY:
                tuples, batches, duplicates = (int(v) for v in text.split(","))
                applied = (tuples, batches, duplicates)
        except ValueError:
            continue
    return index, applied


def _describe(entries: list[Outgoing]) -> str:
    """What messages carried, for an error: "sends #3..#9 and punctuate #2", "close()"."""
    sends = [e.sends for e in entries if e.kind == "batch"]
    parts = []
    if sends:
        first, last = min(s[0] for s in sends), max(s[1] for s in sends)
        parts.append(f"send #{first}" if first == last else f"sends #{first}..#{last}")
    punctuations = [e for e in entries if e.kind == "punctuation"]
    if punctuations:
        parts.append(punctuations[0].what if len(punctuations) == 1 else f"{len(punctuations)} punctuations")
    if any(e.kind == "close" for e in entries):
        parts.append("close()")
    return " and ".join(parts) if parts else "nothing"


def _renamed(error: LowtideError, reason: str) -> LowtideError:
    """``error``'s class with another reason (a gRPC status class keeps its status)."""
    if isinstance(error, ServerError):
        return ServerError(reason, error.status)
    try:
        return type(error)(reason)
    except TypeError:  # a class with another constructor (QuerySyntaxError): never for Ingest
        return InvalidArgument(reason)


__all__ = ["CALL_MAX_BYTES", "CALL_MAX_MESSAGES", "CallLog", "ProducerCore"]
