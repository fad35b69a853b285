"""The front <-> worker channel: a message is read whole or not at all, in order, whatever its
size and however the pipe splits it; a channel out of step is an error, never a skipped message;
the rings of servers that are gone are removed."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import select
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lowtide.server import messages as msg
from lowtide.server.channel import (
    SEGMENT_PREFIX,
    ChannelBroken,
    ChannelReader,
    ChannelWriter,
    create_segment,
    remove_stale_segments,
)
from lowtide.server.local_workers import LocalWorkers
from lowtide.server.transport import WorkerPlace

RING = 1 << 20
# Header sizes around the pipe's own limits: multiprocessing's 16 KiB split, a 64 KiB default
# pipe, the 1 MiB the channel asks for, and well past it.
SIZES = [0, 100, 16_383, 16_384, 16_385, 65_536, 300_000, 1 << 20, 3 << 20]


def _worker_writes(name: str, conn: Connection, sizes: list[int]) -> None:
    """A worker's side: a blocking writer sends a message per size, each with ring columns."""
    segment = shared_memory.SharedMemory(name=name)
    writer = ChannelWriter(segment, conn, msg.TO_FRONT)
    for i, size in enumerate(sizes):
        writer.send(msg.FailedMessage("x" * size, str(i)), {"v": np.full(1000, i, np.int64)})
    writer.close()
    segment.close()


def _front_reads(reader: ChannelReader[msg.ToFront], expected: int) -> list[tuple[Any, Any]]:
    """The front's side: a non-blocking reader woken by the pipe, as under the event loop."""
    os.set_blocking(reader.fileno(), False)
    got: list[tuple[Any, Any]] = []
    try:
        while True:
            select.select([reader.fileno()], [], [], 30)
            got.extend(reader.receive())
    except EOFError:
        pass
    assert len(got) == expected
    return got


def test_messages_of_every_size_arrive_whole_and_in_order() -> None:
    ctx = mp.get_context("spawn")
    segment = create_segment(RING)
    ours, theirs = ctx.Pipe(duplex=False)
    writer = ctx.Process(target=_worker_writes, args=(segment.name, theirs, SIZES))
    writer.start()
    theirs.close()
    try:
        got = _front_reads(ChannelReader(segment, ours, msg.TO_FRONT), len(SIZES))
    finally:
        writer.join(30)
        segment.close()
        segment.unlink()
    for i, ((message, arrays), size) in enumerate(zip(got, SIZES, strict=True)):
        assert message == msg.FailedMessage("x" * size, str(i))
        assert np.array_equal(arrays["v"], np.full(1000, i, np.int64))


@contextlib.contextmanager
def pipe_and_ring(ring: int = RING) -> Iterator[tuple[shared_memory.SharedMemory, Connection, Connection]]:
    """A ring and a one-way pipe (read end, write end) in this process, removed afterwards."""
    segment = create_segment(ring)
    read_end, write_end = mp.Pipe(duplex=False)
    try:
        yield segment, read_end, write_end
    finally:
        segment.close()
        segment.unlink()


def test_a_frame_larger_than_the_pipe_waits_pending_and_goes_whole() -> None:
    """The front's writer never blocks: what the pipe cannot take stays pending, then goes."""
    with pipe_and_ring() as (segment, read_end, write_end):
        os.set_blocking(write_end.fileno(), False)
        os.set_blocking(read_end.fileno(), False)
        writer = ChannelWriter(segment, write_end, msg.TO_WORKER)
        reader = ChannelReader(segment, read_end, msg.TO_WORKER)
        big = msg.StringsMessage(7, [f"value-{i}" for i in range(400_000)])  # a header of several MiB
        writer.try_send(big)
        assert writer.pending
        got = []
        while writer.pending or not got:
            got.extend(reader.receive())  # a partial frame is never a message
            writer.flush()
        got.extend(reader.receive())
        assert [m for m, _ in got] == [big]


