"""The private one-machine Ray cluster of ``--ray local``, started inside the server.

Every listener of it is on 127.0.0.1 unless told another address (``ray_node_ip``), under a token
of its own in the environment its processes inherit (not one Ray would write to ``~/.ray``).

Invariant: the cluster :func:`start_private` hands over has a raylet that outlived its start.
Ray 2.60's raylet now and then aborts as it starts (ray-project/ray#58964): a thread of it raises
SIGABRT within its first second, and its failure handler's ``alarm(3)`` ends it 3 s later, or it
ends at once. Before it registers, ``ray.init`` gives up after Ray's 30 s; after, the node would
be lost with the workers on it a moment into serving. So a start waits until the raylet has lived
:data:`OUTLIVE_S`, and one whose raylet ended is undone whole (every process it started) and made
again, up to :data:`ATTEMPTS` times, saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray._private import ray_constants

from lowtide.errors import StartupFailure

LOOPBACK = "127.0.0.1"  # where the private cluster listens, unless told otherwise
ATTEMPTS = 3  # starts of the private cluster before the server gives up
OUTLIVE_S = 4.5  # a raylet's age past its failure alarm (armed within its first second, 3 s)


def start_private(namespace: str, cpus: int, node_ip: str = "") -> tuple[str, int]:
    """Start the private cluster with room for ``cpus`` CPUs of workers and join it as a driver
    in ``namespace``; its control service's (GCS) address, to watch it by."""
    options: dict[str, Any] = {"num_cpus": max(cpus, os.cpu_count() or 1), "include_dashboard": False}
    if node_ip:
        options["_node_ip_address"] = node_ip
    # Ray gives its control service 30 s to start; a loaded machine may need longer.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    if "RAY_AUTH_TOKEN" not in os.environ and "RAY_AUTH_TOKEN_PATH" not in os.environ:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    for attempt in range(1, ATTEMPTS + 1):
        ended = _start(namespace, options)
        if not ended:
            break
        if attempt == ATTEMPTS:
            raise StartupFailure(
                f"the private Ray cluster did not start: its raylet ended as it started, {ATTEMPTS} "
                f"times in a row (the last: {ended}; Ray's startup abort, ray-project/ray#58964)"
            )
        print(
            f"lowtide: the private Ray cluster's raylet ended as it started ({ended}; Ray's "
            f"startup abort, ray-project/ray#58964): starting the cluster again, attempt "
            f"{attempt + 1} of {ATTEMPTS}",
            file=sys.stderr,
            flush=True,
        )
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    if host != (node_ip or LOOPBACK):  # fail closed: never a private cluster open to the network
        ray.shutdown()
        raise StartupFailure(
            f"the private Ray cluster came up on {host}, not {node_ip or LOOPBACK} "
            "(Ray was imported before the server could keep it on loopback)"
        )
    return host, int(port)


def _start(namespace: str, options: dict[str, Any]) -> str:
    """One start; '' once its raylet outlived :data:`OUTLIVE_S`, else how it ended (the start
    undone)."""
    before = set(_children())
    try:
        ray.init(address="local", namespace=namespace, logging_level=logging.WARNING, **options)
    except Exception as exc:  # Ray's own for a node that did not register: a bare Exception
        started = {pid: state for pid, state in _children().items() if pid not in before}
        # Ray keeps no handle on a node that failed to start: end what this start left running.
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in started:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if ("raylet", "Z") not in started.values():  # not the abort: nothing to try again
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise StartupFailure(f"cannot start the private Ray cluster: {reason}") from None
        return "before it registered"
    node = ray._private.worker._global_node  # the head this start made (Ray's own record of it)
    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
    left = OUTLIVE_S - _age(raylet.pid, default=0.0)
    if left > 0:
        time.sleep(left)  # the alarm is the raylet's own: no event marks that it did not ring
    if raylet.poll() is None:
        return ""
    ray.shutdown()
    return f"exit {raylet.returncode}, after it registered"


def _children() -> dict[int, tuple[str, str]]:
    """This process's children: pid -> (command name, state; 'Z' ended), from /proc (Linux; none
    elsewhere, where what a failed start left ends with the server)."""
    found = {}
    me = os.getpid()
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            stat = entry.read_text()
            name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == me:
                found[int(entry.parent.name)] = (name, fields[0])
    return found


def _age(pid: int, default: float) -> float:
    """Seconds since process ``pid`` started (/proc), or ``default`` where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return default
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
