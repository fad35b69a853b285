"""Flink's answer to one Nexmark query over the events of a folder: an oracle for lowtide's.

Runs in its own interpreter, ``.venv-pyflink`` (``make pyflink``: apache-flink pins pyarrow,
protobuf and apache-beam below what lowtide needs), and imports nothing from lowtide::

    .venv-pyflink/bin/python bench/nexmark/flink_oracle.py --data DIR \\
        --query tests/data/nexmark/q5.sql --out FILE [--parallelism 2] [--watermark-ms 4000]

``DIR`` holds ``person.parquet``, ``auction.parquet`` and ``bid.parquet``, columns as in
tests/data/nexmark/schemas.json (nexmark-flink's ddl_views.sql), times ``timestamp[ms]`` read as
UTC. The wheel bundles no Parquet format for Flink SQL, so each file is rewritten as JSON lines
(in the file's row order) into a temporary folder, and read by the filesystem connector as a
table of the same name with ``WATERMARK FOR dateTime AS dateTime - INTERVAL x SECOND`` (nexmark's
ddl; a watermark for each stream here, where nexmark's single source shares one among the three).
``pipeline.auto-watermark-interval`` 0 emits each stream's watermark after every row that raises
it, so which rows are late depends only on the rows' order, not on the clock: a late row still
counts in every window that has not fired when it arrives. ``count_char(s, c)`` (q14) is a Python
UDF counting as nexmark's Java CountChar does: occurrences of ``c``'s first byte in ``s``'s
UTF-8, 0 for a null ``s``.

The query (the file's text, one SELECT) runs in streaming mode; the bounded sources end with the
final watermark, so every window closes. Its changelog goes to a filesystem sink in the JVM as
debezium-json, and the final multiset (each insert or update's after image adds a row, each
delete or update's before image removes one) is written to ``FILE`` as JSON lines: one object a
row, keys the query's result columns as Flink names them (``EXPR$1`` for an unnamed expression,
``dateTime0`` for a second ``dateTime``) in the select list's order, TIMESTAMP columns as epoch
ms integers, DECIMAL as floats, rows sorted. On stderr: ``seconds=<float> rows=<int>`` (seconds
from submitting the query to the job's end: planning, the local MiniCluster's start, reading the
JSON and writing the changelog). Every socket Flink opens listens on 127.0.0.1; its logs and
temporary files stay in a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

# The columns of nexmark-flink's ddl_views.sql, in its order and with its Flink types.
TABLES: dict[str, list[tuple[str, str]]] = {
    "person": [
        ("id", "BIGINT"),
        ("name", "STRING"),
        ("emailAddress", "STRING"),
        ("creditCard", "STRING"),
        ("city", "STRING"),
        ("state", "STRING"),
        ("dateTime", "TIMESTAMP(3)"),
        ("extra", "STRING"),
    ],
    "auction": [
        ("id", "BIGINT"),
        ("itemName", "STRING"),
        ("description", "STRING"),
        ("initialBid", "BIGINT"),
        ("reserve", "BIGINT"),
        ("dateTime", "TIMESTAMP(3)"),
        ("expires", "TIMESTAMP(3)"),
        ("seller", "BIGINT"),
        ("category", "BIGINT"),
        ("extra", "STRING"),
    ],
    "bid": [
        ("auction", "BIGINT"),
        ("bidder", "BIGINT"),
        ("price", "BIGINT"),
        ("channel", "STRING"),
        ("url", "STRING"),
        ("dateTime", "TIMESTAMP(3)"),
        ("extra", "STRING"),
    ],
}
LOOPBACK = "127.0.0.1"
ROWS_A_BATCH = 65536
# In EXPLAIN's changelog modes: a Rank (not a WindowRank) that only inserts, which a Rank over
# updates never does; and the operators that read watermarks, whose inputs mini-batches can hold
# back (windows then see fewer late rows).
INSERT_ONLY_RANK = re.compile(r"\bRank\(.*changelogMode=\[I\]\)")
EVENT_TIME = re.compile(r"Window|IntervalJoin|OverAggregate|TemporalSort|TemporalJoin|Match\(")


def to_json_lines(source: Path, target: Path, columns: list[tuple[str, str]]) -> None:
    """``source`` (Parquet) as JSON lines in Flink's SQL timestamp format, rows in file order."""
    import pandas as pd  # type: ignore[import-not-found, unused-ignore]
    import pyarrow as pa  # type: ignore[import-not-found, unused-ignore]
    import pyarrow.compute as pc  # type: ignore[import-not-found, unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]

    names = [name for name, _ in columns]
    times = {name for name, kind in columns if kind.startswith("TIMESTAMP")}
    integers = {pa.int64(): pd.Int64Dtype()}.get  # a null stays null, not a float NaN
    table = pq.read_table(source, columns=names)
    with target.open("w", encoding="utf-8") as out:
        for batch in table.to_batches(ROWS_A_BATCH):
            values = [
                # %S of a timestamp[ms] prints its milliseconds too
                pc.strftime(batch.column(n).cast("timestamp[ms]"), format="%Y-%m-%d %H:%M:%S")
                if n in times
                else batch.column(n)
                for n in names
            ]
            frame = pa.RecordBatch.from_arrays(values, names=names).to_pandas(types_mapper=integers)
            frame.to_json(out, orient="records", lines=True, force_ascii=False)


