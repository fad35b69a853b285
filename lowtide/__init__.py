"""lowtide: exact window queries over disordered, multi-source streams (the OOP architecture).

The engine (``Engine``, ``Limits``, ``SlowFlush``) loads on first use, so ``import lowtide.clients``
(a producer, a Spark executor) never pays for the planner, lark or numba. Nothing here loads Arrow
either: the ``lowtide`` command's control calls (listings, registrations) start without it
(tests/integration/test_cli_startup.py holds them to that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lowtide.clock import ManualClock
from lowtide.errors import (
    AlreadyExists,
    CorruptState,
    DeadlineExceeded,
    InvalidArgument,
    LateTuple,
    LowtideError,
    NotFound,
    OutOfRange,
    PermissionDenied,
    QuerySyntaxError,
    RegressingPunctuation,
    ResourceExhausted,
    SchemaMismatch,
    ServerError,
    ServerUnavailable,
    StartupFailure,
    Unauthenticated,
    UnsupportedQuery,
)
from lowtide.handles import Query
from lowtide.lazy import loader
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation

if TYPE_CHECKING:
    from lowtide.engine import Engine, Limits, SlowFlush

__version__ = "0.1.0"

__getattr__ = loader(
    __name__,
    {"Engine": "lowtide.engine", "Limits": "lowtide.engine", "SlowFlush": "lowtide.engine"},
    globals(),
)


__all__ = [
    "END_OF_STREAM",
    "NO_PROGRESS",
    "AlreadyExists",
    "CorruptState",
    "DeadlineExceeded",
    "Engine",
    "InvalidArgument",
    "LateTuple",
    "Limits",
    "LowtideError",
    "ManualClock",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "Punctuation",
    "Query",
    "QuerySyntaxError",
    "RegressingPunctuation",
    "ResourceExhausted",
    "SchemaMismatch",
    "ServerError",
    "ServerUnavailable",
    "SlowFlush",
    "StartupFailure",
    "Unauthenticated",
    "UnsupportedQuery",
    "__version__",
]
