"""Ray clusters for the tests: every node on 127.0.0.1 (tests/conftest.py keeps Ray there).

Ray gives a starting node 30 s to register with the cluster's control service (a constant in
``ray/_private/node.py``); once, on a loaded test machine (the other test process starting Spark
beside it), a first start took longer. A start that fails is made again once, from nothing.

Also what a process tree listens on, from the kernel's tables (the tests that keep Ray on loopback).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

from ray.cluster_utils import Cluster
from server_harness import descendants, listening_sockets

LOOPBACK = "127.0.0.1"


def loopback_cluster(head_cpus: int, nodes: int = 0, node_cpus: int = 2) -> Cluster:
    """A head with ``head_cpus`` CPUs and ``nodes`` more nodes of ``node_cpus``."""
    attempts = 2
    while True:
        attempts -= 1
        cluster = Cluster()
        try:
            cluster.add_node(num_cpus=head_cpus, node_ip_address=LOOPBACK, include_dashboard=False)
            for _ in range(nodes):
                cluster.add_node(num_cpus=node_cpus, node_ip_address=LOOPBACK)
            cluster.wait_for_nodes()
            _all_alive(cluster)
            return cluster
        except Exception as exc:  # Ray raises a bare Exception for a node that did not come up
            cluster.shutdown()
            if not attempts:
                raise
            print(f"ray_harness: the cluster did not start whole, starting it again: {exc}", file=sys.stderr)


def _all_alive(cluster: Cluster) -> None:
    """Raise if a process of a node ended as the others started. Once, in a full run, the head's
    raylet was SIGKILLed 3 s after it started (its log ends mid-run, nothing else of the cluster
    died, no test had signalled it); the cluster then counted a node that could take no actor, and
    the module's server waited out its 120 s placement timeout."""
    dead = [
        f"{kind} (pid {process.pid}, exit {process.returncode})"
        for node in [cluster.head_node, *cluster.worker_nodes]
        for kind, process in node.dead_processes()
    ]
    if dead:
        raise RuntimeError(f"Ray processes ended: {', '.join(dead)}")


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
