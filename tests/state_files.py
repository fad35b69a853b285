"""Reading a ``--state-dir`` as files, to damage it on purpose and to see that nothing changed.

The input log's frames are parsed here independently of ``server/input_log.py`` (a frame is
``[length u32][crc32 u32][payload]``, little-endian), so a test's idea of where a record starts
does not come from the code under test.
"""

from __future__ import annotations

import struct
from pathlib import Path

FRAME = struct.Struct("<II")


def frame_starts(data: bytes) -> list[int]:
    """Where each frame of a whole segment begins."""
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        (length, _crc) = FRAME.unpack_from(data, at)
        at += FRAME.size + length
    assert at == len(data), "not a whole segment"
    return starts


def files(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (``None``) under ``directory``, by relative path."""
    return {
        str(path.relative_to(directory)): None if path.is_dir() else path.read_bytes()
        for path in sorted(directory.rglob("*"))
    }
