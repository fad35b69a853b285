"""What a query does with late tuples (below the punctuation already published)."""

from __future__ import annotations

from enum import Enum

from lowtide.errors import InvalidArgument


class LatePolicy(Enum):
    DROP = "drop"  # counted, and kept in the side stream ``<query>.late``
    UPDATE = "update"  # windows stay open for the allowed lateness and re-emit revisions
    ERROR = "error"  # the batch holding a late tuple is rejected whole

    @staticmethod
    def parse(text: str | LatePolicy) -> LatePolicy:
        if isinstance(text, LatePolicy):
            return text
        try:
            return LatePolicy(text.strip().lower())
        except ValueError:
            raise InvalidArgument(f"unknown late policy {text!r}; expected drop, update or error") from None
