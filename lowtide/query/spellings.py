"""The window syntax Spark and Flink users already write, as other spellings of the bracket form.

`desugar` rewrites a parsed query that windows with a Spark or Flink window function into the
query its bracket form gives: the same `WindowSpec` (whose text is that bracket form), the same
select list, FROM and GROUP BY. The planner cannot tell the two apart, so ``explain`` prints the
same graph and the query gives the same rows.

Spark (``window(col, size[, slide])``, ``session_window(col, gap)``, sizes as strings):

* ``GROUP BY window(ts, '10 seconds'), k``              -> ``[RANGE 10 seconds, WA ts]``
* ``GROUP BY window(ts, '10 seconds', '1 second'), k``  -> ``[RANGE 10 seconds, SLIDE 1 second, WA ts]``
* ``GROUP BY session_window(ts, '30 seconds'), k``      -> ``[SESSION 30 seconds, WA ts]``

Flink group windows (``HOP`` takes the slide first) and window table functions:

* ``GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE), k``       -> ``[RANGE 1 minute, WA ts]``
* ``GROUP BY HOP(ts, INTERVAL '1' SECOND, INTERVAL '10' SECOND)``
                                                        -> ``[RANGE 10 seconds, SLIDE 1 second, WA ts]``
* ``GROUP BY SESSION(ts, INTERVAL '30' SECOND), k``     -> ``[SESSION 30 seconds, WA ts]``
* ``FROM TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY window_start,
  window_end, k`` (``HOP(TABLE S, DESCRIPTOR(ts), slide, size)``, ``SESSION(..., gap)`` alike)
                                                        -> ``[RANGE 1 minute, WA ts] FROM S GROUP BY k``

A date grouped by, as Flink's unwindowed group aggregations write a day (Nexmark's q15-q17):

* ``GROUP BY DATE_FORMAT(ts, 'yyyy-MM-dd'), k``        -> ``[RANGE 1 day, WA ts]``, the select
  item ``DATE_FORMAT(ts, 'yyyy-MM-dd')`` read as ``DATE_FORMAT(window_start, 'yyyy-MM-dd')``; an
  hour or a minute alike (``'yyyy-MM-dd HH'``, ``'yyyy-MM-dd HH:mm'``). A pattern whose values
  name no one interval (``'HH:mm'`` recurs every day) is refused.

Sessions differ in one point, so their spec is the bracket form's with ``touching`` set: Spark's
and Flink's merge sessions that touch - a tuple exactly ``gap`` after the last one joins its
session (Flink's ``TimeWindow.intersects`` is ``start <= other.end && end >= other.start``, in
group windows and the SESSION window table alike; Spark merges while a session's start is ``<=``
the current end) - where the bracket form's starts a new one. ``explain`` shows it.

Every aggregate result begins with the columns ``window_start`` and ``window_end``. The select
items that name a window's bounds are therefore dropped from the select list: Spark's
``window.start``, ``window.end`` and ``window`` (both; ``session_window.*`` likewise), Flink's
``TUMBLE_START(...)`` / ``TUMBLE_END(...)`` (``HOP_*``, ``SESSION_*``) and the ``window_start`` /
``window_end`` columns of a window table. They may keep an alias only if it is the column's own
name; inside an expression (HAVING) they read that column. A variant the bracket form cannot
say (an alignment offset, two windows, CUMULATE, a size that is not a constant) raises
`UnsupportedQuery` naming the bracket form to write instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum
from typing import NoReturn

from lowtide.errors import UnsupportedQuery
from lowtide.query.ast import (
    DURATION_UNITS,
    UNIT_MS,
    Column,
    Duration,
    Expr,
    FromStream,
    FuncCall,
    Interval,
    Literal,
    QueryTree,
    SelectItem,
    TableArg,
    WindowBound,
    WindowSpec,
    rewrite,
    walk,
)
from lowtide.query.functions import MS_PER_DAY, date_pattern
from lowtide.query.topn import ranked_item

__all__ = ["WINDOW_FUNCTIONS", "WindowTable", "desugar", "interval_of", "window_table"]

# Interval units: lowtide's own and Spark's and Flink's, each as (factor, lowtide unit).
_INTERVAL_UNITS: dict[str, tuple[float, str]] = {
    **{word: (1.0, unit) for word, unit in DURATION_UNITS.items()},
    **dict.fromkeys(("us", "microsecond", "microseconds"), (0.001, "ms")),
    **dict.fromkeys(("week", "weeks"), (7.0, "day")),
}
_UNIT_WORDS = {"ms": "millisecond", "s": "second", "min": "minute", "h": "hour", "day": "day"}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_INTERVAL_PART = re.compile(rf"\s*({_NUMBER})\s*([a-z]+)\s*")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_SPARK = ("window", "session_window")
_FLINK = ("tumble", "hop", "session", "cumulate")
WINDOW_FUNCTIONS = frozenset((*_SPARK, *_FLINK))  # in GROUP BY: the query is windowed as they write it
_DATE = "date_format"  # in GROUP BY: a tumbling window of the interval its pattern names
_INTERVAL_UNIT = {MS_PER_DAY: "day", 3_600_000: "h", 60_000: "min", 1000: "s", 1: "ms"}
_AUXILIARY = tuple(f"{f}_{part}" for f in _FLINK[:3] for part in ("start", "end", "rowtime", "proctime"))


class Bound(Enum):
    """Which result column a select item that names a window's bounds stands for."""

    START = "window_start"
    END = "window_end"
    BOTH = "window_start and window_end"


