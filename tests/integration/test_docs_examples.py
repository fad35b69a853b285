"""Every fenced example of README.md and docs/*.md runs as printed, or says why it does not.

Each page is one test: its blocks (``docs_examples.blocks``) in order, each classified by its
fence's language or by the marker comment right before it (the vocabulary is at the top of
``tests/docs_examples.py`` and in docs/development.md, "Tests"):

* ``python`` runs in a subprocess of this interpreter, ``sh`` line by line in bash (``lowtide``,
  ``openssl``, ``curl``), both in a folder of the page's own (linking ``examples/`` and ``.venv``)
  and against the page's server: a real ``lowtide serve`` on free loopback ports, started when a
  block first needs it, or by a block's ``lowtide serve`` line with that line's options. The
  default addresses in their text (``127.0.0.1:50051``, ``127.0.0.1:9464``) become the server's,
  and ``$LOWTIDE_SERVER`` names it.
* ``toml`` is loaded as the server loads a ``--config`` or a ``--tokens`` file.
* ``sql`` is registered on the page's server and dropped (``sql over ...``: on streams made for it).
* ``output of the previous block`` must be what the block before it printed.
* ``not run — REASON`` and ``tested by PATH`` are skipped; a block with neither a runnable
  language nor a marker fails the page.

One server per page (a fresh one per ``lowtide serve`` line), so the pages' names never meet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import docs_examples as ex
import pytest
from server_harness import Server, lowtide_command, start_server

pytestmark = pytest.mark.integration

TIMEOUT = 60  # seconds for one python block or shell line (the slowest, a demo, takes ~5 s)


def test_every_block_of_every_page_is_run_or_marked() -> None:
    problems = []
    for page in ex.PAGES:
        for block in ex.blocks(page):
            try:
                ex.classify(block)
            except ex.Unclassified as exc:
                problems.append(str(exc))
    assert not problems, "\n".join(problems)


class PageRun:
    """One page's blocks, in order, in ``folder``, against the page's server."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        # What a block may name from the root of the clone: the sample files, the venv.
        (folder / "examples").symlink_to(ex.ROOT / "examples")
        (folder / ".venv").symlink_to(Path(sys.executable).parent.parent)
        self.server: Server | None = None
        self.printed: str | None = None  # what the last block printed; None if it did not run
        self.bin = Path(lowtide_command()[0]).parent

    # -- the server --------------------------------------------------------------------------
    def serve(self, *options: str) -> Server:
        self.stop()
        credentials = any(o.startswith(("--tls-cert", "--tokens")) for o in options)
        # One worker unless the example says otherwise: the pages' data is small, and a server
        # starts faster. A server that wants credentials is not warmed up by the harness (it
        # speaks plaintext).
        self.server = start_server(*options, workers=1, warm_up=not credentials)
        return self.server

    def ensure_server(self) -> Server:
        if self.server is None:
            return self.serve()
        assert self.server.alive(), f"the page's server died:\n{self.server.stderr_tail()}"
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()
            shutil.rmtree(server.stderr.parent, ignore_errors=True)

    def rewrite(self, text: str) -> str:
        """The default addresses in an example's text, as the page's server's."""
        if self.server is None:
            return text
        text = text.replace(ex.DEFAULT_SERVER, self.server.target)
        if self.server.metrics_url is not None:
            metrics = self.server.metrics_url.split("//", 1)[1].split("/", 1)[0]
            text = text.replace(ex.DEFAULT_METRICS, metrics)
        return text

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        if self.server is not None:
            env["LOWTIDE_SERVER"] = self.server.target
        return env

    def execute(self, command: list[str], what: str, where: str) -> str:
        """Run ``command`` in the page's folder; its stdout, or a failure naming the block."""
        try:
            done = subprocess.run(
                command,
                cwd=self.folder,
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=TIMEOUT,  # a subscription or a tail must end on its own
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{where}: {what} did not end within {TIMEOUT} s (a subscription or tail that waits "
                f"for a source still open?)\nstdout:\n{exc.stdout!r}"
            ) from None
        tail = self.server.stderr_tail() if self.server is not None else "(no server)"
        assert done.returncode == 0, (
            f"{where}: {what} exited {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n"
            f"stderr:\n{done.stderr[-3000:]}\nthe server's stderr:\n{tail}"
        )
        return done.stdout

    # -- the kinds -------------------------------------------------------------------------------
    def run(self, kind: ex.Kind) -> None:
        printed: str | None = None
        if isinstance(kind, ex.Python):
            printed = self.python(kind.block)
        elif isinstance(kind, ex.Shell):
            printed = self.shell(kind)
        elif isinstance(kind, ex.Toml):
            self.toml(kind.block)
        elif isinstance(kind, ex.Sql):
            self.sql(kind)
        elif isinstance(kind, ex.Output):
            assert self.printed is not None, f"{kind.block.where}: the output of a block that did not run"
            assert ex.same_output(kind.block.body, self.printed), (
                f"{kind.block.where}: the page shows\n{kind.block.body}\nthe block before it printed\n"
                f"{self.printed}"
            )
        self.printed = printed

    def python(self, block: ex.Block) -> str:
        if ex.DEFAULT_SERVER in block.body or "LOWTIDE_SERVER" in block.body:
            self.ensure_server()
        script = self.folder / f"example_{block.line}.py"
        script.write_text(self.rewrite(block.body))
        return self.execute([sys.executable, script.name], "the python block", block.where)

    def shell(self, kind: ex.Shell) -> str:
        printed = []
        for line in kind.lines:
            if ex.is_serve(line):
                self.serve(*ex.serve_options(line, self.folder))
                continue
            if ex.words(line)[0] in ex.LOWTIDE or ex.DEFAULT_SERVER in line or ex.DEFAULT_METRICS in line:
                self.ensure_server()
            command = ["bash", "-o", "pipefail", "-c", self.rewrite(line)]
            printed.append(self.execute(command, repr(line), kind.block.where))
        return "".join(printed)

    def toml(self, block: ex.Block) -> None:
        from lowtide.server.auth import load_tokens
        from lowtide.server.config import ServerConfig

        path = self.folder / f"example_{block.line}.toml"
        path.write_text(block.body)
        try:
            if "tokens" in tomllib.loads(block.body):
                load_tokens(str(path))
            else:
                ServerConfig.load(path)
        except Exception as exc:
            raise AssertionError(f"{block.where}: {type(exc).__name__}: {exc}") from exc

    def sql(self, kind: ex.Sql) -> None:
        from lowtide.clients import Client

        server = self.ensure_server()
        name = f"example_{kind.block.line}"
        with Client(server.target, timeout=60) as client:
            for stream, schema in kind.streams.items():
                client.create_stream(stream, schema, progressing=ex.progressing(schema))
            try:
                client.register_query(kind.block.body, name=name)
            except Exception as exc:
                raise AssertionError(f"{kind.block.where}: the query does not register: {exc}") from exc
            client.drop_query(name)
            for stream in kind.streams:
                client.drop_stream(stream)


@pytest.mark.parametrize("page", ex.PAGES, ids=lambda p: str(p.relative_to(ex.ROOT)))
def test_the_pages_examples_run_as_printed(page: Path, tmp_path: Path) -> None:
    kinds = [ex.classify(block) for block in ex.blocks(page)]
    run = PageRun(tmp_path)
    try:
        for kind in kinds:
            run.run(kind)
    except BaseException:
        if run.server is not None:  # the page's failure is the one to report; logs stay
            run.server.process.kill()
            run.server.process.wait()
        raise
    run.stop()
