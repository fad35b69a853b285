"""Producers and Spark executors import the client, never the engine (issue 11, item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENGINE_MODULES = ("numba", "lark", "lowtide.engine", "lowtide.query", "lowtide.operators", "lowtide.server")


def _loaded_after(statement: str, modules: tuple[str, ...] = ENGINE_MODULES) -> list[str]:
    probe = f"import sys, json; {statement}; print(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_client_and_spark_sink_load_no_engine() -> None:
    assert _loaded_after("import lowtide.clients, lowtide.clients.spark") == []


def test_cli_client_commands_load_no_engine() -> None:
    statement = (
        "import lowtide.clients.cli.commands, lowtide.clients.cli.io; lowtide.clients.cli.build_parser()"
    )
    assert _loaded_after(statement) == []


def test_the_command_line_parser_loads_no_grpc() -> None:
    """The ``lowtide`` command lives in ``lowtide.clients``, whose client classes load on first
    use: ``lowtide --help`` pays for no gRPC, and ``serve`` may still pick its verbosity."""
    statement = "import lowtide.clients.cli; lowtide.clients.cli.build_parser()"
    assert _loaded_after(statement, ("grpc", "lowtide.clients.client")) == []
    assert _loaded_after("from lowtide.clients import Client", ("grpc",)) == ["grpc"]


@pytest.mark.parametrize(("environment", "expected"), [(None, "NONE ERROR"), ("INFO", "INFO INFO")])
def test_grpc_verbosity_defaults_to_none_and_serve_sets_error_unless_the_user_chose(
    environment: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    if environment is not None:
        env["GRPC_VERBOSITY"] = environment
    probe = (
        "import os, lowtide.clients as c; first = os.environ['GRPC_VERBOSITY']; "
        "c.default_grpc_verbosity('ERROR'); print(first, os.environ['GRPC_VERBOSITY'])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == expected


def test_the_engine_still_loads_from_the_package() -> None:
    assert "numba" in _loaded_after("import lowtide; lowtide.Engine")
