"""What each ``lowtide`` command does (the parser lives in :mod:`lowtide.clients.cli`).

Commands raise :class:`~lowtide.errors.LowtideError` for every failure; ``cli.main`` prints it as
one line. Listings go to stdout (a table, or JSON with ``--format json``); so do query names,
plans, results and the low watermark ``source punctuate`` and ``source close`` leave. Progress
and summaries of ``send`` and ``nexmark`` go to stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lowtide.clients.cli.text_table import format_table
from lowtide.errors import DeadlineExceeded, InvalidArgument, SchemaMismatch
from lowtide.names import unknown
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation

if TYPE_CHECKING:
    import pyarrow as pa

    from lowtide.clients.cli.batch_ids import BatchIds
    from lowtide.clients.cli.io import Batches
    from lowtide.schema import Schema


def run_command(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)
    from lowtide.clients import Client
    from lowtide.clients._wire import deadline_reason

    with Client(args.server, timeout=args.timeout, root_certificates=args.tls_ca, token=args.token) as client:
        handler = _HANDLERS[(args.command, getattr(args, "action", None))]
        try:
            handler(client, args)
        except DeadlineExceeded as exc:
            # Only control calls have a deadline here (producers and subscriptions have none).
            if str(exc) != deadline_reason(client.target, args.timeout):
                raise  # the server's own DEADLINE_EXCEEDED, with its reason
            raise DeadlineExceeded(deadline_reason(client.target, args.timeout, "--timeout")) from None
    return 0


def _serve(args: argparse.Namespace) -> int:
    """The clients' one way into the server package (tests/unit/test_layers.py holds it to this):
    the server's own entry reads the ``serve`` options. Imported here, so that every other
    command starts without the server."""
    from lowtide.server.serve import main

    return main(args)


def _sql(text: str) -> str:
    return sys.stdin.read() if text == "-" else text


# -- streams and queries ----------------------------------------------------------------------------
def _stream_create(client: Any, args: argparse.Namespace) -> None:
    client.create_stream(
        args.name,
        args.schema,
        progressing=args.progressing,
        punctuation=args.punctuation,
        sources=args.sources,
        idle_timeout=args.idle_timeout,
    )


def _stream_drop(client: Any, args: argparse.Namespace) -> None:
    client.drop_stream(args.name)


def _watermark(value: int) -> str:
    """A low watermark for people: blank before any progress, "end" once every source closed."""
    if value <= NO_PROGRESS:
        return ""
    return "end" if value >= END_OF_STREAM else str(value)


def _stream_list(client: Any, args: argparse.Namespace) -> None:
    header = ["name", "schema", "progressing", "punctuation", "sources", "low_watermark", "tuples", "late"]
    _print_listing(
        args,
        client.list_streams(),
        header,
        lambda s: [
            s["name"],
            ",".join(f"{c}:{t}" for c, t in s["schema"].items()),
            s["progressing"],
            s["punctuation"],
            ",".join(s["sources"]),
            _watermark(s["low_watermark"]),
            str(s["tuples_ingested"]),
            str(s["late_tuples"]),
        ],
    )


# -- sources --------------------------------------------------------------------------------------
def _stream(client: Any, name: str) -> dict[str, Any]:
    """The stream ``name`` as ``list_streams()`` gives it; NotFound naming the streams there are."""
    streams: list[dict[str, Any]] = client.list_streams()
    info = next((s for s in streams if s["name"] == name), None)
    if info is None:
        raise unknown("stream", name, (s["name"] for s in streams))
    return info


def _source_list(client: Any, args: argparse.Namespace) -> None:
    """Each source: declared or seen since, its punctuation, whether it holds the stream back."""
    info = _stream(client, args.stream)
    iso = args.time_format == "iso" or (args.time_format is None and args.format == "table")
    unit = _time_unit_of(info) if iso else None
    held = _holding_back(info)
    declared = info["declared"]
    sources = [
        {
            "source": name,
            "declared": name in declared,
            "punctuation": _source_punctuation(info["source_punctuation"][name], unit),
            "holds_back": name in held,
        }
        for name in [*declared, *sorted(set(info["sources"]) - set(declared))]
    ]
    low = info["low_watermark"]
    if args.format == "json":
        shown = None if low <= NO_PROGRESS else "end" if low >= END_OF_STREAM else _point(low, unit)
        print(json.dumps({"stream": args.stream, "low_watermark": shown, "sources": sources}, indent=2))
        return
    rows = [
        [
            s["source"],
            "yes" if s["declared"] else "no",
            "none" if s["punctuation"] is None else str(s["punctuation"]),
            "yes" if s["holds_back"] else "",
        ]
        for s in sources
    ]
    print(format_table(["source", "declared", "punctuation", "holds_back"], rows))
    print(f"low watermark: {_low_watermark(low, unit)}")


def _source_punctuate(client: Any, args: argparse.Namespace) -> None:
    info = _stream(client, args.stream)
    value = _punctuation_value(args.value, info, "punctuation")
    _warn_undeclared(args.source, info)
    # Through a producer, as send --punctuation: the token's scope applies, the source's
    # punctuation on the server is checked (a regressing value is refused, nothing sent).
    with client.producer(args.stream, source=args.source) as producer:
        producer.punctuate(value)
    done = f"punctuated at {_point(value, _time_unit_of(info))}"
    _say_progress(client, info, args.source, done, producer.result.low_watermark)


def _source_close(client: Any, args: argparse.Namespace) -> None:
    info = _stream(client, args.stream)
    known = info["source_punctuation"]
    if args.source not in known:  # the server refuses it too: here with the names to choose from
        missing = unknown("source", args.source, known)
        raise type(missing)(f"stream {args.stream!r}: {missing}")
    was = "was closed already" if known[args.source] >= END_OF_STREAM else "closed"
    with client.producer(args.stream, source=args.source) as producer:
        result = producer.close()  # closing a closed source does nothing
    _say_progress(client, info, args.source, was, result.low_watermark)


def _say_progress(client: Any, info: dict[str, Any], source: str, done: str, low: int) -> None:
    """One line: what was done to ``source``, the stream's low watermark ``low`` after it and,
    before the end, the sources holding it back (listed again: others may have moved since)."""
    name, mark = info["name"], _low_watermark(low, _time_unit_of(info))
    line = f"source {source!r} of stream {name!r} {done}: low watermark {mark}"
    held = sorted(_holding_back(_stream(client, name))) if low < END_OF_STREAM else []
    print(f"{line}, held back by {', '.join(held)}" if held else line)


def _time_unit_of(info: dict[str, Any]) -> str | None:
    """The unit of a timestamp progressing attribute (its values shown as ISO 8601), else None."""
    from lowtide.clients.cli.timestamps import timestamp_unit

    return timestamp_unit(info["schema"][info["progressing"]])


def _point(value: int, unit: str | None) -> str | int:
    """A punctuation value: ISO 8601 in ``unit`` (as ``tail`` shows times), without one the integer."""
    from lowtide.clients.cli.timestamps import time_text

    return value if unit is None else time_text(value, unit)


def _source_punctuation(value: int, unit: str | None) -> str | int | None:
    """A source's punctuation: None before its first, "closed" once it closed, else the value."""
    if value <= NO_PROGRESS:
        return None
    return "closed" if value >= END_OF_STREAM else _point(value, unit)


