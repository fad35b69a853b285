"""Memory with a ceiling per server, not per call (issue 30, items 4 and 6): the accounting.

* ``PendingBytes``: what the parts of multi-part batches hold until they apply, summed over every
  Ingest call, within ``max_pending_bytes``; ``admitted_bytes`` measures a part's columns beyond
  its payload (views of the payload cost nothing more).
* ``SendBudget`` and the Subscribe messages: one slice of a result table is serialized at a time,
  and the messages being sent to all subscribers stay within ``max_subscriber_bytes_total``.
* The client's ``Subscription.offset`` moves only once an item is whole: a call cut between the
  slices of a table resumes at that table.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest

from lowtide.batch import Batch
from lowtide.clients.client import Subscription
from lowtide.errors import InvalidArgument, ResourceExhausted
from lowtide.ipc import read_ipc
from lowtide.proto import lowtide_pb2 as pb
from lowtide.punctuation.model import Punctuation
from lowtide.server import service
from lowtide.server.batches import PartialBatch, PendingBytes, admitted_bytes
from lowtide.server.config import ServerConfig
from lowtide.server.hub import SendBudget


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


# -- multi-part batches -----------------------------------------------------------------------------
def test_pending_bytes_are_summed_over_batches_and_refused_past_the_limit() -> None:
    pending = PendingBytes(100)
    first, second = PartialBatch(7, 3, duplicate=False), PartialBatch(8, 2, duplicate=False)
    pending.hold(first, 60)
    pending.hold(second, 40)  # exactly the limit: held
    with pytest.raises(ResourceExhausted) as refused:
        pending.hold(second, 1)
    reason = str(refused.value)
    assert "\n" not in reason and "batch 8: part 1 of 2" in reason
    assert "max_pending_bytes (100; 100 held by calls in progress)" in reason
    assert reason.endswith("send smaller batches, or fewer multi-part batches at once")
    assert (pending.held, first.held, second.held) == (100, 60, 40)  # the refused part charged nothing
    pending.release(first)
    pending.release(first)  # a second release gives back nothing
    assert (pending.held, first.held) == (40, 0)
    pending.hold(second, 60)
    pending.release(second)
    assert pending.held == 0


def test_a_column_read_in_place_costs_nothing_beyond_its_payload() -> None:
    payload = _ipc(pa.table({"v": pa.array(np.arange(1000, dtype=np.int64))}))
    table = read_ipc(payload)
    view = table.column("v").to_numpy()  # Arrow reads the payload in place: a view of it
    kept = table.column("v")  # a column kept as Arrow: its buffers are the payload's too
    assert admitted_bytes(Batch({"v": view, "kept": kept}, 1000), payload) == 0


def test_columns_made_from_the_payload_count_once_each() -> None:
    payload = _ipc(pa.table({"s": pa.array(["a", "b"] * 500)}))
    codes = np.zeros(1000, dtype=np.int64)  # what the string pool makes of "s"
    converted = pa.chunked_array([pa.array(np.arange(1000, dtype=np.int32))])  # a new Arrow buffer
    measured = admitted_bytes(Batch({"s": codes, "same": codes, "n": converted}, 1000), payload)
    assert measured == codes.nbytes + converted.chunk(0).buffers()[1].size


# -- subscribers --------------------------------------------------------------------------------------
def test_the_send_budget_takes_what_fits_and_names_the_offset_to_resume_from() -> None:
    budget = SendBudget(10)
    assert budget.take(6) and budget.take(4) and not budget.take(1)
    budget.give(6)
    assert budget.held == 4 and budget.take(6)
    reason = str(budget.cut(42))
    assert "\n" not in reason and "max_subscriber_bytes_total (10 bytes)" in reason
    assert reason.endswith("resume with from_offset=42")


def _wide(rows: int) -> pa.Table:
    return pa.table({name: pa.array(np.arange(rows, dtype=np.int64)) for name in "abcd"})


def test_a_wide_table_goes_in_slices_under_the_limit_that_join_back_into_it() -> None:
    table, limit = _wide(100_000), 300_000  # 3.2 MB of Arrow: more than ten slices
    messages = list(service._messages(5, table, limit))
    assert len(messages) > 10 and all(m.ByteSize() <= limit for m in messages)
    assert [m.more for m in messages] == [True] * (len(messages) - 1) + [False]
    assert {m.offset for m in messages} == {5}
    assert pa.concat_tables(read_ipc(m.arrow) for m in messages).equals(table)


def test_a_slice_is_serialized_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that stops after the first message leaves one serialized slice, not the table."""
    made: list[int] = []
    serialize = service._arrow_bytes

    def counted(table: pa.Table) -> bytes:
        data = serialize(table)
        made.append(len(data))
        return data

    monkeypatch.setattr(service, "_arrow_bytes", counted)
    messages = service._messages(0, _wide(100_000), 300_000)
    first = next(messages)
    assert len(made) == 1 and made[0] == len(first.arrow) <= 300_000
    assert sum(1 for _ in messages) > 9 and len(made) > 10


