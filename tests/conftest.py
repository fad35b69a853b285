"""Test helpers (reference.py, strategies.py, harness.py) import by name from this folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
