"""Exactly-once ids for the batches of ``lowtide send``: a repeated or resumed send applies once.

The server applies each ``(stream, source, batch_id)`` once (:mod:`lowtide.server.batches`), so
the ids must name the same rows each time the same file is sent, and differ for another file. By
default they come from the file's content: ``(h << INDEX_BITS) + 1 + k`` for batch ``k``, where
``h`` is a 40-bit hash of the file's bytes and of what shapes its batches (format, header, rows
per batch). One file's ids are consecutive, so the server keeps them as one run whatever the file's
size; another file's lie in another range. ``--batch-id-base N`` numbers the batches ``N, N+1, ...``
instead (to send the same file again as new data, or to give a file that is rewritten the ids of
its earlier form). Ids stay below 2**63: the server stores them as int64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from lowtide.errors import InvalidArgument

HASH_BITS = 40
INDEX_BITS = 63 - HASH_BITS  # 2**23 - 1 batches per file: 838 G rows at the default 100000 a batch
ID_END = 1 << 63
_CHUNK = 1 << 20


def content_base(path: Path, shape: str, progress: Callable[[int], None]) -> int:
    """The first batch id of ``path`` sent with batches of ``shape``; ``progress(bytes hashed)``."""
    digest = hashlib.blake2b(shape.encode() + b"\0", digest_size=HASH_BITS // 8)
    done = 0
    try:
        with path.open("rb") as raw:
            while chunk := raw.read(_CHUNK):
                digest.update(chunk)
                done += len(chunk)
                progress(done)
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc.strerror or exc}") from exc
    return (int.from_bytes(digest.digest(), "big") << INDEX_BITS) + 1


class BatchIds:
    """Batch ``k``'s id: ``first + k``, within the file's range (content ids) or below 2**63."""

    def __init__(self, first: int, from_content: bool) -> None:
        self.first = first
        self.end = (first - 1 + (1 << INDEX_BITS)) if from_content else ID_END
        self.from_content = from_content

    def __call__(self, index: int) -> int:
        batch_id = self.first + index
        if batch_id >= self.end:
            advice = "pass a larger --batch-rows" if self.from_content else "pass a smaller --batch-id-base"
            raise InvalidArgument(f"batch {index + 1} would need an id past the range of this send: {advice}")
        return batch_id