def test_small_items_and_punctuation_go_as_one_message() -> None:
    table = _wide(10)
    (message,) = service._messages(3, table, 1 << 20)
    assert (message.offset, message.more) == (3, False) and read_ipc(message.arrow).equals(table)
    (marker,) = service._messages(4, Punctuation(9, "ts"), 1 << 20)
    assert (marker.offset, marker.punctuation.value, marker.punctuation.attribute) == (4, 9, "ts")


def test_a_table_under_the_message_limit_still_goes_in_small_slices() -> None:
    """A reader that stops holds one slice of a few MiB, however wide the table and the limit."""
    table = _wide(400_000)  # 12.8 MB of Arrow, under a 64 MiB message limit
    messages = service._messages(0, table, 64 << 20)
    sizes = [m.ByteSize() for m in messages]
    assert len(sizes) > 3 and max(sizes) <= service._SLICE_BYTES


def test_a_row_wider_than_the_limit_goes_alone() -> None:
    (message,) = service._messages(0, _wide(1), 10)
    assert read_ipc(message.arrow).num_rows == 1


def test_the_frame_a_refusal_came_out_of_lets_its_locals_go() -> None:
    """A refused call's parts do not wait for a garbage collection (the abort's reference cycle)."""

    class Part:
        pass

    kept: list[weakref.ref[Part]] = []

    def receive() -> None:
        part = Part()
        kept.append(weakref.ref(part))
        raise ResourceExhausted("refused")

    def other() -> None:
        raise ResourceExhausted("refused")

    try:
        receive()
    except ResourceExhausted as exc:
        service._forget_locals(exc, other)  # not the frame it came out of: left alone
        assert kept[0]() is not None
        service._forget_locals(exc, receive)
        assert kept[0]() is None


# -- configuration ------------------------------------------------------------------------------------
def test_the_ceilings_are_checked_at_start() -> None:
    with pytest.raises(
        InvalidArgument, match="max_subscriber_bytes_total must be at least max_message_bytes"
    ):
        ServerConfig.load(max_subscriber_bytes_total=1 << 20, max_message_bytes=2 << 20)
    with pytest.raises(InvalidArgument, match="max_pending_bytes must not be negative"):
        ServerConfig.load(max_pending_bytes=-1)
    assert ServerConfig.load(max_subscriber_bytes_total=2 << 20, max_message_bytes=2 << 20)


# -- the client's offset --------------------------------------------------------------------------------
class _Cut(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return "subscribers are being sent more than max_subscriber_bytes_total; resume with from_offset=1"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("lowtide-error", "ResourceExhausted"),)


class _Call:
    def __init__(self, messages: list[pb.SubscribeResponse]) -> None:
        self._messages = iter(messages)

    def __iter__(self) -> Iterator[pb.SubscribeResponse]:
        return self

    def __next__(self) -> pb.SubscribeResponse:
        message = next(self._messages, None)
        if message is None:
            raise _Cut()
        return message

    def cancel(self) -> None:
        pass


class _Stub:
    def __init__(self, messages: list[pb.SubscribeResponse]) -> None:
        self.messages = messages

    def Subscribe(self, request: Any) -> _Call:
        return _Call(self.messages)


def test_a_call_cut_between_slices_leaves_the_offset_at_the_last_whole_item() -> None:
    first = pb.SubscribeResponse(arrow=_ipc(_wide(2)), offset=0)
    slice_of_next = pb.SubscribeResponse(arrow=_ipc(_wide(2)), offset=1, more=True)
    subscription = Subscription(_Stub([first, slice_of_next]), "t", "q", from_oldest=True)
    assert next(subscription).num_rows == 2 and subscription.offset == 0
    with pytest.raises(ResourceExhausted, match="resume with from_offset=1"):
        next(subscription)
    assert subscription.offset == 0  # resume at offset + 1: the table cut between its slices
