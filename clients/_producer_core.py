"""The I/O-free producer: what a producer sends, over which Ingest call, what the server's answer
means and what to tell the caller. No I/O, no locks, no clock but the batcher's: the shells of
:mod:`lowtide.clients._producers` (blocking gRPC, grpc.aio) only open calls, move messages and
wait, as :class:`lowtide.clients._wire.Call` lets the clients run a control call either way.

Invariant: at most one Ingest call is open at a time; every message of it (:class:`CallLog`) is
kept until the server has answered the call; a message is sent again only when the server says
it never read it; and messages reach the server in the order they were made.

The server answers a call only when it ends and stops a call at the first message it rejects,
whole: the messages before it were applied, the ones after it were never read. Its trailing
metadata says which message (``lowtide-message``, 0 being the call's header) and what the call
applied before it (``lowtide-applied``). So on a rejection the producer keeps the error (named
after the batch, punctuation or close it concerns) for its next call to raise, and sends the
messages after the rejected one again on a new call: nothing is applied twice, and later sends go
through. A call that fails without naming a message (the connection broke, the call's deadline
passed, the server stopped) leaves what it carried unknown: the error says which sends those
were, and they are not sent again.

A call is ended and a new one begun every CALL_MAX_BYTES or CALL_MAX_MESSAGES (never inside a
batch in parts), so what a producer keeps stays bounded.

How a shell drives the core (docs/design.md, "Producers"):

* the caller's operations (``send``, ``punctuate``, ``flush``, ``close``, ``leave``) check what
  the client can know, raising at once with nothing queued, and queue their messages;
* :meth:`ProducerCore.step` says what to do next: ``OPEN`` an Ingest call for
  :attr:`ProducerCore.call`, ``SEND`` its messages (its transport takes each with
  :meth:`ProducerCore.take`), ``END`` it and wait for its answer, or ``RETURN`` to the caller;
* the transport reports how each call ended (:meth:`ProducerCore.call_answered`,
  :meth:`~ProducerCore.call_failed`, :meth:`~ProducerCore.call_cancelled`);
* the caller's operation ends with :meth:`ProducerCore.raise_pending`: the oldest rejection not
  raised yet, once its own work is done.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pyarrow as pa

from lowtide import errors
from lowtide.clients._batching import Batcher, Outgoing, prepare, punctuation_value
from lowtide.clients._checks import Contract, RowCheck
from lowtide.clients._wire import IngestResult, MessageBound, translate
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


class Step(Enum):
    """What a producer's shell does next (:meth:`ProducerCore.step`)."""

    OPEN = "open"  # begin an Ingest call for ProducerCore.call; its transport takes its messages
    SEND = "send"  # the call's transport must take messages before the caller goes on
    END = "end"  # the call has all its messages: end its request stream, wait for its answer
    RETURN = "return"  # nothing to wait for: back to the caller


class IngestCall:
    """The Ingest call open now: its messages, those its transport has yet to take, whether it
    takes no more, and whether its transport has news (messages, its end, a linger deadline)."""

    def __init__(self, header: Outgoing) -> None:
        self.log = CallLog()
        self.outbox: deque[Outgoing] = deque()
        self.ending = False
        self.news = True
        self.deadline: float | None = None  # the linger deadline its transport was told of
        self.join(header)

    def join(self, entry: Outgoing) -> None:
        self.log.add(entry)
        self.outbox.append(entry)
        self.news = True

    def end(self) -> None:
        self.ending = True
        self.news = True


