"""The rooms hold what their names say, read from the source with ``ast``.

* The engine (the folders ``lowtide/``, ``operators/`` and ``punctuation/``) imports neither
  ``lowtide.server`` nor ``lowtide.clients``, at run time or for typing.
* The clients import nothing of ``lowtide.server`` but through one seam: ``lowtide serve`` runs
  the server's own entry, ``lowtide.server.serve.main``, imported inside the command's
  ``_serve`` only (every other command, and every user of the clients, loads no server module).
* No import cycle among the product's modules, counting the imports for typing too (a cycle
  through annotations ties two modules together as much), except a package ``__init__``'s lazy
  re-exports (PEP 562: what it imports under ``if TYPE_CHECKING:`` or names in a
  ``lowtide.lazy.loader`` map it loads on first use).
* The checkpoint's modules see the front through their collaborators: they do not import
  ``lowtide.server.front``, not even for typing.
* The server talks to its runner through the door: no module of ``server/`` reads an attribute
  ``runner`` (``door.runner.queries``, ``front.door.runner``) but the door's own
  (``lowtide.server.server_door``) and the runner's (``lowtide.server.process_runner``, whose
  dispatches hold it).
* The planner loads no operator. The planner is every module of ``lowtide/query/`` but the build
  side (:data:`BUILD_SIDE`: what takes live operators - building, the plan it makes, its
  checkpoints, the late rules compiled for its Inputs, the live slices). An operator module is
  ``operators/base.py`` (the class every operator derives from) and every module of
  ``operators/`` that imports it, directly or through others: each operator's module is one. No
  import of a planner module, followed through every module it reaches (for typing too), reaches
  an operator module. Of ``operators/`` the planner reads data alone (window definitions, join
  windows, aggregate calls, placement-free result columns); operators are built from a
  description by the build registry (``operators/build_registry.py``), beside them.

An import is any the interpreter can make: ``import``, ``from ... import`` (relative ones
resolved), ``importlib.import_module`` and ``__import__`` with a constant name, and the modules a
``lowtide.lazy.loader`` map names. One whose name the check cannot read fails it. Each rule has a
planted violation the check must catch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each folder of the product and the name it is installed under (pyproject's package-dir).
PACKAGES = {
    "lowtide": ROOT / "lowtide",
    "lowtide.operators": ROOT / "operators",
    "lowtide.punctuation": ROOT / "punctuation",
    "lowtide.server": ROOT / "server",
    "lowtide.clients": ROOT / "clients",
}
ENGINE = ("lowtide", "lowtide.operators", "lowtide.punctuation")
# The clients' one way into the server: (module, function) -> the server module it may import.
SEAMS = {("lowtide.clients.cli.commands", "_serve"): "lowtide.server.serve"}
# Modules that import by a name they compute: lowtide.lazy's loader imports what its callers'
# maps name, and those maps are read where ``loader`` is called.
COMPUTED = {"lowtide.lazy"}
IMPORTERS = ("import_module", "__import__")


class Unreadable(Exception):
    """An import the check cannot name: passing over it would leave a hole."""


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    if isinstance(test, ast.Attribute):  # typing.TYPE_CHECKING
        return test.attr == "TYPE_CHECKING"
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _callee(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):  # importlib.import_module, lazy.loader
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _from_base(node: ast.ImportFrom, module: str, package: bool) -> str:
    """The full name ``from <base> import ...`` reads from in ``module``: a relative one (level 1
    is the package ``module`` is in, or ``module`` itself if it is a package's ``__init__``)."""
    if node.level == 0:
        assert node.module is not None
        return node.module
    parts = module.split(".") if package else module.split(".")[:-1]
    if node.level > len(parts):
        raise Unreadable(f"{module}, line {node.lineno}: a relative import above the top package")
    return ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])


def _lazy_map(call: ast.Call, where: str) -> Iterator[str]:
    """The modules of a ``loader(package, {attribute: module, ...}, globals())`` map; an entry may
    be ``**dict.fromkeys((attribute, ...), module)``."""
    names = next(
        (k.value for k in call.keywords if k.arg == "names"), call.args[1] if call.args[1:] else None
    )
    if not isinstance(names, ast.Dict):
        raise Unreadable(f"{where}: a lazy loader's map that is not written out")
    for key, value in zip(names.keys, names.values, strict=True):
        if key is None and isinstance(value, ast.Call) and _callee(value.func) == "fromkeys":
            value = value.args[-1]
        if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
            raise Unreadable(f"{where}: a lazy loader's map names a module by a computed name")
        yield value.value


