"""What every test run shares: the hypothesis profiles, the tier markers, the suite's options.

Invariants: a plain run draws the same hypothesis examples every time (profile ``derandomized``;
``make test-explore`` loads ``explore``, which draws new ones from ``--hypothesis-seed``), and
every test under ``tests/integration``, ``tests/fuzz``, ``tests/property`` and ``tests/nexmark``
carries the marker of its folder's tier (collection fails otherwise). Test helpers (reference.py,
strategies.py, harness.py; server_harness.py in tests/integration) import by name.
"""

import os
import sys
from collections.abc import Generator
from pathlib import Path

import pytest
from hypothesis import settings

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(1, str(TESTS / "integration"))  # server_harness, for tests/nexmark's servers too
sys.path.append(str(TESTS.parent / "bench" / "nexmark"))  # nexmark_compare, shared with the bench

# Every socket on loopback: Ray reads this when it is imported (a test imports it before any Ray
# test runs) and then puts a cluster started here, and every driver, on 127.0.0.1 rather than on
# the machine's interface address. The servers the tests start inherit it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Ray's token authentication finds its token here, for every cluster, driver and server the
# tests start, rather than making one in the user's ~/.ray (tests never change the machine).
os.environ.setdefault("RAY_AUTH_TOKEN", "lowtide-tests-" + "0" * 32)

# The folders whose tests carry the marker of that name (pyproject.toml declares them); unit
# tests need none.
TIERS = ("integration", "fuzz", "property", "nexmark")

# A property's failure is shown with the blob that replays it (@reproduce_failure); the
# examples do not depend on the machine's speed (no deadline).
settings.register_profile("derandomized", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, deadline=None, print_blob=True)
settings.load_profile("derandomized")  # --hypothesis-profile explore (make test-explore) overrides


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lowtide")
    group.addoption("--fault-runs", type=int, default=3, help="scenarios of tests/integration/test_faults.py")
    group.addoption("--fault-seed", type=int, default=0, help="the first scenario's seed")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A test module of a tier folder whose tests lack the tier's marker fails to collect:
    ``-m 'not integration'`` must mean what it says."""
    report = yield
    tier = tier_of(collector.path) if isinstance(collector, pytest.Module) else None
    if tier is None or report.outcome != "passed":
        return report
    unmarked = [node.name for node in report.result if node.get_closest_marker(tier) is None]
    if unmarked:
        report.outcome = "failed"
        report.longrepr = f"tests without @pytest.mark.{tier} (pytestmark): {', '.join(unmarked)}"
        report.result = []
    return report


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (make test), a test of an ``xdist_group`` must carry its group in
    its id, which is how xdist keeps the group on one worker: without it the Ray tests, say, run
    on both workers at once, two clusters side by side (pytest 9.2 broke this; pyproject pins
    below it). Fail the run at once rather than let such tests race."""
    if not config.getoption("loadgroup", default=False):  # set in each xdist worker
        return
    lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup does not group {len(lost)} tests (e.g. {lost[0]}): this pytest "
            f"({pytest.__version__}) and pytest-xdist do not work together; see pyproject.toml"
        )


def tier_of(path: Path) -> str | None:
    """The tier marker a test file needs, from its folder under tests/ (None: unit)."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None
