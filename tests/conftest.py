"""Test helpers (reference.py, strategies.py, harness.py) import by name from this folder."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lowtide")
    group.addoption("--fault-runs", type=int, default=3, help="scenarios of tests/integration/test_faults.py")
    group.addoption("--fault-seed", type=int, default=0, help="the first scenario's seed")
