"""Every exception a user can meet is named by a public module in its traceback (issue 22, item 12).

``lowtide.clients._wire.ServerUnavailable`` in a traceback sends a reader to a private module; the
classes live in :mod:`lowtide.errors` and are re-exported by ``lowtide`` and ``lowtide.clients``.
"""

from __future__ import annotations

import lowtide
import lowtide.clients
import lowtide.clients.spark  # loads every client-side module
from lowtide import errors
from lowtide.errors import LowtideError


def _subclasses(kind: type[BaseException]) -> set[type[BaseException]]:
    found = {kind}
    for sub in kind.__subclasses__():
        found |= _subclasses(sub)
    return found


def _exported() -> set[type[BaseException]]:
    exported: set[type[BaseException]] = set()
    for module in (lowtide, lowtide.clients):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                exported.add(value)
    return exported


def test_every_exception_names_a_public_module() -> None:
    private = {
        f"{kind.__module__}.{kind.__qualname__}"
        for kind in _subclasses(LowtideError) | _exported()
        if any(part.startswith("_") for part in kind.__module__.split("."))
    }
    assert not private


def test_every_class_of_lowtide_errors_is_exported_by_the_package() -> None:
    classes = {v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, LowtideError)}
    missing = {kind.__name__ for kind in classes if getattr(lowtide, kind.__name__, None) is not kind}
    assert not missing


def test_the_clients_errors_come_from_lowtide_errors() -> None:
    for name in ("ServerUnavailable", "DeadlineExceeded", "ServerError"):
        assert getattr(lowtide.clients, name).__module__ == "lowtide.errors"
