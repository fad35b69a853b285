"""The one way the tests start a real ``lowtide serve``: a subprocess on a free loopback port.

``start_server(*options, workers=2, metrics=True, config={...})`` runs the installed ``lowtide
serve`` (``--port 0``: it picks a free port and prints it on its ready line), waits for that line
and for every worker to answer, and returns a :class:`Server` (``target``, ``port``, ``pid``,
``metrics_url``); ``running_server(...)`` does the same for a ``with`` block and at its end sends
SIGTERM and asserts the drain exits 0 within 30 s. ``config`` becomes a TOML file (keys of
``lowtide.server.config``) passed with ``--config``; ``options`` are more ``serve`` options, which
win over it as on any command line. The server's stdout and stderr go to a temporary folder
(removed after a clean stop in ``running_server``, kept after a failure): ``server.stderr_tail()``
is what a failing test prints. ``lowtide_command()`` is the CLI the tests run.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

READY = re.compile(r"lowtide serving on (\S+):(\d+) with (\d+) workers; metrics on (\S+)")
START_TIMEOUT = 180.0  # seconds: a cold start compiles numba kernels
STOP_TIMEOUT = 30.0


T = TypeVar("T")


def free_port() -> int:
    """A loopback port free now (for a server started again on the same port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 30.0, diagnostics: Callable[[], str] = str
) -> T:
    """Call ``probe`` until it answers (anything but None or False), for at most ``timeout``
    seconds; its answer. What it waits on is another process's doing (a log line, a listing, a
    scrape): polled, since no event of this process marks it; ``diagnostics`` for the failure."""
    deadline = time.monotonic() + timeout
    while (found := probe()) is None or found is False:
        if time.monotonic() > deadline:
            extra = diagnostics()
            raise AssertionError(
                f"gave up after {timeout:g} s waiting for {what}" + (f"\n{extra}" if extra else "")
            )
        time.sleep(0.02)
    return found


def scrape(server: Server) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """A real scrape of the server: each sample's value by its name (a counter's ``<name>_total``)
    and its sorted labels."""
    assert server.metrics_url is not None
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def listening_sockets() -> dict[str, tuple[str, int]]:
    """Every TCP socket of this machine listening now, by its inode: (address, port), read from
    /proc/net/tcp{,6} (the kernel's own tables: no tool whose output could change). An address
    there is 32-bit words, each in the machine's (little-endian) order."""
    found: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                host, port = fields[1].split(":")
                raw = bytes.fromhex(host)
                address = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found[fields[9]] = (str(ipaddress.ip_address(address)), int(port, 16))
    return found


def processes() -> dict[int, tuple[int, int, bytes]]:
    """Every process of this machine now: its parent, start time (clock ticks after boot) and
    command line, by pid, read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone since the listing
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid ...
        found[int(entry.name)] = (int(fields[1]), int(fields[19]), cmdline)
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), parents first."""
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in processes().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop(0))
        todo += children.get(found[-1], [])
    return found


def lowtide_command() -> list[str]:
    """The installed ``lowtide`` script beside this interpreter, else ``python -m lowtide.clients.cli``."""
    script = Path(sys.executable).with_name("lowtide")
    if script.exists():
        return [str(script)]
    found = shutil.which("lowtide")
    return [found] if found else [sys.executable, "-m", "lowtide.clients.cli"]


