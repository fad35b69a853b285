"""How the front reaches its N workers: the :class:`WorkerTransport` protocol.

A transport starts N workers (index 0..N-1), carries the typed messages of
:mod:`lowtide.server.messages` to each in the order they were posted, hands every message a
worker sends back to ``on_message`` (a result's columns flattened by :func:`encode_columns`,
whatever the transport: the runner decodes them), and reports a worker that died to
``on_death`` once it runs again, empty (the front recovers it). A worker that cannot be kept
running (it fails at start every time) goes to ``on_give_up`` with a one-line reason: the server
stops. What is sent where, and how outputs are melded, is the
:class:`~lowtide.server.process_runner.ProcessRunner`'s: a transport moves messages only, and
knows where each worker runs (:class:`WorkerPlace`, for ``lowtide workers`` and the metric
``lowtide_worker_info``).

Transports: :class:`~lowtide.server.local_workers.LocalWorkers` (processes on this machine, over
shared memory), :class:`~lowtide.server.ray_workers.RayWorkers` (actors of a Ray cluster).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from lowtide.server import messages as msg

Arrays = dict[str, np.ndarray[Any, Any]]
OnMessage = Callable[[int, msg.ToFront, dict[str, Any]], None]
OnDeath = Callable[[int], None]
OnGiveUp = Callable[[str], None]


@dataclass(frozen=True)
class WorkerPlace:
    """Where one worker runs: its node's address (``localhost`` for a process on the server's own
    machine), its process id, how often it was started again since the server started, and its
    status: ``running``, ``placing`` (being started again: where it ran last) or ``pending``
    (waiting out a back-off before its next placement attempt)."""

    node: str
    pid: int
    restarts: int
    status: str


class WorkerTransport(Protocol):
    size: int  # workers

    def start(self) -> None: ...

    def post(self, worker: int, message: msg.ToWorker, arrays: Arrays | None = None) -> None:
        """Queue a message for a worker, after those posted before; never blocks."""
        ...

    def broadcast(self, message: msg.ToWorker) -> None: ...

    async def wait_for_room(self) -> None:
        """Wait while the workers are too far behind (the backpressure ingestion awaits)."""
        ...

    async def idle(self) -> None:
        """Wait until everything posted has reached its worker."""
        ...

    async def stop(self) -> None:
        """Send what is queued, then end every worker."""
        ...

    def places(self) -> list[WorkerPlace]:
        """Where each worker runs, by index; one being started again: where it ran last."""
        ...


def encode_columns(columns: dict[str, Any]) -> Arrays:
    """Engine columns as plain arrays; an Arrow list column travels as offsets and values.

    Strings in a list (heavy hitters of a string column) travel as a fixed-width unicode array:
    an object array would put pointers into this process's memory on the channel.
    """
    flat: Arrays = {}
    for name, values in columns.items():
        if isinstance(values, pa.ListArray):
            items = values.values
            flat[f"{name}\x00offsets"] = values.offsets.to_numpy()
            flat[f"{name}\x00values"] = (
                np.asarray(items.to_pylist(), dtype=np.str_)
                if pa.types.is_string(items.type) or pa.types.is_large_string(items.type)
                else items.to_numpy(zero_copy_only=False)
            )
        else:
            flat[name] = np.asarray(values)
    for name, array in flat.items():
        if array.dtype.hasobject:  # fail the query, rather than the front reading stray pointers
            raise TypeError(f"column {name!r} holds Python objects, which cannot cross the channel")
    return flat


def decode_columns(flat: Arrays) -> dict[str, Any]:
    """The columns :func:`encode_columns` flattened."""
    columns: dict[str, Any] = {}
    for name, values in flat.items():
        base, _, part = name.partition("\x00")
        if part == "offsets":
            columns[base] = pa.ListArray.from_arrays(pa.array(values), pa.array(flat[f"{base}\x00values"]))
        elif not part:
            columns[name] = values
    return columns


__all__ = [
    "Arrays",
    "OnDeath",
    "OnGiveUp",
    "OnMessage",
    "WorkerPlace",
    "WorkerTransport",
    "decode_columns",
    "encode_columns",
]