def test_columns_larger_than_the_ring_travel_in_the_header() -> None:
    with pipe_and_ring(4096) as (segment, read_end, write_end):
        os.set_blocking(write_end.fileno(), False)
        writer = ChannelWriter(segment, write_end, msg.TO_WORKER)
        reader = ChannelReader(segment, read_end, msg.TO_WORKER)
        wide = {"a": np.arange(10_000, dtype=np.int64), "b": np.ones(3, np.bool_)}
        writer.try_send(msg.BatchMessage("q", 0, False, 10_000), wide)
        # the ring again
        writer.try_send(msg.BatchMessage("q", 0, False, 3), {"c": np.arange(3, dtype=np.int32)})
        while writer.pending:
            writer.flush()
        first, second = reader.recv(), reader.recv()
        assert first[0] == msg.BatchMessage("q", 0, False, 10_000)
        assert all(np.array_equal(first[1][k], wide[k]) for k in wide)
        assert np.array_equal(second[1]["c"], np.arange(3, dtype=np.int32))


def test_a_channel_out_of_step_is_an_error_not_a_skipped_message() -> None:
    with pipe_and_ring() as (segment, read_end, write_end):
        writer = ChannelWriter(segment, write_end, msg.TO_FRONT)
        reader = ChannelReader(segment, read_end, msg.TO_FRONT)
        writer.send(msg.EpochMessage("q"))
        os.write(write_end.fileno(), b"\x06" * 64)  # bytes that are not the next frame
        writer.send(msg.EpochMessage("q"))
        assert reader.recv()[0] == msg.EpochMessage("q")
        with pytest.raises(ChannelBroken):
            reader.recv()


def test_a_frame_cut_short_by_the_writers_death_is_no_message() -> None:
    with pipe_and_ring() as (segment, read_end, write_end):
        writer = ChannelWriter(segment, write_end, msg.TO_FRONT)
        writer.send(msg.EpochMessage("q"))
        writer.send(msg.FailedMessage("q", "y" * 10_000))
        os.set_blocking(read_end.fileno(), False)
        whole = os.read(read_end.fileno(), 1 << 20)
        os.write(write_end.fileno(), whole[:-10])  # the same two frames, the second cut short
        write_end.close()
        reader = ChannelReader(segment, read_end, msg.TO_FRONT)
        got = []
        with pytest.raises(EOFError):
            for message, _ in reader.receive():
                got.append(message)
        assert got == [msg.EpochMessage("q")]


def test_rings_of_servers_that_are_gone_are_removed() -> None:
    gone = mp.get_context("spawn").Process(target=int)
    gone.start()
    gone.join()
    stale = shared_memory.SharedMemory(name=f"{SEGMENT_PREFIX}{gone.pid}_test", create=True, size=4096)
    resource_tracker.unregister(f"/{stale.name}", "shared_memory")  # the test removes it, not the tracker
    ours = create_segment(4096)
    try:
        removed = remove_stale_segments()
        assert stale.name.lstrip("/") in removed
        assert not Path("/dev/shm", stale.name.lstrip("/")).exists()
        assert Path("/dev/shm", ours.name.lstrip("/")).exists()  # this process is alive
    finally:
        stale.close()
        ours.close()
        ours.unlink()


def _pipe_end_in(pid: int, pipe: str) -> Path:
    """The other process's descriptor on the same pipe (``pipe:[inode]``)."""
    return next(fd for fd in Path(f"/proc/{pid}/fd").iterdir() if os.readlink(fd) == pipe)


def test_a_worker_whose_channel_falls_out_of_step_is_restarted() -> None:
    """Garbage on a worker's pipe to the front is that worker's failure: the pool kills it,
    reports the death (the front then recovers its queries) and spawns it again."""

    async def run() -> tuple[list[int], list[WorkerPlace], list[WorkerPlace]]:
        deaths: list[int] = []
        died = asyncio.Event()

        def on_death(index: int) -> None:
            deaths.append(index)
            died.set()

        pool = LocalWorkers(1, lambda *_: None, on_death, lambda _: None, channel_bytes=RING)
        pool.start()
        before = pool.places()
        handle = pool.handles[0]
        pipe = os.readlink(f"/proc/self/fd/{handle.reader.fileno()}")
        with open(_pipe_end_in(handle.process.pid, pipe), "wb", buffering=0) as worker_end:
            worker_end.write(b"\x06" * 64)
        await asyncio.wait_for(died.wait(), 30)
        after = pool.places()
        await pool.stop()
        return deaths, before, after

    deaths, before, after = asyncio.run(run())
    assert deaths == [0]
    (first,), (again,) = before, after
    assert (first.node, first.restarts) == ("localhost", 0)
    assert (again.node, again.restarts) == ("localhost", 1)
    assert again.pid != first.pid  # the process spawned again
