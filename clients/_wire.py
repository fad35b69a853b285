"""What the sync and async clients share: requests, responses, Arrow bytes, errors. No I/O here.

Each control call is a :class:`Call` - the stub method, the request message and how to read the
response - so the two clients differ only in how they run it (blocking or awaited).

Errors come back as the exception the server raised (docs/design.md, "Errors"): the class named by
the ``lowtide-error`` trailing metadata, else the class of the gRPC status code. Transport failures
become the client-side classes of :mod:`lowtide.errors`, so one ``except LowtideError`` catches
everything a call can raise::

    LowtideError
    ├── (every class of lowtide.errors, as the server raised it)
    ├── ServerUnavailable      UNAVAILABLE: no server at the target, or it went away
    ├── DeadlineExceeded       DEADLINE_EXCEEDED: the client's timeout passed
    └── ServerError            any other status (INTERNAL, ABORTED, CANCELLED, UNKNOWN, ...)

The gRPC error stays on the lowtide one as ``grpc_error``; the clients raise the lowtide error
``from None``, so an uncaught one prints lowtide's traceback alone, not gRPC's above it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lowtide import errors
from lowtide.errors import (
    DeadlineExceeded,
    LowtideError,
    QuerySyntaxError,
    ResourceExhausted,
    ServerError,
    ServerUnavailable,
)
from lowtide.handles import Query
from lowtide.proto import lowtide_pb2 as pb
from lowtide.punctuation.model import END_OF_STREAM, Punctuation

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")

ERROR_METADATA_KEY = "lowtide-error"
# Results can be large (one table per emission); what we send is bounded by the producer.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


_BY_NAME: dict[str, type[LowtideError]] = {
    name: kind
    for name, kind in vars(errors).items()
    if isinstance(kind, type) and issubclass(kind, LowtideError)
}
_BY_STATUS: dict[str, type[LowtideError]] = {
    "INVALID_ARGUMENT": errors.InvalidArgument,
    "NOT_FOUND": errors.NotFound,
    "ALREADY_EXISTS": errors.AlreadyExists,
    "RESOURCE_EXHAUSTED": errors.ResourceExhausted,
    "UNAUTHENTICATED": errors.Unauthenticated,
    "OUT_OF_RANGE": errors.OutOfRange,
    "PERMISSION_DENIED": errors.PermissionDenied,
    "UNAVAILABLE": ServerUnavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
}
_SYNTAX = re.compile(r"^line (\d+), column (\d+): (.*)$")


def translate(exc: Exception, target: str, timeout: float | None = None) -> LowtideError:
    """The lowtide exception for a failed gRPC call, holding that call's error as ``grpc_error``:
    ``raise translate(exc, target, timeout) from None``. ``timeout`` (seconds) is the call's, for
    the reason of a deadline that passed."""
    if isinstance(exc, LowtideError):
        return exc
    error = _translated(exc, target, timeout)
    error.grpc_error = exc
    return error


def deadline_reason(target: str, timeout: float | None, setting: str = "timeout") -> str:
    """The reason of a call whose deadline passed: the server did not answer within ``timeout``
    seconds, given by ``setting`` (the client's ``timeout``, the command's ``--timeout``)."""
    if timeout is None:
        return (
            f"the server at {target} did not answer before the call's deadline: is it overloaded or stopped?"
        )
    return (
        f"the server at {target} did not answer within {timeout:g} s ({setting}): is it overloaded or "
        f"stopped? A larger {setting} waits longer"
    )


def _translated(exc: Exception, target: str, timeout: float | None) -> LowtideError:
    rpc: Any = exc
    try:
        status = rpc.code().name
        details = rpc.details() or status
        metadata = rpc.trailing_metadata() or ()
    except (AttributeError, TypeError):
        return ServerError(f"{type(exc).__name__}: {exc}")
    named = next((str(value) for key, value in metadata if key == ERROR_METADATA_KEY), None)
    kind = _BY_NAME.get(named or "") or _BY_STATUS.get(status)
    if kind is QuerySyntaxError:
        match = _SYNTAX.match(" ".join(details.split()))
        if match:
            return QuerySyntaxError(match.group(3), int(match.group(1)), int(match.group(2)))
        kind = errors.InvalidArgument
    if kind is ServerUnavailable and named:  # the server's own words: it is starting
        return ServerUnavailable(f"{target}: {details}")
    if kind is ServerUnavailable:
        return ServerUnavailable(f"no lowtide server is reachable at {target}: {_unreachable(details)}")
    if kind is DeadlineExceeded and details == "Deadline Exceeded":  # gRPC's words for the client's
        return DeadlineExceeded(deadline_reason(target, timeout))
    if kind is None:
        return ServerError(details, status)
    return kind(details)


def _unreachable(details: str) -> str:
    """Why a channel found no server, in words a user can act on."""
    lowered = details.lower()
    if "handshake" in lowered or "ssl" in lowered:
        # A TLS client meeting a plaintext server, or a certificate the roots do not cover.
        return (
            "the TLS handshake failed; does it serve TLS (serve --tls-cert), "
            "and do --tls-ca's roots sign its certificate?"
        )
    if lowered.endswith("socket closed"):
        # What a plaintext client sees of a TLS server.
        return "it closed the connection; if it serves TLS, pass --tls-ca (root_certificates=)"
    # gRPC's detail ("failed to connect to all addresses; last error: UNKNOWN: ipv4:...:
    # Failed to connect to remote host: Connection refused") ends with the part a user needs.
    cause = details.rsplit(": ", 1)[-1].strip(" .[]").lower()
    return f"{cause}; is it running?"


# -- Arrow ----------------------------------------------------------------------------------------
def arrow_bytes(tables: Sequence[pa.Table]) -> bytes:
    """One Arrow IPC stream holding every record batch of ``tables`` (all of one schema)."""
    import pyarrow as pa  # here, not at import: control calls (the CLI's listings) never load Arrow

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tables[0].schema) as writer:
        for table in tables:
            writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


# What a message's Arrow bytes aim at: well below a server's default 64 MiB limit, and the most
# when the server does not say its limit (an older one).
MAX_MESSAGE_BYTES = 32 << 20
# Of the server's max_message_bytes, for the request's fields around its Arrow bytes (tens of bytes).
ENVELOPE_BYTES = 1024


def framing(schema: pa.Schema) -> int:
    """About what the IPC framing of one record batch adds to its buffers (its metadata, their
    padding); the schema that opens a message takes about as much."""
    return 128 + 96 * len(schema)


def estimated_bytes(table: pa.Table) -> int:
    """About the bytes ``table`` adds to a message: its buffers and each record batch's framing."""
    batches = int(table.column(0).num_chunks) if table.num_columns else 1
    return int(table.nbytes) + framing(table.schema) * max(1, batches)


