"""Ray clusters for the tests: every node on 127.0.0.1 (tests/conftest.py keeps Ray there).

Ray gives a starting node 30 s to register with the cluster's control service (a constant in
``ray/_private/node.py``); once, on a loaded test machine (the other test process starting Spark
beside it), a first start took longer. A start that fails is made again once, from nothing.
"""

from __future__ import annotations

from ray.cluster_utils import Cluster

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
            return cluster
        except Exception:  # Ray raises a bare Exception for a node that did not come up
            cluster.shutdown()
            if not attempts:
                raise
