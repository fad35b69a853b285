"""Channels of the clients: plaintext or TLS, with or without a bearer token
(docs/design.md, "Security").

``root_certificates`` (PEM bytes, or the path of a PEM file) makes the channel TLS, checking the
server against those roots. ``token`` puts ``authorization: Bearer <token>`` on every call -
control calls, producers' Ingest calls and subscriptions alike, since they share the channel. The
token travels through a client interceptor rather than call credentials: gRPC sends call
credentials only over TLS, and a token must also work on a plaintext loopback channel.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from lowtide.clients import _wire as wire
from lowtide.errors import InvalidArgument

RootCertificates = bytes | str | Path


def pem_bytes(root_certificates: RootCertificates | None) -> bytes | None:
    """The PEM bytes of ``root_certificates``: given as bytes, as PEM text or as a file's path.

    They must hold at least one PEM certificate (checked by the ``ssl`` module's parser): anything
    else - a private key, a DER file - is refused here with one line naming it, before gRPC
    would fail to load it and let the call time out against a server it cannot trust.
    """
    if root_certificates is None:
        return None
    origin = "(given as bytes)"
    if isinstance(root_certificates, bytes):
        pem = root_certificates
    elif isinstance(root_certificates, str) and root_certificates.lstrip().startswith("-----BEGIN"):
        pem, origin = root_certificates.encode(), "(given as PEM text)"
    else:
        origin = str(root_certificates)
        try:
            pem = Path(root_certificates).read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read root certificates {origin}: {exc.strerror or exc}") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (UnicodeDecodeError, ssl.SSLError):
        raise InvalidArgument(
            f"root certificates {origin} hold no PEM certificate (-----BEGIN CERTIFICATE-----); "
            "--tls-ca / root_certificates= takes the CA's certificate, not a key or a DER file"
        ) from None
    return pem


def _metadata(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


def _with_token(metadata: Any, token: str) -> list[tuple[str, str]]:
    """The call's metadata plus the token (any ``authorization`` of the caller's own is replaced)."""
    kept = [(str(k), v) for k, v in (metadata or ()) if str(k).lower() != "authorization"]
    return [*kept, _metadata(token)]


# -- blocking channels ----------------------------------------------------------------------------
class _SyncDetails(grpc.ClientCallDetails):
    """The call's details with other metadata (gRPC's own class is private)."""

    def __init__(self, details: grpc.ClientCallDetails, metadata: Sequence[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = tuple(metadata)
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = getattr(details, "compression", None)


class _SyncToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds the bearer token to every call of a blocking channel."""

    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _SyncDetails(details, _with_token(details.metadata, self._token))

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


def sync_channel(target: str, root_certificates: RootCertificates | None, token: str | None) -> grpc.Channel:
    """A blocking channel to ``target``: TLS with ``root_certificates``, the token on every call."""
    pem = pem_bytes(root_certificates)
    if pem is None:
        channel = grpc.insecure_channel(target, options=wire.CHANNEL_OPTIONS)
    else:
        credentials = grpc.ssl_channel_credentials(root_certificates=pem)
        channel = grpc.secure_channel(target, credentials, options=wire.CHANNEL_OPTIONS)
    return grpc.intercept_channel(channel, _SyncToken(token)) if token else channel


# -- asyncio channels -----------------------------------------------------------------------------
def _aio_details(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*_with_token(details.metadata, token))
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# grpc.aio files each interceptor under one kind only: one class per kind of call.
class _AioUnaryUnaryToken(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(_aio_details(client_call_details, self._token), request)


class _AioUnaryStreamToken(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(_aio_details(client_call_details, self._token), request)


class _AioStreamUnaryToken(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_aio_details(client_call_details, self._token), request_iterator)


class _AioStreamStreamToken(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(_aio_details(client_call_details, self._token), request_iterator)


def aio_channel(
    target: str, root_certificates: RootCertificates | None, token: str | None
) -> grpc.aio.Channel:
    """:func:`sync_channel` for asyncio."""
    pem = pem_bytes(root_certificates)
    interceptors: list[Any] = []
    if token:
        kinds = (_AioUnaryUnaryToken, _AioUnaryStreamToken, _AioStreamUnaryToken, _AioStreamStreamToken)
        interceptors = [kind(token) for kind in kinds]
    if pem is None:
        return grpc.aio.insecure_channel(target, options=wire.CHANNEL_OPTIONS, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(root_certificates=pem)
    return grpc.aio.secure_channel(
        target, credentials, options=wire.CHANNEL_OPTIONS, interceptors=interceptors
    )


__all__ = ["RootCertificates", "aio_channel", "pem_bytes", "sync_channel"]
