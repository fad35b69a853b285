"""Start-up and shutdown of a server: ``serve`` runs one until SIGTERM or SIGINT.

Nothing serves before it can: TLS files and tokens are read, both ports are taken and every
worker answers (and, with ``--state-dir``, the state is recovered) before the ready line. Then it
drains: in-flight batches reach the workers, their results reach the subscribers, subscriptions
end cleanly, the process exits 0.
"""

from __future__ import annotations

import argparse
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


def _reads(front: Front, query: str) -> list[str]:
    """The streams ``query`` reads (its derived tables' too; none if there is no such query): what
    its ``.late`` holds rows of."""
    try:
        return front.door.inputs_of(query)
    except NotFound:
        return []


async def _serve(config: ServerConfig, truncate_log_tail: bool) -> int:
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
    server = grpc.aio.server(options=options, interceptors=security.interceptors)
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
    await server.start()
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


def serve(config: ServerConfig, truncate_log_tail: bool = False) -> int:
    """Run a server until SIGTERM or SIGINT; returns the exit code. ``truncate_log_tail``: the
    operator gives up the damaged or cut end of ``--state-dir``'s input log at this start."""
    import uvloop

    return uvloop.run(_serve(config, truncate_log_tail))


def main(args: argparse.Namespace) -> int:
    """``lowtide serve``: a server with the command's options (parsed by
    :mod:`lowtide.clients.cli`, whose one import of the server this is), a ``--config`` file under
    them; returns the exit code."""
    config = ServerConfig.load(
        args.config,
        host=args.host,
        port=args.port,
        workers=args.workers,
        metrics_port=args.metrics_port,
        state_dir=args.state_dir,
        metrics_host=args.metrics_host,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tokens=args.tokens,
        ray=args.ray,
        worker_cpus=args.worker_cpus,
        ray_node_ip=args.ray_node_ip,
    )
    return serve(config, truncate_log_tail=args.truncate_log_tail)
