"""The door of the server's front: a :class:`~lowtide.door.Door` over the workers'
:class:`~lowtide.server.process_runner.ProcessRunner`, with what the front asks of that runner.

Invariant: the front and what works for it (the service, the staged calls, the checkpoint's
modules, start-up) reach the runner through these named calls only, never through
``door.runner`` (tests/unit/test_layers.py checks): what the front needs of the workers' side is
listed here, and the runner may change behind it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowtide.door import Door
from lowtide.server import messages as msg
from lowtide.server.process_runner import ProcessRunner, RemoteQuery
from lowtide.server.transport import Arrays

# A message a result stream sent a worker while a checkpoint waited: (worker, the message as
# plain data, its arrays); see messages.to_record.
Recorded = tuple[int, tuple[Any, ...], dict[str, Any] | None]


class ServerDoor(Door[ProcessRunner]):
    """The door whose queries run in the workers (see the module)."""

    # -- the queries as the workers run them ------------------------------------------------------
    def remote(self, name: str) -> RemoteQuery | None:
        """Query ``name`` as the workers run it (a derived table's part too); None if unknown."""
        return self.runner.queries.get(name)

    def remotes(self) -> Mapping[str, RemoteQuery]:
        """Every registered query as the workers run it, the parts of derived tables included."""
        return self.runner.queries

    def fail_remote(self, name: str, reason: str, status: str = "ABORTED") -> bool:
        """Fail query ``name`` where it runs (its workers drop it, its subscriptions end with
        ``status``); False if it is unknown or failed already."""
        remote = self.runner.queries.get(name)
        if remote is None or remote.failed:
            return False
        self.runner.fail(remote, reason, status)
        return True

    def hosted(self, worker: int) -> dict[str, int]:
        """The queries with operators on ``worker``, each with its state bytes there."""
        return self.runner.hosted(worker)

    # -- the workers ------------------------------------------------------------------------------
    def on_worker_message(
        self, worker: int, message: msg.QueryOutput | msg.StatsMessage, arrays: Arrays
    ) -> str | None:
        """Apply one message from a worker; the name of the query it concerns, if any."""
        return self.runner.on_worker_message(worker, message, arrays)

    def worker_died(self, worker: int) -> list[str]:
        """Fail every query that had state on ``worker`` (no state directory); their names."""
        return self.runner.worker_died(worker)

    def request_stats(self) -> None:
        self.runner.request_stats()

    def worker_strings(self) -> dict[int, int]:
        """What each worker's string pool held at its last statistics."""
        return dict(self.runner.worker_strings)

    def sync_strings(self) -> None:
        """Send the workers the string pool's entries they lack (before a restore's messages)."""
        self.runner.sync_strings()

    # -- checkpoints ------------------------------------------------------------------------------
    def record(self, channel: list[Recorded] | None, pinned: list[int] | None) -> None:
        """While a checkpoint waits for its barriers: what result streams send to workers goes
        into ``channel``, the codes of the strings the front's last Projects pin into
        ``pinned`` (its output side saves both). None, None: no checkpoint waits."""
        self.runner.recording = channel
        self.pool.recording = pinned


__all__ = ["Recorded", "ServerDoor"]