@dataclass(frozen=True)
class MessageBound:
    """How many Arrow bytes one message may carry to a server whose limit on a message is
    ``server_limit`` (its max_message_bytes, from Health; 0: not known)."""

    server_limit: int = 0

    @property
    def aim(self) -> int:
        """What a message of many rows stays within."""
        if not self.server_limit:
            return MAX_MESSAGE_BYTES
        return max(1, min(MAX_MESSAGE_BYTES, self.server_limit - ENVELOPE_BYTES))

    def fits(self, size: int, rows: int) -> bool:
        """Whether ``size`` Arrow bytes of ``rows`` rows go as one message. A row alone goes up to
        the server's limit; under a limit not known, whatever its size, for the server to judge."""
        if size <= self.aim:
            return True
        return rows == 1 and (not self.server_limit or size <= self.server_limit - ENVELOPE_BYTES)

    def over(self, size: int) -> str:
        """Why a row of ``size`` Arrow bytes cannot be sent (to complete "row 3 ...")."""
        return (
            f"takes {size} bytes as Arrow, more than one message may carry under the server's "
            f"max_message_bytes ({self.server_limit})"
        )

    def pieces(self, table: pa.Table) -> list[pa.Table]:
        """``table`` in slices of about :attr:`aim` bytes each, as estimated (one row at least)."""
        if table.num_rows <= 1 or estimated_bytes(table) + framing(table.schema) <= self.aim:
            return [table]
        room = self.aim - 2 * framing(table.schema)  # the message's schema, the slice's own framing
        rows = max(1, table.num_rows * room // max(1, table.nbytes))
        return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]

    def messages(
        self, table: pa.Table, first_row: int = 0, max_rows: int | None = None
    ) -> Iterator[tuple[pa.Table, bytes]]:
        """``table``'s rows as Arrow messages that fit, in order, each with its rows (at most
        ``max_rows``: then an empty table is no message); a slice whose bytes came out over the
        estimate is cut again. ``ResourceExhausted`` for a row that fits in no message
        (``first_row``: the number of ``table``'s first row, to name it)."""
        if max_rows is None:
            slices = [table]
        else:
            slices = [table.slice(start, max_rows) for start in range(0, table.num_rows, max_rows)]
        todo: list[tuple[int, pa.Table]] = []  # (its first row, a slice), the next one last
        at = first_row
        for piece in (piece for rows in slices for piece in self.pieces(rows)):
            todo.append((at, piece))
            at += piece.num_rows
        todo.reverse()
        while todo:
            at, piece = todo.pop()
            data = arrow_bytes([piece])
            if self.fits(len(data), piece.num_rows):
                yield piece, data
                continue
            if piece.num_rows == 1:
                raise ResourceExhausted(f"row {at} {self.over(len(data))}")
            half = piece.num_rows // 2
            todo += [(at + half, piece.slice(half)), (at, piece.slice(0, half))]


