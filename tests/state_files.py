"""Reading a ``--state-dir`` as files, to damage it on purpose and to see that nothing changed.

The input log's frames are parsed here independently of ``server/input_log.py`` (a frame is
``[length u32][crc32 u32][payload]``, little-endian, the payload ``[header length u32][JSON
header]...``; a segment opens with a frame naming its first record and may end with a seal, and
neither is a record), so a test's idea of where a record starts does not come from the code under
test.
"""

from __future__ import annotations

import struct
import zlib
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


def record_starts(data: bytes) -> list[int]:
    """Where each record of a whole segment begins (its opening frame and seal are not records)."""
    return [
        at
        for at in frame_starts(data)
        if not data.startswith((b'{"kind":"segment"', b'{"kind":"seal"'), at + FRAME.size + 4)
    ]


def files(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (``None``) under ``directory``, by relative path."""
    return {
        str(path.relative_to(directory)): None if path.is_dir() else path.read_bytes()
        for path in sorted(directory.rglob("*"))
    }


def write_end(path: Path, records: int, segment_first: int, size: int, generation: int = 1) -> None:
    """``D/log/end`` as the log writes it: two 36-byte slots ``[generation u64][records u64]
    [segment's first record u64][its bytes u64][crc32 u32]``, the slot ``generation % 2`` holding
    this one (the other left zero)."""
    body = struct.pack("<QQQQ", generation, records, segment_first, size)
    slot = body + struct.pack("<I", zlib.crc32(body))
    slots = [bytes(36), bytes(36)]
    slots[generation % 2] = slot
    path.write_bytes(b"".join(slots))
