"""Every class of the product has a name of its own, read from the source with ``ast``.

Two classes of one name (``Batch`` the engine's columns, ``Batch`` a worker message, ``Batch`` a
log record) make a reader, a traceback and a grep guess which is meant. So no two top-level
classes of the product's folders (``lowtide/``, ``operators/``, ``punctuation/``, ``server/``,
``clients/``) share a name, private ones included. Top-level: in a module's body, or under its
``if``/``try``/``with`` blocks (``if TYPE_CHECKING:``), not inside a function or another class.
The check has a planted duplicate it must catch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("lowtide", "operators", "punctuation", "server", "clients")


def _top_level_classes(body: list[ast.stmt]) -> Iterator[ast.ClassDef]:
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, ast.If | ast.With):
            yield from _top_level_classes(node.body)
            yield from _top_level_classes(node.orelse if isinstance(node, ast.If) else [])
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _top_level_classes(block)


def shared_names(sources: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The class names defined more than once among ``(place, source text)``: name -> places."""
    places: dict[str, list[str]] = {}
    for place, text in sources:
        for node in _top_level_classes(ast.parse(text, place).body):
            places.setdefault(node.name, []).append(f"{place}:{node.lineno}")
    return {name: found for name, found in sorted(places.items()) if len(found) > 1}


def product_sources() -> list[tuple[str, str]]:
    return [
        (path.relative_to(ROOT).as_posix(), path.read_text())
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]


def test_no_two_classes_of_the_product_share_a_name() -> None:
    sources = product_sources()
    assert len(sources) > 100  # the walk found the tree
    assert shared_names(sources) == {}


def test_the_check_catches_a_planted_duplicate() -> None:
    planted = (
        "server/planted.py",
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    class HubSubscription: ...\n"
        "def helper():\n"
        "    class BatchMessage: ...  # inside a function: not top-level\n",
    )
    found = shared_names([*product_sources(), planted])
    hub, where = found["HubSubscription"]
    assert hub.startswith("server/hub.py:") and where == "server/planted.py:3"
    assert "BatchMessage" not in found
