"""The start gate on a real grpc.aio server on loopback: while closed, a call of the lowtide service
is refused UNAVAILABLE at once with the gate's one line (the client says it is starting), the
health service still answers; opened, calls reach the service (here gRPC's generated base
servicer, which answers UNIMPLEMENTED to everything)."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lowtide.clients import AsyncClient
from lowtide.errors import ServerError, ServerUnavailable
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.server.start_gate import STARTING, StartGate


async def _gate_then_open() -> None:
    gate = StartGate()
    server = grpc.aio.server(interceptors=[gate])
    pb_grpc.add_LowtideServicer_to_server(pb_grpc.LowtideServicer(), server)
    checks = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    try:
        async with AsyncClient(target, timeout=5) as client:
            with pytest.raises(ServerUnavailable) as refused:
                await client.list_streams()
            assert str(refused.value) == f"{target}: {STARTING}"
            async with grpc.aio.insecure_channel(target) as channel:
                said = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
            assert said.status == health_pb2.HealthCheckResponse.NOT_SERVING
            gate.open()
            with pytest.raises(ServerError) as passed:  # through the gate: the service's own answer
                await client.list_streams()
            assert passed.value.status == "UNIMPLEMENTED"
    finally:
        await server.stop(None)


def test_a_closed_gate_refuses_at_once_and_an_open_one_lets_calls_through() -> None:
    asyncio.run(_gate_then_open())