def interval(ms: int) -> str:
    return f"INTERVAL '{ms // 1000}.{ms % 1000:03d}' SECOND"


def table_ddl(name: str, columns: list[tuple[str, str]], path: Path, watermark_ms: int) -> str:
    fields = ", ".join(f"`{column}` {kind}" for column, kind in columns)
    return (
        f"CREATE TEMPORARY TABLE `{name}` ({fields}, "
        f"WATERMARK FOR `dateTime` AS `dateTime` - {interval(watermark_ms)}) "
        f"WITH ('connector' = 'filesystem', 'path' = '{path.as_uri()}', 'format' = 'json', "
        "'json.timestamp-format.standard' = 'SQL', 'json.fail-on-missing-field' = 'true')"
    )


def select_text(sql: str) -> str:
    """The query file's SELECT: without its ``--`` comment lines and a final semicolon."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return re.sub(r";\s*$", "", "\n".join(lines).strip())


def arrow_type(kind: Any) -> Any:
    """How a result column of Flink type ``kind`` is read from the sink's JSON (times as text)."""
    import pyarrow as pa  # type: ignore[import-not-found, unused-ignore]
    from pyflink.table import types  # type: ignore[import-not-found, unused-ignore]

    if isinstance(kind, types.BigIntType | types.IntType | types.SmallIntType | types.TinyIntType):
        return pa.int64()
    if isinstance(kind, types.DecimalType | types.DoubleType | types.FloatType):
        return pa.float64()
    if isinstance(
        kind, types.VarCharType | types.CharType | types.TimestampType | types.LocalZonedTimestampType
    ):
        return pa.string()
    if isinstance(kind, types.BooleanType):
        return pa.bool_()
    raise SystemExit(f"a result column of type {kind}, which this oracle does not write")


def read_changes(folder: Path, columns: dict[str, Any]) -> Any:
    """The debezium-json changes of every file under ``folder`` (in-progress ones too), as a table
    of the changed row's ``columns`` and ``sign``: +1 for an insert and an update's after image
    (op ``c``), -1 for a delete and an update's before image (op ``d``)."""
    import pyarrow as pa  # type: ignore[import-not-found, unused-ignore]
    import pyarrow.compute as pc  # type: ignore[import-not-found, unused-ignore]
    import pyarrow.json as pj  # type: ignore[import-not-found, unused-ignore]

    row = pa.struct(list(columns.items()))
    layout = pa.schema([("before", row), ("after", row), ("op", pa.string())])
    options = pj.ParseOptions(explicit_schema=layout, unexpected_field_behavior="error")
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.stat().st_size > 0]
    found = pa.concat_tables(
        [pj.read_json(p, parse_options=options) for p in files] or [layout.empty_table()]
    )
    ops = set(found.column("op").unique().to_pylist())
    if not ops <= {"c", "d"}:
        raise ValueError(f"changes of kinds {ops - {'c', 'd'}}: not debezium-json's c and d")
    added = pc.equal(found.column("op"), "c")
    values = {
        name: pc.if_else(
            added, pc.struct_field(found.column("after"), [i]), pc.struct_field(found.column("before"), [i])
        )
        for i, name in enumerate(columns)
    }
    return pa.table({**values, "sign": pc.if_else(added, 1, -1).cast(pa.int64())})


