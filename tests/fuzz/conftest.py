"""The fuzz suite imports its helpers by name: ``hostile`` from here, ``server_harness`` and
``wire`` from tests/integration (the real-server half runs a server as those tests do)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
