"""Package attributes loaded on first use (PEP 562): a package re-exports what a heavy module
defines without importing that module until someone reads the attribute.

Invariant: each attribute is imported once, then kept in the package's namespace, so later reads
are plain lookups that never reach the loader again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def loader(package: str, names: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps each attribute to the module that
    defines it; ``namespace`` is the package's ``globals()``."""

    def load(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return load
