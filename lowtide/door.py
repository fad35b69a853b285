"""The door: streams, sources, progress, strings, the late check, the query catalog, the order.

Everything a query's input passes before it reaches an operator graph, and everything that must
be decided once for all queries, lives here; the graphs themselves belong to a
:class:`~lowtide.runner.Runner` (in this process, or the server's workers). The same calls and
items as the network client, minus the network (docs/design.md, "Interfaces"). Every call either
applies whole or raises a :class:`~lowtide.errors.LowtideError` and changes nothing. Time-driven
work (heartbeat punctuation, idle sources, the early results of ``EMIT EVERY`` queries) runs on the
door's clock whenever the door is called, or when :meth:`Door.tick` is. A query that passes a limit
while it runs (:class:`Limits`: windows per step) fails alone: the call that drove it applies to the
streams and every other query; the failed query takes no more input, and polling it raises the
:class:`~lowtide.errors.ResourceExhausted` naming it once the results it made before are drained.

Invariant: a batch is judged late once, by :meth:`Door.check_batch`; its judgement travels with it
(:class:`CheckedBatch`) to :meth:`Door.push_admitted` and is taken again only when the door's
:class:`Epoch` moved in between (something the judgement reads changed), so what applies is what
the state at application says. Its strings enter the string pool only as it applies, in the order
changes apply (:mod:`lowtide.strings`), within its stream's limits as they stand then.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from lowtide.batch import Batch
from lowtide.clock import Clock, WallClock
from lowtide.errors import (
    AlreadyExists,
    InvalidArgument,
    LateTuple,
    ResourceExhausted,
    UnsupportedQuery,
)
from lowtide.handles import Item, Query
from lowtide.ipc import validate_table
from lowtide.names import check_name, check_source, unknown
from lowtide.operators.input import Input, LateRule
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.windows import WindowLimits
from lowtide.punctuation.generators import Generator
from lowtide.punctuation.model import (
    END_OF_STREAM,
    MAX_DERIVED_DEPTH,
    NO_PROGRESS,
    Punctuation,
    check_punctuation_value,
)
from lowtide.punctuation.policies import LatePolicy
from lowtide.query import QueryTree, parse_query
from lowtide.query.build import explain
from lowtide.query.derived import Part, part_of, split
from lowtide.query.describe import describe
from lowtide.query.description import PlanDescription, PlanOptions
from lowtide.query.early import EmitTimer, final_rows
from lowtide.query.late_rules import late_rules
from lowtide.query.literals import pin_literals
from lowtide.query.reads import columns_read
from lowtide.query.sharing import ShareIndex
from lowtide.results import Sink
from lowtide.runner import PlannedQuery, Runner
from lowtide.schema import Schema, to_arrow_table, with_codes
from lowtide.snapshot import State, as_dict, as_float, as_int
from lowtide.stream import Stream, select_rows
from lowtide.strings import Coding, PoolLimits, StringPool, Uncoded

DEFAULT_SOURCE = "default"
MAX_QUERY_BYTES = 64 * 1024
R = TypeVar("R", bound=Runner)


@dataclass
class Limits:
    max_streams: int = 1000
    max_queries: int = 1000
    max_batch_rows: int = 10_000_000
    max_query_bytes: int = MAX_QUERY_BYTES  # query text, UTF-8 encoded
    max_windows_per_tuple: int = WindowLimits.max_windows_per_tuple  # RANGE / SLIDE, at register
    max_windows_per_step: int = WindowLimits.max_windows_per_step  # landmark windows per punctuation
    max_strings: int = 5_000_000  # strings one stream may add to the pool (see lowtide.strings)
    max_string_bytes: int = 512 << 20  # ... and the memory they take (lowtide.strings.cost)

    @property
    def windows(self) -> WindowLimits:
        return WindowLimits(self.max_windows_per_tuple, self.max_windows_per_step)

    def lifted(self) -> Limits:
        """These limits with every one that judges new input lifted (a replay applies what was
        accepted under the limits of its day); those that shape how a query runs are kept."""
        shaping = {"max_windows_per_step"}
        lifted = {f.name: sys.maxsize for f in dataclasses.fields(self) if f.name not in shaping}
        return dataclasses.replace(self, **lifted)


@dataclass
class RunningQuery:
    name: str
    sql: str
    description: PlanDescription  # planned once, here; the runner builds it
    late_rules: tuple[LateRule | None, ...]  # each input's (lowtide.query.late_rules), for error
    sink: Sink
    policy: LatePolicy
    derived: Stream | None = None
    subscribers: list[tuple[str, Input]] = field(default_factory=list)  # (stream, what it feeds)
    late_items: list[Any] = field(default_factory=list)
    late_dropped: int = 0
    late_ended: bool = False  # the late side stream took its end-of-stream marker
    timer: EmitTimer | None = None  # EMIT EVERY: when its early results are next due
    failure: ResourceExhausted | None = None  # a limit failed it while it ran (see the module)
    reads: frozenset[str] | None = None  # the columns it reads (lowtide.query.reads); None: all
    part_of: str | None = None  # the query whose derived table this is (lowtide.query.derived)

    @property
    def streams(self) -> list[str]:
        """The stream each of its inputs reads, in input order."""
        return [about.stream for about in self.description.inputs]

    def late_count(self, stream: str, behind: Sequence[Batch], progress: Mapping[str, int]) -> int:
        """How many of the tuples ``behind`` punctuation on ``stream`` would be late for the query
        if it rejects them (``late = 'error'``, not failed): its window operator's rule, from the
        punctuation alone, wherever it runs (no rule: every one); else 0."""
        if self.failure is not None or self.policy is not LatePolicy.ERROR:
            return 0
        rules = [rule for s, rule in zip(self.streams, self.late_rules, strict=True) if s == stream]
        return max(
            (sum(b.n if rule is None else int(rule(b, progress).sum()) for b in behind) for rule in rules),
            default=0,
        )

    def found_late(self, table: Any, rows: int) -> None:
        """Late tuples (raw input rows) into the late side stream ``<query>.late``; once it has
        ended (see :meth:`passed`), they are only counted."""
        self.late_dropped += rows
        if not self.late_ended:
            self.late_items.append(table)

    def passed(self, punctuation: Punctuation, collapse: bool) -> None:
        """The query's output punctuation, as the late side stream's marker: ``<query>.<attribute>``
        at the same value, after every late tuple found before it (so the end of the query's
        output ends its late stream too). Not ``attribute`` itself: late tuples lie below any
        bound on their own columns. ``collapse``: a marker still unread replaces the previous
        one of its attribute (the later one says more), so an unpolled late stream stays small."""
        if self.late_ended or self.part_of is not None:  # a derived table's late tuples are its query's
            return
        self.late_ended = punctuation.value >= END_OF_STREAM
        marker = Punctuation(punctuation.value, f"{self.name}.{punctuation.attribute}")
        last = self.late_items[-1] if self.late_items else None
        if collapse and isinstance(last, Punctuation) and last.attribute == marker.attribute:
            self.late_items[-1] = marker
        else:
            self.late_items.append(marker)


@dataclass(frozen=True)
class Epoch:
    """What a batch is admitted and judged against, as :attr:`Door.epoch` gives it out: work
    prepared in one epoch applies as prepared in that epoch only, and is redone in another.

    ``generation``: which door (a server makes a new one at each recovery, a generation later).
    ``catalog``: changes to what a batch is admitted and judged against - streams and queries
    created or dropped, a query failed, a source closed, a dropped stream's strings released.
    ``progress``: moves of any stream's published progress, which the late check reads. Nothing
    else moves it: a batch that applies without moving progress leaves the judgement of the
    batches checked before it standing (the strings it adds are the pool's to reconcile, see
    :meth:`~lowtide.strings.StringPool.commit`)."""

    generation: int = 0
    catalog: int = 0
    progress: int = 0

    def admits_like(self, other: Epoch) -> bool:
        """Whether parts admitted in this epoch are what ``other`` admits (only progress moved in
        between): such a batch is judged again, its parts kept."""
        return (self.generation, self.catalog) == (other.generation, other.catalog)


@dataclass(frozen=True)
class CheckedBatch:
    """One batch from ``source`` as :meth:`Door.check_batch` judged it in ``epoch``: its admitted
    ``parts``, how their string columns code as it applies (``coding``: the pool adds the strings
    new to it only then) and which of its tuples are ``behind`` punctuation."""

    stream: str
    source: str
    parts: list[Batch]
    coding: Coding
    behind: list[npt.NDArray[np.bool_]]
    epoch: Epoch

    def current(self, stream: str, source: str, epoch: Epoch) -> bool:
        """Whether the judgement holds for this batch applied now (in the same epoch)."""
        return (self.stream, self.source, self.epoch) == (stream, source, epoch)


class Door(Generic[R]):
    """The door of one engine, running its queries' graphs on ``runner`` (see the module)."""

    def __init__(
        self,
        runner: R,
        pool: StringPool,
        clock: Clock | None = None,
        limits: Limits | None = None,
        flush: SlowFlush | None = None,
        collapses_late_markers: bool = True,
        *,
        share_slices: bool = PlanOptions.share_slices,
        paned_min_overlap: int = PlanOptions.paned_min_overlap,
        generation: int = 0,
    ) -> None:
        """``flush``: smooth emission (§8.3.3) for the time windows of every query; None: each
        window's results leave as soon as punctuation completes it. ``collapses_late_markers``:
        consecutive unread markers of a late side stream collapse into the last one (see
        :meth:`RunningQuery.passed`), unless something numbers every item (the server's hubs).
        ``share_slices`` and ``paned_min_overlap``: see
        :class:`~lowtide.query.description.PlanOptions` (False: every Paned-WID query keeps
        slices of its own). ``generation``: of its :class:`Epoch` (a door that replaces another
        takes a later one, so nothing prepared with the other applies as prepared)."""
        self.runner = runner
        self.clock: Clock = clock or WallClock()
        self.limits = limits or Limits()
        self.flush = flush
        # What every query is planned with; each query's own options replace the rest. Made
        # here so that a paned_min_overlap below 1 is refused now, not at the first query.
        self.planning = PlanOptions(share_slices=share_slices, paned_min_overlap=paned_min_overlap)
        self.pool = pool
        self.collapses_late_markers = collapses_late_markers
        # What a batch is admitted and judged against, as it changes (only the door replaces it).
        self.epoch = Epoch(generation)
        self._streams: dict[str, Stream] = {}
        self._queries: dict[str, RunningQuery] = {}
        self._counter = 0
        self._shared = ShareIndex()  # the slices queries share, as data (the runner's are live)
        self._reads: dict[str, frozenset[str] | None] = {}  # per stream: see string_reads

    # -- streams ------------------------------------------------------------------------------
    def create_stream(
        self,
        name: str,
        schema: Mapping[str, str],
        progressing: str = "ts",
        punctuation: str = "explicit",
        sources: list[str] | tuple[str, ...] | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        """Create a stream; ``idle_timeout`` is in seconds of wall time."""
        typed, generator = self.check_stream(name, schema, progressing, punctuation, sources, idle_timeout)
        self._streams[name] = Stream(name, typed, generator, self.clock, tuple(sources or ()), idle_timeout)
        self._catalog_changed()

    def check_stream(
        self,
        name: str,
        schema: Mapping[str, str],
        progressing: str = "ts",
        punctuation: str = "explicit",
        sources: list[str] | tuple[str, ...] | None = None,
        idle_timeout: float | None = None,
    ) -> tuple[Schema, Generator]:
        """Raise what :meth:`create_stream` would raise, changing nothing."""
        check_name(name, "stream")  # names: see lowtide.names
        if name in self._streams or name in self._queries:
            raise AlreadyExists(f"stream {name!r} already exists")
        if sum(not s.derived for s in self._streams.values()) >= self.limits.max_streams:
            raise ResourceExhausted(f"at most {self.limits.max_streams} streams")
        for source in sources or ():
            check_source(source)
        typed = Schema.of(schema, progressing)
        generator = Generator.parse(punctuation, typed.type_of(progressing).unit_ms)
        if idle_timeout is not None and not (0 < idle_timeout < math.inf):
            raise InvalidArgument(f"idle_timeout must be a positive number of seconds, got {idle_timeout}")
        return typed, generator

    def drop_stream(self, name: str) -> None:
        self.check_drop_stream(name)
        del self._streams[name]
        self._catalog_changed()
        self.runner.strings_released(self.pool.release(name))

    def check_drop_stream(self, name: str) -> None:
        stream = self._stream(name)
        if stream.derived:
            raise InvalidArgument(f"{name!r} is the result stream of a query; drop the query")
        readers = [q.part_of or q.name for q in self._queries.values() if name in q.streams]
        if readers:
            raise InvalidArgument(f"stream {name!r} is read by query {readers[0]!r}; drop the query first")

    def _catalog_changed(self) -> None:
        self.epoch = dataclasses.replace(self.epoch, catalog=self.epoch.catalog + 1)

    def _progressed(self, stream: Stream, before: int) -> None:
        """Count a move of ``stream``'s published progress from ``before`` (see :class:`Epoch`)."""
        if stream.progress != before:
            self.epoch = dataclasses.replace(self.epoch, progress=self.epoch.progress + 1)

    def list_streams(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self._streams.values() if not s.derived]

    def low_watermark(self, stream: str) -> int:
        """The published progress of ``stream`` (NO_PROGRESS before any)."""
        return self._stream(stream).progress

    def source_punctuation(self, stream: str, source: str) -> int:
        """What ``source`` has promised on ``stream`` (NO_PROGRESS: nothing, or not a source yet)."""
        known = self._stream(stream).sources.get(source)
        return NO_PROGRESS if known is None else known.punctuation

    def _stream(self, name: str) -> Stream:
        try:
            return self._streams[name]
        except (KeyError, TypeError):
            raise unknown("stream", name, (n for n, s in self._streams.items() if not s.derived)) from None

    # -- queries ------------------------------------------------------------------------------
    def register_query(
        self,
        sql: str,
        name: str | None = None,
        late: str = "drop",
        allowed_lateness: str | int | None = None,
        restored_share: str | None = None,
    ) -> Query:
        """Register a query; its results are polled by name and readable as a stream.

        ``restored_share``: the query is registered again to restore a checkpoint, and reads the
        slices of that :func:`~lowtide.query.sharing.slices_key` as it did when saved."""
        if name is None:
            self._counter += 1
            name = f"q{self._counter}"
            while name in self._queries or name in self._streams:
                self._counter += 1
                name = f"q{self._counter}"
        check_name(name, "query")
        if name in self._queries or name in self._streams:
            raise AlreadyExists(f"query or stream {name!r} already exists")
        if len(self._queries) >= self.limits.max_queries:
            raise ResourceExhausted(f"at most {self.limits.max_queries} queries")
        policy = LatePolicy.parse(late)
        planned = self._plan(sql, name, policy, allowed_lateness, restored_share)
        self._check_room(name, planned)
        for running in planned:  # its derived tables first: each reads those before it
            self._attach(running)
        return Query(name, sql)

    def check_query(
        self, sql: str, name: str | None = None, late: str = "drop", allowed_lateness: str | int | None = None
    ) -> None:
        """Raise what :meth:`register_query` would raise, registering nothing."""
        if name is not None:
            check_name(name, "query")
            if name in self._queries or name in self._streams:
                raise AlreadyExists(f"query or stream {name!r} already exists")
        if len(self._queries) >= self.limits.max_queries:
            raise ResourceExhausted(f"at most {self.limits.max_queries} queries")
        name = name or "check"
        self._check_room(name, self._plan(sql, name, LatePolicy.parse(late), allowed_lateness))

    def _check_room(self, name: str, planned: list[RunningQuery]) -> None:
        if len(self._queries) + len(planned) > self.limits.max_queries:
            raise ResourceExhausted(
                f"at most {self.limits.max_queries} queries, and {name!r} runs as {len(planned)} "
                "(one per derived table, and itself)"
            )

    def explain(self, sql: str) -> str:
        """The operator graph a query would run, one operator a line, from input to output; a
        derived table's graph first, under the name of the part it runs as."""
        texts = []
        for running in self._plan(sql, "query", LatePolicy.DROP, None):
            description = running.description
            early = f"\n{description.early.describe()}" if description.early is not None else ""
            sink = f"\n{len(description.nodes)}. {running.sink.describe()}"
            text = self._explain(description) + sink + early + self.runner.placement(description)
            texts.append(text if running.part_of is None else f"{running.name}:\n{text}")
        if len(texts) > 1:
            texts[-1] = f"query:\n{texts[-1]}"
        return "\n".join(texts)

    def plan_of(self, query: str) -> str:
        """The operators a registered query runs, one a line from input to output."""
        return self._explain(self.query(query).description)

    def _explain(self, description: PlanDescription) -> str:
        share = description.share
        return explain(description, self._shared.readers().get(share.name, 0) if share is not None else 0)

    def _plan(
        self,
        sql: str,
        name: str,
        policy: LatePolicy,
        allowed_lateness: str | int | None,
        restored_share: str | None = None,
    ) -> list[RunningQuery]:
        """``sql`` planned as ``name``: its derived tables' parts first, then itself."""
        if not isinstance(sql, str):
            raise InvalidArgument(f"a query is text, not {type(sql).__name__}")
        size = len(sql.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_query_bytes:
            raise InvalidArgument(f"query of {size} bytes is over the limit of {self.limits.max_query_bytes}")
        try:
            tree = parse_query(sql)
            parts, top = split(tree, name)
            if not parts:
                return [self._planned(tree, sql, name, policy, allowed_lateness, restored_share)]
            if policy is LatePolicy.UPDATE:
                raise UnsupportedQuery(
                    "late='update' revises a derived table's windows, and the query reading them would "
                    "count each revision as a new row: register a query with derived tables with "
                    "late='drop' or late='error'"
                )
            # A query with derived tables shares no slices: its parts restore with it, by name.
            planned: dict[str, RunningQuery] = {}
            for part in (*parts, Part(name, top)):
                text = sql if part.name == name else part.query.text
                running = self._planned(part.query, text, part.name, policy, allowed_lateness, None, planned)
                if part.name != name and running.derived is None:
                    raise UnsupportedQuery(
                        f"derived table ({_shortened(part.query.text)}) has no time column: select its "
                        "input's time column or window it, so that the outer query's input progresses"
                    )
                planned[part.name] = running
            return list(planned.values())
        except RecursionError:  # parse_query bounds nesting; this is the backstop
            raise InvalidArgument("query nests too deeply") from None

    def _planned(
        self,
        query: QueryTree,
        sql: str,
        name: str,
        policy: LatePolicy,
        allowed_lateness: str | int | None,
        restored_share: str | None,
        parts: Mapping[str, RunningQuery] | None = None,
    ) -> RunningQuery:
        """Plan ``query`` as ``name``; ``parts``: the derived tables planned before it, which it
        may read though they are not registered yet (then it shares no slices)."""
        holder: list[RunningQuery] = []
        options = dataclasses.replace(
            self.planning,
            policy=policy,
            allowed_lateness=allowed_lateness,
            windows=self.limits.windows,
            flush=self.flush,
            restored_share=restored_share,
        )
        known = parts or {}

        def catalog(stream: str) -> Schema:
            derived = known[stream].derived if stream in known else None
            if derived is not None:
                return derived.schema
            owner = part_of(stream) if stream in self._queries else None
            if owner is not None:  # it goes when its query goes: no other query may read it
                raise UnsupportedQuery(
                    f"{stream!r} runs a derived table of query {owner!r}: read {owner!r}, or register the "
                    "derived table as a query of its own"
                )
            return self._schema_of(stream)

        def depth_of(stream: str) -> int:
            if stream in known:
                return 1 + max((depth_of(s) for s in known[stream].streams), default=0)
            return self._depth(stream)

        description = describe(query, catalog, options, self._shared if parts is None else None)
        self.runner.check(description)
        depth = max((depth_of(about.stream) for about in description.inputs), default=0)
        if depth > MAX_DERIVED_DEPTH:  # see lowtide.punctuation.model: the domain
            raise UnsupportedQuery(
                f"query {name!r} would read query results {depth} levels deep, at most {MAX_DERIVED_DEPTH}: "
                "each level's window_end may pass its input's values by a window"
            )
        fields = description.schema
        derived = self._derived_stream(name, description)

        def on_punctuation(punctuation: Punctuation) -> None:
            holder[0].passed(punctuation, self.collapses_late_markers)
            if derived is not None and punctuation.attribute == derived.attribute:
                before = derived.progress
                derived.punctuate(name, punctuation.value)
                self._progressed(derived, before)  # a progress the late rules of its readers read

        sink = Sink(
            fields,
            self.pool,
            description.progressing,
            forward=(lambda b: self._forward(derived, name, final_rows(b))) if derived else None,
            forward_punctuation=on_punctuation,
            keeps=part_of(name) is None,
        )
        running = RunningQuery(
            name,
            sql,
            description,
            late_rules(description, self.pool),
            sink,
            policy,
            derived,
            reads=columns_read(query),
            part_of=part_of(name),
        )
        holder.append(running)
        return running

    def _depth(self, stream: str) -> int:
        """How many queries deep ``stream`` is: 0 for an input stream, else its query's depth."""
        running = self._queries.get(stream)
        if running is None:
            return 0
        return 1 + max((self._depth(s) for s in running.streams), default=0)

    @staticmethod
    def _forward(derived: Stream, name: str, batch: Batch) -> None:
        """A query's result rows into its result stream (final rows only: see lowtide.query.early)."""
        if batch.n:
            derived.ingest(batch, batch.columns[derived.attribute] < derived.progress, name)

    def _derived_stream(self, name: str, description: PlanDescription) -> Stream | None:
        if not description.progressing:
            return None
        schema = Schema(description.schema, description.progressing[0], description.aligned)
        return Stream(name, schema, Generator("explicit"), self.clock, (name,), derived=True)

    def _schema_of(self, name: str) -> Schema:
        """The planner's catalog: FROM reads streams and the results of queries alike."""
        stream = self._streams.get(name)
        if stream is None:
            raise unknown("stream", name, self._streams)
        return stream.schema

    def _attach(self, running: RunningQuery) -> None:
        self._reads.clear()
        self._catalog_changed()
        derived = running.derived
        if derived is not None:
            self._streams[running.name] = derived
        self._queries[running.name] = running
        description = running.description
        pin_literals(description, self.pool)  # a runner's pool (a mirror's too) compiles them alike
        running.subscribers = self.runner.register(
            PlannedQuery(
                running.name,
                description,
                frozenset(s for s in running.streams if self._streams[s].derived),
                running.sink,
                self._late_sink(running),
                partial(self._fail, running),
                None
                if running.reads is None
                else running.reads | {self._streams[s].attribute for s in running.streams},
            )
        )
        if description.early is not None:
            running.timer = EmitTimer.started(description.early, self.clock.now())
        self._shared.enter(description.share)
        if description.share is not None and description.share.joins:
            self._regranulate()
            return  # it reads slices whose input is subscribed and punctuated already
        for stream_name, op in running.subscribers:
            stream = self._streams[stream_name]
            stream.subscribers.append(op)
            if stream.progress > NO_PROGRESS:
                op.punctuate(Punctuation(stream.progress, stream.attribute))
        self._regranulate()

    def _late_sink(self, running: RunningQuery) -> Callable[[Any, int], None]:
        """Where ``running``'s late tuples go: its late side stream, or, for a derived table, that
        of the query it is part of (registered with it, so there by the time tuples flow)."""
        part_of = running.part_of
        if part_of is None:
            return running.found_late
        return lambda table, rows: self._queries[part_of].found_late(table, rows)

    def _fail(self, running: RunningQuery, exc: ResourceExhausted) -> None:
        """The runner failed a query while it ran (see :attr:`PlannedQuery.fail`); a derived
        table's part fails its query too (else the query would wait for it without a word)."""
        if running.failure is None:
            self._catalog_changed()  # it judges no batch any more
            running.failure = ResourceExhausted(f"query {running.name!r} failed: {exc}")
        owner = self._queries.get(running.part_of or "")
        if owner is not None:
            self._fail(owner, exc)

    def inputs_of(self, query: str) -> list[str]:
        """The streams ``query`` reads, those its derived tables read in place of their parts:
        what its late side stream ``<query>.late`` holds rows of."""
        names: list[str] = []
        for stream in self.query(query).streams:
            part = self._queries.get(stream)
            names += self.inputs_of(stream) if part is not None and part.part_of is not None else [stream]
        return names

    def share_of(self, query: str) -> str | None:
        """The name (:func:`~lowtide.query.sharing.slices_key`) of the slices ``query`` reads, if it
        shares any."""
        share = self.query(query).description.share
        return share.name if share is not None else None

    # -- checkpoints: the door's progress (the catalog itself is the input log's records) ------------
    def snapshot_progress(self) -> State:
        """The query-name counter, each input stream's progress (a result stream is saved with
        its query's output) and when each EMIT EVERY query's early results are next due."""
        return {
            "counter": self._counter,
            "streams": {name: s.snapshot() for name, s in self._streams.items() if not s.derived},
            "emit": {name: q.timer.next_at for name, q in self._queries.items() if q.timer is not None},
        }

    def restore_progress(self, state: State) -> None:
        """Take a :meth:`snapshot_progress` once the same streams and queries exist again."""
        saved = as_dict(state, "engine progress")
        for name, stream in as_dict(saved["streams"], "streams").items():
            self._stream(name).restore(stream)
        self._counter = as_int(saved["counter"], "counter")
        self._catalog_changed()  # sources closed, and progress
        for name, next_at in as_dict(saved.get("emit", {}), "emit").items():
            running = self._queries.get(name)
            if running is not None and running.timer is not None:
                running.timer.next_at = as_float(next_at, f"emit timer of {name}")

    def drop_query(self, name: str) -> None:
        """Drop a query, and the parts its derived tables run as (readers first)."""
        self.check_drop_query(name)
        parts = [q.name for q in self._queries.values() if q.part_of == name]
        for dropped in (name, *reversed(parts)):
            self._drop(dropped)

    def _drop(self, name: str) -> None:
        running = self._queries[name]
        self._shared.leave(running.description.share)
        del self._queries[name]
        self._reads.clear()
        self._catalog_changed()
        for stream_name, op in running.subscribers:
            if not self._shared_input(op):
                self._streams[stream_name].subscribers.remove(op)
        self._streams.pop(name, None)
        self.runner.drop(name)
        self._regranulate()

    def check_drop_query(self, name: str) -> None:
        part = self.query(name).part_of
        if part is not None:
            raise InvalidArgument(f"query {name!r} runs a derived table of query {part!r}; drop {part!r}")
        readers = [q.name for q in self._queries.values() if name in q.streams]
        if readers:
            raise InvalidArgument(f"query {name!r} is read by query {readers[0]!r}; drop that first")

    def _shared_input(self, op: Input) -> bool:
        """Whether ``op`` still feeds slices some query reads (a query reading shared slices
        lists what feeds them among its subscribers)."""
        return any(
            q.description.share is not None and any(o is op for _, o in q.subscribers)
            for q in self._queries.values()
        )

    def _regranulate(self) -> None:
        """Generated punctuation no finer than the windows in use need (gcd of their slides)."""
        for stream in self._streams.values():
            slides = [
                slide
                for q in self._queries.values()
                for name, slide in q.description.slides
                if name == stream.name
            ]
            stream.granularity = math.gcd(*slides) if slides else 1

    def list_queries(self) -> list[dict[str, Any]]:
        return [
            {
                "name": q.name,
                "sql": q.sql,
                "late": q.policy.value,
                "columns": [name for name, _ in q.description.schema],
                "results": q.sink.results,
                "late_tuples": q.late_dropped,
                "time_unit": q.description.time_unit,
            }
            for q in self._queries.values()
            if q.part_of is None  # its query's explain shows it
        ]

    def query(self, name: str) -> RunningQuery:
        """What the door keeps of a registered query; NotFound naming the known ones."""
        try:
            return self._queries[name]
        except (KeyError, TypeError):
            raise unknown("query", name, self._queries) from None

    # -- data ---------------------------------------------------------------------------------
    def string_reads(self, stream: str) -> frozenset[str] | None:
        """The columns of ``stream`` some query reads (None: all): the door codes these string
        columns whole, of the others only the rows behind punctuation (lowtide.schema)."""
        if stream not in self._reads:
            reads: frozenset[str] | None = frozenset()
            for q in self._queries.values():
                if reads is not None and stream in q.streams:
                    reads = None if q.reads is None else reads | q.reads
            self._reads[stream] = reads
        return self._reads[stream]

    def push(self, stream: str, data: Any, source: str = DEFAULT_SOURCE) -> None:
        """Send a batch from ``source``; rejected whole (nothing applied) on any error."""
        self.push_admitted(stream, [self.admit(stream, data)], source)

    def admit(self, stream: str, data: Any, validated: bool = False) -> Batch:
        """Check a batch, or one part of a batch, against ``stream``: engine columns, the string
        columns still Arrow (coded as the batch applies: the pool takes no string of a batch
        refused or never completed).

        Nothing changes: ``push_admitted`` applies it. The server admits the parts of a large
        batch as they arrive and applies them together. Arrow data is validated in full first,
        unless ``validated`` (the server's :func:`~lowtide.ipc.read_ipc` did it).
        """
        target, table = self._input(stream, data, validated)
        return target.admit(table)

    def check(self, stream: str, data: Any, validated: bool = False) -> int:
        """Raise what :meth:`admit` would raise for its columns, changing nothing: a part staged
        now and admitted when its batch commits. Returns its rows."""
        target, table = self._input(stream, data, validated)
        return target.admit(table).n

    def _input_stream(self, stream: str) -> Stream:
        """``stream``, if it takes input (rows, punctuation, a close): not a query's result stream."""
        target = self._stream(stream)
        if target.derived:
            raise InvalidArgument(f"{stream!r} is the result stream of a query and takes no input")
        return target

    def _input(self, stream: str, data: Any, validated: bool) -> tuple[Stream, pa.Table]:
        target = self._input_stream(stream)
        table = to_arrow_table(data)
        if table.num_rows > self.limits.max_batch_rows:  # before any column is converted
            raise ResourceExhausted(
                f"batch of {table.num_rows} rows is over the limit of {self.limits.max_batch_rows}"
            )
        if not validated:
            validate_table(table)
        return target, table

    def push_admitted(
        self, stream: str, batch: Sequence[Batch] | CheckedBatch, source: str = DEFAULT_SOURCE
    ) -> None:
        """Apply the admitted parts of one batch from ``source``, all or none: they are late
        against the same progress, and the stream advances once, after all of them; the string
        pool takes the strings new to it now, within the stream's limits as they stand now. A
        batch :meth:`check_batch` judged applies as judged in the same :class:`Epoch`; in
        another it is judged again (and may fail), and its parts must be what the door admits
        now (:meth:`Epoch.admits_like`: the caller admits them again otherwise)."""
        target = self._stream(stream)
        self.tick()
        if not isinstance(batch, CheckedBatch):
            checked = self.check_batch(stream, batch, source)
        elif batch.current(stream, source, self.epoch):
            checked = batch
        else:
            checked = self.check_batch(stream, batch.parts, source, batch.coding)
        codes = self.pool.commit(checked.coding, self._pool_limits())
        schema = target.schema
        coded = [with_codes(part, schema, c) for part, c in zip(checked.parts, codes, strict=True)]
        before = target.progress
        target.ingest_parts(list(zip(coded, checked.behind, strict=True)), source)
        self._progressed(target, before)

    def _pool_limits(self) -> PoolLimits:
        return PoolLimits(self.limits.max_strings, self.limits.max_string_bytes)

    def check_batch(
        self, stream: str, parts: Sequence[Batch], source: str = DEFAULT_SOURCE, before: Coding | None = None
    ) -> CheckedBatch:
        """Raise what :meth:`push_admitted` would raise now; else the batch as it would apply now
        (see :class:`CheckedBatch`). Nothing changes: the string columns ``admit`` kept as Arrow
        are looked up in the pool (their strings new to it within its limits for the stream),
        and coded only as the batch applies. ``before``: the coding of an earlier check of these
        parts (its whole columns are not made again)."""
        target = self._stream(stream)
        known = target.sources.get(source)
        if known is None:
            check_source(source)
        elif known.closed:
            raise InvalidArgument(f"source {source!r} of stream {stream!r} is closed")
        behind = [target.late_mask(part) for part in parts]
        reads = self.string_reads(stream)
        made: Sequence[dict[str, Uncoded]] = before.columns if before is not None else [{} for _ in parts]
        columns = [target.to_code(p, reads, m, kept) for p, m, kept in zip(parts, behind, made, strict=True)]
        coding = self.pool.look(stream, columns)
        self.pool.check(coding, self._pool_limits())
        strict = [q for q in self._queries.values() if q.policy is LatePolicy.ERROR and stream in q.streams]
        n_late = 0
        if strict and any(mask.any() for mask in behind):
            # Behind punctuation is late only where a query can no longer count it
            # (docs/design.md, "Punctuation and lateness"), judged on provisional codes: the pool
            # takes the batch's new strings only as it applies.
            schema = target.schema
            rows = [
                select_rows(with_codes(part, schema, codes), mask)
                for part, codes, mask in zip(parts, coding.provisional(), behind, strict=True)
            ]
            progress = {name: s.progress for name, s in self._streams.items()}
            n_late = max(q.late_count(stream, rows, progress) for q in strict)
        if n_late:
            raise LateTuple(
                f"{n_late} tuple(s) of stream {stream!r} are below its punctuation {target.progress} "
                "and a query reading it has late='error'"
            )
        return CheckedBatch(stream, source, list(parts), coding, behind, self.epoch)

    def punctuate(self, stream: str, value: int, source: str = DEFAULT_SOURCE) -> None:
        """Promise that ``source`` sends no more tuples with a progressing value below ``value``."""
        target = self._stream(stream)
        self.tick()
        before = target.progress
        target.punctuate(source, self.check_punctuation(stream, value, source))
        self._progressed(target, before)

    def check_punctuation(self, stream: str, value: Any, source: str = DEFAULT_SOURCE) -> int:
        """Raise what :meth:`punctuate` would raise now; the value as an int."""
        target = self._input_stream(stream)
        integral = isinstance(value, int | np.integer) or (
            isinstance(value, float | np.floating) and bool(np.isfinite(value)) and float(value).is_integer()
        )
        if isinstance(value, bool) or not integral:
            raise InvalidArgument(
                f"punctuation of stream {stream!r} must be an integer in the units of "
                f"{target.attribute!r}, got {value!r}"
            )
        whole = int(value)
        if source not in target.sources:
            check_source(source)
        target.check_punctuation(source, whole)
        check_punctuation_value(whole, stream)
        return whole

    def close_source(self, stream: str, source: str = DEFAULT_SOURCE) -> None:
        """End ``source``: its punctuation becomes +inf."""
        self.check_close(stream, source)
        self._stream(stream).close(source)
        self._catalog_changed()  # a batch from it is refused from now on

    def check_close(self, stream: str, source: str = DEFAULT_SOURCE) -> None:
        self._input_stream(stream).check_source(source)

    def tick(self) -> None:
        """Run heartbeats and idle timeouts against the engine's clock, then the early results
        due (each EMIT EVERY query's timer fires at most once a tick)."""
        for stream in list(self._streams.values()):
            before = stream.progress
            if not stream.derived and stream.tick():
                self._progressed(stream, before)
        now = self.clock.now()
        for running in list(self._queries.values()):
            if running.timer is not None and running.timer.due(now):
                running.timer.fire(now)
                self.runner.emit_early(running.name)

    def tick_due(self, now: float) -> bool:
        """Whether a :meth:`tick` at ``now`` would move any stream or fire any early results
        (no state change)."""
        return any(s.tick_due(now) for s in self._streams.values() if not s.derived) or any(
            q.timer is not None and q.timer.due(now) for q in self._queries.values()
        )

    def poll(self, query: str) -> list[Item]:
        """Result tables and punctuation emitted since the last poll (``"<query>.late"``: the late
        tuples, and the query's punctuation as markers: see :meth:`RunningQuery.passed`)."""
        self.tick()
        return self.drain(query)

    def drain(self, query: str) -> list[Item]:
        """:meth:`poll` without running the clock first."""
        if query.endswith(".late") and query[: -len(".late")] in self._queries:
            running = self._queries[query[: -len(".late")]]
            items, running.late_items = running.late_items, []
            return items
        running = self.query(query)
        items = running.sink.drain()
        if not items and running.failure is not None:
            raise running.failure
        return items

    # -- observability ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters for metrics: per stream and per query operator."""
        return {
            "streams": {
                s.name: {
                    "ingested": s.tuples_ingested,
                    "behind": s.late_tuples,
                    "late": s.late_tuples,  # the name before issue 14: tuples behind punctuation
                    "low_watermark": s.progress,
                }
                for s in self._streams.values()
            },
            "queries": {
                q.name: {
                    "operators": [
                        {"operator": label, "in": n_in, "out": n_out}
                        for label, n_in, n_out in self.runner.operators(q.name)
                    ],
                    "late": q.late_dropped,
                    "results": q.sink.results,
                    "open_windows": self.runner.open_windows(q.name),
                    "state_bytes": self.state_bytes(q.name),
                }
                for q in self._queries.values()
            },
        }

    def state_bytes(self, query: str) -> int:
        self.query(query)  # NotFound for an unknown one
        return self.runner.state_bytes(query)


def _shortened(text: str, most: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= most else flat[:most] + "..."


__all__ = ["DEFAULT_SOURCE", "MAX_QUERY_BYTES", "CheckedBatch", "Door", "Epoch", "Limits", "RunningQuery"]
