"""Ports the server listens on: taken by this server alone, or the start fails in one line.

gRPC and Python's HTTP server would both share a port another process holds (``SO_REUSEPORT``)
or fail with a traceback; lowtide checks each port before it starts anything
(docs/design.md, "Security").
"""

from __future__ import annotations

import socket

from lowtide.errors import StartupFailure


def ensure_free(host: str, port: int, what: str) -> None:
    """Raise :class:`StartupFailure` unless ``host:port`` can be bound now (port 0 always can)."""
    if not 0 <= port <= 65535:
        raise StartupFailure(f"{what} port {port} is out of range (0..65535)")
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupFailure(f"cannot serve {what} on {host}:{port}: {exc.strerror}") from None
    if port == 0:
        return
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # Like the servers themselves: a port in TIME_WAIT is free, one with a listener is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise StartupFailure(f"cannot serve {what} on {host}:{port}: {reason.lower()}") from None


__all__ = ["ensure_free"]
