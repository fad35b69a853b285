"""What the fork server loads once, before any worker forks (:mod:`lowtide.server.worker_fork`).

Importing this module is the preload: the worker's modules (numpy, numba, every operator), and
numba's CPU target made ready by one cached kernel. A process's first numba kernel initializes
that target (its typing and lowering registries: about half a second); done here, no fork pays it
at its first batch.
"""

from __future__ import annotations

from numba import njit

import lowtide.server.worker_process  # noqa: F401  (imported for the forks)


@njit(cache=True)
def _ready(value: int) -> int:
    return value + 1


_ready(1)
