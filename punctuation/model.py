"""Linear punctuation on one progressing attribute, and the domain of that attribute.

``Punctuation(value, attribute)`` promises: no further tuple of the stream it travels on has
``attribute < value``. Values are integers in the attribute's units. Two named bounds stand for
the ends of int64: ``NO_PROGRESS`` (nothing promised yet) and ``END_OF_STREAM`` (every source
closed: nothing more will come).

The domain. A stream's tuples carry progressing values in ``[TIME_MIN, TIME_END)`` = ``[-2^62,
2^62)``, and a source punctuates within ``[TIME_MIN, TIME_END]``; the door refuses anything else
(only closing a source makes its punctuation ``END_OF_STREAM``). Window lengths, slides, gaps,
join ranges and allowed lateness are at most ``MAX_EXTENT`` = 2^58 units, and a query reads
query results at most ``MAX_DERIVED_DEPTH`` levels deep, each level's ``window_end`` passing its
input's values by at most one extent. So every window bound, purge horizon and output
punctuation an operator computes from a value of the domain stays below 2^62 + 12 * 2^58 <
2^63 - 1: no int64 arithmetic overflows, and no output punctuation but the end of the stream's
reaches ``END_OF_STREAM``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.errors import InvalidArgument

NO_PROGRESS = -(2**63)
END_OF_STREAM = 2**63 - 1
TIME_MIN = -(2**62)  # the smallest progressing value a tuple may carry
TIME_END = 2**62  # progressing values are below it; a source's punctuation reaches it at most
DOMAIN = f"[-2^62, 2^62) = [{TIME_MIN}, {TIME_END})"
MAX_EXTENT = 2**58  # a window's RANGE, SLIDE, SESSION gap, join range or allowed lateness, in units
MAX_DERIVED_DEPTH = 8  # levels of queries reading query results


@dataclass(frozen=True)
class Punctuation:
    """No further tuple has ``attribute < value``; an item of a query's output as well."""

    value: int
    attribute: str = "window_end"

    @property
    def is_end(self) -> bool:
        return self.value >= END_OF_STREAM


def check_punctuation_value(value: int, stream: str) -> None:
    """A source's punctuation must lie in ``[TIME_MIN, TIME_END]`` (see the module docstring)."""
    if not TIME_MIN <= value <= TIME_END:
        raise InvalidArgument(
            f"punctuation {value} of stream {stream!r} is outside the domain of a progressing "
            f"attribute: a source punctuates within [-2^62, 2^62] = [{TIME_MIN}, {TIME_END}] "
            "(close the source to end it)"
        )
