"""Hostile payloads for the fuzz suite, and the gRPC service run in-process to receive them.

* **Arrow**: valid IPC streams of the fuzz stream's schema (``ipc``, ``good_table``), mutated by
  bit flips, truncations, splices, overwrites and *metadata patches* (a row count, a column's
  length or null count, a buffer's offset or length set to a hostile value: ``patch_points``
  walks the stream's flatbuffers to find them); arrays built with ``pa.Array.from_buffers``
  (string offsets that run backwards or past their data, validity bitmaps that disagree with
  their null count) and columns of every Arrow type a batch might carry (``odd_columns``).
* **The service in-process** (``InProcess``): the real ``Service`` (``lowtide.server.service``)
  and ``Front`` (``lowtide.server.front``) over workers that take every message and run nothing, driven with a
  context whose ``abort`` raises like grpc.aio's. ``outcome`` runs one call and returns its
  status: ``OK`` or the code it aborted with. Any other exception escapes - on a real server it
  would have been an UNKNOWN status.
* **The rules** the door must apply, written independently of ``lowtide.names``
  (``stream_name_ok``, ``source_ok``), so the fuzz checks the documented rules, not the code.

``examples(n)`` is every property's ``max_examples``: ``n`` by default, ``n`` times
``LOWTIDE_FUZZ_EXAMPLES`` when that is set. Which cases: the same on every run (the derandomized
profile of tests/conftest.py), new ones under ``make test-explore``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from lowtide.proto import lowtide_pb2 as pb
from lowtide.server import messages as msg
from lowtide.server.config import ServerConfig
from lowtide.server.front import Front
from lowtide.server.service import Service

SCALE = int(os.environ.get("LOWTIDE_FUZZ_EXAMPLES", "1") or "1")
ALLOWED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "OUT_OF_RANGE"}
MAX_ROWS = 1000  # the in-process front's max_batch_rows

SCHEMA = {
    "host": "string",
    "port": "int32",
    "bytes": "int64",
    "load": "float64",
    "ok": "bool",
    "ts": "timestamp[ms]",
}
ARROW_SCHEMA = pa.schema(
    [
        ("host", pa.string()),
        ("port", pa.int32()),
        ("bytes", pa.int64()),
        ("load", pa.float64()),
        ("ok", pa.bool_()),
        ("ts", pa.timestamp("ms")),
    ]
)
QUERY = (
    "SELECT host, count(*) AS n, sum(bytes) AS b [RANGE 10 seconds, SLIDE 5 seconds, WA ts] "
    "FROM {s} GROUP BY host"
)
T0 = 1_700_000_000_000


def examples(n: int) -> settings:
    """Settings of a fuzz property with ``n`` cases by default (see the module docstring)."""
    return settings(
        max_examples=n * SCALE,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- valid payloads -------------------------------------------------------------------------------
def good_table(n: int, t0: int = T0, seed: int = 0) -> pa.Table:
    rnd = np.random.default_rng(seed)
    hosts = np.array(["a", "bb", "ccc", "", "\u00e9t\u00e9"])
    return pa.table(
        {
            "host": pa.array(hosts[rnd.integers(0, len(hosts), n)]),
            "port": pa.array(rnd.integers(0, 65536, n), pa.int32()),
            "bytes": pa.array(rnd.integers(-(2**40), 2**40, n), pa.int64()),
            "load": pa.array(rnd.normal(size=n)),
            "ok": pa.array(rnd.integers(0, 2, n).astype(bool)),
            "ts": pa.array(t0 + rnd.integers(0, 60_000, n), pa.timestamp("ms")),
        }
    )


def ipc(*tables: pa.Table | pa.RecordBatch, **options: Any) -> bytes:
    """One Arrow IPC stream holding every batch of ``tables`` (written as they are: no checks);
    ``options``: of ``pa.ipc.IpcWriteOptions`` (compression, allow_64bit)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tables[0].schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        for table in tables:
            if isinstance(table, pa.RecordBatch):
                writer.write_batch(table)
            else:
                writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