def final_rows(changes: Any, timestamps: set[str]) -> Any:
    """The multiset the changes end at, in any order of theirs, its rows sorted; the
    ``timestamps`` columns as epoch ms."""
    import numpy as np  # type: ignore[import-not-found, unused-ignore]
    import pyarrow as pa  # type: ignore[import-not-found, unused-ignore]
    import pyarrow.compute as pc  # type: ignore[import-not-found, unused-ignore]

    names = [n for n in changes.column_names if n != "sign"]
    counted = changes.group_by(names, use_threads=False).aggregate([("sign", "sum")])
    counts = counted.column("sign_sum")
    removed = pc.sum(pc.less(counts, 0)).as_py() or 0
    if removed:
        raise ValueError(f"{removed} rows removed more often than added")
    kept = counted.take(np.repeat(np.arange(len(counted)), counts.to_numpy()))
    for name in timestamps:  # "2020-09-13 12:26:41.5"; a TIMESTAMP_LTZ ends in Z
        text = pc.replace_substring_regex(kept.column(name), "Z$", "")
        kept = kept.set_column(
            kept.column_names.index(name), name, text.cast(pa.timestamp("ms")).cast(pa.int64())
        )
    return kept.select(names).sort_by([(n, "ascending") for n in names])


def write_json_lines(table: Any, target: Path) -> None:
    with target.open("w", encoding="utf-8") as out:
        for batch in table.to_batches(ROWS_A_BATCH):
            for row in batch.to_pylist():
                out.write(json.dumps(row, ensure_ascii=False) + "\n")


def configure(scratch: Path) -> None:
    """Logs and the JVM's temporary files into ``scratch``: read when the gateway JVM starts."""
    os.environ["FLINK_LOG_DIR"] = str(scratch / "log")
    os.environ["JVM_ARGS"] = (
        f"{os.environ.get('JVM_ARGS', '')} -XX:-UsePerfData -Djava.io.tmpdir={scratch / 'tmp'}".strip()
    )
    os.environ["TMPDIR"] = str(scratch / "tmp")
    # No Beam worker pool in this process (PyFlink's "loopback" mode listens on every interface):
    # count_char runs in the JVM's embedded interpreter instead (python.execution-mode: thread).
    os.environ["_python_worker_execution_mode"] = "process"  # noqa: SIM112 (PyFlink reads this name)
    tempfile.tempdir = None  # the Python side (py4j's connection file, UDF workers) reads TMPDIR again
    (scratch / "log").mkdir()
    (scratch / "tmp").mkdir()


def environment(parallelism: int, scratch: Path, mini_batch: bool) -> Any:
    from pyflink.common import Configuration  # type: ignore[import-not-found, unused-ignore]
    from pyflink.table import (  # type: ignore[import-not-found, unused-ignore]
        DataTypes,
        EnvironmentSettings,
        TableEnvironment,
    )
    from pyflink.table.udf import udf  # type: ignore[import-not-found, unused-ignore]

    settings = {
        "parallelism.default": str(parallelism),
        "table.local-time-zone": "UTC",
        "pipeline.auto-watermark-interval": "0 ms",
        "io.tmp.dirs": str(scratch / "tmp"),
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        "python.execution-mode": "thread",
        "python.pythonpath": sysconfig.get_paths()["purelib"],  # this venv's, for the JVM's interpreter
        # loopback only: the MiniCluster's REST endpoint, RPC and data exchange
        "rest.bind-address": LOOPBACK,
        "rest.address": LOOPBACK,
        "jobmanager.bind-host": LOOPBACK,
        "jobmanager.rpc.address": LOOPBACK,
        "taskmanager.bind-host": LOOPBACK,
        "taskmanager.host": LOOPBACK,
    }
    if mini_batch:
        settings |= {
            "table.exec.mini-batch.enabled": "true",
            "table.exec.mini-batch.allow-latency": "100 ms",
            "table.exec.mini-batch.size": "1000",
        }
    config = Configuration()
    for key, value in settings.items():
        config.set_string(key, value)
    t_env = TableEnvironment.create(
        EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(config).build()
    )

    @udf(result_type=DataTypes.BIGINT())  # type: ignore[misc, unused-ignore]
    def count_char(s: str | None, c: str) -> int:
        return 0 if s is None else s.encode("utf-8").count(c.encode("utf-8")[:1])

    t_env.create_temporary_system_function("count_char", count_char)
    return t_env