class ProducerCore:
    """One producer's state apart from its I/O (see the module docstring)."""

    def __init__(
        self,
        target: str,
        stream: str,
        source: str,
        max_batch_rows: int,
        linger_s: float,
        timeout: float | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout  # of each Ingest call, in seconds: for the reason of a deadline passed
        self.batcher = Batcher(stream, source, max_batch_rows, linger_s)
        self.contract: Contract | None = None
        self.sends = 0  # sends accepted so far: "send #n" in error messages
        self.punctuations = 0
        self.last_punctuation: int | None = None  # this producer's, as queued
        self.pending: deque[LowtideError] = deque()  # rejections for the next calls to raise
        self.closed = False  # the server applied this producer's close()
        self.ended = False  # closed or cancelled: no further sends
        self.backlog: deque[Outgoing] = deque()  # messages made, in no call yet
        self.call: IngestCall | None = None
        self._answer_wanted = False  # flush or close: the caller waits for every answer
        self._tuples = self._batches = self._duplicates = 0
        self._low_watermark: int | None = None
        self.answered = False  # some call of this producer has ended

    @property
    def stream(self) -> str:
        return self.batcher.stream

    @property
    def source(self) -> str:
        return self.batcher.source

    def open(self, streams: list[dict[str, Any]], bound: MessageBound | None = None) -> None:
        """Take the stream's schema and the source's punctuation (``Client.list_streams()``), and
        the server's limit on a message (None: not known)."""
        self.contract = Contract.of(streams, self.stream, self.source)
        self.batcher.row_check = RowCheck(self.contract.schema)
        if bound is not None:
            self.batcher.bound = bound

    # -- the caller's operations (under the shell's lock): checks, then messages queued ---------
    def usable(self) -> None:
        if self.ended:
            state = "closed" if self.closed else "cancelled"
            raise InvalidArgument(
                f"the producer of source {self.source!r} on stream {self.stream!r} is {state}"
            )

    def prepare(self, data: Any, batch_id: int | None) -> pa.Table | Mapping[str, Any]:
        """A send's data, checked against the schema where that needs no lock (tables)."""
        self.usable()
        prepared = prepare(data) if batch_id is None else to_arrow_table(data)
        if isinstance(prepared, pa.Table) and self.contract is not None:
            self.contract.check_table(prepared)
        return prepared

    def send(self, prepared: pa.Table | Mapping[str, Any], batch_id: int | None) -> None:
        self.usable()
        number = self.sends + 1  # counts the sends accepted: one that raises here takes none
        if batch_id is None:
            due = self.batcher.add(prepared, number)
        else:
            assert isinstance(prepared, pa.Table)
            due = self.batcher.add_batch(prepared, batch_id, number)
        self.sends = number
        self._queue(due)

    def punctuate(self, value: Any) -> None:
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
        self._queue(self.batcher.punctuation(checked, self.punctuations))

    def flush(self) -> None:
        """The pending rows leave; the caller waits until the server has answered everything."""
        self.usable()
        self._queue(self.batcher.flush())
        self._answer_wanted = True

    def leave(self) -> None:
        """Leaving the producer's ``with`` block: :meth:`flush`, unless it is closed or cancelled."""
        if not self.ended:
            self.flush()

    def close(self) -> None:
        """End the source (its punctuation becomes +inf), unless the server applied that already."""
        if self.closed:
            return
        self.usable()
        self._queue(self.batcher.close())
        self._answer_wanted = True

    def cancel(self) -> None:
        """Abandon the producer: the open call's answer, when it comes, and the backlog are dropped."""
        self.ended = True
        self.call = None
        self.backlog.clear()

    def raise_pending(self) -> None:
        """Raise the oldest rejection not raised yet (the others wait for the next calls)."""
        if self.pending:
            raise self.pending.popleft() from None  # its gRPC error is its grpc_error

    def final_result(self) -> IngestResult:
        """What ``close()`` returns: the server's answers over all this producer's calls."""
        result = self.result
        if result is None:  # not reached: close() waits for an answer
            raise ServerError("the server has not answered the producer's Ingest call", "UNKNOWN")
        return result

    def _queue(self, entries: list[Outgoing]) -> None:
        self.backlog.extend(entries)
        if self.batcher.errors:  # rows that formed no batch: the next call raises it
            self.pending.extend(self.batcher.errors)
            self.batcher.errors.clear()

    # -- the calls: what the shell does next ----------------------------------------------------
    def step(self, room: int) -> Step:
        """What the shell does next, having moved what it can of the backlog into the open call.

        ``room``: how many messages may wait in the call's outbox when the caller goes on (the
        blocking shell's transport takes them on its own thread; the asyncio shell, 0, writes
        each itself). A call is open while rows linger, so that their transport can send them.
        """
        call = self.call
        if call is None:
            if self.backlog or (self.batcher.pending_rows and not self._answer_wanted and not self.ended):
                self.call = IngestCall(self.batcher.header())
                return Step.OPEN
            self._answer_wanted = False  # everything asked for is answered
            return Step.RETURN
        if not call.ending:
            while self.backlog and not call.ending and len(call.outbox) < max(room, 1):
                call.join(self.backlog.popleft())
                if call.log.full():
                    call.end()
            if self._answer_wanted and not self.backlog and not call.ending:
                call.end()
        if call.outbox and (call.ending or self.backlog or len(call.outbox) > room):
            return Step.SEND
        if call.ending:
            return Step.END
        if self.batcher.deadline is not None and self.batcher.deadline != call.deadline:
            call.deadline = self.batcher.deadline
            call.news = True
        return Step.RETURN

    def take(self, call: IngestCall) -> Outgoing | None:
        """The next message for ``call``'s transport to send (None: nothing yet). Rows whose
        linger has passed leave when it has nothing else to send."""
        if call is not self.call:
            return None
        if not call.outbox and not call.ending:
            self.linger()
        return call.outbox.popleft() if call.outbox else None

    def finished(self, call: IngestCall) -> bool:
        """Whether ``call``'s request stream ends: it has sent all it takes, or was dropped."""
        return call is not self.call or (call.ending and not call.outbox)

    def linger(self) -> None:
        """Rows whose linger has passed become messages: after the backlog, all into the open
        call (fewer than ``max_batch_rows`` rows: a call may pass its bound by that), so that
        nothing waits for a caller that may not come."""
        if self.ended or not self.batcher.due():
            return
        self._queue(self.batcher.flush())
        call = self.call
        if call is not None and not call.ending:
            while self.backlog:
                call.join(self.backlog.popleft())
            if call.log.full():
                call.end()

    def linger_delay(self) -> float | None:
        """Seconds until the lingering rows are due (0: now; None: no row lingers)."""
        deadline = self.batcher.deadline
        if deadline is None or self.ended:
            return None
        return max(0.0, deadline - self.batcher.clock())

    def wake(self) -> bool:
        """Whether the open call's transport has news since the last wake (a transport waiting on
        its own thread must be woken to take it)."""
        call = self.call
        if call is None or not call.news:
            return False
        call.news = False
        return True

    # -- the calls: how they ended ------------------------------------------------------------------
    def call_answered(self, call: IngestCall, response: Any) -> None:
        """``call`` ended well (``response``: its IngestResponse)."""
        if call is self.call:
            self.call = None
            self.succeeded(call.log, response)

    def call_failed(self, call: IngestCall, exc: Exception) -> None:
        """``call`` failed: its error waits to be raised, what the server never read goes again."""
        if call is self.call:
            self.call = None
            self.backlog.extendleft(reversed(self.failed(call.log, exc)))

    def call_cancelled(self, call: IngestCall) -> None:
        """``call`` was cancelled from outside (its channel closed): unless by :meth:`cancel`."""
        self.call_failed(call, ServerError("the Ingest call was cancelled", "CANCELLED"))

    # -- the server's answers -------------------------------------------------------------------
    def succeeded(self, log: CallLog, response: Any) -> None:
        """A call ended well: everything in it was applied."""
        self._applied(log.entries[1:])
        self._add(int(response.tuples), int(response.batches), int(response.duplicates))
        self._low_watermark = int(response.low_watermark)

    def failed(self, log: CallLog, exc: Exception) -> list[Outgoing]:
        """A call failed: keep its error for the next call to raise; returns what to send again."""
        error = translate(exc, self.target, self.timeout)
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
            self.closed = self.ended = True

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
    """``error``'s class with another reason (a gRPC status class keeps its status), holding the
    same ``grpc_error``."""
    renamed: LowtideError
    if isinstance(error, ServerError):
        renamed = ServerError(reason, error.status)
    else:
        try:
            renamed = type(error)(reason)
        except TypeError:  # a class with another constructor (QuerySyntaxError): never for Ingest
            renamed = InvalidArgument(reason)
    renamed.grpc_error = error.grpc_error
    return renamed


__all__ = ["CALL_MAX_BYTES", "CALL_MAX_MESSAGES", "CallLog", "IngestCall", "ProducerCore", "Step"]
