"""Who may reach the server and what each caller may do: TLS and bearer tokens
(docs/design.md, "Security").

Invariant: with ``--tokens F`` on, no call reaches a servicer unless its metadata carries
``authorization: Bearer <token>`` with a token of ``F`` whose role allows the method. Every other
call is answered here, before any of its requests is read: ``UNAUTHENTICATED`` (no token, or one
the file does not hold) or ``PERMISSION_DENIED`` (a known token whose role does not allow the
method), with a one-line reason and the error's class in the ``lowtide-error`` trailing metadata,
like every other rejection, so the clients raise :class:`~lowtide.errors.Unauthenticated` and
:class:`~lowtide.errors.PermissionDenied`. Health (``lowtide.v1`` and ``grpc.health.v1``) and
reflection are open to every role, but still need a valid token: without one a caller learns
nothing about the server, not even its streams' schemas.

Roles: ``admin`` may call everything; ``producer`` Ingest, Stage, CommitStaged, AbortStaged,
ListStreams, ListQueries and ListWorkers; ``reader`` Subscribe, CommitOffset, ExplainQuery,
ListStreams, ListQueries and ListWorkers. Tokens
are compared in constant time. A token may also be scoped to names (:mod:`lowtide.server.scopes`):
its calls are then held to them here too, refused with ``PERMISSION_DENIED`` before the front
acts, or their lists filtered. A CommitOffset carries its token's identity (its place in the file)
to the front, where a reader name belongs to the token that first committed under it.
Tokens on a plaintext port bound off loopback: the start warns in one line.

TLS (``--tls-cert``/``--tls-key``) only changes how the port is bound; the files are read and the
pair checked here at start, so a bad file stops the server with one line naming it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import ssl
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import grpc.aio

from lowtide.door import DEFAULT_SOURCE
from lowtide.errors import InvalidArgument, LowtideError, PermissionDenied, Unauthenticated
from lowtide.names import visible_names
from lowtide.proto import lowtide_pb2 as pb
from lowtide.server.config import ServerConfig
from lowtide.server.scopes import TokenScope, committer, counted, parse

if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
    _Context = grpc.aio.ServicerContext[Any, Any]
else:  # the runtime classes are not generic
    _ServerInterceptor = grpc.aio.ServerInterceptor
    _Context = grpc.aio.ServicerContext

SERVICE = "lowtide.v1.Lowtide"
ERROR_KEY = "lowtide-error"  # the error's class, as server/front.py's ``_abort`` sends it
# What each role may call on lowtide.v1.Lowtide; admin may call everything.
ROLE_METHODS: dict[str, frozenset[str]] = {
    "producer": frozenset(
        {"Ingest", "Stage", "CommitStaged", "AbortStaged", "ListStreams", "ListQueries", "ListWorkers"}
    ),
    "reader": frozenset(
        {"Subscribe", "CommitOffset", "ExplainQuery", "ListStreams", "ListQueries", "ListWorkers"}
    ),
}
ROLES = ("admin", *ROLE_METHODS)
# Open to any valid token: probes and tools must work with whatever token they were given.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)
OPEN_METHODS = frozenset({f"/{SERVICE}/Health"})
# The names query ``name`` reads (FROM; none for a name that is no query): its ``.late`` stream
# holds their raw rows. The front answers it, once there is one (Security.bind).
Inputs = Callable[[str], Sequence[str]]
HOW = "send metadata 'authorization: Bearer <token>' (Client(token=...), lowtide --token or $LOWTIDE_TOKEN)"


def split_method(method: str) -> tuple[str, str]:
    """``/lowtide.v1.Lowtide/Ingest`` -> ``("lowtide.v1.Lowtide", "Ingest")``."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


def allows(role: str, method: str) -> bool:
    """Whether ``role`` may call ``method`` (a full gRPC method path)."""
    service, name = split_method(method)
    if role == "admin" or service in OPEN_SERVICES or method in OPEN_METHODS:
        return True
    return service == SERVICE and name in ROLE_METHODS.get(role, frozenset())