@dataclass(frozen=True)
class _Windowing:
    """A window written as a function: its bracket form and how the query names its bounds.

    `call` is the GROUP BY item it replaces (None for a window table in FROM); `written` names it
    in messages, `place` is where it stands.
    """

    spec: WindowSpec
    call: FuncCall | None
    written: str
    place: str

    def bound(self, expr: Expr) -> Bound | None:
        """The bound ``expr`` names, if it names one (a mismatched TUMBLE_START raises)."""
        call = self.call
        if call is None:  # a window table: its columns window_start, window_end
            if isinstance(expr, Column) and expr.name.lower() in ("window_start", "window_end"):
                return Bound(expr.name.lower())
            return None
        if call.name in _SPARK:
            if expr == call:
                return Bound.BOTH
            if isinstance(expr, Column) and expr.qualifier is None and expr.name.lower() == call.name:
                return Bound.BOTH
            if isinstance(expr, Column) and (expr.qualifier or "").lower() == call.name:
                return {"start": Bound.START, "end": Bound.END}.get(expr.name.lower())
            return None
        if isinstance(expr, FuncCall) and expr.name in (f"{call.name}_start", f"{call.name}_end"):
            if [_same(a) for a in expr.args] != [_same(a) for a in call.args]:
                raise UnsupportedQuery(
                    f"{expr.name.upper()}() takes the arguments of GROUP BY {self.written}, the same ones"
                )
            return Bound.START if expr.name.endswith("_start") else Bound.END
        return None


def _same(arg: Expr) -> object:
    """What makes two arguments the same: an interval's length, however it is written."""
    return arg.duration.amount * UNIT_MS[arg.duration.unit or "ms"] if isinstance(arg, Interval) else arg


@dataclass(frozen=True)
class WindowTable:
    """A Flink window table function in FROM: the stream it reads and the window it puts on it."""

    stream: str
    windowing: _Windowing


# ---- intervals -----------------------------------------------------------------------------------


def interval_of(amount: str, unit: str | None) -> Duration:
    """``INTERVAL '<amount>' <unit>`` as a duration; without a unit, `amount` is a Spark interval
    string (``'10 seconds'``, ``'1 hour 30 minutes'``). Raises ValueError with a one-line reason."""
    if unit is None:
        return _interval_string(amount)
    if not re.fullmatch(_NUMBER, amount.strip()):
        raise ValueError(f"INTERVAL {_quote(amount)} {unit}: the amount must be a number")
    return _scaled([(float(amount), unit)], f"{amount} {unit}")


