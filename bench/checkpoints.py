"""Checkpoint size and pause as window state grows (part 4 of ``bench/durability.py``).

For each ``--state-mb`` size, a real ``lowtide serve --workers 2 --state-dir D`` (fsync "no")
gets a stream ``K(k int64, v int64, ts timestamp[ms])`` and one query holding a window open::

    SELECT k, count(*) AS n, sum(v) AS total [RANGE 1 hour, WA ts] FROM K GROUP BY k

The fill sends batches of 1M tuples of new keys (each key one group, all in the first minute of
the hour, the punctuation held below the hour) until a checkpoint holds about ``size`` MB (a
first fill at 24 bytes a group, then more groups in proportion to what the checkpoint fell
short by). Then, for ``--steady-s`` seconds, one producer
sends 1,000-row batches of existing keys (the state stays that size) and waits for each
acknowledgement (``send`` + ``flush()``), while the server checkpoints every
``--interval-s`` seconds. Figures:

* the checkpoint's size on disk and its duration (barrier -> manifest written), and the longest
  time a worker stopped processing for it (its *pause*), from the server's own line per
  checkpoint (``lowtide: checkpoint at change N: B bytes in S s, workers paused P s at most``);
* acknowledgement latency p50 / p99 / max over the steady phase, against the same phase on a
  server with the same state and checkpoints turned off (``checkpoint_interval_s = 0``), run
  right before it: what ingestion notices of the checkpoints.

Writes ``bench/results/checkpoints.md``.

    python bench/checkpoints.py [--state-mb 1,10,100,1000] [--interval-s 2] [--steady-s 12]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from durability import EPOCH_MS, RESULTS, Server, attempt, measured_lowtide, med

SCHEMA = {"k": "int64", "v": "int64", "ts": "timestamp[ms]"}
QUERY = "SELECT k, count(*) AS n, sum(v) AS total [RANGE 1 hour, WA ts] FROM K GROUP BY k"
BYTES_PER_GROUP = 24  # in a checkpoint at least: key, count and sum (the group table adds more)
FILL_ROWS = 1_000_000
STEADY_ROWS = 1_000
TAKEN = re.compile(
    r"^lowtide: checkpoint at change (\d+): (\d+) bytes in ([\d.]+) s, workers paused ([\d.]+) s at most$"
)


@dataclass
class Taken:
    seq: int
    bytes: int
    seconds: float
    pause_s: float


@dataclass
class Sized:
    target_mb: int
    groups: int
    fill_s: float
    ack_ms: dict[str, list[float]] = field(default_factory=dict)  # "on" / "off" -> p50, p99, max
    taken: list[Taken] = field(default_factory=list)  # during the steady phase


def keys_table(keys: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys),
            "v": pa.array(keys & 0xFFFF),
            "ts": pa.array(EPOCH_MS + keys % 60_000, pa.timestamp("ms")),
        }
    )


def fill(target: str, first: int, last: int) -> float:
    """Groups ``first .. last - 1``, 1M new keys a batch (the stream and query made at 0)."""
    from lowtide.clients import Client

    began = time.monotonic()
    with Client(target, timeout=600) as client:
        if first == 0:
            client.create_stream("K", SCHEMA, sources=["p0"])
            client.register_query(QUERY, name="held")
        with client.producer("K", source="p0", max_batch_rows=FILL_ROWS) as producer:
            if first == 0:
                producer.punctuate(EPOCH_MS)  # the hour's window stays open
            for start in range(first, last, FILL_ROWS):
                producer.send(keys_table(np.arange(start, min(start + FILL_ROWS, last), dtype=np.int64)))
            producer.flush()
    return time.monotonic() - began


def whole_checkpoint(running: Server, interval_s: float, state: Path) -> Taken:
    """The checkpoint of everything sent so far: the last one taken once none is in progress (a
    directory without its manifest) and none has come for two intervals (with nothing logged
    since, no new one begins)."""
    count, quiet_since = len(taken(running)), time.monotonic()
    deadline = quiet_since + 600
    while time.monotonic() < deadline:
        now = len(taken(running))
        busy = any(not (d / "MANIFEST.json").exists() for d in (state / "checkpoints").glob("*"))
        if now != count or busy:
            count, quiet_since = now, time.monotonic()
        elif count and time.monotonic() - quiet_since > 2 * interval_s + 1:
            return taken(running)[-1]
        time.sleep(0.2)
    raise RuntimeError(f"no checkpoint in 600 s: {running.status()}")


def steady(target: str, groups: int, seconds: float) -> list[float]:
    """send + flush() latencies (ms) of 1,000-row batches of existing keys for ``seconds``."""
    from lowtide.clients import Client

    rng = np.random.default_rng(4)
    took: list[float] = []
    with Client(target, timeout=600) as client:
        producer = client.producer("K", source="p0", max_batch_rows=STEADY_ROWS)
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            table = keys_table(rng.integers(0, groups, STEADY_ROWS, dtype=np.int64))
            began = time.perf_counter()
            producer.send(table)
            producer.flush()
            took.append((time.perf_counter() - began) * 1000)
    return took


def taken(running: Server) -> list[Taken]:
    found = []
    for line in list(running.stderr):
        match = TAKEN.match(line)
        if match:
            seq, size, seconds, pause = match.groups()
            found.append(Taken(int(seq), int(size), float(seconds), float(pause)))
    return found


def config(interval_s: float) -> str:
    """The server's settings: checkpoints every ``interval_s`` (0: none), never by log size."""
    return (
        f"checkpoint_interval_s = {interval_s}\ncheckpoint_log_bytes = {1 << 40}\n"
        f"max_query_state_bytes = {16 << 30}\n"  # the 1 GB case holds more than the default 1 GiB
    )


