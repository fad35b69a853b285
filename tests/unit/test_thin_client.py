"""Producers and Spark executors import the client, never the engine (issue 11, item 6)."""

from __future__ import annotations

import json
import subprocess
import sys

ENGINE_MODULES = ("numba", "lark", "lowtide.engine", "lowtide.query", "lowtide.operators", "lowtide.server")


def _loaded_after(statement: str) -> list[str]:
    probe = (
        f"import sys, json; {statement}; "
        f"print(json.dumps([m for m in {ENGINE_MODULES!r} if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_client_and_spark_sink_load_no_engine() -> None:
    assert _loaded_after("import lowtide.clients, lowtide.clients.spark") == []


def test_cli_client_commands_load_no_engine() -> None:
    statement = "import lowtide.cli, lowtide.cli_commands, lowtide.cli_io; lowtide.cli.build_parser()"
    assert _loaded_after(statement) == []


def test_the_engine_still_loads_from_the_package() -> None:
    assert "numba" in _loaded_after("import lowtide; lowtide.Engine")
