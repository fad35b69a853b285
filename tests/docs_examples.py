"""Every fenced code block of README.md and docs/*.md, and what the docs-examples test does with it.

``tests/integration/test_docs_examples.py`` runs each page's blocks in order; this module finds
them and classifies them, with no server. A block runs as printed, or the HTML comment right
before its opening fence says why not: a comment that begins ``example:`` (it may span lines,
and must end on the line before the fence). The vocabulary:

Runnable with no marker, by the fence's language:

``python``   run as a script by this interpreter (the venv's), in the page's folder (a temporary
             one linking ``examples/`` and ``.venv``), against the page's server (one worker,
             started when a block first needs it): the default address ``127.0.0.1:50051`` in
             the text becomes the server's (``$LOWTIDE_SERVER`` holds it too), ``127.0.0.1:9464``
             its metrics address.
``sh``       each line (``\\`` continues one) in bash, in the page's folder, with ``lowtide`` on
             the PATH and ``$LOWTIDE_SERVER`` the page's server, the addresses rewritten as for
             python. A line may start only with ``lowtide`` (or ``.venv/bin/lowtide``),
             ``openssl`` or ``curl``: any other command needs a marker. A ``lowtide serve ...``
             line (re)starts the page's server with its options, on free loopback ports (its
             ``--host``, ``--port``, ``--metrics-host`` and ``--metrics-port`` are left out); the
             blocks after it talk to that server.
``toml``     parsed; a file with a ``[tokens]`` table is loaded as ``--tokens`` loads it, any
             other as a server configuration (``lowtide serve --config``).
``sql``      registered on the page's server (then dropped): its streams must exist there.

Markers:

``example: sql over Name(col:type,...) ...`` an ``sql`` block over these streams (``--schema``'s
             syntax; the progressing attribute is ``ts``, else the first timestamp column),
             created for the block and dropped after it; ``nexmark`` names the three streams
             ``lowtide nexmark`` sends (person, auction, bid).
``example: output of the previous block``    what the block before it (which ran) prints, line
             for line (trailing blanks aside).
``example: tested by PATH``                  another test runs it (PATH exists in the repository).
``example: not run — REASON``                not run, and why: Spark, Ray, Docker, Flink, make
             targets, minutes of run time, a listing or an excerpt rather than a command.

Any other block, or a marker outside this vocabulary, fails the test: a new example either runs
or says why it does not (docs/development.md, "Tests").
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

DEFAULT_SERVER = "127.0.0.1:50051"  # rewritten to the page's server
DEFAULT_METRICS = "127.0.0.1:9464"  # rewritten to its metrics address
LOWTIDE = ("lowtide", ".venv/bin/lowtide")
SHELL_COMMANDS = (*LOWTIDE, "openssl", "curl")  # what a shell line may start with
LISTEN_OPTIONS = ("--host", "--port", "--metrics-host", "--metrics-port")  # the test picks these

_FENCE = re.compile(r"^( *)```\s*([\w-]*)")
_NOT_RUN = re.compile(r"not run\s*(?:—|–|-|:)\s*(.*)", re.S)
_TESTED_BY = re.compile(r"tested by (\S+?)[,.;:]?(?:\s|$)")
_STREAM = re.compile(r"(\w+)\(([^)]*)\)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    language: str
    body: str  # dedented as far as the fence is indented
    marker: str | None  # what follows "example:" in the comment right before the fence

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Python:
    block: Block


@dataclass(frozen=True)
class Shell:
    block: Block
    lines: list[str]  # logical lines, continuations joined, blank and comment lines left out


@dataclass(frozen=True)
class Toml:
    block: Block


@dataclass(frozen=True)
class Sql:
    block: Block
    streams: dict[str, dict[str, str]] = field(default_factory=dict)  # created for the block


@dataclass(frozen=True)
class Output:
    block: Block


@dataclass(frozen=True)
class TestedBy:
    block: Block
    path: str


@dataclass(frozen=True)
class NotRun:
    block: Block
    reason: str


Kind = Python | Shell | Toml | Sql | Output | TestedBy | NotRun


class Unclassified(AssertionError):
    """A block the test can neither run nor skip: it needs a marker (or a fix)."""


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of the page, in order, with the marker just before it."""
    lines = (page.read_text() if text is None else text).splitlines()
    found = []
    n = 0
    while n < len(lines):
        match = _FENCE.match(lines[n])
        if match is None:
            n += 1
            continue
        indent, language = len(match[1]), match[2]
        end = n + 1
        while end < len(lines) and not re.match(rf"^ {{0,{indent}}}```\s*$", lines[end]):
            end += 1
        if end == len(lines):
            raise Unclassified(f"{page.relative_to(ROOT)}:{n + 1}: a fence that never closes")
        margin = " " * indent
        body = "\n".join(line.removeprefix(margin) for line in lines[n + 1 : end])
        found.append(Block(page, n + 1, language, body + "\n" if body else "", _marker(lines, n)))
        n = end + 1
    return found


def _marker(lines: list[str], fence: int) -> str | None:
    """The text after ``example:`` of the HTML comment that ends on the line before ``fence``."""
    if fence == 0 or not lines[fence - 1].rstrip().endswith("-->"):
        return None
    start = fence - 1
    while "<!--" not in lines[start]:
        start -= 1
        if start < 0 or fence - start > 12:
            return None
    comment = " ".join(line.strip() for line in lines[start:fence])
    text = comment[comment.index("<!--") + 4 : comment.rindex("-->")].strip()
    return text[len("example:") :].strip() if text.startswith("example:") else None


