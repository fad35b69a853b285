"""Clients of a lowtide server: Python client, CLI helpers, Spark connector.

gRPC's C core writes its own log lines on stderr (a root certificate it cannot load, a failed
handshake) beside the exception that says it in one line: importing this package sets
``GRPC_VERBOSITY=NONE`` unless the environment sets it already (``GRPC_VERBOSITY=ERROR`` brings
them back). gRPC reads it when first imported, so it holds if ``lowtide.clients`` comes first.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # before any import of grpc: it reads this once

from lowtide.clients._wire import IngestResult
from lowtide.clients.client import (
    AsyncClient,
    AsyncProducer,
    AsyncSubscription,
    Client,
    Producer,
    Subscription,
)
from lowtide.errors import DeadlineExceeded, ServerError, ServerUnavailable

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
