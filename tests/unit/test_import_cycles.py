"""No import cycle among the modules of lowtide.query and lowtide.operators.

Read from the source with ``ast``: a module's imports at its top level, those under ``if
TYPE_CHECKING:`` included (a cycle through annotations ties two modules together as much; the
imports inside a function run when it is called and do not count).
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from pathlib import Path

import lowtide.operators
import lowtide.query

PACKAGES = {"lowtide.query": lowtide.query, "lowtide.operators": lowtide.operators}


def modules() -> dict[str, Path]:
    found = {}
    for name, package in PACKAGES.items():
        found[name] = Path(package.__file__ or "")
        for info in pkgutil.iter_modules(package.__path__):
            spec = importlib.util.find_spec(f"{name}.{info.name}")
            assert spec is not None and spec.origin is not None
            found[f"{name}.{info.name}"] = Path(spec.origin)
    return found


def imported(tree: ast.Module, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``tree`` imports at its top level."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
                out.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return out & known


def graph() -> dict[str, set[str]]:
    files = modules()
    known = set(files)
    return {name: imported(ast.parse(path.read_text()), known) - {name} for name, path in files.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges``, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_query_and_operator_modules_import_without_a_cycle() -> None:
    edges = graph()
    assert "lowtide.query.planner" in edges and "lowtide.operators.shared_slices" in edges
    assert cycle(edges) is None, " -> ".join(cycle(edges) or [])


def test_the_check_finds_a_cycle() -> None:
    edges = graph()
    # shared_slices knew its readers' class (under TYPE_CHECKING) before SliceReader
    edges["lowtide.operators.shared_slices"].add("lowtide.operators.paned_wid")
    assert cycle(edges) == [
        "lowtide.operators.paned_wid",
        "lowtide.operators.shared_slices",
        "lowtide.operators.paned_wid",
    ]