def _low_watermark(value: int, unit: str | None) -> str:
    """A stream's low watermark in a line: none (no progress yet), end, or the value."""
    if value <= NO_PROGRESS:
        return "none"
    return "end" if value >= END_OF_STREAM else str(_point(value, unit))


def _holding_back(info: dict[str, Any]) -> set[str]:
    """The open sources of lowest punctuation: the stream's low watermark moves once they
    punctuate past it (an idle source does not count, but ListStreams does not say which are)."""
    open_sources = {s: p for s, p in info["source_punctuation"].items() if p < END_OF_STREAM}
    lowest = min(open_sources.values(), default=None)
    return {s for s, p in open_sources.items() if p == lowest}


def _query_register(client: Any, args: argparse.Namespace) -> None:
    lateness: str | int | None = args.allowed_lateness
    if lateness is not None and args.late != "update":
        # The server plans allowed lateness under late='update' only, and ignores it otherwise.
        fate = "dropped (into <query>.late)" if args.late == "drop" else "refused with their batch"
        raise InvalidArgument(
            f"--allowed-lateness needs --late update (under --late {args.late} no window is kept past "
            f"its punctuation: late tuples are {fate}); add --late update, or leave --allowed-lateness out"
        )
    print(client.register_query(_sql(args.sql), name=args.name, late=args.late, allowed_lateness=lateness))


