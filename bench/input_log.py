"""What the input log's own end costs: appends with ``D/log/end`` kept against appends without.

``D/log/end`` (:mod:`lowtide.server.input_log`) is rewritten with every record (fsync "no" and
"everysec": a 36-byte slot copied into the mapped file after the record's ``write``), so that a log cut short,
even at a record boundary, is refused at start rather than read as a log that ended there. This
measures what that adds to an append, in one process, same run: records of ``--rows`` rows
(the Arrow bytes of a batch of that many ``(srcIP string, len int32, ts int64)`` rows) appended
to a fresh log in a scratch directory, ``--records`` of them, with the end kept (as the server
does) and with it skipped (the log before this change), in turn, ``--runs`` rounds, the order
reversed every other round; the median rate of each and the median of their ratio per round.
Also the start's extra work: finding the ``RefusedRecord`` records in each segment's bytes as it is
read, beside the whole replay.

    .venv/bin/python bench/input_log.py [--rows 100 1000 10000] [--records 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from lowtide.server.input_log import BatchRecord, InputLog, _refusals
from lowtide.server.journal import StateDirectory


def payload(rows: int) -> bytes:
    rng = np.random.default_rng(rows)
    table = pa.table(
        {
            "srcIP": pa.array([f"10.0.{i % 256}.{i % 7}" for i in range(rows)]),
            "len": pa.array(rng.integers(40, 1500, rows), pa.int32()),
            "ts": pa.array(np.arange(rows), pa.int64()),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def appends_per_second(scratch: Path, data: bytes, records: int, keep_end: bool) -> float:
    shutil.rmtree(scratch, ignore_errors=True)
    state = StateDirectory(str(scratch), "no")
    list(state.log.replay())
    state.log.recovered()
    if not keep_end:
        state.log._mark_end = lambda: None  # type: ignore[method-assign]  # the log before D/log/end
    batches = [BatchRecord(0.0, "S", "a", i + 1, (data,)) for i in range(records)]
    began = time.perf_counter()
    for record in batches:
        state.log.append(record)
    elapsed = time.perf_counter() - began
    state.close()
    return records / elapsed


def start_reads(scratch: Path) -> tuple[float, float]:
    """Seconds to find the RefusedRecord records in the bytes of the log in ``scratch`` (what a start's
    replay does for each segment it reads), and the whole replay, that search included."""
    log = InputLog(scratch / "log")
    segments = [path.read_bytes() for path in sorted((scratch / "log").glob("*.seg"))]
    began = time.perf_counter()
    for data in segments:
        _refusals(data)
    search = time.perf_counter() - began
    began = time.perf_counter()
    for _ in log.replay():
        pass
    return search, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="lowtide-bench-log-")) / "state"
    print(f"{'rows/record':>11} {'bytes/record':>12} {'with end':>14} {'without':>14} {'ratio':>6}")
    try:
        for rows in args.rows:
            data = payload(rows)
            records = max(200, args.records * 100 // max(rows, 100))
            kept: list[float] = []
            skipped: list[float] = []
            ratios: list[float] = []
            for run in range(args.runs):
                order = (True, False) if run % 2 == 0 else (False, True)
                rates = {keep: appends_per_second(scratch, data, records, keep) for keep in order}
                kept.append(rates[True])
                skipped.append(rates[False])
                ratios.append(rates[True] / rates[False])
            print(
                f"{rows:>11,} {len(data):>12,} {statistics.median(kept):>10,.0f} r/s "
                f"{statistics.median(skipped):>10,.0f} r/s {statistics.median(ratios):>6.3f}"
            )
        appends_per_second(scratch, payload(args.rows[-1]), 2_000, True)
        size = sum(path.stat().st_size for path in (scratch / "log").glob("*.seg"))
        search, replay = start_reads(scratch)
        print(
            f"start, {size / 1e6:.0f} MB of log: replay {replay * 1e3:.0f} ms, of which {search * 1e3:.1f} ms"
        )
        print("  finding the RefusedRecord records in the segments' bytes")
    finally:
        shutil.rmtree(scratch.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
