"""Makes this interpreter one where only ``pip install lowtide`` ran: the packages of the extras
([spark], [ray], [bench]) and the test tools cannot be imported. Put on PYTHONPATH by a test."""

import sys
from importlib.abc import MetaPathFinder

EXTRAS = frozenset({"pyspark", "pandas", "ray", "matplotlib", "pytest", "hypothesis"})


class _OnlyTheCore(MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r} (an extra, not installed)", name=name)


sys.meta_path.insert(0, _OnlyTheCore())
