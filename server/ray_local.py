"""The private one-machine Ray cluster of ``--ray local``, started inside the server.

Every listener of it is on 127.0.0.1 unless told another address (``ray_node_ip``), under a token
of its own in the environment its processes inherit (not one Ray would write to ``~/.ray``).

Invariant: the server's driver joins the private cluster only once every process of its head
node has outlived its start. Ray 2.60's processes now and then abort as they start
(ray-project/ray#58964): kernel tracing here caught it in the child Ray has just forked, before
it runs its program: threads start in the child within a millisecond of the fork, one of them
(``event_engine``, gRPC's) raises SIGABRT, and the failure handler's ``alarm(3)`` ends the
process 3 s later, or it ends at once. A raylet that ends before
it registers fails the start after Ray's 30 s; one that ends after would take the node, and the
workers on it, a moment into serving; one that ends while the driver registers with it ends the
server's process (Ray's core worker exits). So the head starts first (as ``ray.init`` would start
it), waits until its processes have lived :data:`OUTLIVE_S`, and only then takes the driver; a
start that lost a process is undone whole (every process it started) and made again, up to
:data:`ATTEMPTS` times, saying so.
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
from ray._private.authentication.authentication_token_setup import (
    enable_token_auth_by_default,
    ensure_token_if_auth_enabled,
)
from ray._private.node import Node
from ray._private.parameter import RayParams

from lowtide.errors import StartupFailure

LOOPBACK = "127.0.0.1"  # where the private cluster listens, unless told otherwise
ATTEMPTS = 5  # starts of the private cluster before the server gives up (under load, 2 in a row lost one)
OUTLIVE_S = 4.5  # a process's age past its failure alarm (armed within its first second, 3 s)

_head: list[Node] = []  # the private cluster's head, while it runs


def start_private(namespace: str, cpus: int, node_ip: str = "") -> tuple[str, int]:
    """Start the private cluster with room for ``cpus`` CPUs of workers and join it as a driver
    in ``namespace``; its control service's (GCS) address, to watch it by."""
    # Ray gives its control service 30 s to start; a loaded machine may need longer.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    if "RAY_AUTH_TOKEN" not in os.environ and "RAY_AUTH_TOKEN_PATH" not in os.environ:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    # What ray.init does before it starts a cluster of its own: token authentication on (unless
    # RAY_AUTH_MODE says otherwise), and no usage statistics.
    enable_token_auth_by_default()
    ensure_token_if_auth_enabled({}, create_token_if_missing=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    params = {"node_ip_address": node_ip or LOOPBACK, "num_cpus": max(cpus, os.cpu_count() or 1)}
    head = None
    for attempt in range(1, ATTEMPTS + 1):
        head, ended = _start_head(params)
        if head is not None:
            break
        if attempt == ATTEMPTS:
            raise StartupFailure(
                f"the private Ray cluster did not start: a process of it ended as it started, "
                f"{ATTEMPTS} times in a row (the last: {ended}; Ray's startup abort, ray-project/ray#58964)"
            )
        print(
            f"lowtide: a process of the private Ray cluster ended as it started ({ended}; Ray's "
            f"startup abort, ray-project/ray#58964): starting the cluster again, attempt "
            f"{attempt + 1} of {ATTEMPTS}",
            file=sys.stderr,
            flush=True,
        )
    assert head is not None  # the loop above ends on a head or raises
    _head.append(head)
    try:
        ray.init(
            address=head.address,
            namespace=namespace,
            logging_level=logging.WARNING,
            _node_ip_address=head.node_ip_address,
        )
    # Before serving: nothing is accepted yet, and the start stops, saying why.
    except (ConnectionError, RuntimeError) as exc:
        stop_private()
        raise StartupFailure(f"cannot join the private Ray cluster: {_first_line(exc)}") from None
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    if host != (node_ip or LOOPBACK):  # fail closed: never a private cluster open to the network
        ray.shutdown()
        stop_private()
        raise StartupFailure(
            f"the private Ray cluster came up on {host}, not {node_ip or LOOPBACK} "
            "(Ray was imported before the server could keep it on loopback)"
        )
    return host, int(port)


def stop_private() -> None:
    """End every process of the private cluster, if one runs (after ``ray.shutdown()``)."""
    while _head:
        _head.pop().kill_all_processes(check_alive=False, allow_graceful=True, wait=True)


def _start_head(params: dict[str, Any]) -> tuple[Node | None, str]:
    """Start the head node, as ``ray.init`` does; it once its processes outlived
    :data:`OUTLIVE_S`, else None and how a process of it ended (the start undone)."""
    before = set(_children())
    try:
        head = Node(
            RayParams(**params, include_dashboard=False),
            head=True,
            shutdown_at_exit=False,
            spawn_reaper=True,
            ray_init_cluster=True,
        )
    # Ray's bare Exception for a node that did not register; before serving, nothing is accepted.
    except Exception as exc:
        started = {pid: state for pid, state in _children().items() if pid not in before}
        # Ray keeps no handle on a node that failed to start: end what this start left running.
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in started:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        # A child still under this process's name ended between its fork and its exec: twice
        # in 35 starts here, the raylet (no log of it; Ray waited 30 s) and the control service
        # (none; Ray waited for its port the 120 s set above).
        ours = Path("/proc/self/comm").read_text().strip() if started else ""
        ended = [
            name if name != ours else "a process before it ran its program"
            for name, state in started.values()
            if state == "Z"
        ]
        if not ended:  # not the abort: nothing to try again
            raise StartupFailure(f"cannot start the private Ray cluster: {_first_line(exc)}") from None
        return None, f"{', '.join(ended)}, before the node registered"
    processes = [info.process for infos in head.all_processes.values() for info in infos]
    youngest = min((_age(p.pid, default=0.0) for p in processes), default=0.0)
    if youngest < OUTLIVE_S:  # the alarm is the process's own: no event marks that it did not ring
        time.sleep(OUTLIVE_S - youngest)
    dead = head.dead_processes()
    if not dead:
        return head, ""
    head.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    return None, ", ".join(
        f"{kind} exit {process.returncode}" for kind, process in dead
    ) + ", after it registered"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _children() -> dict[int, tuple[str, str]]:
    """This process's children: pid -> (command name, state; 'Z' ended), from /proc (Linux; none
    elsewhere, where what a failed start left ends with the server)."""
    found = {}
    me = os.getpid()
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):  # a process that ended since the listing
            name, fields = _stat(int(entry.parent.name))
            if int(fields[1]) == me:
                found[int(entry.parent.name)] = (name, fields[0])
    return found


def _age(pid: int, default: float) -> float:
    """Seconds since process ``pid`` started (/proc), or ``default`` where that cannot be read."""
    try:
        _, fields = _stat(pid)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return default
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, list[str]]:
    """Process ``pid``'s command name and the fields of /proc/PID/stat after it (state first)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
