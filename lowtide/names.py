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
reason that shows at most the first ``SHOWN`` characters of it.
"""

from __future__ import annotations

import re

from lowtide.errors import InvalidArgument

MAX_NAME = 128  # streams and queries
MAX_SOURCE = 256
MAX_COLUMN = 256
SHOWN = 40  # characters of a refused name quoted in its reason

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


__all__ = ["MAX_COLUMN", "MAX_NAME", "MAX_SOURCE", "check_column", "check_name", "check_source", "shown"]