def _interval_string(text: str) -> Duration:
    """A Spark interval string: ``[interval] n unit [n unit ...]``, units of a fixed length."""
    body = text.strip().lower()
    body = body[len("interval") :] if body.startswith("interval") else body
    parts, end = [], 0
    for match in _INTERVAL_PART.finditer(body):
        if match.start() != end:
            break
        parts.append((float(match.group(1)), match.group(2)))
        end = match.end()
    if not parts or end != len(body):
        raise ValueError(f"{_quote(text)} is not an interval such as '10 seconds' or '1 minute'")
    return _scaled(parts, text)


def _scaled(parts: list[tuple[float, str]], text: str) -> Duration:
    """The sum of ``(amount, unit)`` parts, in the smallest of their units."""
    units = []
    for _, word in parts:
        if word.lower() not in _INTERVAL_UNITS:
            fixed = (
                "months and years have no fixed length; "
                if word.lower().startswith(("month", "year"))
                else ""
            )
            raise ValueError(f"interval {_quote(text)}: {fixed}units are ms, s, min, h, day, week")
        units.append(_INTERVAL_UNITS[word.lower()])
    smallest = min((unit for _, unit in units), key=UNIT_MS.__getitem__)
    total = sum(
        amount * factor * UNIT_MS[unit] for (amount, _), (factor, unit) in zip(parts, units, strict=True)
    )
    amount = total / UNIT_MS[smallest]
    return Duration(float(round(amount)) if abs(amount - round(amount)) < 1e-9 else amount, smallest)


# ---- the bracket form ----------------------------------------------------------------------------


def _duration_text(duration: Duration) -> str:
    amount = duration.amount
    number = str(int(amount)) if amount.is_integer() else repr(amount)
    if duration.unit is None:
        return number
    return f"{number} {_UNIT_WORDS[duration.unit]}{'' if amount == 1 else 's'}"


def _bracket(
    time: Column, range_: Duration | None, slide: Duration | None, session: Duration | None
) -> WindowSpec:
    """The window spec the bracket form ``[RANGE r[, SLIDE s], WA ts]`` or ``[SESSION g, WA ts]``
    parses into, its text included; a session's is ``touching`` besides (module docstring)."""
    params = [f"SESSION {_duration_text(session)}"] if session is not None else []
    if range_ is not None:
        params.append(f"RANGE {_duration_text(range_)}")
    if slide is not None:
        params.append(f"SLIDE {_duration_text(slide)}")
    params.append(f"WA {_column_text(time)}")
    text = "[" + ", ".join(params) + "]"
    return WindowSpec(
        range=range_, slide=slide, wa=time, session=session, text=text, touching=session is not None
    )


def _column_text(column: Column) -> str:
    names = [column.name] if column.qualifier is None else [column.qualifier, column.name]
    return ".".join(n if _PLAIN_NAME.fullmatch(n) else '"' + n.replace('"', '""') + '"' for n in names)


def _write(spec: WindowSpec) -> str:
    return f"write {spec.text} after the select list"


# ---- window functions ----------------------------------------------------------------------------


