"""The ``lowtide`` command's control commands start light: against a real server, listing,
registering, explaining and dropping load neither Arrow (pyarrow, numpy) nor the engine, the
planner or the server, which cost most of a call's start. A command that sends or reads rows
loads Arrow when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# Modules a control command has no use for: imported by one, they are a regression.
HEAVY = ("pyarrow", "numpy", "lark", "numba", "lowtide.engine", "lowtide.query", "lowtide.operators",
         "lowtide.server")  # fmt: skip

# Runs each command (argv lists, JSON in argv[1]) in this one interpreter, in order, and writes
# to argv[2] what each left loaded of HEAVY; then what ``from lowtide import Engine`` loads.
PROGRAM = """
import contextlib, io, json, sys
from lowtide.clients.cli import main

heavy = tuple(sys.argv[3].split(","))
def loaded():
    return [name for name in heavy if name in sys.modules]  # a package is loaded with any of its modules
report = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help
            code = exc.code
    report.append({"argv": argv, "code": code, "loaded": loaded()})
from lowtide import Engine
report.append({"argv": ["from lowtide import Engine"], "code": 0, "loaded": loaded()})
with open(sys.argv[2], "w") as out:
    json.dump(report, out)
"""


def test_control_commands_load_neither_arrow_nor_the_engine(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream, query = fresh("Light"), fresh("q")
    sql = f"SELECT k, count(*) AS n [RANGE 1 second, SLIDE 1 second, WA ts] FROM {stream} GROUP BY k"
    server = ["--server", target]
    commands = [
        ["--help"],
        ["query", "--help"],
        [*server, "stream", "create", stream, "--schema", "k:string,ts:timestamp[ms]", "--sources", "a,b"],
        [*server, "stream", "list"],
        [*server, "stream", "list", "--format", "json"],
        [*server, "query", "explain", sql],
        [*server, "query", "register", sql, "--name", query],
        [*server, "query", "list"],
        [*server, "query", "list", "--format", "json"],
        [*server, "workers"],
        [*server, "workers", "--format", "json"],
        [*server, "query", "drop", query],
        [*server, "stream", "drop", stream],
    ]
    report_file = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(commands), str(report_file), ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    *report, engine = json.loads(report_file.read_text())
    assert [r["argv"] for r in report] == commands
    failed = [(r["argv"], r["code"]) for r in report if r["code"] != 0]
    assert not failed, f"{failed}: {done.stderr}"
    # The first command that loaded a heavy module, with what it loaded.
    heavy = next(((r["argv"], r["loaded"]) for r in report if r["loaded"]), None)
    assert heavy is None, f"a control command loaded {heavy[1]}: lowtide {' '.join(heavy[0])}"
    # The check sees what loads them: the engine, still importable from the package, does.
    assert {"pyarrow", "numpy", "lowtide.engine"} <= set(engine["loaded"])
