"""The README's five-minute path, read from the README itself so the tests break when it drifts.

The section ``## Five minutes`` holds ``sh`` blocks of commands and, after the last one, a
``text`` block: what its last command prints. Each command line is split as a shell would
(``#`` starts a comment). Only three kinds of line may appear, and ``path()`` refuses any other:
``make TARGET`` and ``source .venv/bin/activate`` (what a fresh clone does first), ``lowtide
serve ...`` (also spelled ``.venv/bin/lowtide serve ...``) and the ``lowtide`` commands that
drive the server.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "## Five minutes"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
_LOWTIDE = ("lowtide", ".venv/bin/lowtide")


@dataclass(frozen=True)
class Path5:
    """The path's commands, in order, split into what sets up, what serves and what runs."""

    make_targets: list[str]  # ``make setup`` -> ["setup"]
    serve: list[str]  # the arguments after ``lowtide serve``
    commands: list[list[str]]  # each client command's arguments after ``lowtide``
    expected: str  # what the last command prints (the ``text`` block after the commands)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced code block of a Markdown text as (language, body)."""
    return [(m[1], m[2]) for m in _FENCE.finditer(text)]


def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    level = len(heading.split(" ", 1)[0])
    lines = text.splitlines(keepends=True)
    start = lines.index(heading + "\n")
    fenced = False
    for end in range(start + 1, len(lines)):
        line = lines[end]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            return "".join(lines[start:end])
    return "".join(lines[start:])


def path(readme: str | None = None) -> Path5:
    text = section(README.read_text() if readme is None else readme, SECTION)
    blocks = fenced_blocks(text)
    shell = [i for i, (lang, _) in enumerate(blocks) if lang == "sh"]
    assert shell, f"no ```sh block under {SECTION!r} in README.md"
    after = [body for lang, body in blocks[shell[-1] + 1 :] if lang == "text"]
    assert after, f"no ```text block after the last ```sh block under {SECTION!r}: what the path prints"
    make: list[str] = []
    serve: list[str] | None = None
    commands: list[list[str]] = []
    for i in shell:
        for line in blocks[i][1].splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] == "make" and len(words) == 2:
                make.append(words[1])
            elif words == ["source", ".venv/bin/activate"]:
                continue
            elif words[0] in _LOWTIDE and words[1:2] == ["serve"]:
                assert serve is None and not commands, "the path starts one server, before any command"
                serve = words[2:]
            elif words[0] in _LOWTIDE:
                commands.append(words[1:])
            else:
                raise AssertionError(f"the README's path has a line no test runs: {line!r}")
    assert serve is not None, "the README's path never starts `lowtide serve`"
    assert commands, "the README's path runs no lowtide command"
    return Path5(make, serve, commands, after[0])