def _group_window(call: FuncCall) -> _Windowing:
    """The window of a Spark or Flink window function written in GROUP BY."""
    name, args = call.name, call.args
    if name == "window":
        _arity(call, 2, 4, "window(timeColumn, windowDuration[, slideDuration[, startTime]])")
        time = _time_column(call, args[0])
        size = _constant(call, args[1], "windowDuration", "[RANGE d, WA ts]")
        slide = (
            _constant(call, args[2], "slideDuration", "[RANGE d, SLIDE s, WA ts]") if len(args) > 2 else None
        )
        spec = _bracket(time, size, slide, None)
        if len(args) == 4:
            _no_offset(call, args[3], "startTime", spec)
    elif name == "session_window":
        _arity(call, 2, 2, "session_window(timeColumn, gapDuration)")
        gap = _constant(call, args[1], "gapDuration", "[SESSION g, WA ts]")
        spec = _bracket(_time_column(call, args[0]), None, None, gap)
    elif name == "tumble":
        _arity(call, 2, 3, "TUMBLE(time_attr, size)")
        spec = _bracket(
            _time_column(call, args[0]), _constant(call, args[1], "size", "[RANGE d, WA ts]"), None, None
        )
        if len(args) == 3:
            _no_offset(call, args[2], "alignment time", spec)
    elif name == "hop":
        _arity(call, 3, 4, "HOP(time_attr, slide, size)")
        slide = _constant(call, args[1], "slide", "[RANGE d, SLIDE s, WA ts]")
        size = _constant(call, args[2], "size", "[RANGE d, SLIDE s, WA ts]")
        spec = _bracket(_time_column(call, args[0]), size, slide, None)
        if len(args) == 4:
            _no_offset(call, args[3], "alignment time", spec)
    elif name == "session":
        _arity(call, 2, 2, "SESSION(time_attr, gap)")
        gap = _constant(call, args[1], "gap", "[SESSION g, WA ts]")
        spec = _bracket(_time_column(call, args[0]), None, None, gap)
    elif name == _DATE:
        spec = _date_window(call)
    else:
        _arity(call, 3, 3, "CUMULATE(time_attr, step, size)")
        _cumulate(call, _time_column(call, args[0]), args[1], args[2])
    return _Windowing(spec, call, _written(call), "in GROUP BY")


def _date_window(call: FuncCall) -> WindowSpec:
    """``GROUP BY DATE_FORMAT(ts, 'yyyy-MM-dd')``: a tumbling window of the interval each value
    of the pattern names (a day here), refused where a value names no one interval."""
    _arity(call, 2, 2, "DATE_FORMAT(ts, 'yyyy-MM-dd')")
    time = _time_column(call, call.args[0])
    pattern = date_pattern(call)
    interval = pattern.interval()
    if isinstance(interval, str):
        written = f"DATE_FORMAT({time.text}, {_quote(pattern.text)})"
        raise UnsupportedQuery(f"GROUP BY {written} is no window: {interval}")
    return _bracket(time, Duration(1.0, _INTERVAL_UNIT[interval]), None, None)


def _formatted_start(
    select: tuple[SelectItem, ...], having: Expr | None, call: FuncCall
) -> tuple[tuple[SelectItem, ...], Expr | None]:
    """The select list and HAVING with ``DATE_FORMAT(ts, p)`` of GROUP BY read as the window's:
    ``DATE_FORMAT(window_start, p)`` (a tuple's value is its window's start, formatted)."""
    start = FuncCall(_DATE, (Column("window_start"), *call.args[1:]))

    def formatted(sub: Expr) -> Expr | None:
        return start if sub == call else None

    items = tuple(replace(item, expr=rewrite(item.expr, formatted)) for item in select)
    return items, None if having is None else rewrite(having, formatted)