# A query or stream name (lowtide.names): one word, never a query's text.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


def _query_explain(client: Any, args: argparse.Namespace) -> None:
    """The plan of a query's text, or of a registered query's text given its name."""
    text = _sql(args.sql)
    name = text.strip()
    if _NAME.fullmatch(name):
        queries = client.list_queries()
        query = next((q for q in queries if q["name"] == name), None)
        if query is None:
            missing = unknown("query", name, (q["name"] for q in queries))
            raise type(missing)(f"{missing}; explain takes a query's text, or a registered query's name")
        text = query["sql"]
    print(client.explain(text))


def _query_drop(client: Any, args: argparse.Namespace) -> None:
    client.drop_query(args.name)


def _query_list(client: Any, args: argparse.Namespace) -> None:
    _print_listing(
        args,
        client.list_queries(),
        ["name", "status", "late", "columns", "results", "late_tuples", "low_watermark", "sql"],
        lambda q: [
            q["name"],
            f"{q['status']}: {q['status_reason']}" if q["status_reason"] else q["status"],
            q["late"],
            ",".join(q["columns"]),
            str(q["results"]),
            str(q["late_tuples"]),
            _watermark(q["low_watermark"]),
            " ".join(q["sql"].split()),
        ],
    )


def _workers(client: Any, args: argparse.Namespace) -> None:
    _print_listing(
        args,
        client.list_workers(),
        ["index", "node", "pid", "restarts", "state_bytes", "queries", "status"],
        lambda w: [
            str(w["index"]),
            w["node"],
            str(w["pid"]),
            str(w["restarts"]),
            str(w["state_bytes"]),
            ",".join(w["queries"]),
            w["status"],
        ],
    )


def _print_listing(
    args: argparse.Namespace,
    items: list[dict[str, Any]],
    header: list[str],
    row: Callable[[dict[str, Any]], list[str]],
) -> None:
    """A list command's output: the items as JSON (``--format json``), else a table, a row each."""
    if args.format == "json":
        print(json.dumps(items, indent=2))
        return
    print(format_table(header, [row(item) for item in items]))


# -- data -------------------------------------------------------------------------------------------
def _send(client: Any, args: argparse.Namespace) -> None:
    from lowtide.clients.cli.io import LazyProgress, read_batches
    from lowtide.schema import Schema

    info = _stream(client, args.stream)
    schema = info["schema"]
    punctuation: str | int = args.punctuation
    if punctuation not in ("none", "end"):  # a bad one stops the send before any row goes
        punctuation = _punctuation_value(punctuation, info)
    source = _source_sending(args.source, info)
    batches = read_batches(args.file, schema, args.batch_rows, args.format, header=not args.no_header)
    ids = _batch_ids(args, batches)
    behind = _check_file(batches, Schema.of(schema, info["progressing"]), info["low_watermark"])
    with (
        LazyProgress(f"sending {args.file}", batches.total, batches.unit) as progress,
        client.producer(args.stream, source=source, max_batch_rows=args.batch_rows) as producer,
    ):
        for index, batch in enumerate(batches):
            producer.send(batch, batch_id=ids(index))
            progress.update(batches.done)
        if punctuation == "end":
            producer.close()
        elif isinstance(punctuation, int):
            producer.punctuate(punctuation)
    result = producer.result
    if result is None:  # nothing went to the server: a file of no rows, sent without punctuation
        print(f"sent 0 tuples to {args.stream}: {args.file} has no rows", file=sys.stderr)
        return
    skipped = f"; {result.duplicates} batches applied before were skipped" if result.duplicates else ""
    print(
        f"sent {result.tuples} tuples in {result.batches} batches to {args.stream} "
        f"(source {source}; low watermark {_watermark(result.low_watermark) or 'none'}{skipped})",
        file=sys.stderr,
    )
    if behind and not result.duplicates:  # with batches skipped, which rows went is not known
        _behind(args, info, behind, result.tuples)


