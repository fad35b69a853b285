"""The producer's batching, shared by the sync and async producers. No I/O, no locks here.

A :class:`Batcher` turns one source's sends, punctuation and close into ``IngestRequest``
messages, in the order they were made. Sends are held back and coalesced until
``max_batch_rows`` rows are pending (then the full batch goes at once) or until ``deadline``
(``linger`` seconds after the oldest pending row), whichever is first. Punctuation and close
flush the pending rows before themselves, so a source's order is never changed. One row sent as a
dict of scalars is kept as a tuple of its values and the pending rows become Arrow columns at
once when they leave: a million quick ``send(row)`` calls travel as a handful of large batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from lowtide.clients._wire import arrow_bytes
from lowtide.errors import InvalidArgument, SchemaMismatch
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


class Batcher:
    """One source's pending rows and the messages they become (see the module docstring)."""

    def __init__(
        self,
        stream: str,
        source: str,
        max_batch_rows: int,
        linger_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch_rows < 1:
            raise InvalidArgument("max_batch_rows must be at least 1")
        self.stream = stream
        self.source = source
        self.max_batch_rows = max_batch_rows
        self.linger_s = max(0.0, linger_s)
        self.clock = clock
        self.deadline: float | None = None  # when the oldest pending row must leave
        self.pending_rows = 0
        self.messages = 0  # messages built so far (the first names the stream and source)
        self._chunks: list[pa.Table] = []  # pending tables, in send order
        self._row_names: tuple[str, ...] = ()
        self._rows: list[tuple[Any, ...]] = []  # pending single rows' values, in _row_names order

    # -- sends --------------------------------------------------------------------------------
    def add(self, prepared: pa.Table | Mapping[str, Any]) -> list[Any]:
        """Take one send (from :func:`prepare`); returns the messages that are due now."""
        if isinstance(prepared, pa.Table):
            return self._add_table(prepared)
        names = tuple(prepared)
        if names != self._row_names:
            self._seal_rows()
            self._row_names = names
        self._rows.append(tuple(prepared.values()))  # a copy: the caller may reuse its dict
        return self._added(1)

    def _add_table(self, table: pa.Table) -> list[Any]:
        self._seal_rows()
        due: list[Any] = []
        offset = 0
        while offset < table.num_rows:
            piece = table.slice(offset, self.max_batch_rows - self.pending_rows)
            self._chunks.append(piece)
            offset += piece.num_rows
            due += self._added(piece.num_rows)
        return due

    def _added(self, rows: int) -> list[Any]:
        if self.pending_rows == 0:
            self.deadline = self.clock() + self.linger_s
        self.pending_rows += rows
        if self.pending_rows >= self.max_batch_rows or self.linger_s == 0:
            return self.flush()
        return []

    def add_batch(self, table: pa.Table, batch_id: int) -> list[Any]:
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
        for part in parts:
            due.append(self._message(arrow=arrow_bytes([part]), batch_id=batch_id, batch_parts=len(parts)))
        return due

    def _seal_rows(self) -> None:
        """Pending single rows become a table chunk (before a table, or a different row shape)."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        arrays = []
        for name, column in zip(self._row_names, zip(*rows, strict=True), strict=True):
            try:
                arrays.append(pa.array(column))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                # Those rows are rejected whole, like a batch the server rejects.
                self.pending_rows -= len(rows)
                reason = " ".join(str(exc).split())
                raise SchemaMismatch(f"column {name!r} of rows sent one by one: {reason}") from exc
        table = pa.Table.from_arrays(arrays, names=list(self._row_names))
        self._chunks.append(table)

    # -- messages -----------------------------------------------------------------------------
    def flush(self) -> list[Any]:
        """Every pending row as messages: one Arrow IPC stream per run of equal schemas."""
        self._seal_rows()
        chunks, self._chunks = self._chunks, []
        self.pending_rows = 0
        self.deadline = None
        due: list[Any] = []
        run: list[pa.Table] = []
        run_bytes = 0
        for chunk in chunks:
            if chunk.num_rows == 0:
                continue
            if run and chunk.schema != run[0].schema:
                due.append(self._message(arrow=arrow_bytes(run)))
                run, run_bytes = [], 0
            for piece in _pieces(chunk):
                if run and run_bytes + piece.nbytes > MAX_MESSAGE_BYTES:
                    due.append(self._message(arrow=arrow_bytes(run)))
                    run, run_bytes = [], 0
                run.append(piece)
                run_bytes += piece.nbytes
        if run:
            due.append(self._message(arrow=arrow_bytes(run)))
        return due

    def due(self) -> bool:
        """Whether the linger time of the oldest pending row has passed."""
        return self.deadline is not None and self.clock() >= self.deadline

    def punctuation(self, value: int) -> list[Any]:
        return [*self.flush(), self._message(punctuation=value)]

    def close(self) -> list[Any]:
        return [*self.flush(), self._message(close=True)]

    def _message(self, **item: Any) -> Any:
        if self.messages == 0:
            item.update(stream=self.stream, source=self.source)
        self.messages += 1
        return pb.IngestRequest(**item)


def _pieces(table: pa.Table) -> list[pa.Table]:
    """``table`` in slices of at most about MAX_MESSAGE_BYTES each."""
    if table.nbytes <= MAX_MESSAGE_BYTES or table.num_rows <= 1:
        return [table]
    rows = max(1, table.num_rows * MAX_MESSAGE_BYTES // table.nbytes)
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


__all__ = ["MAX_MESSAGE_BYTES", "Batcher", "is_row", "prepare", "punctuation_value"]
