"""The integration tests' shared server: one ``lowtide serve`` for the whole session.

Tests get its ``host:port`` from the ``target`` fixture and make names of their own with
``fresh`` (the server is shared). It starts as every test server does
(:func:`server_harness.start_server`) and at the end must drain and exit 0. Helpers live in named
modules (``server_harness``, ``wire``, ``cluster``), never here: ``conftest`` is a name several
folders share.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest
from server_harness import Server, running_server


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
