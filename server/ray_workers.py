"""The workers as actors of a Ray cluster: a :class:`~lowtide.server.transport.WorkerTransport`.

The front joins the cluster as a Ray driver in the namespace ``lowtide`` (:func:`connect`) and
starts one actor per worker, named ``lowtide-worker-<i>``, reserving ``--worker-cpus`` CPUs each
and placed by Ray's SPREAD strategy. Each actor (:class:`RayWorker`) runs the server's own
:class:`~lowtide.server.worker_process.Worker` on the same typed messages as a local worker;
columns travel as numpy arrays (Ray's out-of-band buffers).

A call carries many messages: what the front posts waits in the worker's
:class:`~lowtide.server.outbox.Outbox` and goes in one call at once while fewer than :data:`AHEAD`
calls are on their way to the worker (it would otherwise run out of work), else once the outbox
holds :data:`CALL_BYTES` of columns or a call is answered; at most :data:`IN_FLIGHT` calls are on
their way to one worker. A punctuation or a control message thus waits only while the worker has
calls ahead of it to handle, and under load calls grow to many batches each: Ray's cost is per
call, not per message. Past :data:`MAX_QUEUED_BYTES` posted to a worker and not answered,
ingestion waits. A call and its answer travel inline, in the request to the actor's process and in
its reply (up to :data:`INLINE_BYTES`), rather than through the object store, where each would
cost a put, a pull by the other node and a release (and a punctuation's results wait for all
three).

Invariant: a worker handles messages in the order they were posted, and the front hands its
answers to ``on_message`` in the order the worker sent them, whatever order Ray runs calls in:
calls are numbered, the actor takes them in their numbers' order, and the front awaits their
answers oldest first. What a worker sends outside a call (a checkpoint's file written, reported
by a thread) comes back through a standing call (:meth:`RayWorker.later`), which also tells the
front at once that an actor is gone.

An actor that dies (its node lost, killed, out of memory) is killed for good and placed again
under its name by attempts (Ray places it on a live node with room): each attempt waits
``attempt_timeout_s`` for the new actor to answer, else kills it (a creation Ray leaves pending,
or places on a node being removed) and tries again after a back-off, as Flink's exponential-delay
restart strategy does (:mod:`~lowtide.server.restart_strategy`); only ``max_attempts`` failed in a
row go to ``on_give_up``. Once it answers, ``on_death`` reports it and the front restores it as it
does a local worker, counted in its restarts (:meth:`RayWorkers.places`: each worker's node
address, pid, restarts and status, as its actor's ``where()`` answered). A cluster whose address
has not answered for :data:`CLUSTER_GONE_S` (probed once a second) goes to ``on_give_up`` too,
before Ray would end the driver itself.

``local`` starts a private one-machine cluster inside the server (:mod:`~lowtide.server.ray_local`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorAlreadyExistsError, GetTimeoutError, RayError
from ray.util import get_node_ip_address

from lowtide.errors import StartupFailure
from lowtide.server import messages as msg
from lowtide.server.outbox import Outbox, Outboxes
from lowtide.server.ray_local import start_private, stop_private
from lowtide.server.restart_strategy import Backoff, RestartStrategy
from lowtide.server.transport import Arrays, OnDeath, OnGiveUp, OnMessage, WorkerPlace
from lowtide.server.worker_process import Worker

NAMESPACE = "lowtide"
CALL_BYTES = 4 << 20  # columns that make a call go even while the worker has calls ahead
IN_FLIGHT = 4  # calls on their way to one worker
AHEAD = 2  # calls on their way below which the outbox goes at once: one handled, one waiting
INLINE_BYTES = 2 * CALL_BYTES  # a call this large still travels inline (Ray's default: 100 KB)
MAX_QUEUED_BYTES = 32 << 20  # columns posted to one worker and not answered: ingestion waits past it
# A call's failure: its actor died (Ray), or Ray Client lost the cluster (ray:// addresses).
CallFailed = (RayError, ConnectionError)
PLACE_TIMEOUT_S = 120.0  # at the start, for every actor to be placed and answer (a cold node imports)
PROBE_TIMEOUT_S = 5.0  # to reach the cluster's address before Ray's own, much longer, retries
CLUSTER_GONE_S = 5.0  # the cluster's address unanswered this long: it is gone (Ray ends its driver at 60 s)
JOIN_TIMEOUT_S = 30.0  # for a cluster that answers to take the driver in
NAMES_TIMEOUT_S = 10.0  # for the names of a front killed a moment ago to be free (Ray ends its actors)

Wire = tuple[tuple[int, tuple[Any, ...]], Arrays | None]  # a message as its codec's code and fields


def actor_name(index: int) -> str:
    return f"lowtide-worker-{index}"


def _writable(arrays: Arrays | None) -> Arrays:
    """Columns a receiver may keep and write: Ray hands out read-only views of its object store."""
    if not arrays:
        return {}
    return {name: a if a.flags.writeable else a.copy() for name, a in arrays.items()}


class RayWorker:
    """A worker inside a Ray actor; an async actor, so :meth:`later` waits beside the calls."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.next_call = 0
        self.turn = asyncio.Condition()
        self.parked: set[int] = set()  # numbers of the calls waiting for an earlier one to be handled
        self.answers: list[Wire] = []  # of the call being handled
        self.later_answers: list[Wire] = []  # sent by other threads, for :meth:`later`
        self.later_ready = asyncio.Event()
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = -1
        self.worker = Worker(self)

    def send(self, message: msg.ToFront, arrays: Arrays | None = None) -> None:
        """The worker's :class:`~lowtide.server.worker_process.Outbound`."""
        wire = (msg.TO_FRONT.encode(message), arrays)
        if threading.get_ident() == self.loop_thread:
            self.answers.append(wire)
            return
        with self.lock:
            self.later_answers.append(wire)
        assert self.loop is not None  # a thread sends only after a call started it
        self.loop.call_soon_threadsafe(self.later_ready.set)

    async def handle(self, number: int, calls: list[Wire]) -> list[Wire]:
        """Handle one call's messages, after every call numbered before it; its answers."""
        async with self.turn:
            self.parked.add(number)
            try:
                await self.turn.wait_for(lambda: self.next_call == number)
            finally:
                self.parked.discard(number)
        self.loop, self.loop_thread = asyncio.get_running_loop(), threading.get_ident()
        try:
            for wire, arrays in calls:  # no await in here: no other call runs in between
                self.worker.handle(msg.TO_WORKER.decode(wire), _writable(arrays))
        finally:
            self.next_call += 1
            async with self.turn:
                self.turn.notify_all()
        answers, self.answers = self.answers, []
        return answers

    async def later(self) -> list[Wire]:
        """What the worker sent outside a call, once there is some."""
        self.loop = asyncio.get_running_loop()
        await self.later_ready.wait()
        self.later_ready.clear()
        with self.lock:
            answers, self.later_answers = self.later_answers, []
        return answers

    async def where(self) -> tuple[str, str, int]:
        """The node (id, address) and the process this actor runs in."""
        return ray.get_runtime_context().get_node_id(), get_node_ip_address(), os.getpid()