def window_table(function: Expr) -> WindowTable:
    """The window of ``TABLE(<function>)`` in FROM: TUMBLE, HOP or SESSION over ``TABLE S``."""
    usage = "TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE))"
    if not isinstance(function, FuncCall) or function.name not in _FLINK:
        raise UnsupportedQuery(f"TABLE() in FROM takes a window function (TUMBLE, HOP, SESSION): {usage}")
    name, args = function.name, function.args
    shapes = {
        "tumble": "TUMBLE(TABLE S, DESCRIPTOR(ts), size)",
        "hop": "HOP(TABLE S, DESCRIPTOR(ts), slide, size)",
        "session": "SESSION(TABLE S, DESCRIPTOR(ts), gap)",
        "cumulate": "CUMULATE(TABLE S, DESCRIPTOR(ts), step, size)",
    }
    least = {"tumble": 3, "hop": 4, "session": 3, "cumulate": 4}[name]
    _arity(function, least, least + (name != "session"), shapes[name])
    if not isinstance(args[0], TableArg):
        raise UnsupportedQuery(f"the first argument of {name.upper()}() is the input, TABLE S: {usage}")
    descriptor = args[1]
    if not (
        isinstance(descriptor, FuncCall) and descriptor.name == "descriptor" and len(descriptor.args) == 1
    ):
        raise UnsupportedQuery(f"the second argument of {name.upper()}() is DESCRIPTOR(ts): {usage}")
    time = _time_column(function, descriptor.args[0])
    if name == "cumulate":
        _cumulate(function, time, args[2], args[3])
    if name == "tumble":
        spec = _bracket(time, _constant(function, args[2], "size", "[RANGE d, WA ts]"), None, None)
    elif name == "hop":
        slide = _constant(function, args[2], "slide", "[RANGE d, SLIDE s, WA ts]")
        spec = _bracket(time, _constant(function, args[3], "size", "[RANGE d, SLIDE s, WA ts]"), slide, None)
    else:
        spec = _bracket(time, None, None, _constant(function, args[2], "gap", "[SESSION g, WA ts]"))
    if len(args) > least:
        _no_offset(function, args[least], "offset", spec)
    return WindowTable(args[0].name, _Windowing(spec, None, f"TABLE({name.upper()}(...))", "in FROM"))


def _cumulate(call: FuncCall, time: Column, step_arg: Expr, size_arg: Expr) -> NoReturn:
    """Refuse CUMULATE, naming the nearest bracket form."""
    step = _constant(call, step_arg, "step", "[RANGE ALL, SLIDE s, WA ts]")
    size = _constant(call, size_arg, "size", "[RANGE ALL, SLIDE s, WA ts]")
    landmark = f"[RANGE ALL, SLIDE {_duration_text(step)}, WA {_column_text(time)}]"
    raise UnsupportedQuery(
        f"lowtide has no cumulating window (CUMULATE): the nearest, the landmark window {landmark}, "
        f"grows by {_duration_text(step)} like it but never restarts every {_duration_text(size)}"
    )


def _written(call: FuncCall) -> str:
    return f"{call.name}(...)" if call.name in _SPARK else f"{call.name.upper()}(...)"


def _arity(call: FuncCall, least: int, most: int, usage: str) -> None:
    if not least <= len(call.args) <= most:
        raise UnsupportedQuery(
            f"{_written(call)} takes {least}{'' if least == most else f' to {most}'} arguments: {usage}"
        )


def _time_column(call: FuncCall, arg: Expr) -> Column:
    if not isinstance(arg, Column):
        raise UnsupportedQuery(
            f"{_written(call)} windows on a column, the stream's progressing attribute, not {_shown(arg)}"
        )
    return arg


def _constant(call: FuncCall, arg: Expr, what: str, example: str) -> Duration:
    """A size, slide or gap argument: an interval string or INTERVAL literal."""
    if isinstance(arg, Interval):
        return arg.duration
    if isinstance(arg, Literal) and isinstance(arg.value, str):
        try:
            return _interval_string(arg.value)
        except ValueError as exc:
            raise UnsupportedQuery(f"the {what} of {_written(call)}: {exc}") from None
    raise UnsupportedQuery(
        f"the {what} of {_written(call)} must be a constant interval such as '10 seconds', "
        f"not {_shown(arg)}: lowtide's windows have one size, written in brackets as {example}"
    )


def _no_offset(call: FuncCall, arg: Expr, what: str, spec: WindowSpec) -> None:
    """An alignment offset is fine if it is 0: lowtide aligns windows to 0, as both do by default."""
    try:
        offset = _constant(call, arg, what, spec.text)
    except UnsupportedQuery:
        offset = None
    if offset is None or offset.amount != 0:
        raise UnsupportedQuery(
            f"the {what} of {_written(call)} has no bracket form: lowtide's windows start at multiples "
            f"of their slide from 0; without it, {_write(spec)}"
        )


# ---- the rewrite ---------------------------------------------------------------------------------


