"""Ray clusters for the tests: every node on 127.0.0.1 (tests/conftest.py keeps Ray there).

Ray gives a starting node 30 s to register with the cluster's control service (a constant in
``ray/_private/node.py``); once, on a loaded test machine (the other test process starting Spark
beside it), a first start took longer. A start that fails is made again, from nothing.

A Ray process can also abort as it starts (Ray 2.60; ray-project/ray#58964 reports the same):
in about one full run in two here, a thread of a new raylet raised SIGABRT within its first second
(kernel tracing saw it: thread ``event_engine``, gRPC's, started in the child Ray had just
forked, before it ran its program, as ``server/ray_local.py`` says), its failure handler armed
``alarm(3)`` and hung before writing anything, and SIGALRM ended the raylet 3 s after it started,
its logs silent. A node that lived 3 s had registered by then, so the cluster counted CPUs
that could take no actor, and the test's server waited out its 120 s placement. So a node the
tests add is handed over only once its processes have outlived that alarm
(:data:`ABORT_ALARM_S`); one that did not is replaced, saying so, up to :data:`STARTS` starts
(a head's raylet and then its second start's dashboard process, exit -14 both, happened once).
A raylet that died before it registered (the handler returned at once) fails its ``add_node``
after Ray's 30 s, and is replaced the same way. (``--ray local`` servers start their own
cluster: ``server/ray_local.py`` does the same for them.)

Also what a process tree listens on, from the kernel's tables (the tests that keep Ray on loopback).
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from pathlib import Path
from typing import Any

from ray.cluster_utils import Cluster
from server_harness import descendants, listening_sockets

LOOPBACK = "127.0.0.1"
# From a node's start (the add_node call): past its raylet's 3 s failure alarm, with a margin.
ABORT_ALARM_S = 4.0
REGISTER_TIMEOUT_S = 30.0  # what Cluster.add_node waits for a node to register
STARTS = 5  # a cluster or a node that lost a process as it started is started again, up to this


def loopback_cluster(head_cpus: int, nodes: int = 0, node_cpus: int = 2) -> Cluster:
    """A head with ``head_cpus`` CPUs and ``nodes`` more nodes of ``node_cpus``, every process
    alive past :data:`ABORT_ALARM_S`."""
    attempts = STARTS
    while True:
        attempts -= 1
        cluster = Cluster()
        try:
            head, started, failed = _add(cluster, 1, num_cpus=head_cpus, include_dashboard=False)
            if failed:
                raise RuntimeError(f"the head did not start: {failed[0]}")
            others, last, failed = _add(cluster, nodes, num_cpus=node_cpus)
            lost = _settle(cluster, [*head, *others], max(started, last))
            if lost or failed:
                raise RuntimeError(f"Ray processes ended: {_dead(lost, failed)}")
            return cluster
        except Exception as exc:  # Ray raises a bare Exception for a node that did not come up
            cluster.shutdown()
            if not attempts:
                raise
            print(f"ray_harness: the cluster did not start whole, starting it again: {exc}", file=sys.stderr)


def join_nodes(cluster: Cluster, cpus: int, count: int = 1) -> list[Any]:
    """Add ``count`` nodes of ``cpus`` CPUs to ``cluster`` and return them (each a
    ``ray._private.node.Node``) once they are registered and their processes have outlived
    :data:`ABORT_ALARM_S`; a node that did not is removed and another added (up to
    :data:`STARTS` starts)."""
    joined: list[Any] = []
    for attempt in range(1, STARTS + 1):
        added, started, failed = _add(cluster, count - len(joined), num_cpus=cpus)
        lost = _settle(cluster, added, started)
        joined += [node for node in added if node not in lost]
        if not lost and not failed:
            return joined
        dead = _dead(lost, failed)
        for node in lost:
            cluster.remove_node(node, allow_graceful=False)
        print(f"ray_harness: nodes that joined lost {dead} (attempt {attempt})", file=sys.stderr)
    raise RuntimeError(f"nodes lost a process as they started {STARTS} times in a row, the last: {dead}")


def join_at_once(cluster: Cluster, cpus: int) -> Any:
    """Add a node of ``cpus`` CPUs and return it as soon as it registered (a scenario's timing),
    or None if it never did; :func:`outlived_start` tells later whether it lived."""
    added, _, failed = _add(cluster, 1, num_cpus=cpus)
    if failed:
        print(f"ray_harness: {failed[0]}", file=sys.stderr)
    return added[0] if added else None


def outlived_start(cluster: Cluster, node: Any, started: float) -> bool:
    """Whether ``node`` (added at ``started``, or None: it never registered) is alive past
    :data:`ABORT_ALARM_S`; one that lost a process is removed, saying so."""
    _outlive_start(started)
    if node is not None and not node.dead_processes():
        return True
    if node is not None:
        print(f"ray_harness: a node that joined lost {_dead([node], [])}", file=sys.stderr)
        cluster.remove_node(node, allow_graceful=False)
    return False


def _add(cluster: Cluster, count: int, **options: Any) -> tuple[list[Any], float, list[str]]:
    """Start ``count`` nodes with these ``add_node`` options; the nodes, when the last one started,
    and why each that never registered failed (``add_node`` waits for its raylet to register,
    and raises after Ray's 30 s for one that died first: nothing of it is left to remove)."""
    added: list[Any] = []
    failed: list[str] = []
    started = 0.0
    for _ in range(count):
        started = time.monotonic()
        try:
            added.append(cluster.add_node(wait=False, node_ip_address=LOOPBACK, **options))
        except Exception as exc:  # Ray raises a bare Exception for a node that did not register
            failed.append(f"a node that never registered ({exc})")
    return added, started, failed


def _settle(cluster: Cluster, added: list[Any], started: float) -> list[Any]:
    """Wait until the cluster counts every node alive, or one of ``added`` lost a process (then
    it never will), then until ``added`` outlived :data:`ABORT_ALARM_S`; those of ``added`` that
    lost a process."""
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while not any(node.dead_processes() for node in added):
        try:
            cluster.wait_for_nodes(timeout=0.5)
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
    _outlive_start(started)
    return [node for node in added if node.dead_processes()]


def _outlive_start(started: float) -> None:
    left = started + ABORT_ALARM_S - time.monotonic()
    if left > 0:
        time.sleep(left)  # the alarm is the raylet's own 3 s: no event marks that it did not ring


def _dead(nodes: list[Any], failed: list[str]) -> str:
    """The processes of ``nodes`` that ended (kind, pid, exit: -14 for the alarm), and the nodes
    that ``failed`` to register, or ''."""
    return ", ".join(
        [
            *(
                f"{kind} (pid {process.pid}, exit {process.returncode})"
                for node in nodes
                for kind, process in node.dead_processes()
            ),
            *failed,
        ]
    )


def process_tree(root: int) -> set[int]:
    """``root`` and every process descended from it (Ray's processes are the server's children)."""
    return {root, *descendants(root)}


def listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket listening in one of ``pids``."""
    sockets = listening_sockets()
    found = []
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # ended meanwhile, or its descriptors closed as we read
            continue
        for link in links:
            inode = link.removeprefix("socket:[").removesuffix("]")
            if link.startswith("socket:[") and inode in sockets:
                found.append((*sockets[inode], pid))
    return found


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