def read_arrow(data: bytes) -> pa.Table:
    """A result table the server sent, validated in full like everything read from the network
    (:func:`lowtide.ipc.read_ipc`); a malformed one is a :class:`ServerError`."""
    from lowtide.ipc import read_ipc  # loads Arrow: not at import, for control calls

    try:
        return read_ipc(data)
    except LowtideError as exc:
        raise ServerError(f"the server sent a malformed result: {exc}", "DATA_LOSS") from exc


def subscribe_item(response: Any) -> tuple[int, pa.Table | Punctuation]:
    """A Subscribe message as ``(offset, item)``: a result table or a punctuation marker."""
    which = response.WhichOneof("item")
    if which == "arrow":
        return int(response.offset), read_arrow(response.arrow)
    if which == "punctuation":
        return int(response.offset), Punctuation(
            int(response.punctuation.value), response.punctuation.attribute
        )
    raise ServerError(f"Subscribe sent a message without an item ({which})", "INTERNAL")


def whole_table(first: pa.Table | Punctuation, rest: list[pa.Table | Punctuation]) -> pa.Table | Punctuation:
    """A result table sent in slices (``more``), put back together."""
    if not rest:
        return first
    import pyarrow as pa  # not at import: control calls never load Arrow

    if not all(isinstance(piece, pa.Table) for piece in (first, *rest)):
        raise ServerError("Subscribe split an item that is not a table", "INTERNAL")
    return pa.concat_tables([first, *rest])


def ends_stream(item: pa.Table | Punctuation) -> bool:
    """Whether ``item`` is the end-of-stream punctuation: the last item of a subscription."""
    return isinstance(item, Punctuation) and item.value >= END_OF_STREAM


