"""The ``lowtide`` command. Errors print one line on stderr and exit non-zero.

    lowtide serve [--host H] [--port P] [--workers N] [--metrics-port P] [--state-dir D] [--config F]
                  [--metrics-host H] [--tls-cert F --tls-key F] [--tokens F]
                  [--ray ADDRESS|auto|local [--worker-cpus C] [--ray-node-ip IP]]
    lowtide stream create NAME --schema 'srcIP:string,len:int32,ts:timestamp[ms]' [--progressing ts]
                                [--punctuation explicit] [--sources a,b] [--idle-timeout S]
    lowtide stream drop NAME | stream list [--format table|json]
    lowtide query register SQL [--name N] [--late drop|update|error] [--allowed-lateness L]
                                (--allowed-lateness only with --late update)
    lowtide query explain SQL|NAME | query drop NAME | query list [--format table|json]
    lowtide workers [--format table|json]
    lowtide send STREAM FILE [--source S] [--punctuation none|end|VALUE|TIME] [--batch-rows N]
                       [--no-header] [--batch-id-base N]
                       (--source is required on a stream with declared sources)
    lowtide source list STREAM [--format table|json] [--time-format raw|iso]
    lowtide source punctuate STREAM SOURCE VALUE|TIME | source close STREAM SOURCE
    lowtide tail QUERY [--format table|jsonl|csv] [--from-oldest | --from-now | --from-offset N]
                       [--time-format raw|iso]
                       [--limit N] [--show-punctuation]
    lowtide demo [--seconds S] [--rate R] [--workers N]
                 [--in-process | --spark [--foreach-batch | --parallel]]

Every command but ``serve`` and ``demo`` talks to the server named by ``--server`` (default
``$LOWTIDE_SERVER``, else ``127.0.0.1:50051``), over TLS with ``--tls-ca F`` (the PEM roots to
trust) and with a bearer token ``--token T`` (default ``$LOWTIDE_TOKEN``; the variable keeps the
token out of the process list), waiting ``--timeout`` seconds (above 0) for each control call.
Exit codes: 0 success, 1 any error (one line ``lowtide: <reason>`` on stderr), 2 a usage error
(argparse), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys

from lowtide import __version__
from lowtide.clients import default_grpc_verbosity
from lowtide.errors import LowtideError

DEFAULT_SERVER = "127.0.0.1:50051"
SEND_HELP = """Send the rows of FILE to STREAM, as the source --source: on a stream with declared
sources one must be named (without it the send is refused), on another it defaults to 'default'.

Formats (by extension, or --format; .gz, .bz2 and .zst files are decompressed):
  CSV      a header row naming the stream's columns (in any order), then one row a line;
           with --no-header, no header and the fields in the stream's column order
  JSONL    one JSON object a line, its keys the stream's columns
  Parquet  the stream's columns, of its types or of types that convert exactly
A timestamp[unit] column holds integers (counts of the unit since 1970-01-01 UTC) or ISO 8601
times (2023-11-14T22:13:20.5, 2023-11-14 22:13:20Z, 2023-11-14; without a zone offset, UTC),
to the unit at most, every row as the first. The whole file is read and checked before any
row is sent: a file with a bad row sends nothing, and the error names the first bad row (rows
count from 1, the header not counted) and, for a value that is not of its column's type, the
column by name.

--punctuation after the file: none, end (close the source), an integer, or an ISO 8601 time
read as the stream's progressing attribute reads one in the file (a timestamp[unit] attribute:
its unit since 1970-01-01 UTC).

A stream whose sources have all closed has ended (stream list: low watermark "end"): a closed
source takes no more rows, and every row of another is behind. Rows below the stream's low
watermark are behind its punctuation: the server takes them, but a query counts
one only in its windows not emitted yet; where a window holding it was emitted, it is late
(--late drop: dropped, into <query>.late; --late update: the windows still kept are revised;
--late error: the batch is refused). A send whose rows are all behind exits 1 after sending,
saying so; one with some behind warns.

