"""Files of the state directory: written whole or not at all."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` (on disk) or what it held before, never a part: a crash during
    the write leaves a ``.tmp`` file that readers ignore."""
    write_parts_atomically(path, [data])


def write_parts_atomically(path: Path, parts: Iterable[bytes | memoryview]) -> tuple[int, int]:
    """:func:`write_atomically` of the pieces one after another; their total size and CRC-32."""
    temporary = path.with_name(path.name + ".tmp")
    size = crc = 0
    with temporary.open("wb") as f:
        for part in parts:
            f.write(part)
            size += len(part)
            crc = zlib.crc32(part, crc)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)
    return size, crc


def fsync_directory(directory: Path) -> None:
    """Make a directory's new or renamed entries durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
