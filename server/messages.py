"""The messages between the front and its workers: one frozen dataclass each, by direction.

Each is named ``<what>Message`` (``BatchMessage``, ``CheckpointMessage``): the engine's
:class:`~lowtide.batch.Batch`, the input log's records and the stored checkpoints have names of
their own.

The front sends :data:`ToWorker` messages, a worker answers with :data:`ToFront` ones; the columns
of a batch or a result travel beside them, in the channel's shared memory (see
:mod:`lowtide.server.channel`). Receivers dispatch with ``match`` on the class, exhaustively.

On the pipe a message is ``(code, field values)``: its class's position in its direction's
:class:`Codec` and its fields in declaration order, pickled. That keeps a message close to the
cost of the positional tuple it replaces: no class reference is pickled and looked up per message
(pickling the dataclass itself costs several times more). Front and workers run the same code,
so a code means the same class at both ends; codes are never stored.

A checkpoint keeps the batches and punctuation a query's result stream sent to workers while its
barriers were out (:mod:`lowtide.server.front_snapshot`), as plain data: :func:`to_record` and
:func:`from_record` give that form, ``["batch", query, input, late, rows]`` or
``["punctuate", query, input, attribute, value, sent_at]``, the positional headers of before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, assert_never

from lowtide.errors import CorruptState

if TYPE_CHECKING:
    from lowtide.query.description import PlanDescription


# -- front -> worker ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StringsMessage:
    """The front's new string-pool entries: ``values[i]`` has code ``codes[i]``."""

    codes: list[int]
    values: list[str]


@dataclass(frozen=True, slots=True)
class ForgetMessage:
    """The front released these codes (a dropped stream held them): the mirror forgets them."""

    codes: list[int]


@dataclass(frozen=True, slots=True)
class RegisterMessage:
    """Build and run a query, as the door planned it (the worker plans nothing itself)."""

    query: str
    description: PlanDescription


@dataclass(frozen=True, slots=True)
class DropMessage:
    query: str


@dataclass(frozen=True, slots=True)
class BatchMessage:
    """``rows`` tuples of one input of a query (columns in the payload; none when ``rows`` is 0).
    The name is the query that feeds shared slices when its tuples feed other queries too."""

    query: str
    input_index: int  # which of the query's inputs (its streams, in plan order)
    late: bool  # below the stream's progress: for queries whose late policy is ``update``
    rows: int


@dataclass(frozen=True, slots=True)
class PunctuateMessage:
    query: str
    input_index: int
    attribute: str
    value: int
    sent_at: float  # the front's time.monotonic(), echoed in ReleasedMessage


@dataclass(frozen=True, slots=True)
class EmitMessage:
    """The query's EMIT EVERY timer fired at the front: emit its open windows' current rows
    (``final = false``), then an :class:`EpochMessage`, like the answer to an input message."""

    query: str


@dataclass(frozen=True, slots=True)
class SyncMessage:
    """Answered with :class:`SyncedMessage` after everything sent before it."""

    token: int


@dataclass(frozen=True, slots=True)
class GetStatsMessage:
    """Answered with :class:`StatsMessage`."""


@dataclass(frozen=True, slots=True)
class CheckpointMessage:
    """A barrier: write the state of every query and share to ``path``, after everything sent
    before it and before what follows; answered with :class:`CheckpointedMessage` at once and
    :class:`PersistedMessage` once the file is written."""

    token: int
    path: str


@dataclass(frozen=True, slots=True)
class RestoreMessage:
    """Take the state at ``path`` (sent after the queries are registered again); answered with
    :class:`RestoredMessage`."""

    generation: int
    path: str


@dataclass(frozen=True, slots=True)
class ResetMessage:
    """Forget every query and string: a restore follows, what was sent before is moot."""

    generation: int


@dataclass(frozen=True, slots=True)
class StopMessage:
    """End the worker process."""


# -- worker -> front ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ResultMessage:
    """``rows`` result rows of a query, as engine columns (string codes) in the payload."""

    query: str
    rows: int


@dataclass(frozen=True, slots=True)
class PunctuatedMessage:
    """The query's output punctuation on this worker."""

    query: str
    attribute: str
    value: int


@dataclass(frozen=True, slots=True)
class LateMessage:
    """``rows`` late tuples a query dropped, in the payload; ``columns`` as (name, ColumnType name)."""

    query: str
    rows: int
    columns: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ReleasedMessage:
    """After the results the punctuation sent at ``sent_at`` released for the query."""

    query: str
    sent_at: float


@dataclass(frozen=True, slots=True)
class EpochMessage:
    """After everything one batch or punctuation message made for the query (see ordered_meld)."""

    query: str


@dataclass(frozen=True, slots=True)
class SyncedMessage:
    token: int


