"""A server's life: ``run`` serves until SIGTERM or SIGINT (:mod:`lowtide.server.serve` starts it).

Nothing is answered before it can be: TLS files and tokens are read, both ports are taken and
every worker answers (and, with ``--state-dir``, the state is recovered) before the ready line;
a call that comes sooner is refused ``UNAVAILABLE`` at once (:mod:`lowtide.server.start_gate`). Then it
drains: in-flight batches reach the workers, their results reach the subscribers, subscriptions
end cleanly, the process exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from lowtide.errors import NotFound, StartupFailure
from lowtide.proto import lowtide_pb2 as pb
from lowtide.server import auth
from lowtide.server.config import ServerConfig
from lowtide.server.front import Front
from lowtide.server.ports import ensure_free
from lowtide.server.service import Service, add_service
from lowtide.server.start_gate import StartGate


def _reads(front: Front, query: str) -> list[str]:
    """The streams ``query`` reads (its derived tables' too; none if there is no such query): what
    its ``.late`` holds rows of."""
    try:
        return front.door.inputs_of(query)
    except NotFound:
        return []


async def _ready(front: Front, config: ServerConfig) -> None:
    """Start the workers, wait until each answers, and recover the state directory's state."""
    await front.start()  # a start that fails here (Ray's cluster, for one) says why in one line
    if not config.state_dir:
        print("lowtide: no --state-dir: streams, queries and windows live in memory only", file=sys.stderr)
    await front.sync()  # every worker is up and answering before the server says it serves
    if front.state is not None:
        began = time.monotonic()
        try:
            replayed, torn = await front.recover()
        except BaseException:
            await front.stop()  # the workers and their shared memory go; the state directory stays as it was
            raise
        if torn is not None and torn.lost:
            print(
                f"lowtide: --truncate-log-tail: gave up {torn.lost} acknowledged record(s) at the end of "
                f"the input log ({torn.dropped} bytes cut from {torn.path})",
                file=sys.stderr,
            )
        elif torn is not None:
            print(
                f"lowtide: dropped a torn last record (never acknowledged): {torn.dropped} bytes at "
                f"the end of {torn.path}",
                file=sys.stderr,
            )
        print(
            f"lowtide: state in {config.state_dir}: {len(front.door.list_streams())} streams, "
            f"{len(front.door.remotes())} queries, {replayed} logged changes replayed in "
            f"{time.monotonic() - began:.2f} s",
            file=sys.stderr,
        )


async def run(config: ServerConfig, truncate_log_tail: bool) -> int:
    security = auth.load(config)  # TLS files and tokens are read and checked before anything starts
    # Both ports are taken before any worker starts: a start that fails says why in one line.
    ensure_free(config.host, config.port, "gRPC")
    if config.metrics_port > 0:
        ensure_free(config.metrics_host, config.metrics_port, "metrics")
    front = Front(config, truncate_log_tail)
    security.bind(lambda query: _reads(front, query))
    options = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
    ]
    gate = StartGate()
    server = grpc.aio.server(options=options, interceptors=[gate, *security.interceptors])
    add_service(Service(front), server)
    health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        pb.DESCRIPTOR.services_by_name["Lowtide"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    )
    reflection.enable_server_reflection((*names, reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    try:
        if security.credentials is not None:
            port = server.add_secure_port(address, security.credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # taken since ensure_free looked
        raise StartupFailure(f"cannot serve gRPC on {address}: address already in use") from None
    metrics_url = "off"
    if config.metrics_port >= 0:
        try:
            bound = front.metrics.serve(config.metrics_host, config.metrics_port)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            where = f"{config.metrics_host}:{config.metrics_port}"
            raise StartupFailure(f"cannot serve metrics on {where}: {reason}") from None
        metrics_url = f"http://{config.metrics_host}:{bound}/metrics"
    if security.notice:
        print(security.notice, file=sys.stderr)
    if security.warning:
        print(security.warning, file=sys.stderr)
    # Served from here on, the gate closed: a call before the workers and the state are ready is
    # refused UNAVAILABLE at once (and tried again by the clients), not left to wait out its deadline.
    await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    try:
        await _ready(front, config)
    except BaseException:
        await server.stop(None)  # the start failed, its line said why: nothing serves on
        raise
    gate.open()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stopping = front.stopping
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the ready line: a SIGTERM after it drains
        loop.add_signal_handler(sig, stopping.set)
    print(
        f"lowtide serving on {config.host}:{port} with {config.workers} workers; metrics on {metrics_url}",
        flush=True,
    )
    await stopping.wait()
    await health_servicer.enter_graceful_shutdown()
    stopped = asyncio.ensure_future(server.stop(grace=10))
    await front.stop()
    await stopped
    return front.exit_code