def subscribe_request(query: str, from_oldest: bool, from_offset: int | None = None) -> Any:
    if from_offset is not None:
        if isinstance(from_offset, bool) or not isinstance(from_offset, int) or from_offset < 0:
            raise errors.InvalidArgument(f"from_offset must be an offset (0 or more), got {from_offset!r}")
        return pb.SubscribeRequest(query=str(query), from_oldest=from_oldest, from_offset=from_offset)
    return pb.SubscribeRequest(query=str(query), from_oldest=from_oldest)


# -- control calls --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call(Generic[T]):
    """A unary call: which stub method, with what request, and what its response means."""

    method: str
    request: Any
    parse: Callable[[Any], T]
    # What the call raises when it fails: the client's own reason, when it cut the call short.
    failed: Callable[[LowtideError], LowtideError] = lambda error: error


def _nothing(_: Any) -> None:
    return None


def _schema(columns: Any) -> dict[str, str]:
    return {c.name: c.type for c in columns}


def create_stream(
    name: str,
    schema: Mapping[str, str],
    progressing: str,
    punctuation: str,
    sources: Sequence[str] | None,
    idle_timeout: float | None,
) -> Call[None]:
    if not isinstance(schema, Mapping):
        raise errors.InvalidArgument("schema must be a mapping of column name to type")
    if isinstance(sources, str):
        raise errors.InvalidArgument("sources must be a list of source names, not a string")
    request = pb.CreateStreamRequest(
        name=name,
        schema=[pb.Column(name=str(column), type=str(kind)) for column, kind in schema.items()],
        progressing=progressing,
        punctuation=punctuation,
        sources=list(sources or ()),
        idle_timeout_s=float(idle_timeout or 0.0),
    )
    return Call("CreateStream", request, _nothing)


def drop_stream(name: str) -> Call[None]:
    return Call("DropStream", pb.DropStreamRequest(name=name), _nothing)


def _stream_info(s: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "schema": _schema(s.schema),
        "progressing": s.progressing,
        "punctuation": s.punctuation,
        "sources": list(s.sources),
        "low_watermark": int(s.low_watermark),
        "tuples_ingested": int(s.tuples_ingested),
        "late_tuples": int(s.late_tuples),
        "source_punctuation": {k: int(v) for k, v in s.source_punctuation.items()},
        "declared": list(s.declared_sources),
    }


def list_streams() -> Call[list[dict[str, Any]]]:
    return Call("ListStreams", pb.ListStreamsRequest(), lambda r: [_stream_info(s) for s in r.streams])


def register_query(sql: str, name: str | None, late: str, allowed_lateness: str | int | None) -> Call[Query]:
    request = pb.RegisterQueryRequest(
        sql=sql,
        name=name or "",
        late=late,
        allowed_lateness="" if allowed_lateness is None else str(allowed_lateness),
    )
    return Call("RegisterQuery", request, lambda r: Query(r.name, sql))


def explain(sql: str) -> Call[str]:
    return Call("ExplainQuery", pb.ExplainQueryRequest(sql=sql), lambda r: str(r.plan))


def drop_query(name: str) -> Call[None]:
    return Call("DropQuery", pb.DropQueryRequest(name=str(name)), _nothing)


def _query_info(q: Any) -> dict[str, Any]:
    return {
        "name": q.name,
        "sql": q.sql,
        "late": q.late,
        "columns": [c.name for c in q.columns],
        "schema": _schema(q.columns),
        "results": int(q.results),
        "late_tuples": int(q.late_tuples),
        "low_watermark": int(q.low_watermark),
        "time_unit": q.time_unit,
        "oldest_offset": int(q.oldest_offset),
        "next_offset": int(q.next_offset),
        "readers": {name: int(offset) for name, offset in q.readers.items()},
        "status": q.status,
        "status_reason": q.status_reason,
    }


def list_queries() -> Call[list[dict[str, Any]]]:
    return Call("ListQueries", pb.ListQueriesRequest(), lambda r: [_query_info(q) for q in r.queries])


