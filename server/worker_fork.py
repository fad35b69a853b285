"""Where local workers come from: forks of one process that imported the worker's modules once.

A worker spawned as a fresh interpreter imports numpy, numba and every operator before it serves
(1.5 s or more), at each start and again at each restart after a death. Forking the front would
be instant but is unsafe once gRPC's threads run. So the workers fork from multiprocessing's fork
server: one single-threaded process, started by :func:`start` before the front imports anything
heavy (its imports and the front's overlap), with :data:`WORKER_MODULES` preloaded. A worker killed
is back in milliseconds, and a server starts sooner.

A fork gets the preloaded modules and nothing else of the front's: what a worker needs arrives as
its arguments (its pipes pass as file descriptors), as with ``spawn``; the main module is still
imported in each worker as ``__mp_main__``, so a main module a worker cannot import fails every
start (:mod:`lowtide.server.local_workers` counts them).
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext

WORKER_MODULES = ["lowtide.server.fork_preload"]


def context() -> ForkServerContext:
    """The context local workers start in: forks of the fork server, which preloads the worker's modules."""
    found = mp.get_context("forkserver")
    assert isinstance(found, ForkServerContext)
    found.set_forkserver_preload(WORKER_MODULES)
    return found


def start() -> None:
    """Start the fork server now (it imports :data:`WORKER_MODULES` while the caller goes on)."""
    context()
    forkserver.ensure_running()
