"""lowtide: exact window queries over disordered, multi-source streams (the OOP architecture)."""

from lowtide.engine import Engine, Limits, Query, SlowFlush
from lowtide.errors import (
    AlreadyExists,
    InvalidArgument,
    LateTuple,
    LowtideError,
    NotFound,
    QuerySyntaxError,
    RegressingPunctuation,
    ResourceExhausted,
    SchemaMismatch,
    UnsupportedQuery,
)
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation
from lowtide.testing import ManualClock

__all__ = [
    "END_OF_STREAM",
    "NO_PROGRESS",
    "AlreadyExists",
    "Engine",
    "InvalidArgument",
    "LateTuple",
    "Limits",
    "LowtideError",
    "ManualClock",
    "NotFound",
    "Punctuation",
    "Query",
    "QuerySyntaxError",
    "RegressingPunctuation",
    "ResourceExhausted",
    "SchemaMismatch",
    "SlowFlush",
    "UnsupportedQuery",
]