def _punctuation_value(value: str | int, info: dict[str, Any], option: str = "--punctuation") -> int:
    """A punctuation value (``option``) of the stream ``info``: an integer, or an ISO 8601 time
    converted to the progressing attribute's unit as the file's rows are."""
    from lowtide.clients.cli.timestamps import time_value, timestamp_unit

    if isinstance(value, int):
        return value
    attribute = info["progressing"]
    kind = info["schema"][attribute]
    unit = timestamp_unit(kind)
    if unit is None:
        raise InvalidArgument(
            f"{option} {value!r} is a time, but stream {info['name']!r} progresses on {attribute!r} "
            f"({kind}): give an integer"
        )
    try:
        return time_value(value, unit)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{option} on {attribute!r} ({kind}): {exc}") from None


def _source_sending(source: str | None, info: dict[str, Any]) -> str:
    """The source a send goes as: ``--source``, required on a stream with declared sources (where
    'default' would be an extra source holding the stream back for good), else 'default'."""
    declared = info["declared"]
    if source is None and declared:
        raise InvalidArgument(
            f"stream {info['name']!r} declares sources {', '.join(declared)}: name one with --source"
        )
    source = "default" if source is None else source
    _warn_undeclared(source, info)
    return source


def _warn_undeclared(source: str, info: dict[str, Any]) -> None:
    declared = info["declared"]
    if declared and source not in declared:
        # The engine adds an undeclared source to the stream's minimum when it first speaks.
        print(
            f"lowtide: warning: source {source!r} is not declared on stream {info['name']!r} "
            f"(declared: {', '.join(declared)}); it counts as an extra source: the stream's progress "
            "waits for it as well as for each declared source",
            file=sys.stderr,
        )


def _behind(args: argparse.Namespace, info: dict[str, Any], behind: int, sent: int) -> None:
    """Say that ``behind`` of the ``sent`` tuples were behind the stream's punctuation; an error
    (exit 1, after sending) when all were, a warning when some were."""
    mark = f"{_watermark(info['low_watermark'])}, its low watermark when the send began"
    fate = (
        "the server took them, but a query counts them only in the windows it has not emitted yet, and "
        "for a window it has emitted they are late (--late drop: dropped, kept in <query>.late; --late "
        "update: the windows still kept are revised)"
    )
    if behind >= sent:
        raise InvalidArgument(
            f"all {sent} tuples were behind the punctuation of stream {args.stream!r} ({mark}): {fate}; "
            "send rows before the stream's sources punctuate past them"
        )
    print(
        f"lowtide: warning: {behind} of {sent} tuples were behind the punctuation of stream "
        f"{args.stream!r} ({mark}): {fate}",
        file=sys.stderr,
    )


def _check_file(batches: Batches, schema: Schema, low_watermark: int) -> int:
    """Every row of the file against the stream, before any is sent: a bad file sends nothing
    (sent again once fixed, its content - and so its batch ids - would be new). Returns how many
    rows lie below ``low_watermark`` (behind the stream's punctuation)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from lowtide.clients.cli.io import LazyProgress
    from lowtide.schema import check

    rows = behind = 0
    with LazyProgress(f"checking {batches.path}", batches.total, batches.unit) as progress:
        for table in batches:
            try:
                check(table, schema)
            except SchemaMismatch as exc:
                raise SchemaMismatch(
                    f"cannot send {batches.path}: rows {rows + 1}-{rows + table.num_rows}: {exc}"
                ) from exc
            rows += table.num_rows
            if low_watermark > NO_PROGRESS:
                values = table[schema.progressing]
                if pa.types.is_timestamp(values.type):
                    values = values.cast(pa.int64())
                behind += pc.sum(pc.less(values, low_watermark).cast(pa.int64())).as_py() or 0
            progress.update(batches.done)
    return behind


def _batch_ids(args: argparse.Namespace, batches: Batches) -> BatchIds:
    """The ids of the file's batches: from ``--batch-id-base``, else from the file's content."""
    from lowtide.clients.cli.batch_ids import BatchIds, content_base
    from lowtide.clients.cli.io import LazyProgress

    if args.batch_id_base is not None:
        return BatchIds(args.batch_id_base, from_content=False)
    size = batches.path.stat().st_size
    with LazyProgress(f"hashing {args.file}", size, "bytes") as progress:
        return BatchIds(content_base(batches.path, batches.shape, progress.update), from_content=True)


def _tail(client: Any, args: argparse.Namespace) -> None:
    """Print a query's results, one window-sorted table per punctuation; end at end-of-stream.
    Early results (``EMIT EVERY``) print as they come (:class:`Collated`), and so do a late side
    stream's rows: raw input rows, not windows."""
    from lowtide.clients.cli.io import Collated, Times, writer_for

    iso = args.time_format == "iso" or (args.time_format is None and args.format == "table")
    times = Times(iso, _time_unit(client, args.query) if iso else "")
    writer = writer_for(args.format, sys.stdout)
    held = Collated()
    late = args.query.endswith(".late")  # a query's own name never holds a "." (lowtide.names)
    rows = 0

    def show(table: pa.Table | None) -> bool:
        """Print ``table`` (up to ``--limit``); whether ``--limit`` is reached."""
        nonlocal rows
        if table is not None and table.num_rows:
            if args.limit is not None:
                table = table.slice(0, args.limit - rows)
            writer.table(times.table(table))
            rows += table.num_rows
        return args.limit is not None and rows >= args.limit

    with client.subscribe(args.query, not args.from_now, args.from_offset) as subscription:
        for item in subscription:
            if not isinstance(item, Punctuation):
                if show(item if late else held.add(item)):
                    return
                continue
            if show(held.release(item)):
                return
            if args.show_punctuation:
                writer.punctuation(item.attribute, times.punctuation(item), subscription.offset)
            if item.value >= END_OF_STREAM:
                return
        # The server ended the subscription: it is shutting down, the query was dropped, or its
        # output had ended before the offset the subscription started at.
        show(held.release())