def fill_to(running: Server, megabytes: int, interval_s: float, state: Path) -> tuple[int, Taken]:
    """Fill until a checkpoint holds about ``megabytes`` MB (a second fill makes up what the
    estimate missed): the groups, and the checkpoint of them all."""
    goal = megabytes * 1_000_000
    groups = max(FILL_ROWS // 100, goal // BYTES_PER_GROUP)
    fill(running.target, 0, groups)
    whole = whole_checkpoint(running, interval_s, state)
    if whole.bytes < 0.9 * goal:
        more = int(groups * (goal / whole.bytes - 1))
        fill(running.target, groups, groups + more)
        groups += more
        whole = whole_checkpoint(running, interval_s, state)
    return groups, whole


def one_size(megabytes: int, interval_s: float, steady_s: float, scratch: Path) -> Sized:
    """With checkpoints first: fill to about ``megabytes`` of checkpoint, then the same groups
    without checkpoints."""
    sized = Sized(megabytes, 0, 0.0)
    for setting in ("on", "off"):
        state = Path(tempfile.mkdtemp(prefix=f"checkpoints-{megabytes}-{setting}-", dir=scratch))
        running = Server.start(state, "no", scratch, config(interval_s if setting == "on" else 0))
        try:
            if setting == "on":
                sized.groups = fill_to(running, megabytes, interval_s, state)[0]
                before = len(taken(running))
            else:
                sized.fill_s = fill(running.target, 0, sized.groups)
            took = steady(running.target, sized.groups, steady_s)
            sized.ack_ms[setting] = [
                float(np.percentile(took, 50)),
                float(np.percentile(took, 99)),
                max(took),
            ]
            if setting == "on":
                time.sleep(interval_s + 1)  # one more checkpoint, begun in the steady phase, finishes
                sized.taken = taken(running)[before:]
                if not sized.taken:
                    raise RuntimeError(f"no checkpoint finished in the steady phase: {running.status()}")
        finally:
            running.stop()
            shutil.rmtree(state, ignore_errors=True)
    return sized


def measure(sizes: list[int], interval_s: float, steady_s: float, scratch: Path) -> list[Sized]:
    found = []
    for megabytes in sizes:
        found.append(
            attempt(f"checkpoints {megabytes} MB", lambda: one_size(megabytes, interval_s, steady_s, scratch))  # noqa: B023
        )
        s = found[-1]
        print(
            f"   checkpoints of {megabytes} MB ({s.groups:,} groups): "
            + ", ".join(
                f"{t.bytes / 1e6:.0f} MB in {t.seconds:.2f} s (pause {t.pause_s * 1000:.0f} ms)"
                for t in s.taken
            )
            + f"; acks p99 {s.ack_ms['on'][1]:.2f} ms with, {s.ack_ms['off'][1]:.2f} ms without",
            file=sys.stderr,
        )
    return found


def table(found: list[Sized], interval_s: float, steady_s: float) -> list[str]:
    lines = [
        "### Checkpoints as window state grows",
        "",
        f"One query holding N groups open; checkpoints every {interval_s:g} s during {steady_s:g} s of "
        f"{STEADY_ROWS:,}-row batches, each sent and acknowledged (send + flush) before the next; the same "
        "phase on a server with the same state and no checkpoints beside it. Checkpoint figures are "
        "medians (max) over the checkpoints of the phase, from the server's own line per checkpoint.",
        "",
        "| groups | checkpoint on disk | checkpoints | duration (barrier -> manifest) | worker pause | "
        "ack p50 / p99 / max, checkpointing | ack p50 / p99 / max, no checkpoints |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in found:
        on, off = s.ack_ms["on"], s.ack_ms["off"]
        pauses = [t.pause_s * 1000 for t in s.taken]
        lines.append(
            f"| {s.groups:,} | {med([t.bytes for t in s.taken]) / 1e6:,.1f} MB | {len(s.taken)} | "
            f"{med([t.seconds for t in s.taken]):.2f} s ({max(t.seconds for t in s.taken):.2f} s) | "
            f"{med(pauses):.0f} ms ({max(pauses):.0f} ms) | "
            f"{on[0]:.2f} / {on[1]:.2f} / {on[2]:.1f} ms | {off[0]:.2f} / {off[1]:.2f} / {off[2]:.1f} ms |"
        )
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-mb", default="1,10,100,1000", help="checkpoint sizes to reach, MB")
    parser.add_argument("--interval-s", type=float, default=2.0, help="checkpoint_interval_s")
    parser.add_argument("--steady-s", type=float, default=12.0, help="seconds of acknowledged batches")
    parser.add_argument("--scratch", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="lowtide-checkpoints-", dir=args.scratch))
    try:
        found = measure(
            [int(m) for m in args.state_mb.split(",") if m], args.interval_s, args.steady_s, scratch
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = " ".join(["python bench/checkpoints.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        '## Checkpoint size and pause (lowtide serve, 2 workers, --state-dir, fsync "no")',
        "",
        f"Command: `{command}`; lowtide from {measured_lowtide()}.",
        "",
        *table(found, args.interval_s, args.steady_s),
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoints.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
