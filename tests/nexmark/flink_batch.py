"""Flink's answers to several Nexmark queries from one PyFlink process: one gateway JVM for all.

Run by .venv-pyflink's interpreter (tests/nexmark/test_nexmark_flink.py does; imports nothing
from lowtide)::

    .venv-pyflink/bin/python tests/nexmark/flink_batch.py --data DIR --out FOLDER \\
        [--parallelism 2] [--watermark-ms 4000] q5.sql q8.sql ...

Each query runs as bench/nexmark/flink_oracle.py runs it alone (its ``run``: a TableEnvironment
of its own over the same tables and settings, a job that ends with the sources), one after the
other; only the JVM is shared, which a lone run starts for itself (most of its time). Query
``qN.sql``'s rows go to ``FOLDER/qN.jsonl`` as the oracle writes them; a query the oracle fails
or refuses leaves ``FOLDER/qN.error`` (why) instead, and the others still run. Every query's
scratch folder lives until the end: the JVM keeps the first one's as its temporary directory.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "nexmark"))
import flink_oracle as oracle  # its folder: on the path just above


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder of person/auction/bid.parquet")
    parser.add_argument("--out", type=Path, required=True, help="folder for qN.jsonl (or qN.error)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--watermark-ms", type=int, default=4000, help="each stream's watermark delay")
    parser.add_argument("queries", type=Path, nargs="+", help="Nexmark queries' SELECTs (Flink SQL)")
    args = parser.parse_args(argv)
    # Killed by SIGTERM (a harness's timeout), still remove the temporary folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    scratch = Path(tempfile.mkdtemp(prefix="flink-oracle-"))
    try:
        for query in args.queries:
            folder = scratch / query.stem
            folder.mkdir()
            try:
                found, seconds = oracle.run(
                    args.data.resolve(),
                    query.read_text(encoding="utf-8"),
                    args.parallelism,
                    args.watermark_ms,
                    folder,
                )
            except (Exception, SystemExit):  # the oracle refuses a query with SystemExit
                (args.out / f"{query.stem}.error").write_text(traceback.format_exc(), encoding="utf-8")
                continue
            oracle.write_json_lines(found, args.out / f"{query.stem}.jsonl")
            print(f"{query.stem}: seconds={seconds:.3f} rows={found.num_rows}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
