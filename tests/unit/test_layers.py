"""The rooms hold what their names say, read from the source with ``ast``.

* The core package ``lowtide/`` is the engine: none of its modules imports ``lowtide.server`` or
  ``lowtide.clients``, at run time or for typing.
* No import cycle among the product's modules, counting the imports for typing too (a cycle
  through annotations ties two modules together as much), except a package ``__init__``'s lazy
  re-exports (PEP 562: what it imports under ``if TYPE_CHECKING:`` it loads on first use).
* The checkpoint's modules see the front through their collaborators: they do not import
  ``lowtide.server.front``, not even for typing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "lowtide"
# Each folder of the product and the name it is installed under (pyproject's package-dir).
PACKAGES = {
    "lowtide": CORE,
    "lowtide.operators": ROOT / "operators",
    "lowtide.punctuation": ROOT / "punctuation",
    "lowtide.server": ROOT / "server",
    "lowtide.clients": ROOT / "clients",
}


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if isinstance(test, ast.Attribute):  # typing.TYPE_CHECKING
                name = test.attr
            else:
                name = test.id if isinstance(test, ast.Name) else ""
            if name == "TYPE_CHECKING":
                nodes.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return nodes


def imported(path: Path, typing: bool = True) -> set[str]:
    """The modules ``path`` imports, anywhere in it (functions included), by their full name;
    ``from package import name`` counts as ``package.name`` too (``name`` may be a module).
    ``typing=False`` leaves out the imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if typing else _typing_only(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_the_core_package_imports_neither_the_server_nor_the_clients() -> None:
    modules = sorted(CORE.rglob("*.py"))
    assert len(modules) > 20  # the engine is there to be read
    found = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules
        for name in imported(path)
        if _within(name, "lowtide.server") or _within(name, "lowtide.clients")
    }
    assert not found, sorted(found)


def modules() -> dict[str, Path]:
    """Every module of the product, by its installed name."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def product_imports() -> dict[str, set[str]]:
    """Module -> the product's modules it imports (a package ``__init__``: at run time only)."""
    found = modules()
    return {
        name: (imported(path, typing=path.stem != "__init__") & found.keys()) - {name}
        for name, path in found.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one importing itself
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_cycle_and_only_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_product() -> None:
    graph = product_imports()
    assert {
        "lowtide.server.front",
        "lowtide.operators.shared_slices",
        "lowtide.query.describe",
    } <= graph.keys()
    assert cycles(graph) == []


def test_the_check_sees_a_cycle_the_product_once_had() -> None:
    """Shared Slices knew its readers' class (for typing) before SliceReader."""
    graph = product_imports()
    graph["lowtide.operators.shared_slices"].add("lowtide.operators.paned_wid")
    assert cycles(graph) == [["lowtide.operators.paned_wid", "lowtide.operators.shared_slices"]]


def test_the_checkpoint_modules_do_not_reach_for_the_front() -> None:
    """``front <-> checkpoint coordinator <-> front snapshot`` was a cycle through typing: the
    front was handed whole. They take the parts they use instead."""
    graph = product_imports()
    for name in ("lowtide.server.checkpoint_coordinator", "lowtide.server.front_snapshot"):
        assert "lowtide.server.front" not in graph[name], name
