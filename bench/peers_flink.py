"""The Flink side of ``bench/peers.py``: one windowed count per key in PyFlink's Table API (SQL).

Runs in its own interpreter (``.venv-pyflink``, which ``bench/peers.py`` creates: apache-flink
pins grpcio, protobuf and numpy below what lowtide needs), as a subprocess of ``bench/peers.py``.

Source: the filesystem connector over a folder of CSV files ``k,ts`` (``ts`` in ms), a JVM source:
no Python on the per-row path. ``rt AS TO_TIMESTAMP_LTZ(ts, 3)`` with ``WATERMARK FOR rt AS rt -
INTERVAL '2' SECOND``. Query: ``HOP(TABLE S, DESCRIPTOR(rt), INTERVAL slide, INTERVAL range)``
(``TUMBLE`` when range = slide) ``GROUP BY window_start, window_end, k`` with ``COUNT(*)``;
``--range-s 0``: sessions with gap ``--slide-s``, the group window ``GROUP BY SESSION(rt, INTERVAL
gap), k`` with ``MIN(ts)``, ``MAX(ts) + gap`` (the session's bounds in ms: ``SESSION_START`` is a
TIMESTAMP and ``TIMESTAMPDIFF`` stops at seconds) and ``COUNT(*)``; into a ``blackhole`` sink, or
into CSV files (``--collect``) to check the counts. End of input sends the final watermark, so every
window is emitted before the job ends.

Per job it prints one JSON line: the parallelism, the client's wall time (``execute_sql`` to
``wait()`` returning: planning, the local MiniCluster's start, the job) and the job's net
runtime (``JobExecutionResult.getNetRuntime()``: the job on the cluster, from submission to its
end). A small warm-up job runs first in the same JVM, off the clock. ``--scan`` also times the
source alone (``SELECT k, ts FROM S`` into the blackhole, parallelism 1) after each round.

    .venv-pyflink/bin/python bench/peers_flink.py --data DIR [--warm DIR] [--parallelism 1,2]
        [--runs 3] [--range-s 10] [--slide-s 1] [--scan] [--collect OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def environment(parallelism: int) -> Any:
    from pyflink.table import EnvironmentSettings, TableEnvironment  # type: ignore[import-not-found, unused-ignore]

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = t_env.get_config()
    config.set("parallelism.default", str(parallelism))
    config.set("table.local-time-zone", "UTC")
    config.set_python_executable(sys.executable)  # no Python UDF here, but the workers would need it
    return t_env


def window_sql(range_s: int, slide_s: int) -> str:
    if range_s == 0:  # sessions, gap slide_s: a group window (bounds in ms from the rows themselves)
        return (
            f"SELECT MIN(ts) AS window_start, MAX(ts) + {slide_s * 1000} AS window_end, k, COUNT(*) AS n "
            f"FROM S GROUP BY SESSION(rt, INTERVAL '{slide_s}' SECOND), k"
        )
    if range_s == slide_s:
        window = f"TUMBLE(TABLE S, DESCRIPTOR(rt), INTERVAL '{range_s}' SECOND)"
    else:
        window = f"HOP(TABLE S, DESCRIPTOR(rt), INTERVAL '{slide_s}' SECOND, INTERVAL '{range_s}' SECOND)"
    epoch = "TIMESTAMP '1970-01-01 00:00:00'"
    return (
        f"SELECT CAST(TIMESTAMPDIFF(SECOND, {epoch}, window_start) AS BIGINT) * 1000 AS window_start, "
        f"CAST(TIMESTAMPDIFF(SECOND, {epoch}, window_end) AS BIGINT) * 1000 AS window_end, k, "
        "COUNT(*) AS n "
        f"FROM TABLE({window}) GROUP BY window_start, window_end, k"
    )


def run_job(
    data: Path, parallelism: int, range_s: int, slide_s: int, collect: Path | None, scan: bool = False
) -> dict[str, Any]:
    """One job over ``data``; ``scan``: the source alone into the sink, no window."""
    t_env = environment(parallelism)
    t_env.execute_sql(
        "CREATE TEMPORARY TABLE S (k BIGINT, ts BIGINT, rt AS TO_TIMESTAMP_LTZ(ts, 3), "
        "WATERMARK FOR rt AS rt - INTERVAL '2' SECOND) "
        f"WITH ('connector' = 'filesystem', 'path' = '{data.resolve().as_uri()}', 'format' = 'csv')"
    )
    sink = (
        f"'connector' = 'filesystem', 'path' = '{collect.resolve().as_uri()}', 'format' = 'csv'"
        if collect
        else "'connector' = 'blackhole'"
    )
    columns = "k BIGINT, ts BIGINT" if scan else "window_start BIGINT, window_end BIGINT, k BIGINT, n BIGINT"
    t_env.execute_sql(f"CREATE TEMPORARY TABLE R ({columns}) WITH ({sink})")
    query = "SELECT k, ts FROM S" if scan else window_sql(range_s, slide_s)
    began = time.perf_counter()
    result = t_env.execute_sql(f"INSERT INTO R {query}")
    result.wait()
    wall = time.perf_counter() - began
    net_ms = result.get_job_client().get_job_execution_result().result().get_net_runtime()
    return {"parallelism": parallelism, "scan": scan, "wall_s": wall, "net_s": net_ms / 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of CSV files k,ts")
    parser.add_argument("--warm", type=Path, help="a small folder of the same kind, run first off the clock")
    parser.add_argument("--parallelism", default="1,2")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--range-s", type=int, default=10)
    parser.add_argument("--slide-s", type=int, default=1)
    parser.add_argument("--collect", type=Path, help="write the windows as CSV here instead (one job)")
    parser.add_argument("--scan", action="store_true", help="also time the source alone (parallelism 1)")
    args = parser.parse_args(argv)
    levels = [int(p) for p in args.parallelism.split(",")]
    if args.collect:
        print(json.dumps(run_job(args.data, levels[0], args.range_s, args.slide_s, args.collect)), flush=True)
        return 0
    if args.warm:
        for parallelism in levels:
            run_job(args.warm, parallelism, args.range_s, args.slide_s, None)
    for _ in range(args.runs):
        for parallelism in levels:
            print(json.dumps(run_job(args.data, parallelism, args.range_s, args.slide_s, None)), flush=True)
        if args.scan:
            print(json.dumps(run_job(args.data, 1, args.range_s, args.slide_s, None, scan=True)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
