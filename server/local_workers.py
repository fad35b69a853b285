"""The workers as processes on this machine: a :class:`~lowtide.server.transport.WorkerTransport`.

Each worker has two shared-memory channels (front -> worker, worker -> front). What the front
posts to a worker goes into that worker's :class:`~lowtide.server.outbox.Outbox`, in order; one
task per worker moves the outbox into the channel, a message a call, waiting while the worker is
behind. ``wait_for_room`` is the backpressure the ingest path awaits: past
:data:`MAX_QUEUED_BYTES` not yet in a worker's channel, a producer faster than the workers is
slowed down by gRPC flow control, never dropped. A worker that dies is noticed at once through
its process sentinel and started again at once: a fork of :mod:`~lowtide.server.worker_fork`'s
fork server, which imported the worker's modules once, serves in milliseconds.

A worker that cannot start (it exits with an error of its own before it serves: a broken main
module, shared memory it cannot map) is started again after :data:`START_DELAY_S`, as Flink's
fixed-delay restart strategy does; after :data:`START_ATTEMPTS` such failures in a row the
transport gives up (``on_give_up``: the server stops, naming the cause). A worker that served
ends with exit code 0 (:func:`~lowtide.server.worker_process.worker_main`) or by a signal (killed,
out of memory): that is a death, recovered however often it happens.

Every worker runs on this machine: its node is :data:`NODE` (``localhost``), its pid the
process's, its restarts how often it was spawned again (:meth:`LocalWorkers.places`).
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

from lowtide.server import messages as msg
from lowtide.server.channel import (
    ChannelBroken,
    ChannelFull,
    ChannelReader,
    ChannelWriter,
    create_segment,
    remove_stale_segments,
)
from lowtide.server.outbox import Outbox, Outboxes
from lowtide.server.transport import OnDeath, OnGiveUp, OnMessage, WorkerPlace
from lowtide.server.worker_fork import context
from lowtide.server.worker_process import worker_main

MAX_QUEUED_BYTES = 4 << 20  # what may wait ahead of a punctuation: bounds its latency
START_ATTEMPTS = 3  # failed starts in a row of one worker before the server stops
START_DELAY_S = 1.0  # between a failed start and the next attempt
NODE = "localhost"  # the node of every local worker: the server's own machine


@dataclass
class WorkerHandle:
    index: int
    process: Any
    writer: ChannelWriter[msg.ToWorker]
    reader: ChannelReader[msg.ToFront]
    segments: tuple[shared_memory.SharedMemory, shared_memory.SharedMemory]
    # Closed once its process is gone (while the pool stops: not spawned again).
    outbox: Outbox = field(default_factory=lambda: Outbox(MAX_QUEUED_BYTES))
    task: asyncio.Task[None] | None = None
    failed_starts: int = 0  # of this worker, in a row, before this process (see the module)


class LocalWorkers(Outboxes):
    def __init__(
        self,
        workers: int,
        on_message: OnMessage,
        on_death: OnDeath,
        on_give_up: OnGiveUp,
        channel_bytes: int = 64 << 20,
    ) -> None:
        self.size = workers
        self.on_message = on_message
        self.on_death = on_death
        self.on_give_up = on_give_up
        self.channel_bytes = channel_bytes
        self.handles: list[WorkerHandle] = []
        self.restarts = [0] * workers  # per worker: spawned again after its first start
        self._stopping = False
        self._ctx = context()

    def start(self) -> None:
        stale = remove_stale_segments()
        if stale:
            gone = f"lowtide: removed {len(stale)} shared-memory segment(s) of servers that are gone"
            print(gone, file=sys.stderr)
        self.handles = [self._spawn(i) for i in range(self.size)]

    def _spawn(self, index: int) -> WorkerHandle:
        loop = asyncio.get_running_loop()
        to_worker, from_worker = create_segment(self.channel_bytes), create_segment(self.channel_bytes)
        # One-way pipes (not socket pairs): a writer can see how much room the pipe has left.
        worker_in, front_out = self._ctx.Pipe(duplex=False)
        front_in, worker_out = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=worker_main,
            args=(to_worker.name, worker_in, from_worker.name, worker_out),
            name=f"lowtide-worker-{index}",
            daemon=True,
        )
        process.start()
        worker_in.close()
        worker_out.close()
        # The front never blocks on a worker: the reader takes whatever the pipe has (whole
        # frames only), the writer leaves what the pipe cannot take now pending.
        os.set_blocking(front_in.fileno(), False)
        os.set_blocking(front_out.fileno(), False)
        handle = WorkerHandle(
            index,
            process,
            ChannelWriter(to_worker, front_out, msg.TO_WORKER),
            ChannelReader(from_worker, front_in, msg.TO_FRONT),
            (to_worker, from_worker),
        )
        loop.add_reader(handle.reader.fileno(), self._drain, handle)
        loop.add_reader(process.sentinel, self._died, handle)
        handle.task = loop.create_task(self._pump(handle))
        return handle

    async def _pump(self, handle: WorkerHandle) -> None:
        """Move the outbox into the channel, a message a call: answered once its frame is whole
        in the pipe."""
        outbox, writer = handle.outbox, handle.writer
        pause = 1e-4
        while True:
            await outbox.wait_for(lambda: outbox.busy)
            try:
                if outbox.on_way:  # only the rest of a frame the pipe could not take at once
                    if not writer.flush():
                        raise ChannelFull()
                    outbox.answered()
                    continue
                message, arrays = outbox.messages[0]
                writer.try_send(message, arrays)
            except ChannelFull:
                await asyncio.sleep(pause)
                pause = min(2 * pause, 5e-3)
                continue
            except OSError:
                return  # the worker is gone: its sentinel reports the death
            pause = 1e-4
            outbox.take()
            if not writer.pending:
                outbox.answered()

    def _drain(self, handle: WorkerHandle) -> None:
        try:
            for message, arrays in handle.reader.receive():
                self.on_message(handle.index, message, arrays)
        except EOFError:
            pass  # the worker is gone: the sentinel reports the death
        except ChannelBroken as exc:
            # Its messages can no longer be told apart: the worker's output is lost from here on,
            # so it fails as a whole (the sentinel then respawns and recovers it).
            print(f"lowtide: worker {handle.index}: channel out of step ({exc}); restarting", file=sys.stderr)
            handle.process.kill()

    def _died(self, handle: WorkerHandle) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(handle.process.sentinel)
        self._drain(handle)
        self._close(handle)
        if self._stopping:
            return
        handle.process.join(5)  # its sentinel closes as it exits, a moment before it can be reaped
        code = handle.process.exitcode
        if code is None or code <= 0:  # it served (exit 0) or was killed (a signal): start it again
            self._restart(handle.index, 0)
            return
        failed = handle.failed_starts + 1
        if failed >= START_ATTEMPTS:
            self._stopping = True
            self.on_give_up(
                f"worker {handle.index} cannot start: it exited with code {code} {failed} times in a "
                "row (its error is above)"
            )
            return
        loop.call_later(START_DELAY_S, self._restart, handle.index, failed)

    def _restart(self, index: int, failed_starts: int) -> None:
        if self._stopping:
            return
        self.restarts[index] += 1
        handle = self.handles[index] = self._spawn(index)
        handle.failed_starts = failed_starts
        self.on_death(index)

    def places(self) -> list[WorkerPlace]:
        return [
            WorkerPlace(
                NODE, h.process.pid, self.restarts[h.index], "placing" if h.outbox.closed else "running"
            )
            for h in self.handles
        ]

    def _close(self, handle: WorkerHandle) -> None:
        handle.outbox.close()
        loop = asyncio.get_running_loop()
        loop.remove_reader(handle.reader.fileno())
        if handle.task is not None:
            handle.task.cancel()
        for segment in handle.segments:
            segment.close()
            segment.unlink()

    async def stop(self) -> None:
        self._stopping = True
        await self.idle()
        for handle in self.handles:
            self.post(handle.index, msg.StopMessage())
        await self.idle()
        for handle in self.handles:
            await asyncio.get_running_loop().run_in_executor(None, handle.process.join, 5)
            if handle.process.is_alive():
                handle.process.kill()
