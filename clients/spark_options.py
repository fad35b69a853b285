"""The options ``format("lowtide")`` shares between its reader and its writer
(docs/design.md, "Spark data source").

``server`` (required, ``host:port``), ``token``, ``root_certificates`` (PEM text, or a path read
on the driver: executors need no copy), ``timeout`` (seconds a call may take, 60 by default) and
``reconnect_timeout`` (seconds a call waits for a server that cannot be reached, 120: a server
restarting after a crash, say). A bad option fails on the driver with one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from lowtide.clients._security import pem_bytes
from lowtide.clients.client import Client
from lowtide.errors import InvalidArgument, ServerUnavailable

T = TypeVar("T")


def until_reachable(
    send: Callable[[], T], timeout: float, before_retry: Callable[[], None] = lambda: None
) -> T:
    """``send()``, again while the server cannot be reached (a pause doubling from 0.25 s to 1 s
    between tries, ``before_retry()`` in each), for up to ``timeout`` seconds. The pause stays
    short: a job goes on within a second of its server answering again, and a refused
    connection costs the server next to nothing."""
    deadline = time.monotonic() + timeout
    pause = 0.25
    while True:
        try:
            return send()
        except ServerUnavailable:
            if time.monotonic() + pause > deadline:
                raise
        before_retry()
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def seconds(options: Mapping[str, str], name: str, default: float) -> float:
    """The option ``name`` as a number of seconds (more than 0)."""
    text = options.get(name)
    try:
        value = float(text) if text is not None else default
    except ValueError:
        raise InvalidArgument(f"the option {name!r} must be seconds, got {text!r}") from None
    if not value > 0:
        raise InvalidArgument(f"the option {name!r} must be more than 0 seconds, got {text!r}")
    return value


@dataclass(frozen=True)
class Connection:
    """How the driver and the executors reach the server: picklable, the certificates read on
    the driver."""

    server: str
    timeout: float
    reconnect_timeout: float
    root_certificates: bytes | None
    token: str | None = field(repr=False)  # kept out of Spark's plans and logs

    @staticmethod
    def of(options: Mapping[str, str]) -> Connection:
        server = options.get("server")
        if not server:
            raise InvalidArgument('format("lowtide") needs the option "server" (host:port)')
        return Connection(
            server,
            seconds(options, "timeout", 60.0),
            seconds(options, "reconnect_timeout", 120.0),
            pem_bytes(options.get("root_certificates")),
            options.get("token"),
        )

    def client(self) -> Client:
        return Client(self.server, self.timeout, self.root_certificates, self.token)

    def call(self, action: Callable[[Client], T]) -> T:
        """``action`` on a client of its own, again while the server cannot be reached, for up
        to ``reconnect_timeout``: a call that did not complete is sent again whole (each call of
        the data source may be: a part staged again replaces itself, a commit is once per id)."""
        return until_reachable(lambda: self._once(action), self.reconnect_timeout)

    def _once(self, action: Callable[[Client], T]) -> T:
        with self.client() as client:
            return action(client)


__all__ = ["Connection", "seconds", "until_reachable"]
