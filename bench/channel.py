"""Hand-off between processes: the server's shared-memory channel against a pickled Queue.

Both move the same 10k-row batches (three int64/int32 columns) from one process to another;
the reader copies the columns out, as a worker does. Timing starts after both processes are up
(a round trip first), and covers sending N batches until the reader has taken the last.

    python bench/channel.py [--batches 5000] [--rows 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from lowtide.server import messages as msg
from lowtide.server.channel import ChannelReader, ChannelWriter, create_segment


def _columns(rows: int) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "k": np.arange(rows, dtype=np.int64),
        "len": np.ones(rows, np.int32),
        "ts": np.arange(rows, dtype=np.int64),
    }


def _shm_reader(name: str, conn: Connection, done: Connection, batches: int) -> None:
    segment = shared_memory.SharedMemory(name=name)
    reader = ChannelReader(segment, conn, msg.TO_WORKER)
    reader.recv()  # warm-up message
    done.send("ready")
    for _ in range(batches):
        reader.recv()
    done.send("done")
    segment.close()


def _queue_reader(queue: Any, done: Connection, batches: int) -> None:
    queue.get()
    done.send("ready")
    for _ in range(batches):
        _, columns = queue.get()
        for values in columns.values():
            np.copyto(np.empty_like(values), values)  # the copy out that a worker makes
    done.send("done")


def run_shm(batches: int, rows: int) -> float:
    ctx = mp.get_context("spawn")
    segment = create_segment(64 << 20)
    ours, theirs = ctx.Pipe()
    done_here, done_there = ctx.Pipe()
    reader = ctx.Process(target=_shm_reader, args=(segment.name, theirs, done_there, batches))
    reader.start()
    writer = ChannelWriter(segment, ours, msg.TO_WORKER)
    columns = _columns(rows)
    writer.send(msg.SyncMessage(0), columns)  # warm-up
    done_here.recv()
    began = time.perf_counter()
    for i in range(batches):
        writer.send(msg.BatchMessage("q", i, False, rows), columns)
    done_here.recv()
    seconds = time.perf_counter() - began
    reader.join()
    segment.close()
    segment.unlink()
    return seconds / batches


def run_queue(batches: int, rows: int) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=64)
    done_here, done_there = ctx.Pipe()
    reader = ctx.Process(target=_queue_reader, args=(queue, done_there, batches))
    reader.start()
    columns = _columns(rows)
    queue.put(("warm-up", columns))
    done_here.recv()
    began = time.perf_counter()
    for i in range(batches):
        queue.put((("batch", i), columns))
    done_here.recv()
    seconds = time.perf_counter() - began
    reader.join()
    return seconds / batches


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    shm = statistics.median(run_shm(args.batches, args.rows) for _ in range(args.runs))
    queue = statistics.median(run_queue(args.batches, args.rows) for _ in range(args.runs))
    print(f"{args.rows:,}-row batches, median of {args.runs} runs of {args.batches:,}")
    print(f"shared-memory channel: {shm * 1e6:8.1f} us per batch ({args.rows / shm / 1e6:6.1f}M rows/s)")
    print(f"pickled Queue:         {queue * 1e6:8.1f} us per batch ({args.rows / queue / 1e6:6.1f}M rows/s)")
    print(f"ratio: {queue / shm:.1f}x")


if __name__ == "__main__":
    main()