def desugar(query: QueryTree, table: WindowTable | None = None) -> QueryTree:
    """``query`` with its Spark or Flink window as a bracket window (see the module docstring)."""
    calls = [g for g in query.group_by if isinstance(g, FuncCall) and g.name in (*_SPARK, *_FLINK, _DATE)]
    if table is None and not calls:
        _refuse_strays(query)
        return query
    windowing = table.windowing if table is not None else _group_window(calls[0])
    spec = windowing.spec
    if table is not None and calls:
        raise UnsupportedQuery(
            f"{windowing.written} in FROM windows the query already: drop {_written(calls[0])} from GROUP BY"
        )
    if len(calls) > 1:
        others = _group_window(calls[1]).spec.text
        raise UnsupportedQuery(
            f"GROUP BY has two windows, {spec.text} and {others}: a query has one; "
            f"{_write(spec)} and drop both from GROUP BY"
        )
    if query.window is not None:
        emit = query.window.emit_every
        mixed = spec.text if emit is None else f"{spec.text[:-1]}, EMIT EVERY {_duration_text(emit)}]"
        raise UnsupportedQuery(
            f"the query has two windows, {query.window.text} and {windowing.written} {windowing.place}: "
            f"keep one, e.g. write {mixed} after the select list without {windowing.written}"
        )
    if table is not None:
        item = query.from_[0]
        if (
            len(query.from_) != 1
            or not isinstance(item, FromStream)
            or item.name != table.stream
            or item.window
        ):
            raise UnsupportedQuery(
                f"a window table function must be all of FROM: {_write(spec)}, FROM {table.stream}"
            )
        if not query.group_by and ranked_item(query) is not None:  # a rank anywhere is checked
            return _ranked(query, windowing)
    select = _select(query.select, windowing)
    group_by = _group_by(query.group_by, windowing)
    _refuse_bounds(query.where, windowing, "WHERE: rows have no window before grouping")
    having = None if query.having is None else _read_bounds(query.having, windowing)
    if windowing.call is not None and windowing.call.name == _DATE:
        select, having = _formatted_start(select, having, windowing.call)
    desugared = replace(query, select=select, window=spec, group_by=group_by, having=having)
    _refuse_strays(desugared)
    return desugared


def _ranked(query: QueryTree, windowing: _Windowing) -> QueryTree:
    """The rows of a TUMBLE window table ranked (a Window Top-N, `lowtide.query.topn`): each row
    has one window, so the query keeps its select list (``window_start`` and ``window_end`` are
    columns its rows gain) and is windowed by the bracket form. A row of HOP is in several
    windows and SESSION's windows are known only when they close: both are refused."""
    spec = windowing.spec
    if spec.slide is not None or spec.session is not None:
        raise UnsupportedQuery(
            f"a Window Top-N ranks the rows of TABLE(TUMBLE(...)), not of {windowing.written}: aggregate "
            "per window (GROUP BY window_start, window_end) and rank the result in an outer query"
        )
    _refuse_bounds(query.where, windowing, "WHERE: rank first, then filter in an outer query")
    ranked = replace(query, window=spec)
    _refuse_strays(ranked)
    return ranked


def _select(items: tuple[SelectItem, ...], windowing: _Windowing) -> tuple[SelectItem, ...]:
    """The select list without the items naming the window's bounds (the result has them); a
    bound under another name (``window_start AS starttime``) is kept as a copy of it, so that an
    outer query reads it by that name."""
    kept = []
    for item in items:
        bound = windowing.bound(item.expr)
        if bound is None:
            kept.append(replace(item, expr=_read_bounds(item.expr, windowing)))
            continue
        if item.alias is None or item.alias == bound.value:
            continue
        if bound is Bound.BOTH:
            raise UnsupportedQuery(
                f"{item.text} is two columns, window_start and window_end: select {item.text}.start "
                f"AS ... and {item.text}.end AS ..."
            )
        kept.append(replace(item, expr=WindowBound(bound.value)))
    if not any(not isinstance(item.expr, WindowBound) for item in kept):
        raise UnsupportedQuery(
            "select a group column or an aggregate too, e.g. count(*): the window's bounds are "
            f"always the result's first columns; {_write(windowing.spec)}"
        )
    return tuple(kept)


