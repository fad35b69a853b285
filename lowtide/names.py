"""What a name may be: streams, queries, sources and columns are checked at the door.

Every name comes from the network (or a caller of the in-process engine) and ends up in error
messages, metrics labels, logs and, for streams and queries, in file names of per-stream and
per-query state. The rules, checked before anything is created:

* **stream and query names**: 1 to ``MAX_NAME`` (128) characters of ``A-Z a-z 0-9 _ -``, not
  starting with ``-``. They are file-name safe (no ``/``, no ``.``, so no ``..`` and no hidden
  files, room for a suffix within the usual 255-byte limit) and never look like a command-line
  option. A name that is not a plain identifier (``link-1``, ``2024_data``) is written quoted in
  FROM: ``FROM "link-1"``. A query's late side stream is ``<query>.late``: the ``.`` of that
  suffix never belongs to a query's own name.
* **source names**: 1 to ``MAX_SOURCE`` (256) printable characters: no control characters
  (NUL, newlines, ...), no ``..`` path segment. ``/`` and ``.`` are allowed (the Spark sink names
  its partition sources ``<source>/p<partition>``).
* **column names**: 1 to ``MAX_COLUMN`` (256) characters, no control characters.

A name that breaks a rule is refused with :class:`~lowtide.errors.InvalidArgument` and a one-line
reason that shows at most the first ``SHOWN`` characters of it. A name that is not there is
refused with :class:`~lowtide.errors.NotFound` (:func:`unknown`), whose reason suggests the
closest name and lists the names there are - only those the caller may see (``visible_names``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from contextvars import ContextVar

from lowtide.errors import InvalidArgument, NotFound

MAX_NAME = 128  # streams and queries
MAX_SOURCE = 256
MAX_COLUMN = 256
SHOWN = 40  # characters of a refused name quoted in its reason
LISTED = 12  # names an unknown-name reason lists (the reason stays one short line)

# Which names an unknown-name reason may list: ``(kind, name) -> shown?``. None (the default: the
# in-process engine, an unscoped token) lists all; the server sets it for the length of a call
# made with a scoped token, so that a reason never names what the token may not reach.
Visible = Callable[[str, str], bool]
visible_names: ContextVar[Visible | None] = ContextVar("visible_names", default=None)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shown(name: object) -> str:
    """``repr`` of a name for a reason: at most ``SHOWN`` characters of it, then ``...``."""
    text = str(name)
    return repr(text) if len(text) <= SHOWN else repr(text[:SHOWN]) + f"... ({len(text)} characters)"


def check_name(name: object, what: str) -> str:
    """A stream or query name (``what``: "stream" or "query"), as the module docstring says."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a {what} needs a name")
    if len(name) > MAX_NAME:
        raise InvalidArgument(f"{what} name {shown(name)} is longer than {MAX_NAME} characters")
    if _NAME.fullmatch(name) is None:
        raise InvalidArgument(f"bad {what} name {shown(name)}: use letters, digits, '_' and '-' (not first)")
    return name


def check_source(name: object) -> str:
    """A source name: printable, bounded, no ``..`` segment."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a source needs a name")
    if len(name) > MAX_SOURCE:
        raise InvalidArgument(f"source name {shown(name)} is longer than {MAX_SOURCE} characters")
    if _CONTROL.search(name) is not None:
        raise InvalidArgument(f"bad source name {shown(name)}: it holds a control character")
    if ".." in name.split("/"):
        raise InvalidArgument(f"bad source name {shown(name)}: '..' may not be a segment of it")
    return name


def check_column(name: object) -> str:
    """A column name of a stream's schema."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a column needs a name")
    if len(name) > MAX_COLUMN:
        raise InvalidArgument(f"column name {shown(name)} is longer than {MAX_COLUMN} characters")
    if _CONTROL.search(name) is not None:
        raise InvalidArgument(f"bad column name {shown(name)}: it holds a control character")
    return name


def unknown(kind: str, name: object, known: Iterable[str]) -> NotFound:
    """The NotFound of an unknown ``kind`` ("stream", "query") ``name``, given the ``known`` names:
    the closest one ("did you mean"), then up to ``LISTED`` of them, of those the caller may see."""
    visible = visible_names.get()
    names = sorted(n for n in known if visible is None or visible(kind, n))
    plural = "queries" if kind == "query" else f"{kind}s"
    reason = f"unknown {kind} {shown(name)}"
    if not names:
        return NotFound(f"{reason}; there are no {plural}" if visible is None else reason)
    close = difflib.get_close_matches(str(name), names, n=1)
    if close:
        reason += f" (did you mean {shown(close[0])}?)"
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return NotFound(f"{reason}; {plural}: {', '.join(names[:LISTED])}{more}")


__all__ = [
    "LISTED",
    "MAX_COLUMN",
    "MAX_NAME",
    "MAX_SOURCE",
    "Visible",
    "check_column",
    "check_name",
    "check_source",
    "shown",
    "unknown",
    "visible_names",
]
