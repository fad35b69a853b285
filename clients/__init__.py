"""Clients of a lowtide server: the Python client, the Spark connector (``spark``), the ``lowtide``
command (``cli``) and the demos (``demos``).

gRPC's C core writes its own log lines on stderr (a root certificate it cannot load, a failed
handshake) beside the exception that says it in one line: importing this package sets
``GRPC_VERBOSITY=NONE`` unless the environment sets it already (``GRPC_VERBOSITY=ERROR`` brings
them back). gRPC reads it when first imported, so it holds if ``lowtide.clients`` comes first.

The client classes load on first use (PEP 562): the ``lowtide`` command, which lives here, starts
without gRPC, and ``lowtide serve`` sets its own default (:func:`default_grpc_verbosity`) before
the server loads gRPC.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lowtide.errors import DeadlineExceeded, ServerError, ServerUnavailable
from lowtide.lazy import loader

if TYPE_CHECKING:
    from lowtide.clients._wire import IngestResult
    from lowtide.clients.client import (
        AsyncClient,
        AsyncProducer,
        AsyncSubscription,
        Client,
        Producer,
        Subscription,
    )

_CHOSEN_BY_USER = "GRPC_VERBOSITY" in os.environ


def default_grpc_verbosity(level: str) -> None:
    """Make ``level`` gRPC's verbosity unless the environment chose one; it takes effect only
    before gRPC is first imported."""
    if not _CHOSEN_BY_USER:
        os.environ["GRPC_VERBOSITY"] = level


default_grpc_verbosity("NONE")  # before any import of grpc: it reads this once

__getattr__ = loader(
    __name__,
    {
        "IngestResult": "lowtide.clients._wire",
        **dict.fromkeys(
            ("AsyncClient", "AsyncProducer", "AsyncSubscription", "Client", "Producer", "Subscription"),
            "lowtide.clients.client",
        ),
    },
    globals(),
)


__all__ = [
    "AsyncClient",
    "AsyncProducer",
    "AsyncSubscription",
    "Client",
    "DeadlineExceeded",
    "IngestResult",
    "Producer",
    "ServerError",
    "ServerUnavailable",
    "Subscription",
]
