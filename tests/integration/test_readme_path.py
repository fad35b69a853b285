"""The README's five-minute path, command by command, against a real ``lowtide serve``.

The commands come from the README itself (``readme_path``): the test starts the server the path
starts (on a free port: the README's commands get ``--server``), runs every ``lowtide`` command
from the root of the clone as a newcomer would, and compares what the last one prints with the
output the README shows. A server of its own keeps the README's names (``Packets``) apart from
the other tests'. Server and commands run as after ``pip install lowtide`` without extras
(``tests/data/core_install``: pyspark, pandas, ray cannot be imported), as the README promises.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import readme_path
from server_harness import lowtide_command, running_server

pytestmark = pytest.mark.integration

TIMEOUT = 120
CORE_ONLY = {"PYTHONPATH": str(readme_path.ROOT / "tests" / "data" / "core_install")}


def test_the_readme_path_prints_what_the_readme_shows() -> None:
    path = readme_path.path()
    core_only = {**os.environ, **CORE_ONLY}
    for extra in ("pyspark", "pandas", "ray"):  # the interpreter of the path has none of them
        tried = subprocess.run([sys.executable, "-c", f"import {extra}"], env=core_only, capture_output=True)
        assert b"an extra, not installed" in tried.stderr, tried.stderr
    with running_server(*path.serve, env=CORE_ONLY) as server:
        outputs = []
        for command in path.commands:
            done = subprocess.run(
                [*lowtide_command(), "--server", server.target, *command],
                cwd=readme_path.ROOT,
                capture_output=True,
                text=True,
                env=core_only,
                timeout=TIMEOUT,  # tail must end on its own: the path closes the stream's source
            )
            shown = "lowtide " + " ".join(command)
            assert done.returncode == 0, f"{shown} exited {done.returncode}: {done.stderr}"
            outputs.append(done.stdout)
        assert outputs[-1].strip() == path.expected.strip(), (
            f"{shown} printed\n{outputs[-1]}\nthe README shows\n{path.expected}"
        )
