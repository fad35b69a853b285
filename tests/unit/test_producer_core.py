"""The producer's core without a network (docs/design.md, "Producers"): fed the answers and errors
of its Ingest calls, it says which calls to open, what each carries and in what order, when the
caller waits, what goes again after a rejection, and what the caller is told. Both shells (blocking
and asyncio) run exactly these steps, so a bug here shows without a server."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ingest_rejections import Rejected

from lowtide.clients import _producer_core
from lowtide.clients._producer_core import IngestCall, ProducerCore, Step
from lowtide.errors import (
    InvalidArgument,
    LateTuple,
    NotFound,
    RegressingPunctuation,
    SchemaMismatch,
    ServerError,
    ServerUnavailable,
)
from lowtide.punctuation.model import END_OF_STREAM

INFO = {"name": "S", "schema": {"k": "string", "ts": "int64"}, "progressing": "ts", "declared": ["a"]}
START = "the call's start"


def opened(max_batch_rows: int = 100, linger_s: float = 0.0) -> ProducerCore:
    core = ProducerCore("t", "S", "a", max_batch_rows, linger_s)
    core.open([INFO])
    return core


def send(core: ProducerCore, *ts: int, batch_id: int | None = None) -> None:
    data = {"k": ["x"] * len(ts), "ts": list(ts)}
    core.send(core.prepare(data, batch_id), batch_id)


def answer(tuples: int, batches: int, low_watermark: int = 0) -> Any:
    return SimpleNamespace(tuples=tuples, batches=batches, duplicates=0, low_watermark=low_watermark)


class Transport:
    """Runs the core's steps as a shell does, its transport taking at once what it is given:
    what each call it opened carried, by name."""

    def __init__(self, core: ProducerCore, room: int = 0) -> None:
        self.core, self.room = core, room
        self.calls: list[list[str]] = []

    def run(self) -> Step:
        """Until the core lets the caller go (RETURN) or waits for the open call's answer (END)."""
        while (step := self.core.step(self.room)) not in (Step.RETURN, Step.END):
            if step is Step.OPEN:
                self.calls.append([])
            while (entry := self.core.take(self.open_call())) is not None:
                self.calls[-1].append(entry.what)
        return step

    def open_call(self) -> IngestCall:
        call = self.core.call
        assert call is not None
        return call


def test_messages_leave_in_order_over_one_call_and_flush_waits_for_its_answer() -> None:
    core = opened(max_batch_rows=2, linger_s=60.0)
    wire = Transport(core)
    send(core, 1, 2, 3)  # one full batch now, one row lingers
    assert wire.run() is Step.RETURN  # the call stays open for the lingering row
    core.punctuate(10)
    assert wire.run() is Step.RETURN
    core.flush()
    assert wire.run() is Step.END  # the call ends; the caller waits for the answer
    assert wire.calls == [
        [
            START,
            "batch 1 (rows 0..1 of send #1)",
            "batch 2 (row 2 of send #1)",
            "punctuation 10 (punctuate #1)",
        ]
    ]
    assert core.result is None
    core.call_answered(wire.open_call(), answer(3, 2, 10))
    assert wire.run() is Step.RETURN and core.call is None  # everything answered: flush returns
    core.raise_pending()  # nothing to raise
    result = core.result
    assert result is not None and (result.tuples, result.batches, result.low_watermark) == (3, 2, 10)
    send(core, 11)  # the next send begins a new call
    assert wire.run() is Step.RETURN and len(wire.calls) == 2


def test_the_caller_goes_on_once_no_more_than_room_messages_wait_for_the_transport() -> None:
    core = opened(max_batch_rows=1)
    for ts in range(5):
        send(core, ts)
    assert core.step(2) is Step.OPEN
    call = core.call
    assert call is not None
    sent = []
    while (step := core.step(2)) is Step.SEND:  # the caller waits; the transport takes one
        assert 0 < len(call.outbox) <= 2
        entry = core.take(call)
        assert entry is not None
        sent.append(entry.what)
    assert step is Step.RETURN and len(call.outbox) == 2 and not core.backlog
    assert sent == [
        START,
        "batch 1 (row 0 of send #1)",
        "batch 2 (row 1 of send #2)",
        "batch 3 (row 2 of send #3)",
    ]
    assert core.wake() and not core.wake()  # the transport's thread is woken once for its news


def test_a_rejection_is_raised_once_and_what_the_server_never_read_goes_again_on_a_new_call() -> None:
    core = opened(max_batch_rows=2)
    wire = Transport(core)
    send(core, 1)  # batch 1
    send(core, 2, 3, 4, batch_id=7)  # batch 2, in two parts: applied or rejected together
    send(core, 5)  # batch 3
    core.punctuate(6)
    assert wire.run() is Step.RETURN
    call = wire.open_call()
    send(core, 8)  # queued before the answer came: it follows what goes again
    core.call_failed(call, Rejected("LateTuple", "1 tuple(s) are late", 3, "1,1,0"))  # the 2nd part
    assert wire.run() is Step.RETURN
    assert wire.calls[1] == [
        START,
        "batch 3 (row 4 of send #3)",
        "punctuation 6 (punctuate #1)",
        "batch 4 (row 5 of send #4)",
    ]
    with pytest.raises(
        LateTuple, match=r"^batch 2 \(batch_id 7, rows 1..3 of send #2\) was rejected: 1 tuple"
    ):
        core.raise_pending()
    core.raise_pending()  # raised once
    core.call_answered(call, answer(99, 99))  # a late word about the failed call changes nothing
    result = core.result
    assert result is not None and (result.tuples, result.batches) == (1, 1)