A repeated send is applied once: each batch carries an id made from the file's content and
its position in it, and the server applies a (stream, source, batch id) once. Sending a file
again (after a send that failed midway, say) applies only the batches not applied yet; a file
whose bytes changed is new data, and so is one sent with another --batch-rows, --format or
--no-header. --batch-id-base N numbers the batches N, N+1, ... instead. The punctuation after
the file is safe to repeat too: a source's punctuation may be sent again, and closing a
closed source does nothing (a repeat whose batches were all applied exits 0, even once the
stream has ended).
"""


def _schema(text: str) -> dict[str, str]:
    """``'srcIP:string,len:int32,ts:timestamp[ms]'`` -> ``{"srcIP": "string", ...}``."""
    schema: dict[str, str] = {}
    for part in text.split(","):
        name, colon, kind = part.partition(":")
        if not colon or not name.strip() or not kind.strip():
            raise argparse.ArgumentTypeError(f"expected NAME:TYPE[,NAME:TYPE...], got {part.strip()!r}")
        if name.strip() in schema:
            raise argparse.ArgumentTypeError(f"column {name.strip()!r} appears twice")
        schema[name.strip()] = kind.strip()
    return schema


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _punctuation(text: str) -> str | int:
    """none, end, or a punctuation value (:func:`_punctuation_value`)."""
    if text in ("none", "end"):
        return text
    try:
        return _punctuation_value(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected none, end, an integer or an ISO 8601 time (2023-11-14T22:14:30), got {text!r}"
        ) from None


def _punctuation_value(text: str) -> str | int:
    """An integer, or an ISO 8601 time (kept as text: converted in the stream's unit)."""
    from lowtide.clients.cli.timestamps import looks_like_time

    if looks_like_time(text):
        return text
    try:
        return int(text)
    except ValueError:
        closing = "; lowtide source close ends a source" if text == "end" else ""
        raise argparse.ArgumentTypeError(
            f"expected an integer or an ISO 8601 time (2023-11-14T22:14:30), got {text!r}{closing}"
        ) from None


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _batch_id(text: str) -> int:
    value = _positive(text)
    if value >= 2**63:
        raise argparse.ArgumentTypeError(f"expected a batch id below 2**63, got {text!r}")
    return value


def _offset(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an output offset (0 or more), got {text!r}")
    return int(text)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lowtide", description="out-of-order stream processing")
    parser.add_argument("--version", action="version", version=f"lowtide {__version__}")
    parser.add_argument(
        "--server",
        default=os.environ.get("LOWTIDE_SERVER", DEFAULT_SERVER),
        help=f"server address host:port (default $LOWTIDE_SERVER or {DEFAULT_SERVER})",
    )
    parser.add_argument(
        "--timeout", type=_timeout, default=30.0, help="seconds per control call, above 0 (default 30)"
    )
    parser.add_argument("--tls-ca", metavar="F", help="connect over TLS, trusting the PEM certificates in F")
    parser.add_argument(
        "--token",
        default=os.environ.get("LOWTIDE_TOKEN") or None,
        help="bearer token for a server with --tokens (default $LOWTIDE_TOKEN)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the server until SIGTERM or SIGINT")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port; 0 picks a free one (default 50051)")
    serve.add_argument("--workers", type=int, help="worker processes (default: the number of cores)")
    serve.add_argument("--metrics-port", type=int, help="Prometheus port; 0 picks a free one (default 9464)")
    serve.add_argument(
        "--state-dir",
        help="keep streams, queries, windows and results here across restarts (else memory only)",
    )
    serve.add_argument("--config", help="TOML file of server settings (options here win)")
    serve.add_argument("--metrics-host", help="Prometheus bind address (default 127.0.0.1, whatever --host)")
    serve.add_argument("--tls-cert", metavar="F", help="serve TLS with this PEM certificate (and --tls-key)")
    serve.add_argument("--tls-key", metavar="F", help="the PEM private key of --tls-cert")
    serve.add_argument(
        "--tokens", metavar="F", help="TOML file whose [tokens] table maps tokens to admin|producer|reader"
    )

    serve.add_argument(
        "--ray",
        metavar="ADDRESS|auto|local",
        help="run the workers as actors of this Ray cluster (host:port, ray://host:port; auto: "
        "$RAY_ADDRESS or the running local one; local: a private one-machine Ray)",
    )
    serve.add_argument(
        "--worker-cpus", type=float, help="with --ray: CPUs each worker actor reserves (default 1)"
    )
    serve.add_argument(
        "--ray-node-ip",
        metavar="IP",
        help="with --ray local: the address its private cluster listens on (default 127.0.0.1: "
        "no other machine reaches it)",
    )
    serve.add_argument(
        "--truncate-log-tail",
        action="store_true",
        help="with --state-dir: give up acknowledged records at the end of a damaged or cut input log "
        "(this start only; it says how many)",
    )

    stream = commands.add_parser("stream", help="create, drop or list streams")
    stream_commands = stream.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = stream_commands.add_parser("create", help="create a stream")
    create.add_argument("name")
    create.add_argument(
        "--schema", type=_schema, required=True, help="NAME:TYPE,... e.g. 'k:string,ts:int64'"
    )
    create.add_argument("--progressing", default="ts", help="progressing attribute (default ts)")
    create.add_argument(
        "--punctuation",
        default="explicit",
        help="explicit | ordered | bounded:<slack> | heartbeat:<period>,<skew> (default explicit)",
    )
    create.add_argument("--sources", type=_names, help="declared sources, comma-separated")
    create.add_argument("--idle-timeout", type=float, help="seconds before a silent source goes idle")
    stream_commands.add_parser("drop", help="drop a stream").add_argument("name")
    stream_list = stream_commands.add_parser("list", help="list streams")
    stream_list.add_argument("--format", choices=("table", "json"), default="table")

    query = commands.add_parser("query", help="register, explain, drop or list queries")
    query_commands = query.add_subparsers(dest="action", required=True, metavar="ACTION")
    register = query_commands.add_parser("register", help="register a query; prints its name")
    register.add_argument("sql", help="the query text ('-' reads it from stdin)")
    register.add_argument("--name", help="the query's name (default: the server picks one)")
    register.add_argument("--late", choices=("drop", "update", "error"), default="drop")
    register.add_argument(
        "--allowed-lateness",
        help="only with --late update: how long windows are kept past their punctuation, a duration (2s) "
        "or a number of the window attribute's units",
    )
    query_commands.add_parser("explain", help="print a query's operator graph").add_argument(
        "sql", help="the query text ('-' reads it from stdin), or a registered query's name"
    )
    query_commands.add_parser("drop", help="drop a query").add_argument("name")
    query_list = query_commands.add_parser(
        "list", help="list queries and their status (running, recovering, aborted)"
    )
    query_list.add_argument("--format", choices=("table", "json"), default="table")

    workers = commands.add_parser(
        "workers", help="list the workers: node, pid, restarts, state bytes, queries and status of each"
    )
    workers.add_argument("--format", choices=("table", "json"), default="table")

    send = commands.add_parser(
        "send",
        help="send a CSV, JSONL or Parquet file to a stream",
        description=SEND_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    send.add_argument("stream")
    send.add_argument(
        "file", help="*.csv, *.jsonl / *.ndjson / *.json, *.parquet (optionally .gz, .bz2, .zst)"
    )
    send.add_argument(
        "--source",
        help="the source sending: one of the stream's declared sources (required when it has any), "
        "else default 'default'",
    )
    send.add_argument(
        "--punctuation",
        type=_punctuation,
        default="none",
        help="after the file: none (default), end (close the source), or a punctuation value: an "
        "integer, or an ISO 8601 time (2023-11-14T22:14:30) in a timestamp attribute's unit",
    )
    send.add_argument("--batch-rows", type=_positive, default=100_000, help="rows per batch (default 100000)")
    send.add_argument(
        "--format", choices=("csv", "jsonl", "parquet"), help="file format (default: by extension)"
    )
    send.add_argument(
        "--no-header",
        action="store_true",
        help="the CSV file has no header row: its fields are the stream's columns, in order",
    )
    send.add_argument(
        "--batch-id-base",
        type=_batch_id,
        metavar="N",
        help="number the batches N, N+1, ... (default: ids from the file's content)",
    )

    source = commands.add_parser(
        "source", help="list a stream's sources and what holds it back; punctuate or close a source"
    )
    source_commands = source.add_subparsers(dest="action", required=True, metavar="ACTION")
    source_list = source_commands.add_parser(
        "list",
        help="each source of a stream (declared, or seen since): its punctuation (none, a value, or "
        "closed) and whether it holds the stream's low watermark back",
    )
    source_list.add_argument("stream")
    source_list.add_argument("--format", choices=("table", "json"), default="table")
    source_list.add_argument(
        "--time-format",
        choices=("raw", "iso"),
        help="punctuation as numbers or ISO 8601 times, for a timestamp progressing attribute "
        "(default: iso for table)",
    )
    punctuate = source_commands.add_parser(
        "punctuate",
        help="send a source's punctuation, as send --punctuation does; prints the stream's low watermark",
    )
    punctuate.add_argument("stream")
    punctuate.add_argument("source")
    punctuate.add_argument(
        "value",
        type=_punctuation_value,
        help="an integer, or an ISO 8601 time (2023-11-14T22:14:30) in a timestamp attribute's unit; "
        "never below the source's last",
    )
    close = source_commands.add_parser(
        "close",
        help="close a source (its punctuation becomes +inf; closed already is fine); prints the "
        "stream's low watermark (end once every source has closed)",
    )
    close.add_argument("stream")
    close.add_argument("source")

    nexmark = commands.add_parser(
        "nexmark",
        help="create Nexmark's streams (person, auction, bid) and send them its generator's events",
        description=(
            "Create the streams person, auction and bid (nexmark's columns, progressing on dateTime) "
            "unless they exist, and send them events as nexmark's generator models them (of every 50: "
            "1 person, 3 auctions, 46 bids; hot auctions, bidders and sellers), out of order by up to "
            "--disorder-ms, each batch followed by the punctuation honest after it; at the end the "
            "sources close, so every window completes. Event time starts now and advances at --rate "
            "events per second; the events are sent as their time comes, unless --no-pace. Register "
            "Nexmark's queries (Flink SQL as the nexmark project writes them) before, or after with "
            "tail --from-oldest."
        ),
    )
    nexmark.add_argument(
        "--events", type=_positive, default=1_000_000, help="events to send (default 1000000)"
    )
    nexmark.add_argument(
        "--rate", type=_positive, default=10_000, help="events per second of event time (default 10000)"
    )
    nexmark.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    nexmark.add_argument(
        "--disorder-ms", type=int, default=2_000, help="how late an event may arrive, in ms (default 2000)"
    )
    nexmark.add_argument(
        "--batch-rows", type=_positive, default=10_000, help="arrivals per round of batches (default 10000)"
    )
    nexmark.add_argument(
        "--base-ms", type=int, help="the first event's time, ms since the epoch (default: now)"
    )
    nexmark.add_argument("--no-pace", action="store_true", help="send as fast as the server takes them")
    nexmark.add_argument("--keep-open", action="store_true", help="do not close the sources at the end")

    tail = commands.add_parser("tail", help="print a query's results as they come")
    tail.add_argument("query", help="a query name, or <query>.late for its late tuples")
    tail.add_argument("--format", choices=("table", "jsonl", "csv"), default="table")
    since = tail.add_mutually_exclusive_group()
    since.add_argument(
        "--from-oldest", action="store_true", help="start at the oldest retained result (the default)"
    )
    since.add_argument("--from-now", action="store_true", help="only results emitted from now on")
    since.add_argument(
        "--from-offset",
        type=_offset,
        metavar="N",
        help="from output offset N on (--show-punctuation prints each marker's offset: resume at offset+1)",
    )
    tail.add_argument(
        "--time-format",
        choices=("raw", "iso"),
        help="window bounds and punctuation as numbers or ISO 8601 times (default: iso for table)",
    )
    tail.add_argument("--limit", type=_positive, help="stop after this many result rows")
    tail.add_argument("--show-punctuation", action="store_true", help="print punctuation markers too")

    demo = commands.add_parser(
        "demo", help="start a server and stream three generated, disordered links through Q1-2, Q6-8, Q8-1"
    )
    demo.add_argument("--seconds", type=int, default=120, help="event time to generate (default 120)")
    demo.add_argument("--rate", type=int, default=40_000, help="packets per second per link (default 40000)")
    demo.add_argument("--workers", type=int, default=2, help="server worker processes (default 2)")
    demo.add_argument("--in-process", action="store_true", help="run the engine in this process, no server")
    demo.add_argument(
        "--spark",
        action="store_true",
        help='a Spark Structured Streaming job writes to the server (writeStream.format("lowtide"))',
    )
    spark_sink = demo.add_mutually_exclusive_group()
    spark_sink.add_argument(
        "--foreach-batch", action="store_true", help="with --spark: through LowtideSink on the driver"
    )
    spark_sink.add_argument(
        "--parallel", action="store_true", help="with --spark: through LowtideSink(parallel=True)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # gRPC's C core logs on stderr (a CA file it cannot load, failed TLS handshakes) where the
    # one-line error says it better: silent in the client commands (the package's default),
    # errors only in the server. A GRPC_VERBOSITY of the user's own wins.
    if args.command == "serve":
        default_grpc_verbosity("ERROR")
    try:
        if args.command == "demo":
            if args.spark:
                try:
                    from lowtide.clients.demos.spark import run as run_spark_demo
                except ModuleNotFoundError as exc:
                    if (exc.name or "").partition(".")[0] not in ("pyspark", "pandas"):
                        raise
                    raise LowtideError("demo --spark needs Spark: pip install 'lowtide[spark]'") from None

                sink = "parallel" if args.parallel else "foreachBatch" if args.foreach_batch else "lowtide"
                run_spark_demo(workers=args.workers, sink=sink)
            elif args.in_process:
                from lowtide.clients.demos.in_process import run

                run(args.seconds, args.rate)
            else:
                from lowtide.clients.demos.server import run as run_server_demo

                run_server_demo(args.seconds, args.rate, args.workers)
            return 0
        from lowtide.clients.cli.commands import run_command

        return run_command(args)
    except LowtideError as exc:
        print(f"lowtide: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``lowtide tail q | head``): not an error; keep Python quiet at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if os.environ.get("LOWTIDE_DEBUG"):
            raise
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"lowtide: internal error ({type(exc).__name__}): {reason}", file=sys.stderr)
        return 1