def _worker_info(w: Any) -> dict[str, Any]:
    return {
        "index": int(w.index),
        "node": w.node,
        "pid": int(w.pid),
        "restarts": int(w.restarts),
        "status": w.status,
        "queries": [q.name for q in w.queries],
        "state_bytes": sum(int(q.state_bytes) for q in w.queries),  # of the queries listed
    }


def list_workers() -> Call[list[dict[str, Any]]]:
    return Call("ListWorkers", pb.ListWorkersRequest(), lambda r: [_worker_info(w) for w in r.workers])


def health() -> Call[dict[str, Any]]:
    return Call(
        "Health",
        pb.HealthRequest(),
        lambda r: {
            "status": r.status,
            "workers": int(r.workers),
            "version": r.version,
            "max_message_bytes": int(r.max_message_bytes),
        },
    )


def commit_offset(query: str, reader: str, offset: int) -> Call[None]:
    request = pb.CommitOffsetRequest(query=str(query), reader=str(reader), offset=int(offset))
    return Call("CommitOffset", request, _nothing)


# -- staged batches (Stage, CommitStaged, AbortStaged) ----------------------------------------
def stage(
    stream: str,
    source: str,
    batch_id: int,
    part: str,
    rows: pa.Table | Iterable[pa.Table],
    max_part_rows: int,
    bound: MessageBound,
) -> Call[dict[str, Any]]:
    """One part of batch ``batch_id``: the first message names it, each carries up to
    ``max_part_rows`` rows, within ``bound`` (an empty table stages an empty part). ``rows``: a
    table, or tables made while the call runs (sent as they come). A row that fits in no message
    ends the call before its last message, so nothing is staged, and the call raises why."""
    import pyarrow as pa  # not at import: control calls never load Arrow

    refused: list[LowtideError] = []

    def arrow() -> Iterator[bytes]:
        done = 0
        for table in [rows] if isinstance(rows, pa.Table) else rows:
            for _, data in bound.messages(table, done, max(1, max_part_rows)):
                yield data
            done += table.num_rows

    def requests() -> Iterator[Any]:
        yield pb.StageRequest(stream=stream, source=source, batch_id=batch_id, part=part)
        messages = arrow()
        while True:
            try:
                data = next(messages, None)
            except ResourceExhausted as exc:  # the call ends before `last`: nothing is staged
                refused.append(ResourceExhausted(f"part {part!r} was not staged: {exc}"))
                return
            if data is None:
                break
            yield pb.StageRequest(arrow=data)
        yield pb.StageRequest(last=True)  # the server keeps the part only once this arrives

    return Call(
        "Stage",
        requests(),
        lambda r: {"tuples": int(r.tuples), "duplicate": bool(r.duplicate)},
        lambda error: refused[0] if refused else error,
    )


def commit_staged(
    stream: str, source: str, batch_id: int, parts: Sequence[str], punctuation: int | None
) -> Call[dict[str, Any]]:
    request = pb.CommitStagedRequest(stream=stream, source=source, batch_id=batch_id, parts=list(parts))
    if punctuation is not None:
        request.punctuation = punctuation
    return Call(
        "CommitStaged",
        request,
        lambda r: {
            "tuples": int(r.tuples),
            "duplicate": bool(r.duplicate),
            "low_watermark": int(r.low_watermark),
        },
    )


def abort_staged(stream: str, source: str, batch_id: int) -> Call[int]:
    request = pb.AbortStagedRequest(stream=stream, source=source, batch_id=batch_id)
    return Call("AbortStaged", request, lambda r: int(r.parts))


@dataclass(frozen=True)
class IngestResult:
    """What the server applied from one producer's call (its IngestResponse)."""

    tuples: int
    batches: int
    duplicates: int
    low_watermark: int


def ingest_result(response: Any) -> IngestResult:
    return IngestResult(
        int(response.tuples), int(response.batches), int(response.duplicates), int(response.low_watermark)
    )