def _group_by(group_by: tuple[Expr, ...], windowing: _Windowing) -> tuple[Expr, ...]:
    """GROUP BY without the window: its call, or a window table's window_start and window_end."""
    if windowing.call is not None:
        kept = tuple(g for g in group_by if g != windowing.call)
    else:
        bounds = {windowing.bound(g) for g in group_by} - {None}
        if bounds != {Bound.START, Bound.END}:
            raise UnsupportedQuery(
                f"{windowing.written} needs GROUP BY window_start, window_end: its rows are "
                "aggregated per window (lowtide has no window table without an aggregate)"
            )
        kept = tuple(g for g in group_by if windowing.bound(g) is None)
    for g in kept:
        _refuse_bounds(g, windowing, "GROUP BY: the window groups the rows already")
    return kept


def _refuse_bounds(expr: Expr | None, windowing: _Windowing, where: str) -> None:
    for sub in walk(expr):
        if windowing.bound(sub) is not None:
            raise UnsupportedQuery(f"{_shown(sub)} cannot be in {where}")


def _read_bounds(expr: Expr, windowing: _Windowing) -> Expr:
    """``expr`` with each window bound it names as the result column it stands for."""

    def bound_column(sub: Expr) -> Expr | None:
        bound = windowing.bound(sub)
        if bound is Bound.BOTH:
            raise UnsupportedQuery(f"{_shown(sub)} is two columns, window_start and window_end: name one")
        return None if bound is None else Column(bound.value)

    return rewrite(expr, bound_column)


def _refuse_strays(query: QueryTree) -> None:
    """Refuse what only a window function may take, and window functions away from GROUP BY."""
    exprs = [item.expr for item in query.select] + [query.where, *query.group_by, query.having]
    for expr in exprs:
        for sub in walk(expr):
            reason = _stray(sub)
            if reason is not None:
                raise UnsupportedQuery(reason)


def _stray(expr: Expr) -> str | None:
    if isinstance(expr, TableArg):
        return f"TABLE {expr.name} is an argument of a window table function in FROM only"
    if isinstance(expr, Column) and expr.qualifier is None and expr.name.lower() == "window_time":
        return "window_time is not a lowtide column: a window's rows carry window_start and window_end"
    if not isinstance(expr, FuncCall):
        return None
    name = expr.name
    if name == "descriptor":
        return "DESCRIPTOR() is an argument of a window table function in FROM only"
    if name in (*_SPARK, *_FLINK):
        try:
            spec = _group_window(expr).spec
        except UnsupportedQuery as exc:
            return str(exc)
        return f"{_written(expr)} goes in GROUP BY: GROUP BY {_written(expr)}, ..., or {_write(spec)}"
    if name in _AUXILIARY:
        window, part = name.rsplit("_", 1)
        if part == "rowtime":
            return (
                f"{name.upper()}() is not a lowtide column: select {window.upper()}_END(...), the window_end"
            )
        if part == "proctime":
            return f"{name.upper()}() is not supported: lowtide windows on event time only"
        return f"{name.upper()}() needs GROUP BY {window.upper()}(...) with the same arguments"
    return None


# ---- expression walks ----------------------------------------------------------------------------


def _shown(expr: Expr) -> str:
    """``expr`` as a short text for a message."""
    if isinstance(expr, Column):
        return expr.text
    if isinstance(expr, Literal):
        return _quote(expr.value) if isinstance(expr.value, str) else str(expr.value)
    if isinstance(expr, Interval):
        return f"INTERVAL '{_duration_text(expr.duration)}'"
    if isinstance(expr, FuncCall):
        return f"{expr.name}({', '.join(_shown(a) for a in expr.args)})"
    return "an expression"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
