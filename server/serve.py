"""Start-up of a server: ``main`` is ``lowtide serve``, ``serve`` runs one until SIGTERM or SIGINT.

This module imports little: the fork server of the local workers starts first
(:mod:`lowtide.server.worker_fork`) and imports the workers' modules while this process imports
the front's (:mod:`lowtide.server.serving`, the server's life from ports to drain).
"""

from __future__ import annotations

import argparse

from lowtide.server import worker_fork
from lowtide.server.config import ServerConfig


def serve(config: ServerConfig, truncate_log_tail: bool = False) -> int:
    """Run a server until SIGTERM or SIGINT; returns the exit code. ``truncate_log_tail``: the
    operator gives up the damaged or cut end of ``--state-dir``'s input log at this start."""
    import uvloop

    if not config.ray:
        worker_fork.start()
    # Imported once the fork server imports too: the two overlap.
    from lowtide.server.serving import run

    return uvloop.run(run(config, truncate_log_tail))


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
