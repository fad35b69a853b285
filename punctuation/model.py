"""Linear punctuation on one progressing attribute.

``Punctuation(value, attribute)`` promises: no further tuple of the stream it travels on has
``attribute < value``. Values are integers in the attribute's units. Two named bounds stand for
the ends of the domain: ``NO_PROGRESS`` (nothing promised yet) and ``END_OF_STREAM`` (every source
closed: nothing more will come).
"""

from __future__ import annotations

from dataclasses import dataclass

NO_PROGRESS = -(2**63)
END_OF_STREAM = 2**63 - 1


@dataclass(frozen=True)
class Punctuation:
    """No further tuple has ``attribute < value``; an item of a query's output as well."""

    value: int
    attribute: str = "window_end"

    @property
    def is_end(self) -> bool:
        return self.value >= END_OF_STREAM