def shell_lines(body: str) -> list[str]:
    """The commands of a shell block: continuations joined; blank and comment lines left out."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line for line in joined.splitlines() if shlex.split(line, comments=True)]


def words(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def is_serve(line: str) -> bool:
    found = words(line)
    return found[0] in LOWTIDE and found[1:2] == ["serve"]


def serve_options(line: str, folder: Path) -> list[str]:
    """A ``lowtide serve`` line's options for the test's server: the listening ones left out (the
    test's server takes free loopback ports), a background ``&`` dropped, and a value naming a
    file of the page's folder made absolute (the server does not run there)."""
    given = [w for w in words(line)[2:] if w != "&"]
    options: list[str] = []
    skip = False
    for word in given:
        if skip:
            skip = False
        elif word in LISTEN_OPTIONS:
            skip = True
        elif not word.startswith(tuple(f"{o}=" for o in LISTEN_OPTIONS)):
            options.append(
                str(folder / word) if not word.startswith("-") and (folder / word).exists() else word
            )
    return options


def parse_streams(spec: str) -> dict[str, dict[str, str]]:
    """``nexmark`` and ``Name(col:type,...)`` declarations, as name -> schema."""
    streams: dict[str, dict[str, str]] = {}
    rest = spec
    if re.search(r"\bnexmark\b", rest):
        from lowtide.clients.nexmark import SCHEMAS

        for name, schema in SCHEMAS.items():
            streams[name] = {f.name: _type_name(f.type) for f in schema}
        rest = re.sub(r"\bnexmark\b", "", rest)
    for name, columns in _STREAM.findall(rest):
        pairs = [c.split(":", 1) for c in columns.replace(" ", "").split(",") if c]
        if not pairs or any(len(p) != 2 for p in pairs):
            raise Unclassified(f"stream {name}({columns}): write its columns as col:type,col:type")
        streams[name] = {column: kind for column, kind in pairs}
        rest = rest.replace(f"{name}({columns})", "")
    if rest.strip() or not streams:
        raise Unclassified(f"'sql over {spec}': name streams as Name(col:type,...) or nexmark")
    return streams


def _type_name(kind: object) -> str:
    import pyarrow as pa

    assert isinstance(kind, pa.DataType)
    if pa.types.is_timestamp(kind):
        return f"timestamp[{kind.unit}]"
    return {"large_string": "string", "string": "string", "bool": "bool"}.get(str(kind), str(kind))


def progressing(schema: dict[str, str]) -> str:
    """``ts`` if the stream has it, else its first timestamp column."""
    if "ts" in schema:
        return "ts"
    stamps = [c for c, t in schema.items() if t.startswith("timestamp")]
    if not stamps:
        raise Unclassified(f"a stream of {schema} has no ts and no timestamp column to progress on")
    return stamps[0]


def classify(block: Block) -> Kind:
    """What the test does with ``block``; :class:`Unclassified` when it cannot tell."""
    marker, language = block.marker, block.language
    if marker is None:
        if language == "python":
            return Python(block)
        if language == "sh":
            lines = shell_lines(block.body)
            unknown = [line for line in lines if words(line)[0] not in SHELL_COMMANDS]
            if unknown:
                raise Unclassified(
                    f"{block.where}: a shell line the test cannot run: {unknown[0]!r} (lines may start "
                    f"with {', '.join(SHELL_COMMANDS)}); fix it, or mark the block "
                    "<!-- example: not run — REASON -->"
                )
            return Shell(block, lines)
        if language == "toml":
            return Toml(block)
        if language == "sql":
            return Sql(block)
        raise Unclassified(
            f"{block.where}: a ```{language} block with no marker: give it a language the test runs "
            "(python, sh, toml, sql) or the comment line before it: <!-- example: not run — REASON -->, "
            "<!-- example: output of the previous block -->, <!-- example: tested by PATH -->"
        )
    if found := _NOT_RUN.fullmatch(marker):
        reason = found[1].strip()
        if len(reason) < 10:
            raise Unclassified(
                f"{block.where}: 'not run' needs its reason: <!-- example: not run — REASON -->"
            )
        return NotRun(block, reason)
    if found := _TESTED_BY.match(marker):
        if not (ROOT / found[1]).is_file():
            raise Unclassified(f"{block.where}: tested by {found[1]}, which is no file of the repository")
        return TestedBy(block, found[1])
    if marker.startswith("output of the previous block"):
        return Output(block)
    if marker.startswith("sql over "):
        if language != "sql":
            raise Unclassified(f"{block.where}: 'sql over' marks a ```sql block, not ```{language}")
        return Sql(block, parse_streams(marker[len("sql over ") :]))
    raise Unclassified(
        f"{block.where}: unknown marker 'example: {marker}': the vocabulary is 'not run — REASON', "
        "'tested by PATH', 'output of the previous block', 'sql over STREAMS' (tests/docs_examples.py)"
    )


def same_output(shown: str, printed: str) -> bool:
    """Line for line, trailing blanks and blank lines at either end aside."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip("\n").splitlines()]

    return lines(shown) == lines(printed)
