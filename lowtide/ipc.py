"""Arrow IPC stream bytes from the network, read safely: checked before and validated in full after.

``read_ipc(data, max_rows)`` is the only way lowtide turns received bytes into a ``pyarrow.Table``
(the server's Ingest, the client's Subscribe). A payload, however malformed, gives either a
table that is safe to use or :class:`~lowtide.errors.SchemaMismatch` (INVALID_ARGUMENT) /
:class:`~lowtide.errors.ResourceExhausted` with a one-line reason - never a crash, and never an
allocation much larger than the payload:

1. **Before Arrow decodes anything**, each message's metadata is read (a few fields of its
   flatbuffer, bounds-checked here): a *compressed* body is refused (its buffers would be
   inflated to whatever size they claim: a 5 kB zstd body can claim gigabytes; lowtide's
   clients never compress), and so is a batch claiming more rows than ``max_rows`` in total (a
   column of type ``null`` holds any number of rows in no bytes at all, and the door would
   allocate for each of them).
2. Arrow then reads the stream. Uncompressed buffers are views of ``data``: nothing is copied
   beyond byte swapping for a big-endian sender.
3. **The table is validated in full** (``Table.validate(full=True)``): offsets in order and
   within their data, UTF-8 strings, dictionary indices within their dictionary, child arrays
   long enough, validity bitmaps and lengths within their buffers. Without this a string column
   whose offsets run backwards or past its data makes the first reader of its values read
   outside the buffer (a SIGSEGV of the reading process). Cheap validation, which Arrow does
   itself on read, misses exactly those.

Nested, dictionary-encoded and extension columns pass here when they are valid: whether they
fit the stream's schema is the door's business (:mod:`lowtide.schema` refuses all but
dictionary-encoded strings, with a reason).
"""

from __future__ import annotations

import struct

import pyarrow as pa

from lowtide.errors import ResourceExhausted, SchemaMismatch

# Message.header's union type (Message.fbs): which table the header is.
_DICTIONARY_BATCH = 2
_RECORD_BATCH = 3


class _Malformed(Exception):
    """Metadata that does not hold together (a flatbuffer offset out of its buffer)."""


def _unpack(fmt: str, buf: bytes, pos: int) -> int:
    size = struct.calcsize(fmt)
    if pos < 0 or pos + size > len(buf):
        raise _Malformed(f"offset {pos} out of the metadata's {len(buf)} bytes")
    value: int = struct.unpack_from(fmt, buf, pos)[0]
    return value


def _field(buf: bytes, table: int, slot: int) -> int | None:
    """Where field ``slot`` of the flatbuffer table at ``table`` is, or None when it is absent."""
    vtable = table - _unpack("<i", buf, table)
    entry = 4 + 2 * slot
    if entry + 2 > _unpack("<H", buf, vtable):
        return None
    offset = _unpack("<H", buf, vtable + entry)
    return table + offset if offset else None


def _table(buf: bytes, at: int | None) -> int | None:
    """The table an offset field at ``at`` points to."""
    return None if at is None else at + _unpack("<I", buf, at)


def _batch_claim(metadata: bytes) -> tuple[int, bool]:
    """The rows a record or dictionary batch message claims, and whether its body is compressed.

    Message: version (slot 0), header_type (1), header (2), ...; DictionaryBatch: id (0),
    data (1, a RecordBatch); RecordBatch: length (0), nodes (1), buffers (2), compression (3).
    """
    message = _unpack("<I", metadata, 0)
    kind_at = _field(metadata, message, 1)
    kind = 0 if kind_at is None else _unpack("<B", metadata, kind_at)
    header = _table(metadata, _field(metadata, message, 2))
    if header is None or kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
        return 0, False
    batch = header if kind == _RECORD_BATCH else _table(metadata, _field(metadata, header, 1))
    if batch is None:
        return 0, False
    length_at = _field(metadata, batch, 0)
    rows = 0 if length_at is None else _unpack("<q", metadata, length_at)
    if rows < 0:
        raise _Malformed(f"a batch of {rows} rows")
    compressed = _field(metadata, batch, 3) is not None
    return (rows if kind == _RECORD_BATCH else 0), compressed


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _prescan(data: bytes, max_rows: int | None) -> None:
    """Refuse compressed bodies and, past ``max_rows``, row counts: before Arrow decodes a byte."""
    rows = 0
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return
        if message.type not in ("record batch", "dictionary batch"):
            continue
        claimed, compressed = _batch_claim(message.metadata.to_pybytes())
        if compressed:
            raise SchemaMismatch("compressed Arrow IPC bodies are not accepted; send the batch uncompressed")
        rows += claimed
        if max_rows is not None and rows > max_rows:
            raise ResourceExhausted(f"batch of {rows} rows is over the limit of {max_rows}")


def read_ipc(data: bytes, max_rows: int | None = None) -> pa.Table:
    """The table held by the Arrow IPC stream ``data``, checked and validated in full (see above)."""
    try:
        _prescan(data, max_rows)
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        table.validate(full=True)
        table.schema.names  # noqa: B018 - field names decode here (bytes that are not UTF-8 fail)
    except (ResourceExhausted, SchemaMismatch):
        raise
    except MemoryError as exc:
        raise ResourceExhausted(f"Arrow IPC stream too large to read: {_first_line(exc)}") from exc
    except (_Malformed, pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise SchemaMismatch(f"malformed Arrow IPC stream: {_first_line(exc)}") from exc
    except NotImplementedError as exc:
        raise SchemaMismatch(f"unsupported Arrow IPC stream: {_first_line(exc)}") from exc
    return table


def validate_table(table: pa.Table) -> None:
    """Validate an in-process table in full (what ``read_ipc`` does to received ones)."""
    try:
        table.validate(full=True)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise SchemaMismatch(f"invalid Arrow data: {_first_line(exc)}") from exc


__all__ = ["read_ipc", "validate_table"]
