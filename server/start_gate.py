"""Calls that come while a server starts: refused at once with UNAVAILABLE, never left waiting.

The gRPC port is taken and served from the start, so a second server on it fails at once; but the
front answers only once every worker answers and the state is recovered. Until then (the gate is
closed) every call of the lowtide service is refused with ``UNAVAILABLE`` and a one-line reason,
which the clients and the Spark sink try again; the standard health service says ``NOT_SERVING``
and reflection answers. Before the gate, the port accepted connections it did not serve, and a
call waited out its deadline.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from lowtide.errors import ServerUnavailable
from lowtide.server.auth import SERVICE, refusal, split_method

if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # the runtime class is not generic
    _ServerInterceptor = grpc.aio.ServerInterceptor

STARTING = "the server is starting: its workers and state are not ready yet; try again"


class StartGate(_ServerInterceptor):
    """Closed until :meth:`open`: the lowtide service's calls are refused, the others pass."""

    def __init__(self) -> None:
        self.is_open = False

    def open(self) -> None:
        self.is_open = True

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if self.is_open or handler is None or split_method(str(handler_call_details.method))[0] != SERVICE:
            return handler
        return refusal(handler, ServerUnavailable(STARTING))
