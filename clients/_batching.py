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
from lowtide.clients._wire import MessageBound, arrow_bytes, estimated_bytes, framing
from lowtide.errors import InvalidArgument, LowtideError, ResourceExhausted, SchemaMismatch
from lowtide.proto import lowtide_pb2 as pb
from lowtide.schema import to_arrow_table

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
    dropped and their error is kept in ``errors`` for the producer's next call to raise; so is a
    row that fits in no message under ``bound`` (the server's limit on a message).
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
        self.bound = MessageBound()  # not known until the producer opens
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
        parts (each of at most ``max_batch_rows`` rows, within ``bound``) as it needs, which the
        server applies together once the last has arrived. A row that fits in no message raises
        ``ResourceExhausted`` here, and nothing of the batch is sent."""
        if batch_id < 1:
            raise InvalidArgument("batch_id must be a positive integer (0 means no id)")
        rows = _rows(self.rows, table.num_rows)
        try:  # before the flush: a batch that raises leaves what is pending as it was
            parts = list(self.bound.messages(table, self.rows, self.max_batch_rows))
        except ResourceExhausted as exc:  # re-raised naming the batch: none of it was sent
            raise ResourceExhausted(
                f"batch_id {batch_id} ({rows} of send #{send}) was not sent: {exc}"
            ) from None
        due = self.flush()
        self.batches += 1
        self.units += 1
        what = f"batch {self.batches} (batch_id {batch_id}, {rows} of send #{send})"
        for i, (part, data) in enumerate(parts):
            request = pb.IngestRequest(arrow=data, batch_id=batch_id, batch_parts=len(parts))
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
                sends = _sends(*self._row_sends)
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
        """Every pending row as messages within ``bound``: one Arrow IPC stream per run of equal
        schemas, cut where the estimated bytes pass the bound's aim."""
        self._seal_rows()
        chunks, self._chunks = self._chunks, []
        self.pending_rows = 0
        self.deadline = None
        aim = self.bound.aim
        due: list[Outgoing] = []
        run: list[_Chunk] = []
        run_bytes = 0
        for chunk in chunks:
            if chunk.table.num_rows == 0:
                continue
            if run and chunk.table.schema != run[0].table.schema:
                due += self._batches(run)
                run = []
            for offset, piece in _offsets(self.bound.pieces(chunk.table)):
                size = estimated_bytes(piece)
                if run and run_bytes + size > aim:
                    due += self._batches(run)
                    run = []
                if not run:
                    run_bytes = framing(piece.schema)  # the schema that opens the message
                run.append(_Chunk(piece, chunk.first_row + offset, chunk.sends))
                run_bytes += size
        if run:
            due += self._batches(run)
        return due

    def _batches(self, run: list[_Chunk]) -> list[Outgoing]:
        """``run`` as one message, or as two runs again while its bytes do not fit (the estimate
        fell short). A row that fits in no message is dropped: its error waits in ``errors``."""
        data = arrow_bytes([c.table for c in run])
        rows = sum(c.table.num_rows for c in run)
        if self.bound.fits(len(data), rows):
            return [self._batch(run, rows, data)]
        if rows == 1:
            sends = _sends(*run[0].sends)
            reason = f"{_rows(run[0].first_row, 1)} of {sends} was not sent: it {self.bound.over(len(data))}"
            self.errors.append(ResourceExhausted(reason))
            return []
        del data
        first, second = _halves(run)
        return self._batches(first) + self._batches(second)

    def _batch(self, run: list[_Chunk], rows: int, data: bytes) -> Outgoing:
        self.batches += 1
        self.units += 1
        first, last = run[0].sends[0], run[-1].sends[1]
        what = f"batch {self.batches} ({_rows(run[0].first_row, rows)} of {_sends(first, last)})"
        request = pb.IngestRequest(arrow=data)
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


def _sends(first: int, last: int) -> str:
    return f"send #{first}" if first == last else f"sends #{first}..#{last}"


def _offsets(pieces: list[pa.Table]) -> list[tuple[int, pa.Table]]:
    out, offset = [], 0
    for piece in pieces:
        out.append((offset, piece))
        offset += piece.num_rows
    return out


def _halves(run: list[_Chunk]) -> tuple[list[_Chunk], list[_Chunk]]:
    """``run`` (of two rows or more) in two, in order: between its chunks, or its one chunk cut."""
    if len(run) > 1:
        return run[: len(run) // 2], run[len(run) // 2 :]
    chunk = run[0]
    half = chunk.table.num_rows // 2
    return (
        [_Chunk(chunk.table.slice(0, half), chunk.first_row, chunk.sends)],
        [_Chunk(chunk.table.slice(half), chunk.first_row + half, chunk.sends)],
    )


__all__ = ["Batcher", "Outgoing", "is_row", "prepare", "punctuation_value"]