@functools.cache
def bases() -> list[bytes]:
    """Valid streams to mutate: one batch, several batches, dictionary-encoded strings, empty."""
    one = good_table(20)
    dictionary = one.set_column(0, "host", one.column("host").dictionary_encode())
    several = ipc(good_table(5, seed=1), good_table(7, seed=2))
    return [ipc(one), several, ipc(dictionary), ipc(one.slice(0, 0))]


# -- mutations ------------------------------------------------------------------------------------
def _messages(data: bytes) -> list[tuple[int, int, int]]:
    """(metadata start, metadata length, body length) of each message of an IPC stream."""
    out, pos = [], 0
    while pos + 8 <= len(data):
        (marker,) = struct.unpack_from("<I", data, pos)
        if marker == 0xFFFFFFFF:
            (length,) = struct.unpack_from("<i", data, pos + 4)
            start = pos + 8
        else:
            length, start = marker, pos + 4
        if length <= 0 or start + length > len(data):
            break
        meta = data[start : start + length]
        body = _int_field(meta, _root(meta), 3) or 0
        out.append((start, length, body))
        pos = start + length + body
    return out


def _root(meta: bytes) -> int:
    return int(struct.unpack_from("<I", meta, 0)[0])


def _slot(meta: bytes, table: int, slot: int) -> int | None:
    vtable = table - struct.unpack_from("<i", meta, table)[0]
    if 4 + 2 * slot + 2 > struct.unpack_from("<H", meta, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", meta, vtable + 4 + 2 * slot)[0]
    return table + offset if offset else None


def _int_field(meta: bytes, table: int, slot: int) -> int | None:
    at = _slot(meta, table, slot)
    return None if at is None else int(struct.unpack_from("<q", meta, at)[0])


def _deref(meta: bytes, at: int | None) -> int | None:
    return None if at is None else at + struct.unpack_from("<I", meta, at)[0]


def patch_points(data: bytes) -> list[int]:
    """Absolute positions of the int64s a record or dictionary batch's metadata claims: its row
    count, each column's length and null count, each buffer's offset and length."""
    points = []
    for start, _, _ in _messages(data):
        meta = data[start:]
        message = _root(meta)
        kind_at = _slot(meta, message, 1)
        kind = meta[kind_at] if kind_at is not None else 0
        header = _deref(meta, _slot(meta, message, 2))
        if header is None or kind not in (2, 3):
            continue
        batch = header if kind == 3 else _deref(meta, _slot(meta, header, 1))
        if batch is None:
            continue
        length = _slot(meta, batch, 0)
        if length is not None:
            points.append(start + length)
        for slot in (1, 2):  # nodes (length, null_count), buffers (offset, length): 16 bytes each
            vector = _deref(meta, _slot(meta, batch, slot))
            if vector is None:
                continue
            (count,) = struct.unpack_from("<I", meta, vector)
            points += [start + vector + 4 + 8 * k for k in range(2 * count)]
    return points


HOSTILE_INTS = [0, 1, -1, 7, 8, 63, 64, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, -(2**63)]


@st.composite
def mutated(draw: Any) -> bytes:
    """A valid stream of the fuzz schema, damaged in one of several ways."""
    data = bytearray(draw(st.sampled_from(bases())))
    how = draw(st.sampled_from(["flip", "truncate", "splice", "overwrite", "patch", "patch"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif how == "splice":
        other = draw(st.sampled_from(bases()))
        data = data[: draw(st.integers(0, len(data)))] + other[draw(st.integers(0, len(other))) :]
    elif how == "overwrite":
        pos = draw(st.integers(0, len(data) - 1))
        data[pos : pos + 8] = draw(st.binary(min_size=1, max_size=8))
    elif points := patch_points(bytes(data)):
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.sampled_from(points))
            value = draw(st.one_of(st.sampled_from(HOSTILE_INTS), st.integers(-(2**63), 2**63 - 1)))
            struct.pack_into("<q", data, pos, value)
    return bytes(data)


# -- arrays Arrow's own constructors would not make ------------------------------------------------
def with_column(name: str, values: pa.Array, n: int | None = None) -> pa.Table:
    """A good table of ``len(values)`` rows whose column ``name`` is replaced by ``values``."""
    table = good_table(len(values) if n is None else n)
    return table.set_column(table.schema.get_field_index(name), name, values)


@st.composite
def bad_offsets(draw: Any) -> pa.Table:
    """A string column whose offsets pass Arrow's cheap checks (first 0, last the data's size)
    and nothing else: backwards, far past the data, negative."""
    n = draw(st.integers(1, 12))
    data = draw(st.binary(min_size=0, max_size=40))
    middle = draw(
        st.lists(
            st.one_of(st.integers(0, len(data)), st.sampled_from([-1, 2**31 - 1, 1 << 20, -(2**31)])),
            min_size=n - 1,
            max_size=n - 1,
        )
    )
    offsets = np.array([0, *middle, len(data)], dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    strings = pa.Array.from_buffers(pa.string(), n, buffers)
    return with_column("host", strings)


@st.composite
def bad_bitmaps(draw: Any) -> pa.Table:
    """A column whose validity bitmap disagrees with its null count, or whose dictionary indices
    point past the dictionary."""
    n = draw(st.integers(1, 40))
    column = draw(st.sampled_from(["port", "bytes", "load", "ok", "host", "dict"]))
    bitmap = pa.py_buffer(draw(st.binary(min_size=(n + 7) // 8, max_size=(n + 7) // 8 + 4)))
    claimed = draw(st.integers(0, n))
    if column == "dict":
        indices = pa.array(draw(st.lists(st.integers(-5, 10), min_size=n, max_size=n)), pa.int8())
        values = pa.DictionaryArray.from_arrays(indices, pa.array(["x", "y"]), safe=False)
        return with_column("host", values)
    if column == "host":
        offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32).tobytes())
        values = pa.Array.from_buffers(pa.string(), n, [bitmap, offsets, pa.py_buffer(b"x" * n)], claimed)
        return with_column("host", values)
    kind = ARROW_SCHEMA.field(column).type
    width = max(1, kind.bit_width // 8)
    data = pa.py_buffer(b"\x01" * (n * width))
    return with_column(column, pa.Array.from_buffers(kind, n, [bitmap, data], claimed))


def odd_type_arrays(n: int) -> list[pa.Array]:
    """Arrays of types a batch might carry for any column (all valid Arrow)."""
    ints = list(range(n))
    return [
        pa.array(ints, pa.int8()),
        pa.array(ints, pa.uint64()),
        pa.array([2**64 - 1] * n, pa.uint64()),
        pa.array([float(i) for i in ints], pa.float16()),
        pa.array([i + 0.5 for i in ints], pa.float32()),
        pa.array([float("nan")] * n),
        pa.array([1e300] * n),
        pa.array([None] * n, pa.null()),
        pa.array([None] * n, pa.int64()),
        pa.array([str(i) for i in ints], pa.large_string()),
        pa.array([None] * n, pa.string()),
        pa.array([str(i) for i in ints], pa.string_view()),
        pa.array([b"\xff" * i for i in ints], pa.binary()),
        pa.array([str(i) for i in ints]).dictionary_encode(),
        pa.array(ints, pa.int64()).dictionary_encode(),
        pa.array([[i] for i in ints], pa.list_(pa.int64())),
        pa.array([{"a": i} for i in ints], pa.struct([("a", pa.int64())])),
        pa.array([T0 * 1_000_000 + 1] * n, pa.timestamp("ns")),
        pa.array([T0 * 1000] * n, pa.timestamp("us", tz="UTC")),
        pa.array([2**62] * n, pa.timestamp("s")),
        pa.array(ints, pa.date32()),
        pa.array(ints, pa.time32("s")),
        pa.array([1] * n, pa.decimal128(5, 2)),
        pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"0" * 16] * n, pa.binary(16))),
        pa.ExtensionArray.from_storage(pa.json_(), pa.array(["{}"] * n, pa.string())),
        pa.ExtensionArray.from_storage(pa.bool8(), pa.array(ints, pa.int8())),
    ]


@st.composite
def odd_columns(draw: Any) -> pa.Table:
    """A batch with columns of the stream's names and others, duplicated or missing, of any type."""
    n = draw(st.integers(0, 6))
    good = good_table(n)
    arrays = odd_type_arrays(n)
    names = draw(st.lists(st.sampled_from([*SCHEMA, "extra", "ts", "host", ""]), min_size=0, max_size=8))
    columns = []
    for name in names:
        if name in SCHEMA and draw(st.booleans()):
            columns.append((name, good.column(name).combine_chunks()))
        else:
            columns.append((name, draw(st.sampled_from(arrays))))
    if not columns:
        return pa.table({})
    return pa.Table.from_arrays([c for _, c in columns], names=[name for name, _ in columns])


# -- names ----------------------------------------------------------------------------------------
NAME_TEXT = st.one_of(
    st.text(alphabet="abcXYZ019_-./ \x00\n\t\x7f\u00e9\u2028", min_size=0, max_size=12),
    st.sampled_from(["..", ".", "a/../b", "../x", "a/b", "-x", "x-", "_", "9", "p/p0", "a..b", "\x00"]),
    st.integers(100, 10_000).map(lambda n: "n" * n),
)


def stream_name_ok(name: str) -> bool:
    """The documented rule for stream and query names (README, lowtide/names.py)."""
    return re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}", name) is not None


def _printable(name: str) -> bool:
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in "\u2028\u2029" for c in name)


def source_ok(name: str) -> bool:
    return 0 < len(name) <= 256 and _printable(name) and ".." not in name.split("/")


def column_ok(name: str) -> bool:
    return 0 < len(name) <= 256 and _printable(name)


# -- the service in-process -----------------------------------------------------------------------
class Aborted(grpc.aio.AbortError):
    """What ``context.abort`` raises in-process: the status a client would get."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.metadata = metadata


class Context:
    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Iterable[tuple[str, str]] = ()
    ) -> None:
        raise Aborted(code, details, tuple(trailing_metadata))


class NoWorkers:
    """Workers that take every message and run nothing (the door is what is fuzzed here)."""

    size = 1

    def post(self, worker: int, message: msg.ToWorker, arrays: dict[str, Any] | None = None) -> None:
        pass

    def broadcast(self, message: msg.ToWorker) -> None:
        pass

    async def wait_for_room(self) -> None:
        pass


class InProcess:
    """The gRPC service of one front, called directly; one stream ``S`` and query ``Q`` on it."""

    def __init__(self) -> None:
        config = ServerConfig(workers=1, metrics_port=-1, max_batch_rows=MAX_ROWS)
        self.front = Front(config)
        self.front.workers = self.front.door.runner.workers = NoWorkers()  # type: ignore[assignment]
        self.service = Service(self.front)
        self.loop = asyncio.new_event_loop()
        self.last: Any = None
        columns = [pb.Column(name=n, type=t) for n, t in SCHEMA.items()]
        self.expect_ok(self.service.CreateStream(pb.CreateStreamRequest(name="S", schema=columns), Context()))
        query = pb.RegisterQueryRequest(sql=QUERY.format(s="S"), name="Q")
        self.expect_ok(self.service.RegisterQuery(query, Context()))

    def close(self) -> None:
        self.loop.close()

    def outcome(self, call: Awaitable[Any]) -> tuple[str, str]:
        """(status, details) of one call: OK (its response in ``last``), or the code it aborted with."""
        self.last = None
        try:
            self.last = self.loop.run_until_complete(call)  # type: ignore[arg-type]
        except Aborted as aborted:
            return aborted.code.name, aborted.details
        return "OK", ""

    def expect_ok(self, call: Awaitable[Any]) -> None:
        status = self.outcome(call)
        assert status == ("OK", ""), status

    def ingest(self, messages: Sequence[pb.IngestRequest]) -> tuple[str, str]:
        async def feed() -> AsyncIterator[pb.IngestRequest]:
            for message in messages:
                yield message

        return self.outcome(self.service.Ingest(feed(), Context()))

    def arrow(self, payload: bytes, stream: str = "S", source: str = "s") -> tuple[str, str]:
        return self.ingest([pb.IngestRequest(stream=stream, source=source), pb.IngestRequest(arrow=payload)])

    def ingested(self) -> int:
        return int(self.front.door.stats()["streams"]["S"]["ingested"])


def assert_allowed(status: tuple[str, str], what: object = "") -> None:
    """An answer a client may get for a hostile request: an allowed code, a one-line reason."""
    code, details = status
    assert code in ALLOWED, (code, details, what)
    if code != "OK":
        assert details.strip() and "\n" not in details and len(details) <= 500, (code, details, what)
