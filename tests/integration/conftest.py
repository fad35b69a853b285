"""The integration tests' shared server: one ``lowtide serve`` for the whole session, one Ray
cluster for the session's Ray tests (``ray_cluster``) and one local SparkSession for its Spark
tests (``spark_sessions``).

Tests get its ``host:port`` from the ``target`` fixture and make names of their own with
``fresh`` (the server is shared). It starts as every test server does
(:func:`server_harness.start_server`) and at the end must drain and exit 0. Helpers live in named
modules (``server_harness``, ``wire``, ``cluster``), never here: ``conftest`` is a name several
folders share.

A module whose tests share a server of its own (a module-scoped fixture) is an ``xdist_group`` of
its own too: under ``--dist loadgroup`` (make test) its tests then run on one worker, which starts
that server once, where tests spread over both workers would start it on each.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from server_harness import Server, running_server

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster
    from spark_checks import Sessions


@pytest.fixture(scope="session")
def lowtide_server() -> Iterator[Server]:
    with running_server() as server:
        yield server


@pytest.fixture
def target(lowtide_server: Server) -> str:
    """``host:port`` of the session's server."""
    assert lowtide_server.alive(), f"the server died:\n{lowtide_server.stderr_tail()}"
    return lowtide_server.target


_names = itertools.count(1)


@pytest.fixture
def fresh() -> Callable[[str], str]:
    """Unique stream and query names (the server is shared by the whole session)."""
    return lambda prefix: f"{prefix}_{os.getpid()}_{next(_names)}"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Cluster]:
    """A Ray cluster on loopback (tests/conftest.py keeps Ray there): a head without CPUs and two
    nodes of 2 CPUs. This process joins it as a driver in the namespace ``lowtide`` (it finds the
    workers' actors by name). One server at a time uses it (the Ray tests share the xdist group
    ``ray``); a test that removes nodes leaves two again."""
    import ray  # only the Ray tests pay for importing it
    from ray_harness import loopback_cluster

    cluster = loopback_cluster(head_cpus=0, nodes=2)
    cluster.connect(namespace="lowtide")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[Sessions]:
    """The session's SparkSession (``spark_sessions.get(task_attempts)``), stopped at its end: a
    Spark module's ``spark`` fixture takes it rather than start a SparkContext of its own."""
    from spark_checks import Sessions  # only the Spark tests pay for importing pyspark

    sessions = Sessions()
    try:
        yield sessions
    finally:
        sessions.stop()
