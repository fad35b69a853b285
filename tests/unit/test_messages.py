"""Front↔worker messages: each direction's codec carries every message of its union, unchanged
through pickle; a checkpoint's recorded batches and punctuation keep their plain-data form."""

from __future__ import annotations

import pickle
import typing
from typing import Any

import pytest

from lowtide.errors import CorruptState
from lowtide.query import parse_query
from lowtide.query.describe import describe
from lowtide.query.description import PlanOptions
from lowtide.schema import Schema
from lowtide.server import messages as msg

# A query as the door planned it: what a worker builds (it plans nothing itself).
SCHEMA = Schema.of({"k": "string", "ts": "int64"}, "ts")
SQL = "SELECT k, count(*) AS n [RANGE 10, SLIDE 2, WA ts] FROM S WHERE k = 'a' GROUP BY k"
DESCRIPTION = describe(parse_query(SQL), {"S": SCHEMA}.__getitem__, PlanOptions())
TO_WORKER: list[msg.ToWorker] = [
    msg.BatchMessage("q", 1, True, 10),
    msg.PunctuateMessage("q", 0, "ts", 5, 1.5),
    msg.StringsMessage([3, 0], ["a", "b"]),
    msg.ForgetMessage([3]),
    msg.RegisterMessage("q", DESCRIPTION),
    msg.DropMessage("q"),
    msg.EmitMessage("q"),
    msg.SyncMessage(4),
    msg.GetStatsMessage(),
    msg.CheckpointMessage(1, "/tmp/w0"),
    msg.RestoreMessage(2, "/tmp/w0"),
    msg.ResetMessage(3),
    msg.StopMessage(),
]
TO_FRONT: list[msg.ToFront] = [
    msg.ResultMessage("q", 3),
    msg.PunctuatedMessage("q", "window_end", 9),
    msg.LateMessage("q", 2, (("k", "INT64"),)),
    msg.ReleasedMessage("q", 1.25),
    msg.EpochMessage("q"),
    msg.FailedMessage("q", "ValueError: no"),
    msg.StatsMessage({"q": {"late": 1}}, 12),
    msg.SyncedMessage(4),
    msg.CheckpointedMessage(1, 0.004, None),
    msg.PersistedMessage(1, 4096, 0xDEADBEEF, None),
    msg.RestoredMessage(2, "OSError: full"),
    msg.ResetDoneMessage(3),
]


@pytest.mark.parametrize(
    ("codec", "union", "examples"),
    [(msg.TO_WORKER, msg.ToWorker, TO_WORKER), (msg.TO_FRONT, msg.ToFront, TO_FRONT)],
)
def test_every_message_crosses_its_codec(codec: msg.Codec[Any], union: Any, examples: list[Any]) -> None:
    assert {type(m) for m in examples} == set(typing.get_args(union))
    for message in examples:
        wire = pickle.loads(pickle.dumps(codec.encode(message), protocol=pickle.HIGHEST_PROTOCOL))
        assert codec.decode(wire) == message


def test_recorded_messages_keep_their_plain_form() -> None:
    batch, punctuate = msg.BatchMessage("q", 1, False, 7), msg.PunctuateMessage("q", 0, "ts", 5, 2.5)
    assert msg.to_record(batch) == ("batch", "q", 1, False, 7)
    assert msg.to_record(punctuate) == ("punctuate", "q", 0, "ts", 5, 2.5)
    for message in (batch, punctuate):
        assert msg.from_record(tuple(list(msg.to_record(message)))) == message


@pytest.mark.parametrize(
    "record", [(), ("batch", "q", 1, "no", 7), ("punctuate", "q", 0, "ts", 5), ("sync", 3)]
)
def test_a_damaged_record_is_corrupt_state(record: tuple[object, ...]) -> None:
    with pytest.raises(CorruptState):
        msg.from_record(record)
