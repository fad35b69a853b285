"""The reference (tests/reference.py) behind SQL text and the calls of a stream's sources, for tests
that run whole queries: written from docs/design.md ("Data model", "Windows", "Punctuation and
lateness", "Results and offsets") and docs/queries.md ("Window semantics", "Session windows",
"Results"), sharing no code with lowtide (nothing here imports it).

* :func:`read`: a query's SQL in the bracket form, as a :class:`Query` (a :class:`reference.Spec`,
  the streams of its UNION, a WHERE of column-literal comparisons, EMIT EVERY), or
  :class:`Unsupported` naming what the reference cannot evaluate.
* :class:`World`: streams, their sources and progress (the minimum over the live sources: declared
  ones from the start, undeclared ones from when they first speak, closed ones +inf, idle ones not
  at all; published progress never goes back); queries registered on it, each counting the
  tuples that arrive after it was registered, its progress the minimum over its streams (a
  query's results are a stream too, progressing on ``window_end``). :meth:`World.output` gives
  what a query owes so far: every row (revision 0) of a window punctuation covers, over the tuples
  it can count, and its output punctuation. A tuple behind its query's progress counts in the
  windows still open (``end > progress`` when it came; sessions: :func:`reference.session_counts`);
  it is late where a window holding it has been emitted: under ``late='error'`` its batch is
  refused (:meth:`World.refusing`; a session query refuses any tuple behind, docs/late-data.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reference import (
    END_OF_STREAM,
    NO_PROGRESS,
    Agg,
    Row,
    Spec,
    Window,
    canonical,
    covered,
    evaluate,
    first_open_end,
    session_counts,
    session_punctuation,
)

AGGREGATES = {"count", "sum", "min", "max", "avg", "var", "stddev", "median", "quantile", "count_distinct"}
AGGREGATES |= {"heavy_hitters"}
WITH_PARAMETER = {"quantile", "heavy_hitters"}
UNITS_MS = {  # a duration's unit, in milliseconds
    **dict.fromkeys(["ms", "millisecond", "milliseconds"], 1),
    **dict.fromkeys(["s", "sec", "secs", "second", "seconds"], 1000),
    **dict.fromkeys(["m", "min", "mins", "minute", "minutes"], 60_000),
    **dict.fromkeys(["h", "hour", "hours"], 3_600_000),
    **dict.fromkeys(["d", "day", "days"], 86_400_000),
}
NS_PER = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}  # timestamp[unit] of an attribute
WINDOW_WORDS = {"RANGE", "SLIDE", "SESSION", "WA", "PA", "RATTR", "SATTR", "EMIT"}
COMPARE = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"|(?P<name>row-num|[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*)"
    r"|(?P<symbol><=|>=|<>|!=|[=<>()\[\],*;+\-/%.]))"
)


class Unsupported(Exception):
    """What in a query the reference cannot evaluate (one line)."""


@dataclass(frozen=True)
class Condition:
    column: str
    op: str
    value: Any

    def holds(self, row: Row) -> bool:
        v = row[self.column]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return False  # a comparison with null is not true
        return bool(COMPARE[self.op](v, self.value))


@dataclass(frozen=True)
class Query:
    spec: Spec
    inputs: tuple[str, ...]  # the streams (or query results) of its UNION
    where: tuple[Condition, ...] = ()
    emit: bool = False  # EMIT EVERY: rows have ``final`` (the reference gives final rows only)
    late: str = "drop"


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int
    end: int


def tokens(sql: str) -> list[Token]:
    out, at = [], 0
    while at < len(sql):
        if not sql[at:].strip():
            break
        m = TOKEN.match(sql, at)
        if m is None or m.end() == at:
            raise Unsupported(f"cannot read the query at {sql[at : at + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append(Token(kind, m.group(kind), m.start(kind), m.end()))
        at = m.end()
    return out


# -- reading SQL -----------------------------------------------------------------------------------
@dataclass
class Parsed:
    columns: list[str] = field(default_factory=list)  # selected plain columns
    aggs: list[Agg] = field(default_factory=list)
    window: dict[str, Any] = field(default_factory=dict)
    emit: bool = False
    inputs: list[str] = field(default_factory=list)
    where: list[tuple[str, str, Any]] = field(default_factory=list)
    group_by: list[str] = field(default_factory=list)
    having: tuple[Agg, str, float] | None = None


class Reader:
    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.toks = tokens(sql)
        self.at = 0

    def peek(self, ahead: int = 0) -> Token | None:
        i = self.at + ahead
        return self.toks[i] if i < len(self.toks) else None

    def word(self, ahead: int = 0) -> str:
        tok = self.peek(ahead)
        return tok.text.upper() if tok is not None and tok.kind in ("name", "symbol") else ""

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise Unsupported("the query ends too soon")
        self.at += 1
        return tok

    def accept(self, *words: str) -> bool:
        if all(self.word(i) == w for i, w in enumerate(words)):
            self.at += len(words)
            return True
        return False

    def expect(self, word: str) -> None:
        if not self.accept(word):
            tok = self.peek()
            raise Unsupported(f"expected {word}, found {tok.text if tok else 'the end'!r}")

    def name(self) -> str:
        tok = self.take()
        if tok.kind != "name":
            raise Unsupported(f"expected a name, found {tok.text!r}")
        return tok.text

    def number(self) -> float:
        sign = -1 if self.accept("-") else 1
        tok = self.take()
        if tok.kind != "number":
            raise Unsupported(f"expected a number, found {tok.text!r}")
        value = float(tok.text)
        return sign * (int(value) if value.is_integer() and "." not in tok.text else value)

    def query(self) -> Parsed:
        out = Parsed()
        self.expect("SELECT")
        self.items(out)
        if self.word() == "[":
            self.window(out)
        self.emit_every(out)
        self.expect("FROM")
        out.inputs = self.union()
        if self.word() in ("[", ",", "JOIN", "AS", "INNER", "LEFT", "CROSS"):
            raise Unsupported("joins (a window after a stream in FROM, or two FROM items)")
        if self.accept("WHERE"):
            out.where.append(self.condition())
            while self.accept("AND"):
                out.where.append(self.condition())
        if self.accept("GROUP", "BY"):
            out.group_by.append(self.name())
            while self.accept(","):
                out.group_by.append(self.name())
        if self.accept("HAVING"):
            agg = self.aggregate()
            op = self.take().text
            if op not in (">", ">=", "<"):
                raise Unsupported(f"HAVING with {op!r} (the reference compares with >, >= or <)")
            out.having = (agg, op, self.number())
        self.emit_every(out)
        self.accept(";")
        if self.peek() is not None:
            raise Unsupported(f"{self.sql[self.peek().start :]!r}")  # type: ignore[union-attr]
        if not out.window:
            raise Unsupported("a query without a bracket window (whole stream; Spark's, Flink's spelling)")
        return out

    def items(self, out: Parsed) -> None:
        while True:
            if self.word(1) == "(":
                out.aggs.append(self.aggregate())
            else:
                column = self.name()
                if self.word() == "AS":
                    raise Unsupported(f"the column {column} renamed")
                if self.word() not in (",", "[", "FROM", "EMIT"):
                    raise Unsupported(f"the select item {column} {self.word()!r}... (an expression)")
                out.columns.append(column)
            if not self.accept(","):
                return

    def aggregate(self) -> Agg:
        first = self.take()
        func = first.text.lower()
        if func not in AGGREGATES:
            raise Unsupported(f"the function {first.text}")
        self.expect("(")
        if self.accept("*"):
            if func != "count":
                raise Unsupported(f"{func}(*)")
            column, func = None, "count*"
        else:
            if self.word() == "DISTINCT":
                raise Unsupported("count(DISTINCT ...)")
            column = self.name()
            if self.word() != "," and self.word() != ")":
                raise Unsupported(f"an aggregate of an expression ({first.text}({column} ...)")
        param = None
        if func in WITH_PARAMETER:
            self.expect(",")
            param = float(self.number())
        self.expect(")")
        last = self.toks[self.at - 1]
        if self.word() == "FILTER":
            raise Unsupported("FILTER (WHERE ...)")
        text = self.sql[first.start : last.end]
        name = self.name() if self.accept("AS") else text
        return Agg(func, column, name, param)

    def duration(self) -> tuple[float, int | None]:
        value = self.number()
        unit = self.word().lower()
        if unit in UNITS_MS:
            self.at += 1
            return value, UNITS_MS[unit]
        return value, None

    def window(self, out: Parsed) -> None:
        self.expect("[")
        w = out.window
        while True:
            if self.accept("RANGE"):
                if self.accept("ALL"):
                    w["range"] = "all"
                elif self.accept("TUMBLING"):
                    w["range"] = w["slide"] = self.duration()
                else:
                    size = self.duration()
                    w["range"] = ("rows", size[0]) if self.accept("ROWS") else size
            elif self.accept("SLIDE"):
                size = self.duration()
                w["slide"] = ("rows", size[0]) if self.accept("ROWS") else size
            elif self.accept("SESSION"):
                w["session"] = self.duration()
            elif self.accept("WA"):
                w["wa"] = self.name()
            elif self.accept("PA"):
                w["pa"] = [self.name()]
                while self.word() == "," and self.peek(1) is not None and self.word(1) not in WINDOW_WORDS:
                    self.at += 1
                    w["pa"].append(self.name())
            elif self.word() in ("RATTR", "SATTR"):
                raise Unsupported("slide-by-tuple windows (RATTR, SATTR)")
            elif self.word() == "EMIT":
                self.emit_every(out)
            else:
                tok = self.peek()
                raise Unsupported(f"the window item {tok.text if tok else 'end'!r}")
            if self.accept("]"):
                return
            self.expect(",")

    def emit_every(self, out: Parsed) -> None:
        if self.accept("EMIT"):
            self.expect("EVERY")
            self.duration()
            out.emit = True

    def union(self) -> list[str]:
        names = self.union_item()
        while self.accept("UNION"):
            if self.accept("ALL"):
                raise Unsupported("UNION ALL")
            names += self.union_item()
        return names

    def union_item(self) -> list[str]:
        if self.accept("("):
            if self.word() == "SELECT":
                raise Unsupported("a derived table")
            names = self.union()
            self.expect(")")
            return names
        if self.word() == "TABLE":
            raise Unsupported("a window table function")
        return [self.name()]

    def condition(self) -> tuple[str, str, Any]:
        if self.word() in ("NOT", "(") or self.word(1) == "(":
            raise Unsupported("a WHERE beyond a conjunction of comparisons of a column with a literal")
        column = self.name()
        op = self.take().text
        if op not in COMPARE:
            raise Unsupported(f"WHERE {column} {op} ...")
        tok = self.peek()
        if tok is not None and tok.kind == "string":
            self.at += 1
            value: Any = tok.text[1:-1].replace("''", "'")
        else:
            value = self.number()
        if self.word() == "OR":
            raise Unsupported("OR in WHERE")
        return column, op, value


def _length(size: Any, unit_ns: int | None, what: str) -> int:
    """A RANGE, SLIDE or gap in the attribute's units (``unit_ns``: one unit in ns; None for an
    integer attribute, whose durations take no unit)."""
    if isinstance(size, tuple) and size[0] == "rows":
        raise Unsupported(f"{what} in ROWS on a time attribute")
    value, unit_ms = size
    if unit_ms is None:
        out = value
    elif unit_ns is None:
        raise Unsupported(f"{what} with a unit on an attribute that is not a timestamp")
    else:
        out = value * unit_ms * 10**6 / unit_ns
    if out != int(out) or out <= 0:
        raise Unsupported(f"{what} of {out} units")
    return int(out)


def _rows(size: Any, what: str) -> int:
    if not (isinstance(size, tuple) and size[0] == "rows"):
        raise Unsupported(f"{what} that is not in ROWS on a tuple window")
    value = size[1]
    if value != int(value) or value <= 0:
        raise Unsupported(f"{what} of {value} rows")
    return int(value)


def read(sql: str, late: str, inputs: dict[str, Schema]) -> Query:
    """The query, or :class:`Unsupported`. ``inputs``: what each stream or query result it may read
    looks like."""
    if late not in ("drop", "error"):
        raise Unsupported(f"late={late!r} (revisions)")
    parsed = Reader(sql).query()
    for name in parsed.inputs:
        if name not in inputs:
            raise Unsupported(f"FROM {name}: not a stream the reference was told of")
    schemas = [inputs[name] for name in parsed.inputs]
    schema = schemas[0]
    if any(s.columns != schema.columns for s in schemas) or len({s.result_of is None for s in schemas}) > 1:
        raise Unsupported("a UNION of inputs with different columns")
    if any(s.generated for s in schemas):
        raise Unsupported("a stream with generated punctuation (ordered, bounded, heartbeat)")
    w = parsed.window
    if "wa" not in w:
        raise Unsupported("a window without WA")
    pa_cols = tuple(w.get("pa", ()))
    if w["wa"] == "row-num":
        if schema.result_of is not None:
            raise Unsupported("a tuple window over query results")
        if parsed.where:
            raise Unsupported("a tuple window with WHERE (which rows it numbers)")
        if "session" in w or w.get("range") == "all" or "range" not in w:
            raise Unsupported("a tuple window without RANGE n ROWS")
        size = _rows(w["range"], "RANGE")
        window = Window("rows", _rows(w.get("slide", w["range"]), "SLIDE"), size, "row-num", pa_cols)
        group_by = tuple(parsed.group_by)
    else:
        if w["wa"] != schema.progressing:
            raise Unsupported(f"WA {w['wa']}: not the progressing attribute {schema.progressing}")
        unit = schema.unit_ns()
        if "session" in w:
            if "range" in w or "slide" in w:
                raise Unsupported("a session window with RANGE or SLIDE")
            window = Window("session", 0, attribute=w["wa"], gap=_length(w["session"], unit, "SESSION"))
        elif w.get("range") == "all":
            if "slide" not in w:
                raise Unsupported("RANGE ALL without SLIDE")
            window = Window("landmark", _length(w["slide"], unit, "SLIDE"), attribute=w["wa"])
        elif "range" in w:
            size = _length(w["range"], unit, "RANGE")
            window = Window("sliding", _length(w.get("slide", w["range"]), unit, "SLIDE"), size, w["wa"])
        else:
            raise Unsupported("a window without RANGE or SESSION")
        group_by = tuple(parsed.group_by) + tuple(p for p in pa_cols if p not in parsed.group_by)
        if schema.result_of is not None and window.kind != "sliding":
            raise Unsupported(f"a {window.kind} window over query results")
    spec = Spec(window, group_by, tuple(parsed.aggs), parsed.having)
    if sorted(parsed.columns) != sorted(spec.keys):
        raise Unsupported(f"selected columns {parsed.columns} other than the group columns {list(spec.keys)}")
    names = [a.name for a in spec.aggs] + list(spec.keys)
    if len(set(names)) != len(names) or not spec.aggs:
        raise Unsupported("result columns named twice, or no aggregate")
    used = [*spec.keys, *(a.column for a in spec.aggs if a.column), *(c for c, _, _ in parsed.where)]
    if parsed.having is not None and parsed.having[0].column:
        used.append(parsed.having[0].column)
    for column in used:
        if column not in schema.columns:
            raise Unsupported(f"the column {column} (not a plain column of {parsed.inputs[0]})")
    where = []
    for column, op, value in parsed.where:
        kind = schema.columns[column]
        if not (isinstance(value, str) == (kind == "string") and not kind.startswith("timestamp")):
            raise Unsupported(f"WHERE {column} {op} {value!r} on a {kind} column")
        where.append(Condition(column, op, value))
    if late == "error" and where:
        raise Unsupported("late='error' with WHERE (whether a tuple the WHERE drops is late)")
    return Query(spec, tuple(parsed.inputs), tuple(where), parsed.emit, late)


# -- streams, sources, queries ---------------------------------------------------------------------
@dataclass
class Schema:
    columns: dict[str, str]  # name -> type (string, int32, int64, float64, bool, timestamp[ms], ...)
    progressing: str
    generated: bool = False
    result_of: str | None = None  # the query whose results these are
    units_ns: int | None = None  # a query result's window_end: the units of its query's window

    def unit_ns(self) -> int | None:
        if self.result_of is not None:
            return self.units_ns
        kind = self.columns[self.progressing]
        m = re.fullmatch(r"timestamp\[(s|ms|us|ns)\]", kind)
        return NS_PER[m.group(1)] if m else None


@dataclass
class Source:
    punctuation: int = NO_PROGRESS
    closed: bool = False
    idle: bool = False
    heard: float = 0.0


@dataclass
class Stream:
    schema: Schema
    idle_timeout: float | None
    sources: dict[str, Source]
    progress: int = NO_PROGRESS

    def advance(self) -> None:
        live = [s.punctuation for s in self.sources.values() if not s.idle]
        if live:
            self.progress = max(self.progress, min(live))


@dataclass
class Registered:
    name: str
    query: Query
    progress: int  # the minimum over its inputs' progress
    arrivals: list[tuple[Row, int]] = field(default_factory=list)  # a tuple and its progress then
    counted: list[Row] = field(default_factory=list)  # sessions: the tuples counted
    max_finite: int | None = None  # the largest finite progress (landmark windows)
    rows_seen: dict[tuple[Any, ...], int] = field(default_factory=dict)  # tuple windows, per partition
    punctuation: int | None = None  # sessions: the output punctuation, set as progress moves
    before: set[tuple[Any, ...]] = field(default_factory=set)  # a reader: result rows out before it
    late: list[Row] = field(default_factory=list)  # the tuples it could not count, each once


class World:
    """Streams and queries as the definitions have them; fed the calls of every source in the order
    they were applied (``now``: the time of the clock that judges idle sources)."""

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}
        self.queries: dict[str, Registered] = {}

    # streams and sources
    def create_stream(
        self,
        name: str,
        schema: dict[str, str],
        progressing: str,
        punctuation: str,
        sources: Sequence[str],
        idle_timeout: float | None,
        now: float,
    ) -> None:
        declared = {s: Source(heard=now) for s in sources}
        generated = punctuation != "explicit"
        self.streams[name] = Stream(Schema(dict(schema), progressing, generated), idle_timeout, declared)

    def _source(self, stream: str, source: str, now: float) -> Source:
        """The source speaks: an undeclared one counts from now, an idle one again."""
        s = self.streams[stream].sources.setdefault(source, Source(heard=now))
        s.heard, s.idle = now, False
        return s

    def tick(self, now: float) -> None:
        """Idle timeouts: a source silent for ``idle_timeout`` stops counting."""
        for stream in self.streams.values():
            if stream.idle_timeout is not None:
                for s in stream.sources.values():
                    s.idle = not s.closed and now - s.heard >= stream.idle_timeout
        self._moved()

    def punctuate(self, stream: str, source: str, value: int, now: float) -> None:
        s = self._source(stream, source, now)
        assert value >= s.punctuation, "a punctuation that goes back is refused, never applied"
        s.punctuation = value
        self._moved()

    def close(self, stream: str, source: str, now: float) -> None:
        s = self._source(stream, source, now)
        s.punctuation, s.closed = END_OF_STREAM, True
        self._moved()

    def _moved(self) -> None:
        for stream in self.streams.values():
            stream.advance()
        for q in self.queries.values():
            if self._fed(q):
                low = min(self.streams[i].progress for i in q.query.inputs)
                if low > q.progress:
                    self._advance(q, low)

    def _fed(self, q: Registered) -> bool:
        """Fed by streams (not a reader of query results)."""
        return self.streams[q.query.inputs[0]].schema.result_of is None

    # queries
    def read(self, sql: str, late: str) -> Query:
        return read(sql, late, {name: s.schema for name, s in self.streams.items()})

    def register(self, name: str, query: Query) -> None:
        inputs = [self.streams[i] for i in query.inputs]
        q = Registered(name, query, min(s.progress for s in inputs))
        self.queries[name] = q
        if inputs[0].schema.result_of is not None:
            q.before = set(canonical(self.output(inputs[0].schema.result_of)[0], self._keys(inputs[0])))
        else:
            self._advance(q, q.progress)
        spec = query.spec
        columns = {"window_start": "int64", "window_end": "int64", "revision": "int64"}
        first = inputs[0].schema.columns
        columns.update({k: first[k] for k in spec.keys})
        columns.update({a.name: "aggregate" for a in spec.aggs})
        if query.emit:
            columns["final"] = "bool"
        unit = None if spec.window.kind == "rows" else inputs[0].schema.unit_ns()
        self.streams[name] = Stream(Schema(columns, "window_end", result_of=name, units_ns=unit), None, {})

    def _keys(self, stream: Stream) -> list[str]:
        base = self.queries[stream.schema.result_of or ""]
        return list(base.query.spec.keys)

    def _advance(self, q: Registered, progress: int) -> None:
        q.progress = progress
        if NO_PROGRESS < progress < END_OF_STREAM:
            q.max_finite = progress if q.max_finite is None else max(q.max_finite, progress)
        window = q.query.spec.window
        if window.kind == "session" and progress > NO_PROGRESS:
            # The output punctuation moves only when progress does (docs/queries.md, "Session
            # windows": after p, p + 1, or the end of a session still open below it).
            q.punctuation = session_punctuation(q.query.spec, q.counted, progress, progress - window.gap + 1)

    def push(self, stream: str, source: str, tuples: Sequence[Row], now: float) -> None:
        """One batch, applied whole: every tuple judged against the progress before it."""
        self._source(stream, source, now)
        for q in self.queries.values():
            if stream not in q.query.inputs:
                continue
            spec = q.query.spec
            for row in tuples:
                if not all(c.holds(row) for c in q.query.where):
                    continue
                q.arrivals.append((row, q.progress))
                if spec.window.kind == "rows" and q.progress < END_OF_STREAM:
                    part = tuple(row[p] for p in spec.window.partition)
                    q.rows_seen[part] = q.rows_seen.get(part, 0) + 1
                if spec.window.kind == "session":
                    counts = self._session_counts(q, row, q.progress)
                    if counts:
                        q.counted.append(row)
                else:
                    counts = spec.window.kind == "rows" or not self._late(q, row)
                if not counts and q.progress < END_OF_STREAM:  # its end is a query's last item
                    q.late.append(row)

    def _session_counts(self, q: Registered, row: Row, progress: int) -> bool:
        if progress <= NO_PROGRESS or row[q.query.spec.window.attribute] >= progress:
            return True  # not behind: every session it could join is still open
        return session_counts(q.query.spec, [*((r, NO_PROGRESS) for r in q.counted), (row, progress)])[-1]

    def refusing(self, stream: str, tuples: Sequence[Row]) -> list[str]:
        """The queries under ``late='error'`` that refuse the batch: a tuple of it is late for
        them, or (sessions) behind the stream's punctuation at all (docs/late-data.md, "Policies":
        whether it touches an emitted session depends on state only the workers hold)."""
        behind = self.streams[stream].progress
        out = []
        for q in self.queries.values():
            if q.query.late != "error" or stream not in q.query.inputs:
                continue
            if q.query.spec.window.kind == "session":
                refused = any(r[q.query.spec.window.attribute] < behind for r in tuples)
            else:
                refused = any(self._late(q, r) for r in tuples)
            if refused:
                out.append(q.name)
        return out

    def _late(self, q: Registered, row: Row) -> bool:
        """Whether the query can no longer count ``row``: a window holding it was emitted."""
        window, p = q.query.spec.window, q.progress
        if p <= NO_PROGRESS:
            return False
        if window.kind == "rows":
            return p >= END_OF_STREAM
        t: int = row[window.attribute]
        if window.kind == "landmark":
            return (t // window.slide + 1) * window.slide <= p  # its first window, the earliest to end
        assert window.range is not None
        # The windows holding it, from the extent (w * slide <= t < w * slide + range).
        near = range((t - window.range) // window.slide - 1, t // window.slide + 2)
        spans = [(w * window.slide, w * window.slide + window.range) for w in near]
        return any(end <= p for start, end in spans if start <= t < end)

    def punctuation(self, name: str) -> int | None:
        """The output punctuation ``name`` owes so far (None: nothing promised yet)."""
        q = self.queries[name]
        window = q.query.spec.window
        if not self._fed(q):  # its progress is its input query's output punctuation
            base = self.punctuation(self.streams[q.query.inputs[0]].schema.result_of or "")
            return first_open_end(window, NO_PROGRESS if base is None else base, 0)
        if window.kind == "session":
            return q.punctuation
        return first_open_end(window, q.progress, sum(q.rows_seen.values()))

    def output(self, name: str) -> tuple[list[Row], int | None]:
        """The rows (revision 0) and the output punctuation ``name`` owes so far."""
        q = self.queries[name]
        spec, query = q.query.spec, q.query
        if not self._fed(q):  # reads a query's results: none is ever behind its punctuation
            base = self.streams[query.inputs[0]]
            rows, progress_or_none = self.output(base.schema.result_of or "")
            keys = self._keys(base)
            tuples = [r for k, r in canonical(rows, keys).items() if k not in q.before]
            tuples = [r for r in tuples if all(c.holds(r) for c in query.where)]
            progress = NO_PROGRESS if progress_or_none is None else progress_or_none
            return self._finish(q, evaluate(spec, tuples), progress, {}), self.punctuation(name)
        tuples = [row for row, _ in q.arrivals]
        if spec.window.kind == "rows":  # numbered as they come: none is behind a tuple window
            expected = evaluate(spec, [row for row, p in q.arrivals if p < END_OF_STREAM])
        elif spec.window.kind == "session":
            expected = evaluate(spec, q.counted)
        else:
            at = [p for _, p in q.arrivals]
            expected = evaluate(spec, tuples, q.max_finite, lambda i, start, end: end > at[i])
        return self._finish(q, expected, q.progress, q.rows_seen), self.punctuation(name)

    def late(self, name: str) -> list[Row]:
        """The tuples ``name`` could not count (a window holding it emitted when it came), each
        once: its side stream under ``late='drop'``."""
        q = self.queries[name]
        if not self._fed(q) or q.query.where or q.query.spec.window.kind == "rows" or q.query.late != "drop":
            raise Unsupported("the side stream of a reader of results, a WHERE, a tuple window, not 'drop'")
        return list(q.late)

    def _finish(
        self, q: Registered, expected: list[Row], progress: int, seen: dict[tuple[Any, ...], int]
    ) -> list[Row]:
        """The rows punctuation has covered, as a result has them (revision 0; EMIT: final)."""
        out = []
        for row in expected:
            if covered(q.query.spec, row, progress, seen):
                row = {**row, "revision": 0}
                if q.query.emit:
                    row["final"] = True
                out.append(row)
        return out
