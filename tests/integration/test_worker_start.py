"""A worker that cannot start is started again a bounded number of times, then the server stops.

The server here runs from a main script that a worker cannot import again (every worker, a fork of
the fork server, imports the parent's main module as ``__mp_main__``): every worker dies before it
serves, as with a broken main module in production. No mock: the real front, real worker processes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MAIN = """
import sys

if __name__ != "__main__":  # a worker importing the main module again: it cannot start
    raise RuntimeError("this main module refuses to be imported by a worker")

from lowtide.server.config import ServerConfig
from lowtide.server.serve import serve

sys.exit(serve(ServerConfig.load(None, host="127.0.0.1", port=0, workers=2, metrics_port=-1)))
"""


def test_workers_that_cannot_start_stop_the_server_naming_the_cause(tmp_path: Path) -> None:
    main = tmp_path / "broken_main.py"
    main.write_text(MAIN)
    done = subprocess.run([sys.executable, str(main)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    # One line of the server's says why. Another worker's traceback may share its line on the
    # pipe (both processes write the same stderr), so the line is found, not split out.
    stops = re.findall(
        r"lowtide: worker [01] cannot start: it exited with code 1 3 times in a row "
        r"\(its error is above\); stopping",
        done.stderr,
    )
    assert len(stops) == 1, done.stderr[-2000:]
    # The worker's own error is what the line points to, and it is there.
    assert "RuntimeError: this main module refuses to be imported by a worker" in done.stderr