def _toml(config: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return f'"{v}"' if isinstance(v, str) else str(v)

    return "".join(f"{key} = {value(v)}\n" for key, v in config.items())


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    target: str
    port: int
    workers: int
    metrics_url: str | None
    stdout: Path
    stderr: Path
    exit_code: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self, lines: int = 40) -> str:
        text = self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def checkpoints(self) -> int:
        """The checkpoints this server has reported taking (one stderr line each)."""
        text = self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
        return text.count("lowtide: checkpoint at change")

    def await_checkpoint(self, timeout: float = 30.0) -> None:
        """Wait until the server reports a checkpoint taken after this call began."""
        taken = self.checkpoints()
        wait_for("a checkpoint", lambda: self.checkpoints() != taken, timeout, self.stderr_tail)

    def worker_pids(self) -> list[int]:
        """The worker processes, oldest first: the children of the server's fork server (its child
        running ``multiprocessing.forkserver``)."""
        table = processes()
        forkservers = {
            pid for pid, (ppid, _, cmdline) in table.items() if ppid == self.pid and b"forkserver" in cmdline
        }
        found = [(start, pid) for pid, (ppid, start, _) in table.items() if ppid in forkservers]
        return [pid for _, pid in sorted(found)]

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait for the drain; asserts exit 0 within ``timeout`` seconds."""
        if self.exit_code is None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.exit_code = self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(
                    f"server did not exit within {timeout} s of SIGTERM; stderr:\n{self.stderr_tail()}"
                ) from None
        assert self.exit_code == 0, (
            f"server exited {self.exit_code} on SIGTERM; stderr:\n{self.stderr_tail()}"
        )
        return self.exit_code


def start_server(
    *options: str,
    workers: int = 2,
    metrics: bool = True,
    config: dict[str, Any] | None = None,
    port: int = 0,
    own_group: bool = False,
    warm_up: bool = True,
    env: dict[str, str | None] | None = None,
) -> Server:
    """Start a server and wait for its ready line (the caller stops it); ``port`` 0: a free one;
    ``own_group``: in a process group of its own (as systemd or ``timeout`` start it);
    ``warm_up`` false for a server that wants credentials (TLS, tokens): its tests bring them;
    ``env``: variables to set in its environment, or (None) to leave out of it."""
    environment = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    folder = Path(tempfile.mkdtemp(prefix="lowtide-it-"))
    command = [
        *lowtide_command(),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--metrics-port",
        "0" if metrics else "-1",
    ]
    if config:
        (folder / "server.toml").write_text(_toml(config))
        command += ["--config", str(folder / "server.toml")]
    out, err = folder / "stdout.txt", folder / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [*command, *options],
            stdout=stdout,
            stderr=stderr,
            env=environment,
            process_group=0 if own_group else None,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        match = READY.search(out.read_text(errors="replace"))
        if match is not None:
            break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            tail = "\n".join(err.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"server did not start (exit {process.returncode}); stderr:\n{tail}")
        time.sleep(0.05)
    host, bound, count, metrics_url = match.groups()
    if warm_up:
        try:
            _warm_up(f"{host}:{bound}")
        except Exception:
            process.kill()
            process.wait()
            raise
    return Server(
        process,
        f"{host}:{bound}",
        int(bound),
        int(count),
        None if metrics_url == "off" else metrics_url,
        out,
        err,
    )


def kill9(server: Server) -> None:
    """SIGKILL the front and every worker at once: nothing gets to flush or say goodbye."""
    for pid in [server.pid, *server.worker_pids()]:
        os.kill(pid, signal.SIGKILL)
    server.process.wait(30)
    server.exit_code = 0  # killed on purpose: the harness's clean-stop check does not apply


def rows_until_end(client: Any, query: str) -> list[dict[str, Any]]:
    """Every row a subscription to ``query`` gives, from its oldest, until its end of stream."""
    from lowtide import END_OF_STREAM, Punctuation

    rows: list[dict[str, Any]] = []
    with client.subscribe(query) as subscription:
        for item in subscription:
            if isinstance(item, Punctuation):
                if item.value >= END_OF_STREAM:
                    break
            else:
                rows += item.to_pylist()
    return rows


def _warm_up(target: str) -> None:
    """Wait until every worker answers: a query on all of them, fed and closed, then dropped.

    The ready line comes before the workers have imported (and, on a cold cache, compiled)
    everything; the tests' own timeouts should not pay for that.
    """
    import grpc
    import pyarrow as pa

    from lowtide.proto import lowtide_pb2 as pb
    from lowtide.proto import lowtide_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = lowtide_pb2_grpc.LowtideStub(channel)
        schema = [pb.Column(name="k", type="int64"), pb.Column(name="ts", type="int64")]
        stub.CreateStream(pb.CreateStreamRequest(name="warmup", schema=schema, progressing="ts"), timeout=30)
        sql = "SELECT k, count(*) [RANGE 1, SLIDE 1, WA ts] FROM warmup GROUP BY k"
        stub.RegisterQuery(pb.RegisterQueryRequest(sql=sql, name="warmup_q"), timeout=30)
        sink = pa.BufferOutputStream()
        data = pa.table({"k": pa.array(range(8), pa.int64()), "ts": pa.array(range(8), pa.int64())})
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write_table(data)
        messages = [
            pb.IngestRequest(stream="warmup", source="s", arrow=sink.getvalue().to_pybytes()),
            pb.IngestRequest(close=True),
        ]
        subscription = stub.Subscribe(
            pb.SubscribeRequest(query="warmup_q", from_oldest=True), timeout=START_TIMEOUT
        )
        stub.Ingest(iter(messages), timeout=30)
        for item in subscription:
            if item.WhichOneof("item") == "punctuation" and item.punctuation.value == 2**63 - 1:
                break
        subscription.cancel()
        stub.DropQuery(pb.DropQueryRequest(name="warmup_q"), timeout=30)
        stub.DropStream(pb.DropStreamRequest(name="warmup"), timeout=30)


@contextlib.contextmanager
def running_server(
    *options: str,
    workers: int = 2,
    metrics: bool = True,
    config: dict[str, Any] | None = None,
    warm_up: bool = True,
    env: dict[str, str | None] | None = None,
) -> Iterator[Server]:
    """A server for the ``with`` block; stopped with SIGTERM at its end (exit 0 asserted)."""
    server = start_server(*options, workers=workers, metrics=metrics, config=config, warm_up=warm_up, env=env)
    try:
        yield server
    except BaseException:
        with contextlib.suppress(AssertionError):  # the test's own failure is the one to report
            server.stop()
        raise  # the logs stay in server.stderr's folder
    server.stop()
    shutil.rmtree(server.stderr.parent, ignore_errors=True)