def test_a_failure_naming_no_message_sends_nothing_again() -> None:
    core = opened()
    wire = Transport(core)
    send(core, 1)
    send(core, 2)
    core.punctuate(3)
    wire.run()
    core.call_failed(wire.open_call(), Rejected("", "connection reset", None))
    assert wire.run() is Step.RETURN and len(wire.calls) == 1
    with pytest.raises(
        ServerUnavailable, match=r"sends #1..#2 and punctuation 3 \(punctuate #1\) may or may not"
    ):
        core.raise_pending()


def test_a_call_cancelled_from_outside_is_the_next_calls_error() -> None:
    core = opened()
    wire = Transport(core)
    send(core, 1)
    wire.run()
    core.call_cancelled(wire.open_call())
    with pytest.raises(ServerError, match="the Ingest call was cancelled; send #1 may or may not") as raised:
        core.raise_pending()
    assert raised.value.status == "CANCELLED"
    send(core, 2)  # the producer stays usable
    assert wire.run() is Step.RETURN and len(wire.calls) == 2


def test_a_full_call_ends_at_a_units_end_and_the_rest_follows_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_producer_core, "CALL_MAX_MESSAGES", 3)
    core = opened(max_batch_rows=1)
    wire = Transport(core)
    send(core, 1)
    send(core, 2, 3, batch_id=4)  # two parts: the call ends after the second, not inside the batch
    send(core, 5)
    assert wire.run() is Step.END
    assert wire.calls == [
        [START, "batch 1 (row 0 of send #1)", *["batch 2 (batch_id 4, rows 1..2 of send #2)"] * 2]
    ]
    core.call_answered(wire.open_call(), answer(3, 2))
    assert wire.run() is Step.RETURN
    assert wire.calls[1] == [START, "batch 3 (row 3 of send #3)"]


def test_lingering_rows_keep_a_call_open_and_leave_when_due() -> None:
    now = [0.0]
    core = opened(linger_s=5.0)
    core.batcher.clock = lambda: now[0]
    wire = Transport(core)
    assert core.linger_delay() is None
    send(core, 1)
    assert wire.run() is Step.RETURN and wire.calls == [[START]]  # open, for the linger
    assert core.wake()  # its transport learns of the deadline
    call = wire.open_call()
    now[0] = 4.0
    assert core.linger_delay() == 1.0 and core.take(call) is None and not core.finished(call)
    send(core, 2)  # joins the lingering rows
    assert not core.wake()  # the deadline is the same: no news
    now[0] = 5.0
    entry = core.take(call)
    assert entry is not None and entry.what == "batch 1 (rows 0..1 of sends #1..#2)"
    assert core.linger_delay() is None and core.take(call) is None
    core.wake()  # the transport is woken: it has seen everything so far
    send(core, 3)  # a new deadline: news for the transport waiting without one
    assert wire.run() is Step.RETURN and core.wake() and core.linger_delay() == 5.0


def test_close_ends_the_producer_and_a_second_close_sends_nothing() -> None:
    core = opened()
    wire = Transport(core)
    send(core, 1)
    core.close()
    assert wire.run() is Step.END
    assert wire.calls == [[START, "batch 1 (row 0 of send #1)", "close()"]]
    core.call_answered(wire.open_call(), answer(1, 1, END_OF_STREAM))
    assert wire.run() is Step.RETURN and core.closed and core.ended
    assert core.final_result().low_watermark == END_OF_STREAM
    core.close()
    assert wire.run() is Step.RETURN and len(wire.calls) == 1
    with pytest.raises(InvalidArgument, match="is closed"):
        send(core, 2)


def test_a_rejected_close_leaves_the_producer_open() -> None:
    core = opened()
    wire = Transport(core)
    core.close()
    wire.run()
    core.call_failed(wire.open_call(), Rejected("NotFound", "no source 'a'", 1, "0,0,0"))
    assert wire.run() is Step.RETURN and not core.ended
    with pytest.raises(NotFound, match=r"^close\(\) was rejected: no source 'a'"):
        core.raise_pending()
    core.punctuate(5)  # usable
    assert wire.run() is Step.RETURN


def test_cancel_drops_the_open_call_its_answer_and_what_waits() -> None:
    now = [0.0]
    core = opened(max_batch_rows=2, linger_s=5.0)
    core.batcher.clock = lambda: now[0]
    wire = Transport(core)
    send(core, 1)
    wire.run()
    call = wire.open_call()
    send(core, 2)  # batch 1, made: it waits for the next step
    send(core, 3)  # lingers
    core.cancel()
    now[0] = 10.0
    assert core.finished(call) and core.take(call) is None  # its request stream ends
    assert core.linger_delay() is None  # the linger task ends
    core.linger()
    assert not core.backlog  # nothing lingers on to be sent
    core.call_answered(call, answer(1, 1))  # the abandoned call's answer is dropped, so is its failure
    core.call_failed(call, Rejected("LateTuple", "late", 1, "0,0,0"))
    assert core.result is None and not core.pending and wire.run() is Step.RETURN
    with pytest.raises(InvalidArgument, match="is cancelled"):
        send(core, 3)
    core.leave()  # leaving the with block of a cancelled producer sends nothing
    assert wire.run() is Step.RETURN and len(wire.calls) == 1


def test_what_the_client_can_know_raises_at_once_with_nothing_queued() -> None:
    core = opened()
    core.punctuate(10)
    queued = list(core.backlog)
    with pytest.raises(RegressingPunctuation):
        core.punctuate(9)
    with pytest.raises(SchemaMismatch, match="lacks the progressing attribute"):
        core.prepare({"k": ["x"]}, None)
    assert list(core.backlog) == queued and core.sends == 0