@dataclass(frozen=True, slots=True)
class FailedMessage:
    """The query failed on this worker (and was dropped there); ``reason`` is one line;
    ``status`` the gRPC code its subscriptions end with (a limit: RESOURCE_EXHAUSTED)."""

    query: str
    reason: str
    status: str = "ABORTED"


@dataclass(frozen=True, slots=True)
class StatsMessage:
    """Per query: operators as (label, tuples in, tuples out), state_bytes, open_windows, late;
    and the strings the worker's pool holds."""

    queries: dict[str, dict[str, Any]]
    strings: int = 0


@dataclass(frozen=True, slots=True)
class CheckpointedMessage:
    """The barrier passed: the state at it is being written (see :class:`PersistedMessage`)."""

    token: int
    pause_s: float  # how long the worker stopped processing for it
    error: str | None  # None: being written; else the one-line reason it will not be


@dataclass(frozen=True, slots=True)
class PersistedMessage:
    """The worker's file of the checkpoint is on disk: its size and CRC-32, for the manifest."""

    token: int
    size: int
    crc32: int
    error: str | None  # None: written; else the one-line reason it was not


@dataclass(frozen=True, slots=True)
class RestoredMessage:
    generation: int
    error: str | None


@dataclass(frozen=True, slots=True)
class ResetDoneMessage:
    """The worker has forgotten everything sent before the :class:`ResetMessage` of ``generation``."""

    generation: int


QueryInput: TypeAlias = BatchMessage | PunctuateMessage
ToWorker: TypeAlias = (
    StringsMessage
    | ForgetMessage
    | RegisterMessage
    | DropMessage
    | QueryInput
    | EmitMessage
    | SyncMessage
    | GetStatsMessage
    | CheckpointMessage
    | RestoreMessage
    | ResetMessage
    | StopMessage
)
QueryOutput: TypeAlias = (
    ResultMessage | PunctuatedMessage | LateMessage | ReleasedMessage | EpochMessage | FailedMessage
)  # melded per query
ToFront: TypeAlias = (
    QueryOutput
    | StatsMessage
    | SyncedMessage
    | CheckpointedMessage
    | PersistedMessage
    | RestoredMessage
    | ResetDoneMessage
)

M = TypeVar("M")


class Codec(Generic[M]):
    """The message classes of one direction, numbered by their position: what the pipe carries."""

    def __init__(self, *classes: type[M]) -> None:
        self._classes: tuple[Callable[..., M], ...] = classes
        self._codes: dict[type[M], int] = {cls: code for code, cls in enumerate(classes)}
        self._fields: dict[type[M], Callable[[M], tuple[Any, ...]]] = {cls: _getter(cls) for cls in classes}

    def encode(self, message: M) -> tuple[int, tuple[Any, ...]]:
        cls = type(message)
        return self._codes[cls], self._fields[cls](message)

    def decode(self, wire: tuple[int, tuple[Any, ...]]) -> M:
        code, values = wire
        return self._classes[code](*values)


def _getter(cls: type[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """The field values of a ``cls`` in declaration order, as a tuple (``attrgetter``, in C)."""
    names = [f.name for f in dataclasses.fields(cls)]
    if not names:
        return lambda message: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda message: (one(message),)
    return attrgetter(*names)


TO_WORKER: Codec[ToWorker] = Codec(
    BatchMessage,
    PunctuateMessage,
    StringsMessage,
    RegisterMessage,
    DropMessage,
    SyncMessage,
    GetStatsMessage,
    CheckpointMessage,
    RestoreMessage,
    ResetMessage,
    StopMessage,
    EmitMessage,
    ForgetMessage,
)
TO_FRONT: Codec[ToFront] = Codec(
    ResultMessage,
    PunctuatedMessage,
    LateMessage,
    ReleasedMessage,
    EpochMessage,
    FailedMessage,
    StatsMessage,
    SyncedMessage,
    CheckpointedMessage,
    PersistedMessage,
    RestoredMessage,
    ResetDoneMessage,
)


# -- in a checkpoint ------------------------------------------------------------------------------
def to_record(message: QueryInput) -> tuple[str | int | bool | float, ...]:
    """A recorded message as plain data (see the module's docstring)."""
    match message:
        case BatchMessage():
            return ("batch", message.query, message.input_index, message.late, message.rows)
        case PunctuateMessage():
            return (
                "punctuate",
                message.query,
                message.input_index,
                message.attribute,
                message.value,
                message.sent_at,
            )
        case _:
            assert_never(message)


def from_record(record: tuple[object, ...]) -> QueryInput:
    """The message :func:`to_record` made; raises :class:`CorruptState` for anything else."""
    match record:
        case ("batch", str(query), int(index), bool(late), int(rows)):
            return BatchMessage(query, index, late, rows)
        case ("punctuate", str(query), int(index), str(attribute), int(value), float(sent_at)):
            return PunctuateMessage(query, index, attribute, value, sent_at)
    raise CorruptState(f"checkpoint: {str(record)[:80]} is no recorded batch or punctuation")
