"""Clients of a lowtide server: Python client, CLI helpers, Spark connector."""

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