RemoteWorker = ray.remote(RayWorker)


@dataclass
class _Actor:
    """One worker as the front sees it: its actor, what waits for it, what is on its way."""

    index: int
    actor: Any  # Ray's handle of the actor
    where: str = ""  # its node and process, for the log
    node: str = ""  # its node's address and its process (see :meth:`RayWorkers.places`)
    pid: int = 0
    # Closed once its actor is gone (or the pool stops): posts are dropped.
    outbox: Outbox = field(default_factory=lambda: Outbox(MAX_QUEUED_BYTES))
    calls: deque[Any] = field(default_factory=deque)  # the answers' refs of the outbox's calls on their way
    numbered: int = 0  # calls sent so far
    sent: asyncio.Event = field(default_factory=asyncio.Event)  # a call to await
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class RayWorkers(Outboxes):
    def __init__(
        self,
        workers: int,
        address: str,
        cpus: float,
        on_message: OnMessage,
        on_death: OnDeath,
        on_give_up: OnGiveUp,
        restart: RestartStrategy,
        node_ip: str,
    ) -> None:
        self.size = workers
        self.address = address
        self.cpus = cpus
        self.node_ip = node_ip
        self.restart = restart
        self.backoffs = [Backoff(self.restart) for _ in range(workers)]
        self.status = ["placing"] * workers  # placing | pending (a back-off) | running
        self.on_message = on_message
        self.on_death = on_death
        self.on_give_up = on_give_up
        self.handles: list[_Actor] = []
        self.restarts = [0] * workers  # per worker: placed again after its first start
        self._stopping = False
        self._cluster_gone = False
        self._replacing: set[asyncio.Task[None]] = set()
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Join the cluster and place every worker; blocks until they answer (before serving)."""
        # Read by Ray's core worker of this process as ray.init starts it (an existing setting wins).
        os.environ.setdefault("RAY_max_direct_call_object_size", str(INLINE_BYTES))
        watched = connect(self.address, math.ceil(self.size * self.cpus), self.node_ip)
        try:
            self.handles = [_Actor(i, self._create_named(i)) for i in range(self.size)]
            places = ray.get([h.actor.where.remote() for h in self.handles], timeout=PLACE_TIMEOUT_S)
        except ActorAlreadyExistsError as exc:
            _leave()
            raise StartupFailure(
                f"cannot start the workers on the Ray cluster: {exc.args[0].split('. ')[0]} "
                "(another lowtide server runs on it)"
            ) from None
        except GetTimeoutError:
            free = ray.available_resources().get("CPU", 0)
            _leave()
            raise StartupFailure(
                f"cannot place {self.size} workers of {self.cpus:g} CPUs on the Ray cluster within "
                f"{PLACE_TIMEOUT_S:.0f} s ({free:g} CPUs free)"
            ) from None
        except RayError as exc:  # an actor that failed as it started (its error is above)
            _leave()
            raise StartupFailure(f"cannot start the workers on the Ray cluster: {_first_line(exc)}") from None
        for handle, place in zip(self.handles, places, strict=True):
            self._placed(handle, place, "on")
            self.backoffs[handle.index].placed(time.monotonic())
        self._watch = asyncio.get_running_loop().create_task(self._watch_cluster(watched))

    def _create_named(self, index: int) -> Any:
        """Create the worker's actor; a name still held waits a moment (a front killed a moment
        ago: Ray ends its actors once it sees it gone), then fails."""
        deadline = time.monotonic() + NAMES_TIMEOUT_S
        while True:
            try:
                return self._create(index)
            except ActorAlreadyExistsError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # paced: the start blocks anyway until every worker answers

    def _create(self, index: int) -> Any:
        options = {
            "name": actor_name(index),
            "namespace": NAMESPACE,
            "num_cpus": self.cpus,
            "scheduling_strategy": "SPREAD",
            "max_restarts": 0,  # the front recreates it and restores its state (see the module)
            "max_task_retries": 0,
            # Its answers (results) travel inline too, as the front's calls do (see start()).
            "runtime_env": {"env_vars": {"RAY_max_direct_call_object_size": str(INLINE_BYTES)}},
        }
        return RemoteWorker.options(**options).remote(index)

    def _placed(self, handle: _Actor, place: tuple[str, str, int], how: str, after: str = "") -> None:
        node_id, address, pid = place
        handle.where = f"Ray node {address} ({node_id[:8]}), pid {pid}"
        handle.node, handle.pid = address, pid
        self.status[handle.index] = "running"
        print(
            f"lowtide: worker {handle.index} ({actor_name(handle.index)}) {how} {handle.where}{after}",
            file=sys.stderr,
        )
        loop = asyncio.get_running_loop()
        handle.tasks = [
            loop.create_task(self._pump(handle)),
            loop.create_task(self._receive(handle)),
            loop.create_task(self._later(handle)),
        ]

    # -- the front's side of the protocol ------------------------------------------------------
    def places(self) -> list[WorkerPlace]:
        return [
            WorkerPlace(h.node, h.pid, self.restarts[h.index], self.status[h.index]) for h in self.handles
        ]

    async def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        await self.idle()
        for handle in self.handles:
            self.post(handle.index, msg.StopMessage())
        await self.idle()
        for task in list(self._replacing):
            task.cancel()
        # Their attempts end (and kill the actor they waited for) before Ray shuts down below:
        # a Ray call after ray.shutdown() would start a local Ray instance for itself. Their
        # outcomes are dropped, hiding nothing: an attempt places an actor, and the actors go too.
        await asyncio.gather(*self._replacing, return_exceptions=True)
        for handle in self.handles:
            handle.outbox.close()
            for task in handle.tasks:
                task.cancel()
            if not self._cluster_gone:  # nothing to kill, and no one to ask
                with contextlib.suppress(*CallFailed):
                    ray.kill(handle.actor, no_restart=True)
        _leave()

    async def _watch_cluster(self, address: tuple[str, int]) -> None:
        """Stop the server, saying why, once the cluster's address has not answered for
        :data:`CLUSTER_GONE_S` (its workers are gone and none can be placed again)."""
        host, port = address
        unanswered_since: float | None = None
        while True:
            await asyncio.sleep(1.0)  # paced: one probe a second
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
                writer.close()
                unanswered_since = None
                continue
            except (OSError, TimeoutError) as exc:
                reason = exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else "no answer"
            now = time.monotonic()
            unanswered_since = unanswered_since or now
            if now - unanswered_since >= CLUSTER_GONE_S and not self._stopping:
                self._stopping = self._cluster_gone = True
                self.on_give_up(
                    f"the Ray cluster at {host}:{port} is gone ({reason} for {CLUSTER_GONE_S:.0f} s)"
                )
                return

    # -- moving messages -----------------------------------------------------------------------
    @staticmethod
    def _due(outbox: Outbox) -> bool:
        if not outbox.messages or outbox.on_way >= IN_FLIGHT:
            return False
        return outbox.on_way < AHEAD or outbox.waiting_bytes >= CALL_BYTES

    async def _pump(self, handle: _Actor) -> None:
        """Send the outbox in calls of many messages (see the module)."""
        outbox = handle.outbox
        while True:
            await outbox.wait_for(lambda: self._due(outbox))
            call = [(msg.TO_WORKER.encode(message), arrays) for message, arrays in outbox.take(CALL_BYTES)]
            handle.calls.append(handle.actor.handle.remote(handle.numbered, call))
            handle.numbered += 1
            handle.sent.set()

    async def _receive(self, handle: _Actor) -> None:
        """Hand each call's answers to the front, oldest call first."""
        while True:
            while not handle.calls:
                handle.sent.clear()
                await handle.sent.wait()
            try:
                answers = await handle.calls[0]
            except CallFailed as exc:
                self._died(handle, exc)
                return
            if handle.outbox.closed:
                return
            handle.calls.popleft()
            handle.outbox.answered()
            self._deliver(handle, answers)

    async def _later(self, handle: _Actor) -> None:
        while True:
            try:
                answers = await handle.actor.later.remote()
            except CallFailed as exc:
                self._died(handle, exc)
                return
            if handle.outbox.closed:
                return
            self._deliver(handle, answers)

    def _deliver(self, handle: _Actor, answers: list[Wire]) -> None:
        for wire, arrays in answers:
            self.on_message(handle.index, msg.TO_FRONT.decode(wire), _writable(arrays))

    # -- a worker gone -------------------------------------------------------------------------
    def _died(self, handle: _Actor, cause: Exception) -> None:
        """Its actor failed a call: what was on its way is lost with it (the front's recovery
        sends it again); it is killed for good and created again."""
        if handle.outbox.closed:
            return
        handle.outbox.close()
        current = asyncio.current_task()
        for task in handle.tasks:
            if task is not current:
                task.cancel()
        handle.calls.clear()
        if self._stopping:  # the pool is ending: nothing to place again
            return
        self.status[handle.index] = "placing"
        self.backoffs[handle.index].died(time.monotonic())
        print(
            f"lowtide: worker {handle.index} on {handle.where} is gone ({_first_line(cause)}); "
            "placing it again",
            file=sys.stderr,
        )
        with contextlib.suppress(*CallFailed):
            ray.kill(handle.actor, no_restart=True)
        task = asyncio.get_running_loop().create_task(self._replace(handle.index))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, index: int) -> None:
        """Place the worker again, attempt after attempt (see the module), until one answers or
        ``max_attempts`` failed in a row."""
        backoff, lost = self.backoffs[index], time.monotonic()
        attempts = 0
        while not self._stopping:
            self.status[index] = "placing"
            attempts += 1
            try:
                actor, place = await self._attempt(index)
            except (TimeoutError, *CallFailed) as exc:
                # A failed attempt's actor was never posted to: the worker's work waits in the
                # front's log for the recovery that follows its placement, none of it lost here.
                why = (
                    f"no answer within {self.restart.attempt_timeout_s:g} s"
                    if isinstance(exc, TimeoutError)
                    else _first_line(exc)
                )
                wait = backoff.attempt_failed()
                if wait is None:
                    self._stopping = True
                    self.on_give_up(
                        f"worker {index} cannot be placed on the Ray cluster: {backoff.failed} attempts "
                        f"failed in a row (restart_max_attempts), the last: {why}"
                    )
                    return
                print(
                    f"lowtide: worker {index}: placing it failed ({why}); next attempt in {wait:g} s",
                    file=sys.stderr,
                )
                self.status[index] = "pending"
                await asyncio.sleep(wait)
                continue
            if self._stopping:
                return
            handle = self.handles[index] = _Actor(index, actor)
            self.restarts[index] += 1
            took = f"; {time.monotonic() - lost:.1f} s after it was lost, attempt {attempts}"
            self._placed(handle, place, "placed again on", took)
            backoff.placed(time.monotonic())
            self.on_death(index)
            return

    async def _attempt(self, index: int) -> tuple[Any, tuple[str, str, int]]:
        """Create the worker's actor and wait for it to answer, within the attempt's timeout;
        an actor that did not answer is killed (Ray may hold its creation pending forever)."""
        async with asyncio.timeout(self.restart.attempt_timeout_s):
            while True:
                try:
                    actor = self._create(index)
                    break
                except ActorAlreadyExistsError:  # the name is the dead actor's a moment longer
                    await asyncio.sleep(0.1)
            try:
                return actor, await actor.where.remote()
            except BaseException:  # re-raised: only the unanswered actor (no work of ours) is ended
                if not self._cluster_gone:  # nothing to kill, and no one to ask
                    with contextlib.suppress(*CallFailed):
                        ray.kill(actor, no_restart=True)
                raise