def _time_unit(client: Any, query: str) -> str:
    """The unit of the query's window bounds (``ms``...), "" for plain numbers or a late stream."""
    return next((q["time_unit"] for q in client.list_queries() if q["name"] == query), "")


def _nexmark(client: Any, args: argparse.Namespace) -> None:
    """``lowtide nexmark``: see its --help."""
    from lowtide.clients import nexmark
    from lowtide.clients.cli.io import LazyProgress

    if args.disorder_ms < 0:
        raise InvalidArgument(f"--disorder-ms must be 0 or more, got {args.disorder_ms}")
    existing = {s["name"]: s for s in client.list_streams()}
    for name in nexmark.STREAMS:
        columns = {field.name: str(field.type) for field in nexmark.SCHEMAS[name]}
        if name not in existing:
            client.create_stream(name, columns, progressing="dateTime")
        elif dict(existing[name]["schema"]) != columns:
            raise InvalidArgument(
                f"stream {name!r} exists with other columns than nexmark's {columns}: drop it, or send "
                "to another server"
            )
    began = time.time()
    base_ms = int(began * 1000) if args.base_ms is None else args.base_ms
    events = nexmark.generate(
        args.events, seed=args.seed, rate=args.rate, disorder_ms=args.disorder_ms, base_ms=base_ms
    )
    lag = began - base_ms / 1000  # pace by event time as if the first event were now
    producers = {name: client.producer(name) for name in nexmark.STREAMS}
    sent = 0
    with LazyProgress("sending nexmark's events", args.events, "events") as progress:
        for stream, table, punctuation in nexmark.batches(events, args.batch_rows):
            if not args.no_pace:  # a batch goes once its events' time has come
                time.sleep(max(0.0, (punctuation + args.disorder_ms) / 1000 + lag - time.time()))
            producers[stream].send(table)
            for producer in producers.values():
                producer.punctuate(punctuation)
            sent += table.num_rows
            progress.update(sent)
    for producer in producers.values():
        if args.keep_open:
            producer.flush()
        else:
            producer.close()
    counts = ", ".join(f"{events.tables[name].num_rows} {name}s" for name in nexmark.STREAMS)
    elapsed = time.time() - began
    print(
        f"sent {sent} events ({counts}) in {elapsed:.1f} s, {sent / max(elapsed, 1e-9):,.0f} events/s",
        file=sys.stderr,
    )


_HANDLERS = {
    ("stream", "create"): _stream_create,
    ("stream", "drop"): _stream_drop,
    ("stream", "list"): _stream_list,
    ("query", "register"): _query_register,
    ("query", "explain"): _query_explain,
    ("query", "drop"): _query_drop,
    ("query", "list"): _query_list,
    ("source", "list"): _source_list,
    ("source", "punctuate"): _source_punctuate,
    ("source", "close"): _source_close,
    ("workers", None): _workers,
    ("send", None): _send,
    ("tail", None): _tail,
    ("nexmark", None): _nexmark,
}