def import_sites(
    source: str, module: str, *, package: bool = False, typing: bool = True, lazy: bool = True
) -> set[tuple[str, str]]:
    """What ``module`` (its ``source``; ``package``: it is a package's ``__init__``) imports, anywhere
    in it: (the full name, the function it is imported in, "" at module level). ``from a import b``
    counts ``a`` and ``a.b`` (``b`` may be a module). ``typing=False`` leaves out what is under
    ``if TYPE_CHECKING:``, ``lazy=False`` the modules of a ``lowtide.lazy.loader`` map."""
    tree = ast.parse(source, module)
    importers, loaders = set(IMPORTERS), {"loader"}
    for node in ast.walk(tree):  # the names these functions are imported under
        if isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, package)
            for alias in node.names:
                if (base, alias.name) == ("importlib", "import_module"):
                    importers.add(alias.asname or alias.name)
                elif (base, alias.name) == ("lowtide.lazy", "loader"):
                    loaders.add(alias.asname or alias.name)
    sites: set[tuple[str, str]] = set()

    def visit(node: ast.AST, function: str) -> None:
        where = f"{module}, line {getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            sites.update((alias.name, function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, package)
            sites.add((base, function))
            sites.update((f"{base}.{alias.name}", function) for alias in node.names)
        elif isinstance(node, ast.Call) and _callee(node.func) in importers:
            name = node.args[0] if node.args else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value[:1] != ".":
                sites.add((name.value, function))
            elif module not in COMPUTED:
                raise Unreadable(f"{where}: an import by a name the check cannot read")
        elif isinstance(node, ast.Call) and _callee(node.func) in loaders:
            names = set(_lazy_map(node, where))  # read even when left out: an unreadable map fails
            if lazy:
                sites.update((name, function) for name in names)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.If) and not typing and _is_type_checking(node):
            for child in node.orelse:
                visit(child, function)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "")
    return sites


def imports_of(source: str, module: str, **options: bool) -> set[str]:
    """The full names ``module`` imports (:func:`import_sites`' options)."""
    return {name for name, _ in import_sites(source, module, **options)}


def imported(path: Path, module: str, **options: bool) -> set[str]:
    return imports_of(path.read_text(), module, package=path.stem == "__init__", **options)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def modules(packages: Mapping[str, Path] = PACKAGES) -> dict[str, Path]:
    """Every module of the product (of ``packages``: name -> folder), by its installed name."""
    found: dict[str, Path] = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def engine_breaks(packages: Mapping[str, Path] = PACKAGES) -> set[str]:
    """Each import of the server or the clients by a module of the engine's folders."""
    return {
        f"{name} imports {target}"
        for name, path in modules({p: packages[p] for p in ENGINE}).items()
        for target in imported(path, name)
        if _within(target, "lowtide.server") or _within(target, "lowtide.clients")
    }


def client_breaks(packages: Mapping[str, Path] = PACKAGES) -> set[str]:
    """Each import of the server by a module of the clients, but through a seam of :data:`SEAMS`."""
    return {
        f"{name} imports {target}" + (f" in {function}" if function else "")
        for name, path in modules({"lowtide.clients": packages["lowtide.clients"]}).items()
        for target, function in import_sites(path.read_text(), name, package=path.stem == "__init__")
        if _within(target, "lowtide.server") and not _within(target, SEAMS.get((name, function), "\0"))
    }


def test_the_engine_imports_neither_the_server_nor_the_clients() -> None:
    engine = modules({p: PACKAGES[p] for p in ENGINE})
    # the engine is there to be read, each folder of it
    assert {"lowtide.door", "lowtide.operators.meld", "lowtide.punctuation.model"} <= engine.keys()
    assert engine_breaks() == set()


def test_the_clients_reach_the_server_only_through_the_serve_seam() -> None:
    assert client_breaks() == set()
    commands = PACKAGES["lowtide.clients"] / "cli" / "commands.py"
    seam = import_sites(commands.read_text(), "lowtide.clients.cli.commands")
    assert ("lowtide.server.serve.main", "_serve") in seam  # the seam is there, and what it is