def tables(t_env: Any, scratch: Path, watermark_ms: int) -> None:
    for name, columns in TABLES.items():
        t_env.execute_sql(table_ddl(name, columns, scratch / "data" / f"{name}.json", watermark_ms))


def changelog_modes(t_env: Any, sql: str) -> str:
    from pyflink.table.explain_detail import ExplainDetail  # type: ignore[import-not-found, unused-ignore]

    return str(t_env.explain_sql(sql, ExplainDetail.CHANGELOG_MODE))


def run(data: Path, query: str, parallelism: int, watermark_ms: int, scratch: Path) -> tuple[Any, float]:
    """The query's final multiset (a table, its rows sorted), and the seconds from submitting it to
    the job's end."""
    from pyflink.table import (  # type: ignore[import-not-found, unused-ignore]
        FormatDescriptor,
        TableDescriptor,
        types,
    )

    configure(scratch)
    (scratch / "data").mkdir()
    for name, columns in TABLES.items():
        to_json_lines(data / f"{name}.parquet", scratch / "data" / f"{name}.json", columns)
    sql = select_text(query)
    t_env = environment(parallelism, scratch, mini_batch=False)
    tables(t_env, scratch, watermark_ms)
    if INSERT_ONLY_RANK.search(changelog_modes(t_env, sql)):
        # Flink 2.3 plans a ROW_NUMBER() <= 1 whose rank is not selected as a deduplication that
        # keeps the first row when its ORDER BY has several keys (RankUtil.keepLastDeduplicateRow),
        # hence insert-only, but the rank still updates: the sink would get UPDATE_AFTERs alone.
        # Mini-batches make that plan send UPDATE_BEFOREs (RankUtil.outputInsertOnlyInDeduplicate).
        t_env = environment(parallelism, scratch, mini_batch=True)
        tables(t_env, scratch, watermark_ms)
        if EVENT_TIME.search(changelog_modes(t_env, sql)):
            raise SystemExit("a top-1 that Flink plans as insert-only, with event-time operators")
        print("mini-batch: on (a top-1 Flink would plan as insert-only)", file=sys.stderr)
    table = t_env.sql_query(sql)
    schema = table.get_resolved_schema()
    kinds = dict(zip(schema.get_column_names(), schema.get_column_data_types(), strict=True))
    timestamps = {
        name
        for name, kind in kinds.items()
        if isinstance(kind, types.TimestampType | types.LocalZonedTimestampType)
    }
    read_as = {name: arrow_type(kind) for name, kind in kinds.items()}
    # A sink in the JVM: collect() brings rows to Python a py4j call each (a few hundred a second).
    # debezium-json writes every kind of change; the filesystem sink takes what its format takes.
    out = scratch / "out"
    sink = (
        TableDescriptor.for_connector("filesystem")
        .option("path", out.as_uri())
        .format(
            FormatDescriptor.for_format("debezium-json")
            .option("timestamp-format.standard", "SQL")
            .option("encode.decimal-as-plain-number", "true")
            .build()
        )
        .build()
    )
    began = time.perf_counter()
    table.execute_insert(sink).wait()
    seconds = time.perf_counter() - began
    changes = read_changes(out, read_as)
    return final_rows(changes, timestamps), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of person/auction/bid.parquet")
    parser.add_argument("--query", type=Path, required=True, help="a Nexmark query's SELECT (Flink SQL)")
    parser.add_argument("--out", type=Path, required=True, help="the result as JSON lines")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--watermark-ms", type=int, default=4000, help="each stream's watermark delay")
    args = parser.parse_args(argv)
    # Killed by SIGTERM (a harness's timeout), still remove the temporary folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    scratch = Path(tempfile.mkdtemp(prefix="flink-oracle-"))
    try:
        found, seconds = run(
            args.data.resolve(),
            args.query.read_text(encoding="utf-8"),
            args.parallelism,
            args.watermark_ms,
            scratch,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_json_lines(found, args.out)
    print(f"seconds={seconds:.3f} rows={found.num_rows}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
