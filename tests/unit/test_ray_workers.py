"""The Ray transport's pieces that need no cluster: the actor class run as a plain object (calls
taken in their numbers' order, whatever order they arrive in), and the ``ray`` settings.

The transport over a real multi-node cluster is tested in tests/integration/test_ray.py.
"""

from __future__ import annotations

import asyncio

import pytest

from lowtide.errors import InvalidArgument
from lowtide.server import messages as msg
from lowtide.server.config import ServerConfig
from lowtide.server.ray_workers import RayWorker, Wire


def wire(message: msg.ToWorker) -> Wire:
    return (msg.TO_WORKER.encode(message), None)


async def parked(actor: RayWorker, number: int) -> None:
    """Until call ``number`` waits for its turn (each pass lets the other tasks run)."""
    while number not in actor.parked:
        await asyncio.sleep(0)


def test_an_actor_takes_calls_in_their_numbers_order() -> None:
    async def run() -> list[msg.ToFront]:
        actor = RayWorker(0)
        stats = asyncio.ensure_future(actor.handle(1, [wire(msg.GetStatsMessage())]))
        await asyncio.wait_for(parked(actor, 1), 5)  # call 1 arrived first and waits for call 0
        assert not stats.done()
        strings = await actor.handle(0, [wire(msg.StringsMessage([0, 1], ["a", "b"]))])
        assert strings == []
        return [msg.TO_FRONT.decode(answer) for answer, _ in await stats]

    (answer,) = asyncio.run(run())
    assert answer == msg.StatsMessage({}, 2)  # the strings of call 0 were in the pool before call 1


def test_what_a_thread_sends_comes_back_through_the_standing_call() -> None:
    async def run() -> list[msg.ToFront]:
        actor = RayWorker(0)
        later = asyncio.ensure_future(actor.later())
        await actor.handle(0, [wire(msg.SyncMessage(7))])  # the actor's loop is known from a call
        await asyncio.to_thread(actor.send, msg.PersistedMessage(3, 10, 20, None))
        return [msg.TO_FRONT.decode(answer) for answer, _ in await asyncio.wait_for(later, 5)]

    assert asyncio.run(run()) == [msg.PersistedMessage(3, 10, 20, None)]


@pytest.mark.parametrize("address", ["auto", "local", "127.0.0.1:6379", "ray://head.example:10001"])
def test_ray_takes_ray_s_forms_of_an_address(address: str) -> None:
    assert ServerConfig.load(ray=address).ray == address


@pytest.mark.parametrize("address", ["yes", "127.0.0.1", "http://head:8265", "head:port"])
def test_ray_refuses_what_is_no_address(address: str) -> None:
    with pytest.raises(InvalidArgument, match="ray must be auto, local or a cluster address"):
        ServerConfig.load(ray=address)


def test_worker_cpus_must_be_positive() -> None:
    assert ServerConfig.load(worker_cpus=0.5).worker_cpus == 0.5
    with pytest.raises(InvalidArgument, match="worker_cpus"):
        ServerConfig.load(worker_cpus=0)