# -- planted violations: each must fail the check ---------------------------------------------------
def plant(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    """A product of the files given (paths under the repository's folders), for the checks."""
    packages = {name: tmp_path / folder.name for name, folder in PACKAGES.items()}
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return packages


# case -> (the planted file, its text, what the check must say: "<module> imports <each name>")
PLANTED_ENGINE = {
    "core imports the server": (
        "lowtide/query/planted.py",
        "def f():\n    from lowtide.server.front import Front\n",
        "lowtide.query.planted",
        ["lowtide.server.front", "lowtide.server.front.Front"],
    ),
    "operators/ imports the clients for typing": (
        "operators/planted.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lowtide.clients\n",
        "lowtide.operators.planted",
        ["lowtide.clients"],
    ),
    "punctuation/ imports the server": (
        "punctuation/planted.py",
        "import lowtide.server.hub\n",
        "lowtide.punctuation.planted",
        ["lowtide.server.hub"],
    ),
    "a relative import": (
        "lowtide/query/planted.py",
        "from ..server import front\n",
        "lowtide.query.planted",
        ["lowtide.server", "lowtide.server.front"],
    ),
    "a relative import from a package": (
        "operators/sub/__init__.py",
        "from ...clients import client\n",
        "lowtide.operators.sub",
        ["lowtide.clients", "lowtide.clients.client"],
    ),
    "importlib.import_module": (
        "lowtide/planted.py",
        "import importlib\n\ndef f():\n    return importlib.import_module('lowtide.server.front')\n",
        "lowtide.planted",
        ["lowtide.server.front"],
    ),
    "import_module under another name": (
        "lowtide/planted.py",
        "from importlib import import_module as load\nload('lowtide.clients.client')\n",
        "lowtide.planted",
        ["lowtide.clients.client"],
    ),
    "a lazy loader's map": (
        "lowtide/planted/__init__.py",
        "from lowtide.lazy import loader\n"
        "__getattr__ = loader(__name__, {'Front': 'lowtide.server.front'}, globals())\n",
        "lowtide.planted",
        ["lowtide.server.front"],
    ),
    "a lazy loader's map by dict.fromkeys": (
        "punctuation/planted.py",
        "from lowtide import lazy\n"
        "__getattr__ = lazy.loader(__name__, names={**dict.fromkeys(('A', 'B'), 'lowtide.clients.spark')},"
        " namespace=globals())\n",
        "lowtide.punctuation.planted",
        ["lowtide.clients.spark"],
    ),
}


@pytest.mark.parametrize("case", PLANTED_ENGINE)
def test_the_engine_check_catches_a_planted_import(tmp_path: Path, case: str) -> None:
    relative, text, module, names = PLANTED_ENGINE[case]
    packages = plant(tmp_path, {relative: text, "lowtide/fine.py": "import lowtide.errors\n"})
    assert engine_breaks(packages) == {f"{module} imports {name}" for name in names}


PLANTED_CLIENTS = {
    "the clients import the server": (
        "clients/planted.py",
        "from lowtide.server.config import ServerConfig\n",
        "lowtide.clients.planted",
        ["lowtide.server.config", "lowtide.server.config.ServerConfig"],
    ),
    "relative, from the CLI": (
        "clients/cli/planted.py",
        "def f():\n    from ...server import front\n",
        "lowtide.clients.cli.planted",
        ["lowtide.server in f", "lowtide.server.front in f"],
    ),
    "importlib.import_module": (
        "clients/planted.py",
        "import importlib\nimportlib.import_module('lowtide.server.serve')\n",
        "lowtide.clients.planted",
        ["lowtide.server.serve"],
    ),
    "the seam's module, outside the seam's function": (
        "clients/cli/commands.py",
        "import lowtide.server.serve\n\ndef _serve(args):\n    from lowtide.server.serve import main\n",
        "lowtide.clients.cli.commands",
        ["lowtide.server.serve"],
    ),
    "the seam's function, another server module": (
        "clients/cli/commands.py",
        "def _serve(args):\n    from lowtide.server import front\n",
        "lowtide.clients.cli.commands",
        ["lowtide.server in _serve", "lowtide.server.front in _serve"],
    ),
    "a lazy loader's map": (
        "clients/planted/__init__.py",
        "from lowtide.lazy import loader\n"
        "__getattr__ = loader(__name__, {'Front': 'lowtide.server.front'}, globals())\n",
        "lowtide.clients.planted",
        ["lowtide.server.front"],
    ),
}


@pytest.mark.parametrize("case", PLANTED_CLIENTS)
def test_the_clients_check_catches_a_planted_import(tmp_path: Path, case: str) -> None:
    relative, text, module, names = PLANTED_CLIENTS[case]
    packages = plant(tmp_path, {relative: text, "clients/fine.py": "from lowtide.errors import NotFound\n"})
    assert client_breaks(packages) == {f"{module} imports {name}" for name in names}


@pytest.mark.parametrize(
    "text",
    [
        "import importlib\nname = 'lowtide.server'\nimportlib.import_module(name)\n",
        "__import__('lowtide.' + 'server')\n",
        "from importlib import import_module\nimport_module('.front', 'lowtide.server')\n",
        "from lowtide.lazy import loader\n__getattr__ = loader(__name__, MAP, globals())\n",
        "from lowtide.lazy import loader\n__getattr__ = loader(__name__, {'A': NAME}, globals())\n",
        "from .... import x\n",
    ],
)
def test_an_import_the_check_cannot_name_fails_it(text: str) -> None:
    with pytest.raises(Unreadable):
        imports_of(text, "lowtide.query.planted")


@pytest.mark.parametrize(
    ("text", "module", "package", "names"),
    [
        ("from . import a", "lowtide.query.plan", False, {"lowtide.query", "lowtide.query.a"}),
        ("from . import a", "lowtide.query", True, {"lowtide.query", "lowtide.query.a"}),
        ("from .b import c", "lowtide.query.plan", False, {"lowtide.query.b", "lowtide.query.b.c"}),
        ("from ..errors import E", "lowtide.query.plan", False, {"lowtide.errors", "lowtide.errors.E"}),
        ("from .. import x", "lowtide.query", True, {"lowtide", "lowtide.x"}),
    ],
)
def test_relative_imports_resolve_to_full_names(
    text: str, module: str, package: bool, names: set[str]
) -> None:
    assert imports_of(text, module, package=package) == names


def product_imports(packages: Mapping[str, Path] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the product's modules it imports (a package ``__init__``: at run time only), of
    the product in ``packages``."""
    found = modules(packages)
    return {
        name: (imported(path, name, typing=eager, lazy=eager) & found.keys()) - {name}
        for name, path in found.items()
        for eager in [path.stem != "__init__"]
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


# The modules that may read ``.runner``: the door that owns it, and the runner's own module.
RUNNER_KEEPERS = {"lowtide.server.server_door", "lowtide.server.process_runner"}


def runner_reaches(packages: Mapping[str, Path] = PACKAGES) -> set[str]:
    """Each ``<expression>.runner`` in a module of the server but :data:`RUNNER_KEEPERS`."""
    found = set()
    for name, path in modules({"lowtide.server": packages["lowtide.server"]}).items():
        if name in RUNNER_KEEPERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if isinstance(node, ast.Attribute) and node.attr == "runner":
                found.add(f"{name}, line {node.lineno}: .runner")
    return found


def test_the_server_reaches_its_runner_through_the_door_only() -> None:
    assert runner_reaches() == set()


@pytest.mark.parametrize(
    "text",
    [
        "def f(front):\n    return front.door.runner.queries\n",
        "def f(self):\n    runner = self.door.runner\n    runner.request_stats()\n",
        "def f(door):\n    door.runner.recording = None\n",
    ],
)
def test_the_runner_check_catches_a_planted_reach(tmp_path: Path, text: str) -> None:
    fine = "def g(runner):\n    return runner.queries  # a runner of its own: no reach through\n"
    packages = plant(tmp_path, {"server/planted.py": text, "server/fine.py": fine})
    (planted,) = runner_reaches(packages)
    assert planted.startswith("lowtide.server.planted, line ")


def test_the_checkpoint_modules_do_not_reach_for_the_front() -> None:
    """``front <-> checkpoint coordinator <-> front snapshot`` was a cycle through typing: the
    front was handed whole. They take the parts they use instead."""
    graph = product_imports()
    for name in ("lowtide.server.checkpoint_coordinator", "lowtide.server.front_snapshot"):
        assert "lowtide.server.front" not in graph[name], name


# -- the planner loads no operator -----------------------------------------------------------------
# The modules of lowtide/query/ that take live operators: everything else there is the planner.
BUILD_SIDE = {
    "lowtide.query.build",
    "lowtide.query.plan",
    "lowtide.query.plan_state",
    "lowtide.query.late_rules",
    "lowtide.query.live_shares",
}
OPERATOR_BASE = "lowtide.operators.base"


def _paths(graph: Mapping[str, set[str]], start: str) -> dict[str, list[str]]:
    """Each module ``start`` reaches, and one shortest chain of imports to it (breadth first)."""
    paths = {start: [start]}
    queue = [start]
    for node in queue:
        for target in sorted(graph[node]):
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    return paths


def planner_breaks(packages: Mapping[str, Path] = PACKAGES) -> set[str]:
    """Each operator module a planner module reaches: ``"<planner> loads <operator>: a -> b -> c"``."""
    graph = product_imports(packages)
    operators = {
        name for name in graph if _within(name, "lowtide.operators") and OPERATOR_BASE in _paths(graph, name)
    }
    planner = [name for name in graph if _within(name, "lowtide.query") and name not in BUILD_SIDE]
    return {
        f"{name} loads {target}: {' -> '.join(path)}"
        for name in planner
        for target, path in _paths(graph, name).items()
        if target in operators
    }


def test_the_planner_loads_no_operator() -> None:
    graph = product_imports()
    planner = {name for name in graph if _within(name, "lowtide.query")} - BUILD_SIDE
    # the planner is there to be read, and the build side is what this file says it is
    assert {
        "lowtide.query.describe",
        "lowtide.query.description",
        "lowtide.query.strategies",
        "lowtide.query.sharing",
        "lowtide.query.graph",
    } <= planner
    assert graph.keys() >= BUILD_SIDE
    assert "lowtide.operators.wid_aggregate" in _paths(graph, "lowtide.query.build")  # it does build
    assert planner_breaks() == set()


# case -> the planted files, and what the check must say
PLANTED_PLANNER = {
    "a planner module imports an operator": (
        {"lowtide/query/planted.py": "from lowtide.operators.wid_aggregate import WIDAggregate\n"},
        [
            "lowtide.query.planted loads lowtide.operators.wid_aggregate: "
            "lowtide.query.planted -> lowtide.operators.wid_aggregate",
            "lowtide.query.planted loads lowtide.operators.base: "
            "lowtide.query.planted -> lowtide.operators.wid_aggregate -> lowtide.operators.base",
        ],
    ),
    "for typing only": (
        {
            "lowtide/query/planted.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from lowtide.operators.base import Operator\n"
        },
        [
            "lowtide.query.planted loads lowtide.operators.base: "
            "lowtide.query.planted -> lowtide.operators.base"
        ],
    ),
    "through a data module that imports an operator": (
        {
            "lowtide/query/planted.py": "from lowtide.operators.join_windows import Band\n",
            "operators/join_windows.py": "from lowtide.operators import base\n",
        },
        [
            "lowtide.query.planted loads lowtide.operators.join_windows: "
            "lowtide.query.planted -> lowtide.operators.join_windows",
            "lowtide.query.planted loads lowtide.operators.base: "
            "lowtide.query.planted -> lowtide.operators.join_windows -> lowtide.operators.base",
        ],
    ),
    "through the build side, in a function": (
        {"lowtide/query/planted.py": "def f():\n    from lowtide.query import build\n"},
        [
            "lowtide.query.planted loads lowtide.operators.wid_aggregate: "
            "lowtide.query.planted -> lowtide.query.build -> lowtide.operators.wid_aggregate",
            "lowtide.query.planted loads lowtide.operators.base: lowtide.query.planted -> "
            "lowtide.query.build -> lowtide.operators.wid_aggregate -> lowtide.operators.base",
        ],
    ),
    "the build registry, by importlib": (
        {
            "lowtide/query/planted.py": "import importlib\n"
            "importlib.import_module('lowtide.operators.build_registry')\n",
            "operators/build_registry.py": "from ..operators.wid_aggregate import WIDAggregate\n",
        },
        [
            "lowtide.query.planted loads lowtide.operators.build_registry: "
            "lowtide.query.planted -> lowtide.operators.build_registry",
            "lowtide.query.planted loads lowtide.operators.wid_aggregate: "
            "lowtide.query.planted -> lowtide.operators.build_registry -> lowtide.operators.wid_aggregate",
            "lowtide.query.planted loads lowtide.operators.base: lowtide.query.planted -> "
            "lowtide.operators.build_registry -> lowtide.operators.wid_aggregate -> lowtide.operators.base",
        ],
    ),
}


@pytest.mark.parametrize("case", PLANTED_PLANNER)
def test_the_planner_check_catches_a_planted_operator(tmp_path: Path, case: str) -> None:
    planted, says = PLANTED_PLANNER[case]
    product = {  # an operator, a data module, the build side building and a planner reading data
        "operators/base.py": "class Operator: ...\n",
        "operators/wid_aggregate.py": "from lowtide.operators.base import Operator\n",
        "operators/windows.py": "import math\n",
        "lowtide/query/build.py": "from lowtide.operators.wid_aggregate import WIDAggregate\n",
        "lowtide/query/fine.py": "from lowtide.operators import windows\nimport lowtide.query.graph\n",
        "lowtide/query/graph.py": "from lowtide.errors import UnsupportedQuery\n",
    }
    packages = plant(tmp_path, {**product, **planted})
    assert planner_breaks(packages) == set(says)