def _leave() -> None:
    """Leave the cluster as its driver, and end it if it is the server's private one."""
    ray.shutdown()
    stop_private()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


def connect(address: str, cpus: int, node_ip: str = "") -> tuple[str, int]:
    """Join the Ray cluster at ``address`` as a driver in :data:`NAMESPACE` (``local``: start a
    private one-machine cluster with room for ``cpus`` CPUs of workers, on ``node_ip`` or
    loopback); the address to watch it by. An address that does not answer stops the start at
    once, rather than after Ray's retries (minutes)."""
    if address == "local":
        return start_private(NAMESPACE, cpus, node_ip)
    watched = _probe(address)
    # Ray Client's calls block while it reconnects (30 s by default): no longer than the
    # front waits before it calls the cluster gone. An operator's own setting stays.
    os.environ.setdefault("RAY_CLIENT_RECONNECT_GRACE_PERIOD", f"{CLUSTER_GONE_S:.0f}")
    _join(address)
    return watched


def _join(address: str) -> None:
    """``ray.init``; a cluster that answers but refuses the driver (a node not yet registered,
    its control service busy on a loaded machine) is tried again for up to JOIN_TIMEOUT_S."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
            return
        except (ConnectionError, RuntimeError, ValueError) as exc:  # at the start: nothing taken yet
            reason = f"cannot join the Ray cluster at {address}: {_first_line(exc)}"
            if isinstance(exc, ValueError) or time.monotonic() >= deadline:
                raise StartupFailure(reason) from None
            print(f"lowtide: {reason}; trying again", file=sys.stderr, flush=True)
            time.sleep(1.0)  # Ray's own pace between its connection attempts


def _probe(address: str) -> tuple[str, int]:
    """Connect to the cluster's address (``auto``: the one Ray would use) once, briefly; it."""
    target = address.removeprefix("ray://")
    if address == "auto":
        target = os.environ.get("RAY_ADDRESS", "")
        if not target:
            from ray._private.services import canonicalize_bootstrap_address_or_die

            try:  # the address of the running local cluster (`ray start` records it)
                target = canonicalize_bootstrap_address_or_die("auto")
            except ConnectionError:
                raise StartupFailure(
                    "--ray auto: no Ray cluster found (RAY_ADDRESS is not set and none runs here; "
                    "start one with `ray start --head`)"
                ) from None
        target = target.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise StartupFailure(f"cannot reach the Ray cluster at {address}: {reason.lower()}") from None
    return host, int(port)


__all__ = ["NAMESPACE", "RayWorker", "RayWorkers", "actor_name", "connect"]
