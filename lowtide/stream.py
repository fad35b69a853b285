"""A stream at the door: schema check, sources, and progress as the Meld of its sources.

Each source has its own punctuation (explicit or generated). The stream's progress is the
minimum over its live sources - declared sources count from the start (so the stream waits for
each of them), undeclared ones from the moment they first speak, closed ones as +inf, idle ones
(silent for ``idle_timeout``) not at all until they speak again. Published progress never
regresses; a tuple below it is *behind* punctuation (counted here), passed to the queries as
such: each query decides where it is late (docs/design.md, "Punctuation and lateness"). Every change
is checked before it is applied, so a rejected call changes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.clock import Clock
from lowtide.errors import NotFound, RegressingPunctuation
from lowtide.operators.input import Input
from lowtide.punctuation.generators import Generator
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, TIME_END, TIME_MIN, Punctuation
from lowtide.schema import Schema, admit, to_code
from lowtide.snapshot import State, as_bool, as_dict, as_float, as_int, as_list, as_str
from lowtide.strings import PoolLimits, StringPool, Uncoded


@dataclass
class Source:
    name: str
    last_heard: float
    punctuation: int = NO_PROGRESS
    max_seen: int = NO_PROGRESS
    closed: bool = False
    idle: bool = False


@dataclass
class Stream:
    name: str
    schema: Schema
    generator: Generator
    clock: Clock
    declared: tuple[str, ...] = ()
    idle_timeout: float | None = None
    derived: bool = False  # the result stream of a query
    progress: int = NO_PROGRESS
    granularity: int = 1  # generated punctuation is floored to this (the smallest SLIDE in use)
    subscribers: list[Input] = field(default_factory=list)
    sources: dict[str, Source] = field(default_factory=dict)
    tuples_ingested: int = 0
    late_tuples: int = 0  # tuples behind punctuation (the checkpoint's name)
    _next_heartbeat: float = 0.0

    def __post_init__(self) -> None:
        now = self.clock.now()
        for name in self.declared:
            self.sources[name] = Source(name, now)
        self._next_heartbeat = now

    @property
    def attribute(self) -> str:
        return self.schema.progressing

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schema": self.schema.as_dict(),
            "progressing": self.attribute,
            "punctuation": self.generator.kind,
            "sources": sorted(self.sources),
            "declared": list(self.declared),
            "low_watermark": self.progress,
            "source_punctuation": {s.name: s.punctuation for s in self.sources.values()},
        }

    # -- checkpoints -------------------------------------------------------------------------
    def snapshot(self) -> State:
        """Progress and counters; the schema, generator and declared sources are the catalog's."""
        return {
            "progress": self.progress,
            "granularity": self.granularity,
            "tuples_ingested": self.tuples_ingested,
            "late_tuples": self.late_tuples,
            "next_heartbeat": float(self._next_heartbeat),
            "sources": [
                {
                    "name": s.name,
                    "last_heard": float(s.last_heard),
                    "punctuation": s.punctuation,
                    "max_seen": s.max_seen,
                    "closed": s.closed,
                    "idle": s.idle,
                }
                for s in self.sources.values()
            ],
        }

    def restore(self, state: State) -> None:
        """Take a :meth:`snapshot` of the same stream; subscribers are not punctuated again
        (their restored operators have seen that progress)."""
        saved = as_dict(state, f"stream {self.name}")
        self.progress = as_int(saved["progress"], "progress")
        self.granularity = as_int(saved["granularity"], "granularity")
        self.tuples_ingested = as_int(saved["tuples_ingested"], "tuples_ingested")
        self.late_tuples = as_int(saved["late_tuples"], "late_tuples")
        self._next_heartbeat = as_float(saved["next_heartbeat"], "next_heartbeat")
        self.sources = {}
        for entry in as_list(saved["sources"], "sources"):
            s = as_dict(entry, "source")
            name = as_str(s["name"], "source name")
            self.sources[name] = Source(
                name,
                as_float(s["last_heard"], "last_heard"),
                as_int(s["punctuation"], "punctuation"),
                as_int(s["max_seen"], "max_seen"),
                as_bool(s["closed"], "closed"),
                as_bool(s["idle"], "idle"),
            )

    # -- checks (no state change) -----------------------------------------------------------
    def admit(
        self,
        data: Any,
        pool: StringPool | None = None,
        reads: Collection[str] | None = None,
        limits: PoolLimits | None = None,
    ) -> Batch:
        """The batch as engine columns; raises on a schema mismatch. String columns stay Arrow
        unless a ``pool`` codes those in ``reads`` (None: all) now (see
        :func:`~lowtide.schema.admit`)."""
        return admit(data, self.schema, pool, self.name, reads, limits)

    def to_code(
        self,
        batch: Batch,
        reads: Collection[str] | None,
        behind: npt.NDArray[np.bool_],
        known: Mapping[str, Uncoded],
    ) -> dict[str, Uncoded]:
        """The string columns of an admitted batch to code as it applies, as needed now
        (``behind``: its :meth:`late_mask`; see :func:`~lowtide.schema.to_code`)."""
        return to_code(batch, self.schema, reads, behind, known)

    def late_mask(self, batch: Batch) -> npt.NDArray[np.bool_]:
        """Which tuples are behind punctuation: below the published progress."""
        return batch.columns[self.attribute] < self.progress

    def check_punctuation(self, source: str, value: int) -> None:
        known = self.sources.get(source)
        if known is not None and value < known.punctuation:
            raise RegressingPunctuation(
                f"punctuation {value} of source {source!r} on stream {self.name!r} goes back from "
                f"{known.punctuation}"
            )
        if known is not None and known.closed:
            raise RegressingPunctuation(f"source {source!r} of stream {self.name!r} is closed")

    def check_source(self, source: str) -> None:
        if source not in self.sources:
            raise NotFound(f"stream {self.name!r} has no source {source!r}")

    # -- changes ----------------------------------------------------------------------------
    def _heard(self, source: str) -> Source:
        now = self.clock.now()
        known = self.sources.get(source)
        if known is None:
            known = self.sources[source] = Source(source, now)
        known.last_heard = now
        known.idle = False
        return known

    def ingest(self, batch: Batch, late: npt.NDArray[np.bool_], source: str) -> None:
        """Deliver a checked batch to every query reading this stream, then advance progress."""
        self.ingest_parts([(batch, late)], source)

    def ingest_parts(self, parts: Sequence[tuple[Batch, npt.NDArray[np.bool_]]], source: str) -> None:
        """Deliver the checked parts of one batch, then advance progress once, after all of them."""
        known = self._heard(source)
        for batch, late in parts:
            self._deliver(batch, late)
            if batch.n:
                known.max_seen = max(known.max_seen, int(batch.columns[self.attribute].max()))
        if any(batch.n for batch, _ in parts):
            implied = self.generator.after_batch(known.max_seen)
            if implied is not None:
                self._raise_source(known, self._coarsen(implied))
        self._publish()

    def _deliver(self, batch: Batch, late: npt.NDArray[np.bool_]) -> None:
        self.tuples_ingested += batch.n
        n_late = int(late.sum())
        self.late_tuples += n_late
        on_time = batch if n_late == 0 else select_rows(batch, ~late)
        late_batch = select_rows(batch, late) if n_late else None
        for subscriber in self.subscribers:
            if subscriber.numbers_rows and n_late and self.progress < END_OF_STREAM:
                subscriber.process(batch)  # a tuple window: none is behind it, order matters
                continue
            if on_time.n:
                subscriber.process(on_time)
            if late_batch is not None:
                subscriber.process_late(late_batch)

    def punctuate(self, source: str, value: int) -> None:
        known = self._heard(source)
        self._raise_source(known, value)
        self._publish()

    def close(self, source: str) -> None:
        known = self._heard(source)
        known.closed = True
        known.punctuation = END_OF_STREAM
        self._publish()

    def tick_due(self, now: float) -> bool:
        """Whether :meth:`tick` at ``now`` would change anything (no state change)."""
        if self.generator.kind == "heartbeat" and now >= self._next_heartbeat:
            return True
        if self.idle_timeout is None:
            return False
        return any(
            (not known.closed and now - known.last_heard >= self.idle_timeout) != known.idle
            for known in self.sources.values()
        )

    def tick(self) -> bool:
        """Heartbeats and idle timeouts, on the engine's clock; whether anything changed."""
        now = self.clock.now()
        changed = False
        if self.generator.kind == "heartbeat" and now >= self._next_heartbeat:
            self._next_heartbeat = now + self.generator.period_ms / 1000.0
            now_units = int(now * 1000.0 / self.schema.type_of(self.attribute).unit_ms)
            implied = self.generator.on_timer(now_units)
            for known in self.sources.values():
                if implied is not None and not known.closed:
                    self._raise_source(known, self._coarsen(implied))
                    changed = True
        if self.idle_timeout is not None:
            for known in self.sources.values():
                idle = not known.closed and now - known.last_heard >= self.idle_timeout
                changed = changed or idle != known.idle
                known.idle = idle
        if changed:
            self._publish()
        return changed

    def _coarsen(self, value: int) -> int:
        """A generated punctuation, floored to the granularity and held within the domain: a
        bounded slack or a heartbeat's skew may take it past either end, where it promises the
        same as the end (no tuple lies outside the domain)."""
        value = min(max(value, TIME_MIN), TIME_END)
        return value - value % self.granularity if self.granularity > 1 else value

    @staticmethod
    def _raise_source(known: Source, value: int) -> None:
        known.punctuation = max(known.punctuation, value)

    def _publish(self) -> None:
        live = [s.punctuation for s in self.sources.values() if not s.idle]
        if not live:
            return
        low = min(live)
        if low > self.progress:
            self.progress = low
            for subscriber in self.subscribers:
                subscriber.punctuate(Punctuation(low, self.attribute))


def select_rows(batch: Batch, mask: npt.NDArray[np.bool_]) -> Batch:
    """The rows of ``mask``; a batch may carry Arrow columns (a query's heavy-hitter lists, the
    string columns the door keeps until the batch is applied)."""
    if not any(isinstance(v, pa.Array | pa.ChunkedArray) for v in batch.columns.values()):
        return batch.select(mask)
    keep = pa.array(mask)
    columns = {
        name: v.filter(keep) if isinstance(v, pa.Array | pa.ChunkedArray) else v[mask]
        for name, v in batch.columns.items()
    }
    return Batch(columns, int(mask.sum()), batch.late)
