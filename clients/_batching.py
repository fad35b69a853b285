"""The producer's batching, for its core (:mod:`lowtide.clients._producer_core`). No I/O, no locks here.

A :class:`Batcher` turns one source's sends, punctuation and close into ``IngestRequest``
messages, in the order they were made. Sends are held back and coalesced until
``max_batch_rows`` rows are pending (then the full batch goes at once) or until ``deadline``
(``linger`` seconds after the oldest pending row), whichever is first. Punctuation and close
flush the pending rows before themselves, so a source's order is never changed. One row sent as a
dict of scalars is kept as a tuple of its values and the pending rows become Arrow columns at
once when they leave: a million quick ``send(row)`` calls travel as a handful of large batches.

Every message leaves as an :class:`Outgoing`: the request and what it carries (which batch, which
rows of which sends, which punctuation), so that a rejection by the server can name it and the
messages after it can be sent again on a new call. The messages of one batch sent in parts form
one *unit*: the server applies or rejects them together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lowtide.clients._checks import RowCheck
from lowtide.clients._wire import arrow_bytes
from lowtide.errors import InvalidArgument, LowtideError, SchemaMismatch
from lowtide.proto import lowtide_pb2 as pb
from lowtide.schema import to_arrow_table

# Keep each message well below the server's default 64 MiB message limit.
MAX_MESSAGE_BYTES = 32 << 20
_SCALARS = frozenset({int, float, str, bool, bytes, type(None)})


def is_row(data: Any) -> bool:
    """One tuple as a dict of scalars (``{"k": 1, "ts": 5}``), not a dict of columns."""
    if not isinstance(data, Mapping) or not data:
        return False
    for value in data.values():
        if type(value) in _SCALARS or isinstance(value, str | bytes) or not hasattr(value, "__len__"):
            continue
        return False
    return True


def prepare(data: Any) -> pa.Table | Mapping[str, Any]:
    """What ``send`` accepts, checked in the caller's thread: a row as it is, else an Arrow table."""
    if is_row(data):
        return data
    return to_arrow_table(data)


