"""The one exception hierarchy of lowtide, translated to gRPC status codes at the server.

    LowtideError                      every rejection; ``str(e)`` is the one-line reason
    ├── InvalidArgument               INVALID_ARGUMENT
    │   ├── SchemaMismatch            a batch that does not fit its stream's schema
    │   ├── QuerySyntaxError          a query that does not parse (carries line and column)
    │   ├── UnsupportedQuery          a query that parses but cannot be planned
    │   ├── RegressingPunctuation     a source's punctuation went backwards
    │   └── LateTuple                 late tuples under the ``error`` late policy
    ├── NotFound                      NOT_FOUND: unknown stream, query or source
    ├── AlreadyExists                 ALREADY_EXISTS: a duplicate stream or query name
    ├── ResourceExhausted             RESOURCE_EXHAUSTED: a configured limit was passed, or a full disk
    ├── OutOfRange                    OUT_OF_RANGE: a subscription offset older than the retention
    ├── Unauthenticated               UNAUTHENTICATED: no bearer token, or one the server does not know
    ├── PermissionDenied              PERMISSION_DENIED: the token's role may not make that call
    ├── CorruptState                  DATA_LOSS: a state snapshot that is damaged or fits another plan
    ├── StartupFailure                the server cannot start (a port in use, a bad setting)
    │   (raised by the clients, never by the server:)
    ├── ServerUnavailable             UNAVAILABLE: no server at the target, or it went away
    ├── DeadlineExceeded              DEADLINE_EXCEEDED: the client's timeout passed
    └── ServerError                   any other status (INTERNAL, ABORTED, CANCELLED, UNKNOWN, ...)

Every class is defined here (a public module, so a traceback names ``lowtide.errors``) and
re-exported by ``lowtide`` and, for the clients' own, by ``lowtide.clients``.

A call that raises leaves the engine as it was before the call.
"""

from __future__ import annotations

# A reason travels as the gRPC status detail, percent-encoded in the trailing metadata, whose
# default limit is 8 KiB: 500 characters stay below it even when each is 4 bytes of UTF-8.
MAX_REASON = 500


class LowtideError(Exception):
    """Base of every lowtide rejection."""

    status: str = "UNKNOWN"
    # In a client: the failed gRPC call's own error (the lowtide error is raised from None, so
    # an uncaught one prints lowtide's traceback alone); None elsewhere.
    grpc_error: Exception | None = None

    def __init__(self, reason: str) -> None:
        # A reason is one line of at most MAX_REASON characters: the server sends it as the
        # gRPC status detail.
        line = " ".join(reason.split())
        super().__init__(line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "...")

    @property
    def reason(self) -> str:
        return str(self)


class InvalidArgument(LowtideError):
    status = "INVALID_ARGUMENT"


class SchemaMismatch(InvalidArgument):
    pass


class QuerySyntaxError(InvalidArgument):
    def __init__(self, reason: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {reason}")
        self.line = line
        self.column = column


class UnsupportedQuery(InvalidArgument):
    pass


class RegressingPunctuation(InvalidArgument):
    pass


class LateTuple(InvalidArgument):
    pass


class NotFound(LowtideError):
    status = "NOT_FOUND"


class AlreadyExists(LowtideError):
    status = "ALREADY_EXISTS"


class ResourceExhausted(LowtideError):
    status = "RESOURCE_EXHAUSTED"


class OutOfRange(LowtideError):
    """``Subscribe(from_offset=n)`` where item ``n`` is no longer retained (``retained_items``,
    ``retained_bytes``)."""

    status = "OUT_OF_RANGE"


class Unauthenticated(LowtideError):
    """The server wants a bearer token (``--tokens``) and the call had none it knows."""

    status = "UNAUTHENTICATED"


class PermissionDenied(LowtideError):
    """The call's token is known, but its role (admin, producer, reader) does not allow the call."""

    status = "PERMISSION_DENIED"


class StartupFailure(LowtideError):
    """``lowtide serve`` cannot start; never sent over the network."""

    status = "FAILED_PRECONDITION"


class CorruptState(LowtideError):
    """A state snapshot that cannot be read (truncated, damaged, an unknown format version) or
    that does not fit the operators it is restored into (``lowtide.snapshot``)."""

    status = "DATA_LOSS"


class ServerUnavailable(LowtideError):
    """No server answers at the target, the connection broke (a client-side error), or the server
    is still starting (its workers and state not ready yet)."""

    status = "UNAVAILABLE"


class DeadlineExceeded(LowtideError):
    """The call did not finish within the client's timeout (a client-side error)."""

    status = "DEADLINE_EXCEEDED"


class ServerError(LowtideError):
    """Any other failure status of a call; ``status`` names the gRPC code (INTERNAL, ABORTED, ...)."""

    def __init__(self, reason: str, status: str = "UNKNOWN") -> None:
        super().__init__(reason)
        self.status = status