def bearer(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` entry, or None (absent or another scheme)."""
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def _digest(token: str) -> bytes:
    # Comparing digests keeps the comparison's time independent of the tokens' lengths too.
    return hashlib.sha256(token.encode()).digest()


def _no_inputs(name: str) -> Sequence[str]:
    return ()


class TokenAuth(_ServerInterceptor):
    """The grpc.aio interceptor enforcing the module's invariant for a ``{token: scope}`` table."""

    def __init__(self, tokens: Mapping[str, TokenScope], inputs: Inputs = _no_inputs) -> None:
        # Each token's identity is its place in the file: stable while the server runs, and
        # nothing derived from the secret is kept or shown.
        self._tokens = [
            (_digest(token), scope, f"token #{number}")
            for number, (token, scope) in enumerate(tokens.items(), 1)
        ]
        self.inputs = inputs

    def scope_of(self, token: str) -> tuple[TokenScope, str] | None:
        """The scope and identity of ``token``; every known token is compared (in constant time),
        match or not."""
        presented = _digest(token)
        found: tuple[TokenScope, str] | None = None
        for digest, scope, identity in self._tokens:
            if hmac.compare_digest(presented, digest):
                found = scope, identity
        return found

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> tuple[TokenScope, str]:
        """The scope and token identity of the call of ``method`` with ``metadata``; raises its
        rejection instead."""
        token = bearer(metadata)
        if token is None:
            raise Unauthenticated(f"this server needs a bearer token: {HOW}")
        found = self.scope_of(token)
        if found is None:
            raise Unauthenticated("the bearer token is not known to this server")
        scope = found[0]
        if not allows(scope.role, method):
            may = ", ".join(sorted(ROLE_METHODS.get(scope.role, ())))
            raise PermissionDenied(
                f"role {scope.role!r} may not call {split_method(method)[1]} (it may call {may})"
            )
        return found

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:  # no handler: gRPC answers UNIMPLEMENTED
            return handler
        method = str(handler_call_details.method)
        try:
            scope, identity = self.check(method, handler_call_details.invocation_metadata)
        except LowtideError as error:
            return refusal(handler, error)
        service, name = split_method(method)
        if service != SERVICE:
            return handler
        if name == "CommitOffset":  # an admin's commits are bound to no token: it may move any reader
            handler = committing(handler, None if scope.role == "admin" else identity)
        return scoped(handler, name, scope, self.inputs)


async def _abort(
    context: _Context,
    error: LowtideError,
    metadata: tuple[tuple[str, str], ...] = (),
) -> None:
    await context.abort(
        grpc.StatusCode[error.status],
        str(error),
        trailing_metadata=((ERROR_KEY, type(error).__name__), *metadata),
    )


def refusal(handler: grpc.RpcMethodHandler[Any, Any], error: LowtideError) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``handler``'s kind that aborts every call with ``error``, reading nothing.

    A refused Ingest also says it stopped at the call's start (``lowtide-message`` 0, nothing
    applied), so a producer reports its messages as not applied rather than "may have been".
    """
    metadata: tuple[tuple[str, str], ...] = ()
    if handler.request_streaming:
        metadata = (("lowtide-message", "0"), ("lowtide-applied", "0,0,0"))

    async def refuse(_request: Any, context: _Context) -> None:
        await _abort(context, error, metadata)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(refuse, handler.request_deserializer, handler.response_serializer)


async def _ingest_requests(requests: AsyncIterator[Any], scope: TokenScope) -> AsyncIterator[Any]:
    """``requests``, refused at the first: it names the stream and source of the whole call (the
    front ignores them on later messages). The refusal is raised to the front's Ingest before it
    has a message, so the call answers as stopped at message 0 with nothing applied."""
    first = True
    async for request in requests:
        if first and isinstance(request, pb.IngestRequest | pb.StageRequest):  # else: malformed
            error = scope.ingest(request.stream, request.source or DEFAULT_SOURCE)
            if error is not None:
                raise error
        first = False
        yield request


def _visible(response: Any, scope: TokenScope) -> Any:
    """A list call's ``response`` without the streams or queries ``scope`` hides (a worker's state
    bytes are those of the queries shown: the client sums them)."""
    if isinstance(response, pb.ListStreamsResponse):
        return pb.ListStreamsResponse(streams=[s for s in response.streams if scope.sees_stream(s.name)])
    if isinstance(response, pb.ListQueriesResponse):
        return pb.ListQueriesResponse(queries=[q for q in response.queries if scope.sees_query(q.name)])
    if isinstance(response, pb.ListWorkersResponse):  # every worker, with the queries the scope shows
        for worker in response.workers:
            seen = [q for q in worker.queries if scope.sees_query(q.name)]
            del worker.queries[:]
            worker.queries.extend(seen)
    return response


def committing(
    handler: grpc.RpcMethodHandler[Any, Any], identity: str | None
) -> grpc.RpcMethodHandler[Any, Any]:
    """The CommitOffset ``handler`` made for the token ``identity`` (None: an admin): the front
    reads it from :data:`~lowtide.server.scopes.committer`."""
    commit = cast("Callable[..., Awaitable[Any]]", handler.unary_unary)

    async def committed(request: Any, context: _Context) -> Any:
        committer.set(identity)  # the call's own task: it ends with the call
        return await commit(request, context)

    return grpc.unary_unary_rpc_method_handler(
        committed, handler.request_deserializer, handler.response_serializer
    )


def _late_inputs(name: str, inputs: Inputs) -> Sequence[str]:
    """The names whose raw rows ``name`` holds: its query's inputs if it is ``<query>.late``."""
    return inputs(name.removesuffix(".late")) if name.endswith(".late") else ()


def scoped(
    handler: grpc.RpcMethodHandler[Any, Any], name: str, scope: TokenScope, inputs: Inputs = _no_inputs
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` of lowtide.v1.Lowtide's method ``name``, held to ``scope`` (:mod:`.scopes`);
    ``inputs`` tells what a query reads, the scope of its ``.late`` stream.

    A request that did not parse is passed on as it came: the front answers INVALID_ARGUMENT.
    """
    if not scope.limited:
        return handler

    # Each call runs in a task of its own: what it sets here is its own, and ends with it.
    def shows(kind: str, name: str) -> bool:
        return scope.sees(kind, name, _late_inputs(name, inputs) if kind == "query" else ())

    serializers = (handler.request_deserializer, handler.response_serializer)
    # grpc.aio's behaviours are coroutine functions (async generators for a streamed response),
    # which grpc's typing does not know.
    if name in ("Ingest", "Stage"):
        ingest = cast("Callable[..., Awaitable[Any]]", handler.stream_unary)

        async def checked_ingest(requests: AsyncIterator[Any], context: _Context) -> Any:
            visible_names.set(shows)
            return await ingest(_ingest_requests(requests, scope), context)

        return grpc.stream_unary_rpc_method_handler(checked_ingest, *serializers)
    if name == "Subscribe":
        subscribe = cast("Callable[..., AsyncIterator[Any]]", handler.unary_stream)

        async def checked_subscribe(request: Any, context: _Context) -> AsyncIterator[Any]:
            visible_names.set(shows)
            if isinstance(request, pb.SubscribeRequest) and (
                error := scope.subscribe(request.query, _late_inputs(request.query, inputs))
            ):
                await _abort(context, error)
            async for response in subscribe(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(checked_subscribe, *serializers)
    if name == "CommitOffset":
        commit = cast("Callable[..., Awaitable[Any]]", handler.unary_unary)

        async def checked_commit(request: Any, context: _Context) -> Any:
            visible_names.set(shows)
            if isinstance(request, pb.CommitOffsetRequest) and (
                error := scope.subscribe(request.query, _late_inputs(request.query, inputs))
            ):
                await _abort(context, error)
            return await commit(request, context)

        return grpc.unary_unary_rpc_method_handler(checked_commit, *serializers)
    if name in ("CommitStaged", "AbortStaged"):
        staged = cast("Callable[..., Awaitable[Any]]", handler.unary_unary)

        async def checked_staged(request: Any, context: _Context) -> Any:
            visible_names.set(shows)
            if isinstance(request, pb.CommitStagedRequest | pb.AbortStagedRequest) and (
                error := scope.ingest(request.stream, request.source or DEFAULT_SOURCE)
            ):
                await _abort(context, error)
            return await staged(request, context)

        return grpc.unary_unary_rpc_method_handler(checked_staged, *serializers)
    if name in ("ExplainQuery", "ListStreams", "ListQueries", "ListWorkers"):
        call = cast("Callable[..., Awaitable[Any]]", handler.unary_unary)

        async def checked(request: Any, context: _Context) -> Any:
            visible_names.set(shows)
            if isinstance(request, pb.ExplainQueryRequest) and (error := scope.explain(request.sql)):
                await _abort(context, error)
            return _visible(await call(request, context), scope)

        return grpc.unary_unary_rpc_method_handler(checked, *serializers)
    return handler


# -- loading at start -----------------------------------------------------------------------------
def _read(path: str, option: str) -> bytes:
    if not path:
        raise InvalidArgument(f"{option} is missing: --tls-cert and --tls-key go together")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {option} {path}: {exc.strerror or exc}") from None


def load_tokens(path: str) -> dict[str, TokenScope]:
    """``{token: scope}`` from the ``[tokens]`` table of the TOML file at ``path``; one line on error.

    Each entry is ``"token" = "role"`` or a table ``{role = "...", streams = [...], ...}``
    (:func:`lowtide.server.scopes.parse`). A reason names an entry by its place, never by its
    token: a token is a secret, and reasons end up in logs.
    """
    try:
        data = tomllib.loads(_read(path, "--tokens").decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"cannot read --tokens {path}: {exc}") from None
    table = data.get("tokens")
    if not isinstance(table, dict) or not table:
        raise InvalidArgument(f"--tokens {path} has no [tokens] table mapping each token to its role")
    tokens: dict[str, TokenScope] = {}
    for number, (token, entry) in enumerate(table.items(), 1):
        where = f"--tokens {path}: token #{number}"
        if not token or not token.isascii() or not token.isprintable() or " " in token:
            raise InvalidArgument(f"{where}: a token must be printable ASCII without spaces")
        if isinstance(entry, dict) and "role" not in entry:
            raise InvalidArgument(f"{where}: its table needs a role ({', '.join(ROLES)})")
        role = entry["role"] if isinstance(entry, dict) else entry
        if role not in ROLES:
            raise InvalidArgument(f"{where}: unknown role {role!r}; roles are {', '.join(ROLES)}")
        tokens[token] = parse(entry, role, where)
    return tokens


def _no_password() -> bytes:
    return b""  # an encrypted key fails the check instead of prompting on the terminal


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of ``--tls-cert``/``--tls-key``, or None for plaintext."""
    if not config.tls_cert and not config.tls_key:
        return None
    cert = _read(config.tls_cert, "--tls-cert")
    key = _read(config.tls_key, "--tls-key")
    try:  # gRPC would only fail at the first handshake: check the pair now, with a reason
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(config.tls_cert, config.tls_key, _no_password)
    except ssl.SSLError as exc:
        # OpenSSL's "[SSL] PEM lib" means a file that is not PEM of the kind expected.
        reason = exc.reason or "expected a PEM certificate and its unencrypted PEM private key"
        raise InvalidArgument(
            f"cannot use --tls-cert {config.tls_cert} with --tls-key {config.tls_key}: {reason}"
        ) from None
    return grpc.ssl_server_credentials([(key, cert)])


def loopback(host: str) -> bool:
    """Whether binding ``host`` stays on this machine: 127.0.0.0/8, ::1 or localhost, or a name
    resolving to those alone. Unresolvable: False (the start fails on it anyway)."""
    name = host.strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        found = socket.getaddrinfo(name, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return False
    addresses = [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in found]
    return bool(addresses) and all(
        (address.ipv4_mapped or address).is_loopback
        if isinstance(address, ipaddress.IPv6Address)
        else address.is_loopback
        for address in addresses
    )


def plaintext_warning(config: ServerConfig) -> str | None:
    """The start's warning line when bearer tokens would cross a network unencrypted: tokens on,
    no TLS, and a bind address that is not loopback."""
    if not config.tokens or config.tls_cert or loopback(config.host):
        return None
    return (
        f"lowtide: warning: bearer tokens travel in plaintext on {config.host}, not a loopback address: "
        "anyone on the network path can read and replay them; serve TLS (--tls-cert, --tls-key)"
    )


@dataclass(frozen=True)
class Security:
    """What ``serving.run`` needs: port credentials, interceptors, and lines for stderr (or None)."""

    credentials: grpc.ServerCredentials | None
    interceptors: list[_ServerInterceptor]
    notice: str | None
    warning: str | None  # tokens over plaintext off loopback (plaintext_warning)

    def bind(self, inputs: Inputs) -> None:
        """Let the token checks ask the front what a query reads (the scope of its ``.late``)."""
        for interceptor in self.interceptors:
            if isinstance(interceptor, TokenAuth):
                interceptor.inputs = inputs


def load(config: ServerConfig) -> Security:
    """Read and check the TLS files and the tokens file of ``config`` (one line on any error)."""
    credentials = server_credentials(config)
    tokens = load_tokens(config.tokens) if config.tokens else {}
    interceptors: list[_ServerInterceptor] = [TokenAuth(tokens)] if tokens else []
    said = []
    if credentials is not None:
        said.append(f"TLS with certificate {config.tls_cert}")
    if tokens:
        said.append(f"bearer tokens ({counted(list(tokens.values()))})")
    notice = f"lowtide: {' and '.join(said)}" if said else None
    return Security(credentials, interceptors, notice, plaintext_warning(config))


__all__ = [
    "ROLES",
    "Security",
    "TokenAuth",
    "allows",
    "bearer",
    "committing",
    "load",
    "load_tokens",
    "loopback",
    "plaintext_warning",
    "scoped",
    "server_credentials",
]