def punctuation_value(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgument(
            f"punctuation must be an integer in the progressing attribute's units, got {value!r}"
        )
    return int(value)


@dataclass(frozen=True)
class Outgoing:
    """One message for an Ingest call and what it carries."""

    request: Any  # pb.IngestRequest
    unit: int  # messages of one unit (a batch in parts) are applied or rejected together
    what: str  # how an error names the unit: "batch 3 (rows 200..299 of send #4)"
    kind: str  # "batch", "punctuation", "close" or "header"
    rows: int = 0
    last: bool = True  # whether this message ends its unit
    sends: tuple[int, int] = (0, 0)  # the first and last send (1, 2, ...) whose rows it carries

    @property
    def nbytes(self) -> int:
        return len(self.request.arrow) if self.kind == "batch" else 64


@dataclass(frozen=True)
class _Chunk:
    table: pa.Table
    first_row: int  # the producer's row number of its first row (0, 1, ...)
    sends: tuple[int, int]


class Batcher:
    """One source's pending rows and the messages they become (see the module docstring).

    With a :class:`RowCheck` (the stream's schema) a row is checked as it is added and the
    pending rows become columns of the stream's own types. Rows that still form no batch are
    dropped and their error is kept in ``errors`` for the producer's next call to raise.
    """

    def __init__(
        self,
        stream: str,
        source: str,
        max_batch_rows: int,
        linger_s: float,
        clock: Callable[[], float] = time.monotonic,
        rows: RowCheck | None = None,
    ) -> None:
        if max_batch_rows < 1:
            raise InvalidArgument("max_batch_rows must be at least 1")
        self.stream = stream
        self.source = source
        self.max_batch_rows = max_batch_rows
        self.linger_s = max(0.0, linger_s)
        self.clock = clock
        self.row_check = rows
        self.deadline: float | None = None  # when the oldest pending row must leave
        self.pending_rows = 0
        self.rows = 0  # rows taken so far (the next row's number)
        self.batches = 0  # batches made so far (the next batch is number batches + 1)
        self.units = 0
        self.errors: list[LowtideError] = []  # rows that formed no batch, for the next call to raise
        self._chunks: list[_Chunk] = []  # pending tables, in send order
        self._row_names: tuple[str, ...] = ()
        self._rows: list[tuple[Any, ...]] = []  # pending single rows' values, in _row_names order
        self._row_first = 0  # the row number of the first pending single row
        self._row_sends = (0, 0)

    def header(self) -> Outgoing:
        """The first message of every Ingest call: which stream and source it feeds."""
        request = pb.IngestRequest(stream=self.stream, source=self.source)
        return Outgoing(request, 0, "the call's start", "header")

    # -- sends --------------------------------------------------------------------------------
    def add(self, prepared: pa.Table | Mapping[str, Any], send: int = 0) -> list[Outgoing]:
        """Take send number ``send`` (from :func:`prepare`); returns the messages due now.

        A row that fails its check raises here, and nothing of it is kept."""
        if isinstance(prepared, pa.Table):
            return self._add_table(prepared, send)
        if self.row_check is not None:
            names, values = self.row_check(prepared)
        else:
            names, values = tuple(prepared), tuple(prepared.values())  # a copy: the caller may reuse its dict
        if names != self._row_names:
            self._seal_rows()
            self._row_names = names
        if not self._rows:
            self._row_first, self._row_sends = self.rows, (send, send)
        self._rows.append(values)
        self._row_sends = (self._row_sends[0], send)
        self.rows += 1
        return self._added(1)

    def _add_table(self, table: pa.Table, send: int) -> list[Outgoing]:
        self._seal_rows()
        due: list[Outgoing] = []
        offset = 0
        while offset < table.num_rows:
            piece = table.slice(offset, self.max_batch_rows - self.pending_rows)
            self._chunks.append(_Chunk(piece, self.rows + offset, (send, send)))
            offset += piece.num_rows
            due += self._added(piece.num_rows)
        self.rows += table.num_rows
        return due

    def _added(self, rows: int) -> list[Outgoing]:
        if self.pending_rows == 0:
            self.deadline = self.clock() + self.linger_s
        self.pending_rows += rows
        if self.pending_rows >= self.max_batch_rows or self.linger_s == 0:
            return self.flush()
        return []

    def add_batch(self, table: pa.Table, batch_id: int, send: int = 0) -> list[Outgoing]:
        """A batch with its own exactly-once id, sent after what is pending, alone: in as many
        parts (each of at most ``max_batch_rows`` rows and about MAX_MESSAGE_BYTES) as it needs,
        which the server applies together once the last has arrived."""
        if batch_id < 1:
            raise InvalidArgument("batch_id must be a positive integer (0 means no id)")
        due = self.flush()
        step = self.max_batch_rows
        parts = [
            piece for start in range(0, table.num_rows, step) for piece in _pieces(table.slice(start, step))
        ]
        self.batches += 1
        self.units += 1
        rows = _rows(self.rows, table.num_rows)
        what = f"batch {self.batches} (batch_id {batch_id}, {rows} of send #{send})"
        for i, part in enumerate(parts):
            request = pb.IngestRequest(arrow=arrow_bytes([part]), batch_id=batch_id, batch_parts=len(parts))
            last = i == len(parts) - 1
            due.append(Outgoing(request, self.units, what, "batch", part.num_rows, last, (send, send)))
        self.rows += table.num_rows
        return due

    def _seal_rows(self) -> None:
        """Pending single rows become a table chunk (before a table, or a different row shape)."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        names = self._row_names
        kinds = self.row_check.arrow_types(names) if self.row_check is not None else [None] * len(names)
        arrays = []
        for name, kind, column in zip(names, kinds, zip(*rows, strict=True), strict=True):
            try:
                arrays.append(pa.array(column, type=kind))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                # Those rows are dropped whole, like a batch the server rejects; the next call says so.
                self.pending_rows -= len(rows)
                reason = " ".join(str(exc).split())
                first, last = self._row_sends
                sends = f"send #{first}" if first == last else f"sends #{first}..#{last}"
                self.errors.append(
                    SchemaMismatch(
                        f"{_rows(self._row_first, len(rows))} ({sends}, one row each) were not sent: "
                        f"column {name!r}: {reason}"
                    )
                )
                return
        table = pa.Table.from_arrays(arrays, names=list(names))
        self._chunks.append(_Chunk(table, self._row_first, self._row_sends))

    # -- messages -----------------------------------------------------------------------------
    def flush(self) -> list[Outgoing]:
        """Every pending row as messages: one Arrow IPC stream per run of equal schemas."""
        self._seal_rows()
        chunks, self._chunks = self._chunks, []
        self.pending_rows = 0
        self.deadline = None
        due: list[Outgoing] = []
        run: list[_Chunk] = []
        run_bytes = 0
        for chunk in chunks:
            if chunk.table.num_rows == 0:
                continue
            if run and chunk.table.schema != run[0].table.schema:
                due.append(self._batch(run))
                run, run_bytes = [], 0
            for offset, piece in _offsets(_pieces(chunk.table)):
                if run and run_bytes + piece.nbytes > MAX_MESSAGE_BYTES:
                    due.append(self._batch(run))
                    run, run_bytes = [], 0
                run.append(_Chunk(piece, chunk.first_row + offset, chunk.sends))
                run_bytes += piece.nbytes
        if run:
            due.append(self._batch(run))
        return due

    def _batch(self, run: list[_Chunk]) -> Outgoing:
        self.batches += 1
        self.units += 1
        rows = sum(c.table.num_rows for c in run)
        first, last = run[0].sends[0], run[-1].sends[1]
        sends = f"send #{first}" if first == last else f"sends #{first}..#{last}"
        what = f"batch {self.batches} ({_rows(run[0].first_row, rows)} of {sends})"
        request = pb.IngestRequest(arrow=arrow_bytes([c.table for c in run]))
        return Outgoing(request, self.units, what, "batch", rows, True, (first, last))

    def due(self) -> bool:
        """Whether the linger time of the oldest pending row has passed."""
        return self.deadline is not None and self.clock() >= self.deadline

    def punctuation(self, value: int, number: int = 0) -> list[Outgoing]:
        due = self.flush()
        self.units += 1
        what = f"punctuation {value} (punctuate #{number})" if number else f"punctuation {value}"
        return [*due, Outgoing(pb.IngestRequest(punctuation=value), self.units, what, "punctuation")]

    def close(self) -> list[Outgoing]:
        due = self.flush()
        self.units += 1
        return [*due, Outgoing(pb.IngestRequest(close=True), self.units, "close()", "close")]


def _rows(first: int, n: int) -> str:
    return f"row {first}" if n == 1 else f"rows {first}..{first + n - 1}"


def _offsets(pieces: list[pa.Table]) -> list[tuple[int, pa.Table]]:
    out, offset = [], 0
    for piece in pieces:
        out.append((offset, piece))
        offset += piece.num_rows
    return out


def _pieces(table: pa.Table) -> list[pa.Table]:
    """``table`` in slices of at most about MAX_MESSAGE_BYTES each."""
    if table.nbytes <= MAX_MESSAGE_BYTES or table.num_rows <= 1:
        return [table]
    rows = max(1, table.num_rows * MAX_MESSAGE_BYTES // table.nbytes)
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


__all__ = ["MAX_MESSAGE_BYTES", "Batcher", "Outgoing", "is_row", "prepare", "punctuation_value"]
