"""Who may reach the server and what each caller may do: TLS and bearer tokens (DESIGN.md §9).

Invariant: with ``--tokens F`` on, no call reaches a servicer unless its metadata carries
``authorization: Bearer <token>`` with a token of ``F`` whose role allows the method. Every other
call is answered here, before any of its requests is read: ``UNAUTHENTICATED`` (no token, or one
the file does not hold) or ``PERMISSION_DENIED`` (a known token whose role does not allow the
method), with a one-line reason and the error's class in the ``lowtide-error`` trailing metadata,
like every other rejection, so the clients raise :class:`~lowtide.errors.Unauthenticated` and
:class:`~lowtide.errors.PermissionDenied`. Health (``lowtide.v1`` and ``grpc.health.v1``) and
reflection are open to every role, but still need a valid token: without one a caller learns
nothing about the server, not even its streams' schemas.

Roles: ``admin`` may call everything; ``producer`` Ingest, ListStreams and ListQueries; ``reader``
Subscribe, ExplainQuery, ListStreams and ListQueries. Tokens are compared in constant time.

TLS (``--tls-cert``/``--tls-key``) only changes how the port is bound; the files are read and the
pair checked here at start, so a bad file stops the server with one line naming it.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from lowtide.errors import InvalidArgument, LowtideError, PermissionDenied, Unauthenticated
from lowtide.server.config import ServerConfig

if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # the runtime class is not generic
    _ServerInterceptor = grpc.aio.ServerInterceptor

SERVICE = "lowtide.v1.Lowtide"
ERROR_KEY = "lowtide-error"  # the error's class, as server/front.py's ``_abort`` sends it
# What each role may call on lowtide.v1.Lowtide; admin may call everything.
ROLE_METHODS: dict[str, frozenset[str]] = {
    "producer": frozenset({"Ingest", "ListStreams", "ListQueries"}),
    "reader": frozenset({"Subscribe", "ExplainQuery", "ListStreams", "ListQueries"}),
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
HOW = "send metadata 'authorization: Bearer <token>' (Client(token=...), lowtide --token or $LOWTIDE_TOKEN)"


def _split(method: str) -> tuple[str, str]:
    """``/lowtide.v1.Lowtide/Ingest`` -> ``("lowtide.v1.Lowtide", "Ingest")``."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


def allows(role: str, method: str) -> bool:
    """Whether ``role`` may call ``method`` (a full gRPC method path)."""
    service, name = _split(method)
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


class TokenAuth(_ServerInterceptor):
    """The grpc.aio interceptor enforcing the module's invariant for a ``{token: role}`` table."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self._tokens = [(_digest(token), role) for token, role in tokens.items()]

    def role_of(self, token: str) -> str | None:
        """The role of ``token``; every known token is compared (in constant time), match or not."""
        presented = _digest(token)
        role: str | None = None
        for digest, candidate in self._tokens:
            if hmac.compare_digest(presented, digest):
                role = candidate
        return role

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> LowtideError | None:
        """The rejection due to a call of ``method`` with ``metadata``, or None to let it through."""
        token = bearer(metadata)
        if token is None:
            return Unauthenticated(f"this server needs a bearer token: {HOW}")
        role = self.role_of(token)
        if role is None:
            return Unauthenticated("the bearer token is not known to this server")
        if not allows(role, method):
            may = ", ".join(sorted(ROLE_METHODS.get(role, ())))
            return PermissionDenied(f"role {role!r} may not call {_split(method)[1]} (it may call {may})")
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        error = self.check(method, handler_call_details.invocation_metadata)
        if error is None or handler is None:  # no handler: gRPC answers UNIMPLEMENTED
            return handler
        return refusal(handler, error)


def refusal(handler: grpc.RpcMethodHandler[Any, Any], error: LowtideError) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``handler``'s kind that aborts every call with ``error``, reading nothing.

    A refused Ingest also says it stopped at the call's start (``lowtide-message`` 0, nothing
    applied), so a producer reports its messages as not applied rather than "may have been".
    """
    metadata: tuple[tuple[str, str], ...] = ((ERROR_KEY, type(error).__name__),)
    if handler.request_streaming:
        metadata += (("lowtide-message", "0"), ("lowtide-applied", "0,0,0"))

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode[error.status], str(error), trailing_metadata=metadata)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(refuse, handler.request_deserializer, handler.response_serializer)


# -- loading at start -----------------------------------------------------------------------------
def _read(path: str, option: str) -> bytes:
    if not path:
        raise InvalidArgument(f"{option} is missing: --tls-cert and --tls-key go together")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {option} {path}: {exc.strerror or exc}") from None


def load_tokens(path: str) -> dict[str, str]:
    """``{token: role}`` from the ``[tokens]`` table of the TOML file at ``path``; one line on error."""
    try:
        data = tomllib.loads(_read(path, "--tokens").decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"cannot read --tokens {path}: {exc}") from None
    table = data.get("tokens")
    if not isinstance(table, dict) or not table:
        raise InvalidArgument(f"--tokens {path} has no [tokens] table mapping each token to its role")
    for token, role in table.items():
        if not token or not token.isascii() or not token.isprintable() or " " in token:
            raise InvalidArgument(f"--tokens {path}: a token must be printable ASCII without spaces")
        if role not in ROLES:
            # The token itself stays out of the message: it is a secret, and ends up in logs.
            raise InvalidArgument(f"--tokens {path}: unknown role {role!r}; roles are {', '.join(ROLES)}")
    return {str(token): str(role) for token, role in table.items()}


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


@dataclass(frozen=True)
class Security:
    """What ``_serve`` needs: port credentials, interceptors, and a line for stderr (or None)."""

    credentials: grpc.ServerCredentials | None
    interceptors: list[_ServerInterceptor]
    notice: str | None


def load(config: ServerConfig) -> Security:
    """Read and check the TLS files and the tokens file of ``config`` (one line on any error)."""
    credentials = server_credentials(config)
    tokens = load_tokens(config.tokens) if config.tokens else {}
    interceptors: list[_ServerInterceptor] = [TokenAuth(tokens)] if tokens else []
    said = []
    if credentials is not None:
        said.append(f"TLS with certificate {config.tls_cert}")
    if tokens:
        counts = {role: sum(1 for r in tokens.values() if r == role) for role in ROLES}
        said.append("bearer tokens (" + ", ".join(f"{n} {role}" for role, n in counts.items() if n) + ")")
    notice = f"lowtide: {' and '.join(said)}" if said else None
    return Security(credentials, interceptors, notice)


__all__ = ["ROLES", "Security", "TokenAuth", "allows", "bearer", "load", "load_tokens", "server_credentials"]
