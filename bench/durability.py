"""What ``--state-dir`` costs: ingest throughput, acknowledgement latency, recovery time.

Every figure comes from real ``lowtide serve --port 0 --workers 2 --metrics-port 0`` processes
on loopback, a fresh server (and a fresh state directory, under ``--scratch``) per run. The
state directory's ``fsync`` policy is set through a ``--config`` TOML file. The workload is a
packet stream ``S(srcIP string, len int32, ts timestamp[ms])``: 1,000 source addresses, 20% of
packets delayed uniformly up to 2 s, event time running at 100k packets per second, each batch
followed by its source's punctuation ``last arrival - 2 s`` (so nothing is late). Two queries
are registered on it before the data, a sliding and a tumbling window::

    SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 10 seconds, SLIDE 1 second, WA ts]
      FROM S GROUP BY srcIP
    SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 1 second, WA ts] FROM S GROUP BY srcIP

1. **Ingest throughput**, per batch size (``--batches``, rows per batch) and per setting: no
   state directory (the baseline), then ``--state-dir`` with fsync ``no`` (the default),
   ``everysec`` and ``always``. One producer process (``Client.producer``, its tables built
   before the start signal) sends every batch and its punctuation, then closes its source; a
   subscriber thread per query waits for its end-of-stream punctuation. Figure: rows / (start
   signal -> both subscribers have the end of the stream): every result delivered. The
   producer's own clock (start -> ``close()`` acknowledged) is the ingest rate beside it, and
   the CPU time (user + system, /proc) of the front process and of the workers over the run,
   per tuple, is the figure least moved by other load on the machine. Each server is warmed
   up first (the same queries over 200k rows of another stream, so numba has compiled before
   the clock starts). ``--runs`` rounds; the settings run in turn within a
   round, the order reversed every other round; medians. Each setting's ratio is the median
   over rounds of its rate / the baseline's rate *in the same round*.
2. **Acknowledgement latency**: on a fresh server per setting (same stream and queries), one
   producer sends ``--ack-batches`` batches of ``--ack-rows`` rows, each followed by ``flush()``
   (which returns once the server acknowledged it: one Ingest call, one logged batch, with
   fsync "always" one fsync). Latency = ``send`` + ``flush``, p50 / p99 / max per run (after
   50 untimed ones), medians over ``--ack-runs`` rounds (order reversed every other round).
   The raw cost of an fsync on the scratch file system (append 30 KB, fsync) is measured
   beside it.
3. **Recovery against log length**: for each ``--recovery-mb`` size, a server with
   ``--state-dir`` (fsync "no") takes batches of 10k rows with punctuation until its log holds
   that many MB; then the front and its workers get SIGKILL, and a new server starts on the same
   directory. Figure: process start -> its ready line (``lowtide serving on ...``), and the
   server's own ``... N logged changes replayed in X s`` line; the median of ``--restarts``
   kill -9 / start cycles. The log was just written, so it is read from the page cache. A
   server on an empty state directory, and one without, give the start-up floor.

Checkpoint size and pause as window state grows from 1 MB to 1 GB: ``bench/checkpoints.py``.

The servers run whatever ``lowtide`` this interpreter imports (``PYTHONPATH`` can point it at
another checkout); the report names its folder. Writes ``bench/results/durability.md`` (the
tables) and ``bench/results/durability.json`` (every figure, every run). The scratch
directories are deleted at the end.

    python bench/durability.py [--rows 5000000] [--batches 10000,100000] [--runs 5]
                               [--ack-rows 1000] [--ack-batches 1000] [--ack-runs 3]
                               [--recovery-mb 10,100,500] [--restarts 3] [--scratch /tmp] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

T = TypeVar("T")
RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {"srcIP": "string", "len": "int32", "ts": "timestamp[ms]"}
QUERIES = {
    "sliding": (
        "SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 10 seconds, SLIDE 1 second, WA ts] "
        "FROM {stream} GROUP BY srcIP"
    ),
    "tumbling": (
        "SELECT srcIP, count(*) AS n, sum(len) AS bytes [RANGE 1 second, WA ts] FROM {stream} GROUP BY srcIP"
    ),
}
KEYS = 1_000
RATE_PER_MS = 100  # event time: 100k packets per second
MAX_DELAY_MS = 2_000
EPOCH_MS = 1_700_000_000_000
SETTINGS = ("memory", "no", "everysec", "always")  # memory: no --state-dir, the baseline
TARGET_RATIO = 0.8  # the target for the default policy (fsync "no")
READY = re.compile(r"^lowtide serving on (\S+):(\d+) with (\d+) workers; metrics on (\S+)$")
REPLAYED = re.compile(
    r"^lowtide: state in .*: (\d+) streams, (\d+) queries, (\d+) logged changes replayed in ([\d.]+) s$"
)
END_OF_STREAM = 2**63 - 1
COMMAND = "python bench/durability.py"  # as run, for the report


def label(setting: str) -> str:
    return "no --state-dir" if setting == "memory" else f'--state-dir, fsync "{setting}"'


# -- workload -------------------------------------------------------------------------------------
ADDRESSES = pa.array([f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(KEYS)])


def packets(first: int, rows: int, rng: np.random.Generator) -> tuple[pa.Table, int]:
    """Packets ``first`` .. ``first + rows - 1`` of the timeline, and the punctuation after them."""
    arrival = (first + np.arange(rows, dtype=np.int64)) // RATE_PER_MS
    delayed = rng.random(rows) < 0.2
    ts = EPOCH_MS + arrival - np.where(delayed, rng.integers(0, MAX_DELAY_MS, rows), 0)
    table = pa.table(
        {
            "srcIP": ADDRESSES.take(pa.array(rng.integers(0, KEYS, rows))),
            "len": pa.array(rng.integers(40, 1500, rows, dtype=np.int32)),
            "ts": pa.array(ts, pa.timestamp("ms")),
        }
    )
    return table, EPOCH_MS + int(arrival[-1]) - MAX_DELAY_MS


def workload(rows: int, batch: int, seed: int = 7) -> list[tuple[pa.Table, int]]:
    rng = np.random.default_rng(seed)
    return [packets(start, min(batch, rows - start), rng) for start in range(0, rows, batch)]


# -- servers --------------------------------------------------------------------------------------
class StartFailed(RuntimeError):
    pass


class RunFailed(RuntimeError):
    """A run that did not finish (on a shared machine, a server may be killed under it)."""


FAILURES: list[str] = []  # every failed attempt, in the JSON


def attempt(what: str, run: Callable[[], T], tries: int = 3) -> T:
    """``run()``; on a failure say why and run it again, up to ``tries`` times."""
    for number in range(tries):
        try:
            return run()
        except Exception as failure:  # a shared machine: say why, try again
            ours = [f for f in traceback.extract_tb(failure.__traceback__) if f.filename == __file__]
            where = f" (in {ours[-1].name}, line {ours[-1].lineno})" if ours else ""
            reason = f"{type(failure).__name__}{where}: {failure}"
            FAILURES.append(f"{what}: {reason}")
            print(f"   ({what}: attempt {number + 1} failed: {reason})", file=sys.stderr)
            if number == tries - 1:
                raise
            time.sleep(2)
    raise AssertionError("not reached")


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


@dataclass
class Server:
    process: subprocess.Popen[str]
    target: str
    began: float  # monotonic, just before Popen
    ready_s: float  # process start -> ready line
    stderr: list[str]

    @staticmethod
    def start(
        state_dir: Path | None = None, fsync: str = "no", scratch: Path | None = None, config: str = ""
    ) -> Server:
        """``config``: more TOML lines for the state directory's server."""
        script = Path(sys.executable).with_name("lowtide")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "lowtide.clients.cli"]
        command += ["serve", "--host", "127.0.0.1", "--port", "0", "--workers", "2", "--metrics-port", "0"]
        if state_dir is not None:
            assert scratch is not None
            toml = state_dir.with_name(state_dir.name + ".toml")
            toml.write_text(f'fsync = "{fsync}"\nretained_items = 1024\n{config}')
            command += ["--state-dir", str(state_dir), "--config", str(toml)]
        began = time.monotonic()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []

        def collect() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                lines.append(line.rstrip("\n"))

        threading.Thread(target=collect, daemon=True).start()
        line = process.stdout.readline() if process.stdout else ""
        ready = time.monotonic() - began
        match = READY.match(line.strip())
        if match is None:
            process.kill()
            code = process.wait()
            time.sleep(0.2)
            raise StartFailed(
                f"lowtide serve did not start (exit {code}): {line!r}; stderr:\n" + "\n".join(lines)
            )
        return Server(process, f"{match.group(1)}:{match.group(2)}", began, ready, lines)

    def status(self) -> str:
        code = self.process.poll()
        tail = " | ".join(self.stderr[-4:])
        return f"server {'running' if code is None else f'exited {code}'}; its stderr: {tail}"

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds (user + system, every thread) of the front, and of the processes under it."""
        return cpu_seconds(self.process.pid), sum(cpu_seconds(pid) for pid in self.workers())

    def replayed(self) -> tuple[int, float] | None:
        """The server's own ``N logged changes replayed in X s`` (changes, seconds)."""
        for line in self.stderr:
            match = REPLAYED.match(line)
            if match:
                return int(match.group(3)), float(match.group(4))
        return None

    def workers(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid:
                        found.append(int(entry.name))
                except (OSError, IndexError, ValueError):
                    continue
        return found

    def kill9(self) -> None:
        """SIGKILL the front and every process under it at once (``kill -9``)."""
        for pid in [self.process.pid, *self.workers()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9


@contextlib.contextmanager
def server(setting: str, scratch: Path) -> Iterator[Server]:
    """A fresh server for ``setting`` (a fresh state directory), stopped and deleted afterwards."""
    state = None if setting == "memory" else Path(tempfile.mkdtemp(prefix=f"state-{setting}-", dir=scratch))
    running = Server.start(state, setting, scratch)
    try:
        yield running
    finally:
        running.stop()
        if state is not None:
            shutil.rmtree(state, ignore_errors=True)


def prepare(target: str, stream: str = "S", warm: bool = True) -> list[str]:
    """The stream and both queries (after a warm-up over another stream, off the clock)."""
    from lowtide.clients import Client

    with Client(target, timeout=120) as client:
        if warm:
            client.create_stream("Warm", SCHEMA, sources=["w"])
            names = [
                client.register_query(sql.format(stream="Warm"), name=f"warm_{q}")
                for q, sql in QUERIES.items()
            ]
            with client.producer("Warm", source="w", max_batch_rows=10_000) as producer:
                for table, p in workload(200_000, 10_000, seed=3):
                    producer.send(table)
                    producer.punctuate(p)
                producer.close()
            for name in names:
                wait_end(client, str(name))
                client.drop_query(name)
            client.drop_stream("Warm")
        client.create_stream(stream, SCHEMA, sources=["p0"])
        return [str(client.register_query(sql.format(stream=stream), name=q)) for q, sql in QUERIES.items()]


def wait_end(client: Any, query: str) -> None:
    from lowtide import Punctuation

    with client.subscribe(query, from_oldest=True) as items:
        for item in items:
            if isinstance(item, Punctuation) and item.value >= END_OF_STREAM:
                return


# -- 1. ingest throughput -------------------------------------------------------------------------
def producer_main(target: str, rows: int, batch: int, start: Any, out: Any) -> None:
    """Build the batches, open the producer, wait for the start; send, punctuate, close."""
    from lowtide.clients import Client

    work = workload(rows, batch)
    try:
        with Client(target, timeout=600) as client:
            producer = client.producer("S", source="p0", max_batch_rows=batch)
            out.put(("ready", 0.0, 0))
            start.wait()
            began = time.monotonic()
            for table, p in work:
                producer.send(table)
                producer.punctuate(p)
            result = producer.close()
            out.put(("done", time.monotonic() - began, result.tuples))
    except Exception as error:  # the bench process says what happened, and tries again
        out.put(("failed", 0.0, f"{type(error).__name__}: {error}"))


@dataclass
class Throughput:
    setting: str
    batch: int
    round: int
    tuples_s: float  # start -> both queries' end of stream at their subscribers
    ingest_tuples_s: float  # start -> the producer's close() acknowledged
    front_ns: float  # CPU of the front process per tuple, over the same span
    workers_ns: float  # CPU of the processes under it (2 workers) per tuple
    log_mb: float
    start_s: float
    load: float  # 1-minute load average before the run


def throughput_once(setting: str, rows: int, batch: int, number: int, scratch: Path) -> Throughput:
    from lowtide.clients import Client

    ctx = mp.get_context("spawn")
    load = os.getloadavg()[0]
    with server(setting, scratch) as running:
        names = prepare(running.target)
        out, start = ctx.Queue(), ctx.Event()
        producer = ctx.Process(target=producer_main, args=(running.target, rows, batch, start, out))
        producer.start()
        kind, _, why = out.get(timeout=600)
        if kind != "ready":
            raise RunFailed(f"the producer failed: {why}; {running.status()}")
        ended: list[float] = []
        failed: list[str] = []

        def until_end(query: str) -> None:
            try:
                with Client(running.target) as client:
                    wait_end(client, query)
                ended.append(time.monotonic())
            except Exception as error:
                failed.append(f"subscriber of {query}: {type(error).__name__}: {error}")

        listeners = [threading.Thread(target=until_end, args=(name,)) for name in names]
        for listener in listeners:
            listener.start()
        time.sleep(0.3)  # the subscriptions reach the server; from_oldest covers a race anyway
        front0, workers0 = running.cpu_s()
        began = time.monotonic()
        start.set()
        for listener in listeners:
            listener.join()
        front1, workers1 = running.cpu_s()
        if failed:
            producer.kill()
            raise RunFailed(f"{'; '.join(failed)}; {running.status()}")
        kind, ingest_s, tuples = out.get(timeout=600)
        producer.join(60)
        if kind != "done":
            raise RunFailed(f"the producer failed: {tuples}; {running.status()}")
        if tuples != rows:
            raise RunFailed(f"{setting}: the server applied {tuples:,} of {rows:,} tuples")
        log_mb = log_bytes(running) / 1e6
    return Throughput(
        setting,
        batch,
        number,
        rows / (max(ended) - began),
        rows / ingest_s,
        (front1 - front0) / rows * 1e9,
        (workers1 - workers0) / rows * 1e9,
        log_mb,
        running.ready_s,
        load,
    )


def state_dir_of(running: Server) -> Path | None:
    args = running.process.args
    assert isinstance(args, list)
    return Path(args[args.index("--state-dir") + 1]) if "--state-dir" in args else None


def log_bytes(running: Server) -> int:
    state = state_dir_of(running)
    return sum(p.stat().st_size for p in (state / "log").glob("*.seg")) if state else 0


# -- 2. acknowledgement latency -------------------------------------------------------------------
@dataclass
class Ack:
    setting: str
    round: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    count: int


def ack_once(setting: str, rows: int, batches: int, number: int, scratch: Path) -> Ack:
    from lowtide.clients import Client

    work = workload((batches + 50) * rows, rows, seed=5)
    with server(setting, scratch) as running:
        prepare(running.target)
        took: list[float] = []
        with Client(running.target, timeout=120) as client:
            producer = client.producer("S", source="p0", max_batch_rows=rows)
            for n, (table, _p) in enumerate(work):
                began = time.perf_counter()
                producer.send(table)
                producer.flush()
                if n >= 50:
                    took.append((time.perf_counter() - began) * 1000)
            producer.close()
    return Ack(
        setting,
        number,
        float(np.percentile(took, 50)),
        float(np.percentile(took, 99)),
        max(took),
        len(took),
    )


def raw_fsync_ms(scratch: Path, count: int = 300) -> tuple[float, float]:
    """p50 / p99 of append 30 KB + fsync on the scratch file system (what "always" waits for)."""
    path = scratch / "fsync-probe"
    data = os.urandom(30_000)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    took = []
    try:
        for _ in range(count):
            began = time.perf_counter()
            os.write(fd, data)
            os.fsync(fd)
            took.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return float(np.percentile(took, 50)), float(np.percentile(took, 99))


# -- 3. recovery ----------------------------------------------------------------------------------
@dataclass
class Recovery:
    target_mb: int
    log_mb: float
    segments: int
    rows: int
    records: int  # as the restarted server reports them
    fill_s: float
    ready_s: list[float] = field(default_factory=list)  # process start -> ready line, per restart
    replay_s: list[float] = field(default_factory=list)  # the server's own figure, per restart
    tuples_back: int = 0  # tuples_ingested of S after the last restart
    state_mb: float = 0.0  # the whole state directory (log, and checkpoints where a server keeps them)


def fill(target: str, megabytes: int, running: Server) -> tuple[int, float]:
    """Batches of 10k packets with punctuation until the log holds ``megabytes`` MB (or, should
    a server cut its log behind checkpoints, until 1.5 times that much Arrow data went in)."""
    from lowtide.clients import Client

    rng = np.random.default_rng(9)
    sent = sent_bytes = 0
    began = time.monotonic()
    with (
        Client(target, timeout=600) as client,
        client.producer("S", source="p0", max_batch_rows=10_000) as producer,
    ):
        while log_bytes(running) < megabytes * 1e6 and sent_bytes < 1.5 * megabytes * 1e6:
            for _ in range(20):
                table, p = packets(sent, 10_000, rng)
                producer.send(table)
                producer.punctuate(p)
                sent += 10_000
                sent_bytes += table.nbytes
            producer.flush()
    return sent, time.monotonic() - began


def recovery(megabytes: int, restarts: int, scratch: Path) -> Recovery:
    from lowtide.clients import Client

    state = Path(tempfile.mkdtemp(prefix=f"recovery-{megabytes}-", dir=scratch))
    running: Server | None = None
    try:
        running = Server.start(state, "no", scratch)
        prepare(running.target, warm=False)
        rows, fill_s = fill(running.target, megabytes, running)
        segments = list((state / "log").glob("*.seg"))
        found = Recovery(megabytes, log_bytes(running) / 1e6, len(segments), rows, 0, fill_s)
        found.state_mb = sum(p.stat().st_size for p in state.rglob("*") if p.is_file()) / 1e6
        for _ in range(restarts):
            running.kill9()
            running = None
            running = Server.start(state, "no", scratch)
            time.sleep(0.2)  # the stderr reader has the replay line (printed before the ready line)
            replayed = running.replayed()
            if replayed is None:
                raise RunFailed(f"no replay line from the restarted server: {running.status()}")
            found.records, seconds = replayed
            found.ready_s.append(running.ready_s)
            found.replay_s.append(seconds)
        with Client(running.target, timeout=120) as client:
            found.tuples_back = next(s for s in client.list_streams() if s["name"] == "S")["tuples_ingested"]
        if found.tuples_back != rows:
            raise RunFailed(f"{found.tuples_back:,} tuples back after the restart, {rows:,} acknowledged")
    finally:
        if running is not None:
            running.stop()
        shutil.rmtree(state, ignore_errors=True)
    return found


# -- report ---------------------------------------------------------------------------------------
def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def measured_lowtide() -> str:
    """Where the ``lowtide`` measured comes from (its folder; the git commit if it is a clone)."""
    import lowtide

    folder = Path(lowtide.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return f"{folder}" + (f" at {commit}" if commit else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000_000, help="packets per throughput run")
    parser.add_argument("--batches", default="10000,100000", help="rows per batch, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="rounds of throughput runs")
    parser.add_argument("--ack-runs", type=int, default=3, help="rounds of latency runs")
    parser.add_argument("--ack-rows", type=int, default=1_000)
    parser.add_argument("--ack-batches", type=int, default=1_000)
    parser.add_argument("--recovery-mb", default="10,100,500", help="log sizes to recover, MB")
    parser.add_argument("--restarts", type=int, default=3, help="kill -9 / start cycles per log size")
    parser.add_argument("--scratch", default=tempfile.gettempdir(), help="where the state directories go")
    parser.add_argument("--skip", default="", help="parts to skip: throughput,ack,recovery")
    parser.add_argument("--quick", action="store_true", help="1M rows, 1 round, 200 acks, 10/50 MB logs")
    args = parser.parse_args(argv)
    global COMMAND
    COMMAND = " ".join(["python bench/durability.py", *(argv if argv is not None else sys.argv[1:])])
    if args.quick:
        args.ack_runs = 1
        args.rows, args.runs, args.ack_batches, args.recovery_mb, args.restarts = (
            1_000_000,
            1,
            200,
            "10,50",
            1,
        )
    batches = [int(b) for b in args.batches.split(",") if b]
    sizes = [int(m) for m in args.recovery_mb.split(",") if m]
    skip = set(args.skip.split(","))
    free_mb = shutil.disk_usage(args.scratch).free / 1e6
    if sizes and max(sizes) * 2 > free_mb:
        raise SystemExit(f"{args.scratch} has {free_mb:,.0f} MB free: too little for a {max(sizes)} MB log")
    print(
        f"rows={args.rows:,} batches={batches} runs={args.runs} ({os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at start; scratch {args.scratch}, {free_mb / 1e3:,.0f} GB free)",
        file=sys.stderr,
    )
    began = time.monotonic()
    report: dict[str, Any] = {
        "command": COMMAND,
        "rows": args.rows,
        "runs": args.runs,
        "cores": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
        "lowtide": measured_lowtide(),
    }
    scratch = Path(tempfile.mkdtemp(prefix="lowtide-durability-", dir=args.scratch))
    try:
        throughput = [] if "throughput" in skip else measure_throughput(args, batches, scratch)
        acks = [] if "ack" in skip else measure_acks(args, scratch)
        fsync_raw = raw_fsync_ms(scratch)
        recoveries = [] if "recovery" in skip else measure_recovery(sizes, args.restarts, scratch)
        floors = [] if "recovery" in skip else start_floors(args.restarts, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.update(
        throughput=[asdict(t) for t in throughput],
        ack=[asdict(a) for a in acks],
        raw_fsync_p50_p99_ms=fsync_raw,
        recovery=[asdict(r) for r in recoveries],
        start_floor=floors,
        failures=FAILURES,
        seconds=time.monotonic() - began,
    )
    lines = tables(args, batches, throughput, acks, fsync_raw, recoveries, floors)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "durability.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "durability.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines))
    print(f"({time.monotonic() - began:.0f} s)", file=sys.stderr)
    return 0


def measure_throughput(args: argparse.Namespace, batches: list[int], scratch: Path) -> list[Throughput]:
    found = []
    for batch in batches:
        for number in range(args.runs):
            order = SETTINGS if number % 2 == 0 else SETTINGS[::-1]
            for setting in order:
                run = attempt(
                    f"throughput {setting} {batch}",
                    lambda: throughput_once(setting, args.rows, batch, number, scratch),  # noqa: B023
                )
                found.append(run)
                print(
                    f"   {batch:,}-row batches, round {number + 1}, {label(setting)}: "
                    f"{run.tuples_s / 1e6:.2f} M/s end to end, {run.ingest_tuples_s / 1e6:.2f} M/s ingest, "
                    f"front {run.front_ns:.0f} ns/tuple, workers {run.workers_ns:.0f} ns/tuple, "
                    f"load {run.load:.1f}" + (f", log {run.log_mb:.0f} MB" if run.log_mb else ""),
                    file=sys.stderr,
                )
    return found


def measure_acks(args: argparse.Namespace, scratch: Path) -> list[Ack]:
    found = []
    for number in range(args.ack_runs):
        for setting in SETTINGS if number % 2 == 0 else SETTINGS[::-1]:
            found.append(
                attempt(
                    f"acks {setting}",
                    lambda: ack_once(setting, args.ack_rows, args.ack_batches, number, scratch),  # noqa: B023
                )
            )
            a = found[-1]
            print(
                f"   acks, round {number + 1}, {label(setting)}: "
                f"p50 {a.p50_ms:.2f} ms, p99 {a.p99_ms:.2f} ms",
                file=sys.stderr,
            )
    return found


def measure_recovery(sizes: list[int], restarts: int, scratch: Path) -> list[Recovery]:
    found = []
    for megabytes in sizes:
        found.append(attempt(f"recovery {megabytes} MB", lambda: recovery(megabytes, restarts, scratch)))  # noqa: B023
        r = found[-1]
        print(
            f"   recovery of {r.log_mb:.0f} MB ({r.records:,} records, {r.rows:,} rows): ready in "
            f"{', '.join(f'{s:.2f}' for s in r.ready_s)} s; "
            f"replay {', '.join(f'{s:.2f}' for s in r.replay_s)} s",
            file=sys.stderr,
        )
    return found


def start_floors(restarts: int, scratch: Path) -> list[dict[str, Any]]:
    """Process start -> ready line without a state directory, and on an empty one."""
    found = []
    for name in ("memory", "empty"):
        took = []
        for _ in range(restarts):
            state = None if name == "memory" else Path(tempfile.mkdtemp(prefix="empty-", dir=scratch))
            running = Server.start(state, "no", scratch)
            took.append(running.ready_s)
            running.stop()
            if state is not None:
                shutil.rmtree(state, ignore_errors=True)
        found.append({"setting": name, "ready_s": took})
    return found


def tables(
    args: argparse.Namespace,
    batches: list[int],
    throughput: list[Throughput],
    acks: list[Ack],
    fsync_raw: tuple[float, float],
    recoveries: list[Recovery],
    floors: list[dict[str, Any]],
) -> list[str]:
    lines = [
        "## What --state-dir costs (lowtide serve, 2 workers, loopback)",
        "",
        f"{os.cpu_count()} cores, shared. Command: `{COMMAND}`; lowtide from {measured_lowtide()}.",
        "",
    ]
    if throughput:
        lines += [
            f"### Ingest throughput: {args.rows:,} packets (srcIP string, len int32, ts timestamp[ms]), "
            "sliding 10 s / 1 s and tumbling 1 s GROUP BY srcIP",
            "",
            "Rows / (start -> both queries' end of stream at their subscribers); medians of "
            f"{args.runs} round(s); ratio = median over rounds of rate / the baseline's rate in that round.",
            "",
            "| batch rows | setting | end to end | ratio to no --state-dir | ingest (producer's close) | "
            "front CPU / tuple | workers' CPU / tuple | log | runs (M/s) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for batch in batches:
            mine = [t for t in throughput if t.batch == batch]
            base = {t.round: t.tuples_s for t in mine if t.setting == "memory"}
            for setting in SETTINGS:
                runs = [t for t in mine if t.setting == setting]
                ratio = med([t.tuples_s / base[t.round] for t in runs if t.round in base])
                log = f"{med([t.log_mb for t in runs]):.0f} MB" if setting != "memory" else "-"
                lines.append(
                    f"| {batch:,} | {label(setting)} | {med([t.tuples_s for t in runs]) / 1e6:.2f} M/s | "
                    f"{ratio:.2f}x | {med([t.ingest_tuples_s for t in runs]) / 1e6:.2f} M/s | "
                    f"{med([t.front_ns for t in runs]):.0f} ns | "
                    f"{med([t.workers_ns for t in runs]):.0f} ns | {log} | "
                    + ", ".join(f"{t.tuples_s / 1e6:.2f}" for t in runs)
                    + " |"
                )
        default = [t for t in throughput if t.setting == "no"]
        if default:
            worst = min(
                med(
                    [
                        t.tuples_s / b.tuples_s
                        for t in default
                        for b in throughput
                        if t.batch == batch == b.batch and b.round == t.round and b.setting == "memory"
                    ]
                )
                for batch in batches
            )
            verdict = "met" if worst >= TARGET_RATIO else "NOT met"
            lines += [
                "",
                f'Target: fsync "no" >= {TARGET_RATIO}x no --state-dir: lowest {worst:.2f}x ({verdict}, '
                "the lower of the batch sizes' median ratios).",
            ]
        logged = [t for t in throughput if t.setting == "no"]
        if logged:
            per_row = med([t.log_mb for t in logged]) * 1e6 / args.rows
            lines += ["", f"The log holds {per_row:.1f} bytes per packet (Arrow IPC as received, framed)."]
        lines.append("")
    if acks:
        lines += [
            f"### Acknowledgement latency: {args.ack_rows:,}-row batches, send + flush() each, "
            f"{args.ack_batches:,} per run",
            "",
            "| setting | p50 | p99 | max | runs (p50 / p99) |",
            "|---|---|---|---|---|",
        ]
        for setting in SETTINGS:
            runs = [a for a in acks if a.setting == setting]
            lines.append(
                f"| {label(setting)} | {med([a.p50_ms for a in runs]):.2f} ms | "
                f"{med([a.p99_ms for a in runs]):.2f} ms | "
                f"{med([a.max_ms for a in runs]):.1f} ms | "
                + ", ".join(f"{a.p50_ms:.2f} / {a.p99_ms:.2f}" for a in runs)
                + " |"
            )
        lines += [
            "",
            f"Raw append of 30 KB + fsync on the scratch file system: p50 {fsync_raw[0]:.2f} ms, "
            f"p99 {fsync_raw[1]:.2f} ms.",
            "",
        ]
    if recoveries:
        lines += [
            "### Recovery: kill -9, then a new server on the same --state-dir",
            "",
            "| log on disk | segments | state dir | rows | records replayed | start -> ready | "
            "replay (server's line) | log MB / replay s | tuples back |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in recoveries:
            replay = med(r.replay_s)
            lines.append(
                f"| {r.log_mb:.0f} MB | {r.segments} | {r.state_mb:.0f} MB | {r.rows:,} | {r.records:,} | "
                f"{med(r.ready_s):.2f} s | "
                f"{replay:.2f} s | {r.log_mb / replay if replay else float('nan'):.0f} | {r.tuples_back:,} |"
            )
        for floor in floors:
            what = "no --state-dir" if floor["setting"] == "memory" else "an empty --state-dir"
            lines.append(f"| {what} | | | | | {med(floor['ready_s']):.2f} s | | | |")
        lines += [
            "",
            f"Medians of {args.restarts} kill -9 / start cycle(s) per size; "
            "the log is read from the page cache.",
            "",
        ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
