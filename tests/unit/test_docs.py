"""README.md and docs/: links resolve, the first lines are the two commands, no page names what a
reader cannot look up, the configuration table is the server's, and the sample file is readable.

Links and anchors are checked as GitHub renders them: a relative link is a path from the page's
folder, ``#anchor`` a heading's slug (lowercased, punctuation dropped, spaces to hyphens, ``-1``,
``-2`` ... for repeats). Code (fenced blocks and inline spans) is skipped: it shows text, it does
not link.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pyarrow as pa
import pytest
import readme_path

from lowtide.clients.cli import build_parser
from lowtide.clients.cli.io import read_batches
from lowtide.schema import Schema, check
from lowtide.server.config import ServerConfig

ROOT = readme_path.ROOT
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# What a reader of the repository cannot follow: the design contract and the issue tracker are
# not part of it, and a benchmark is named by its script, not by a letter.
INTERNAL = {
    "the design contract": re.compile(r"\bDESIGN\b"),
    "a section sign": re.compile("§"),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "a seed document": re.compile(r"\bseed \d{3}\b", re.I),
    "an experiment letter": re.compile(r"\bexperiment \(", re.I),
}


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set()
    for match in re.finditer(r"^#{1,6} (.+)$", text, re.M):
        base = slug(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_the_pages_exist() -> None:
    names = {page.name for page in PAGES}
    for name in ("queries", "late-data", "durability", "security", "spark", "operations", "benchmarks"):
        assert f"{name}.md" in names, f"docs/{name}.md is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved.relative_to(ROOT)}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_a_reader_cannot_follow(page: Path) -> None:
    found = [
        f"{what} in line {n}: {line.strip()!r}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        for what, pattern in INTERNAL.items()
        if pattern.search(line)
    ]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_the_readme_begins_with_make_demo_and_make_test() -> None:
    first = (ROOT / "README.md").read_text().splitlines()[:8]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for command in ("make demo", "make test"):
        assert any(line.startswith(command) for line in first), f"README's first lines lack {command!r}"
        assert command.split()[1] in targets, f"{command!r} is not a Makefile target"


def test_the_five_minute_path_uses_what_the_repository_has() -> None:
    path = readme_path.path()
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert set(path.make_targets) <= targets, path.make_targets
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("lowtide") == "lowtide.clients.cli:main"  # what `make setup` puts in .venv/bin
    parser = build_parser()
    for command in [["serve", *path.serve], *path.commands]:
        parser.parse_args(command)  # SystemExit (a usage error) fails the test


def test_the_sample_file_reads_with_the_schema_the_readme_creates() -> None:
    path = readme_path.path()
    parser = build_parser()
    create = parser.parse_args(next(c for c in path.commands if c[:2] == ["stream", "create"]))
    send = parser.parse_args(next(c for c in path.commands if c[0] == "send"))
    assert send.stream == create.name
    sample = ROOT / send.file
    assert sample.is_relative_to(ROOT / "examples") and sample.exists(), sample
    header = sample.read_text().splitlines()[0].split(",")
    assert header == list(create.schema), "the sample's header row names the stream's columns"
    table = pa.concat_tables(read_batches(str(sample), create.schema, send.batch_rows))
    assert table.num_rows > 0
    check(table, Schema.of(create.schema, create.progressing))  # what the producer and the door check
    shown = path.expected.strip().splitlines()[1:]
    assert len(shown) > 0 and all(line.split()[2] in set(table["srcIP"].to_pylist()) for line in shown)


def test_the_configuration_table_is_the_servers() -> None:
    text = readme_path.section((ROOT / "docs" / "operations.md").read_text(), "## Configuration")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    documented = [key for row in rows for key in re.findall(r"`(\w+)`", row.split("|")[1])]
    assert len(documented) == len(set(documented)), f"a key is listed twice: {documented}"
    keys = {f.name for f in fields(ServerConfig)}
    assert set(documented) - keys == set(), "documented but not a ServerConfig key"
    assert keys - set(documented) == set(), "ServerConfig keys missing from docs/operations.md"
    defaults = ServerConfig()
    for row in rows:
        key, default = (cell.strip().strip("`") for cell in row.split("|")[1:3])
        if key != "workers":  # the number of cores
            assert tomllib.loads(f"v = {default}")["v"] == getattr(defaults, key), f"default of {key}"


def test_the_module_map_is_the_code() -> None:
    """docs/development.md's module map names every module of the product, and only modules that
    exist: under each folder's heading (a line that begins with it), a table row's backquoted
    ``x.py`` is that folder's file, and a ``sub/`` before it names its subfolder."""
    page = (ROOT / "docs" / "development.md").read_text()
    section = page[page.index("### Module map") :]
    folders = {"lowtide", "operators", "punctuation", "server", "clients"}
    folder = ""
    named: set[Path] = set()
    for line in section.splitlines():
        tokens = re.findall(r"`([\w./]+)`", line)
        if line.startswith("`") and tokens and tokens[0].rstrip("/") in folders:
            folder = tokens.pop(0).rstrip("/")
        sub = ""
        for token in tokens:
            if token.endswith("/"):
                sub = token
            elif token.endswith((".py", ".lark")) and folder:
                named.add(Path(folder) / sub / token)
    missing = sorted(str(p) for p in named if not (ROOT / p).exists())
    assert not missing, f"the module map names files that do not exist: {missing}"
    modules = {
        p.relative_to(ROOT) for f in folders for p in (ROOT / f).rglob("*.py") if p.name != "__init__.py"
    }
    unnamed = sorted(str(p) for p in modules - named)
    assert not unnamed, f"the module map does not name: {unnamed}"
