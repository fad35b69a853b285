"""How lowtide's rows and Flink's are compared, and Flink's rows got: one set of rules for the
test tier (tests/nexmark/test_nexmark_flink.py) and the bench (bench/nexmark.py).

Rows compare as multisets of tuples, in the select list's order, by position (Flink names an
unnamed expression ``EXPR$1``, lowtide by its text), without the window bounds and revision
lowtide gives every aggregate row; times as epoch ms, floats at 9 significant digits. Where the
two differ by definition:

* TRUNCATED: Flink's ``AVG`` of a ``BIGINT`` is a ``BIGINT``, the mean truncated (Java's long
  division); lowtide's avg is the mean (docs/queries.md). Compared truncated, so the rest of the
  row must still be equal.
* DECIDING: ``ROW_NUMBER``'s ties are each side's to break: compared by what decides the rank
  (the partition, the ORDER BY values) and the rank, which are the same whatever row wins a tie.

Imports nothing from lowtide. Callers put bench/nexmark on ``sys.path`` (``nexmark`` alone
names a test helper, a bench script and this folder).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "tests" / "data" / "nexmark"
FLINK_PYTHON = ROOT / ".venv-pyflink" / "bin" / "python"
ORACLE = ROOT / "bench" / "nexmark" / "flink_oracle.py"
# The queries both lowtide and Flink run (docs/nexmark.md says why not the others).
BOTH = (0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19, 22)
ADDED = ("window_start", "window_end")  # lowtide's bounds of an aggregate's row (and its revision)
TRUNCATED = {4: ("AVG(Q.final)",), 17: ("avg_price",)}
DECIDING = {
    9: ("id", "price", "bid_dateTime"),
    18: ("bidder", "auction", "dateTime"),
    19: ("auction", "price", "rank_number"),
}
Rows = Counter[tuple[Any, ...]]


def value(v: Any) -> Any:
    """A result value as both sides are compared: timestamps as epoch ms, floats at 9 digits (a
    mean's last bits depend on how it is summed)."""
    if isinstance(v, datetime):
        return int(v.replace(tzinfo=v.tzinfo or UTC).timestamp() * 1000)
    return float(f"{v:.9g}") if isinstance(v, float) else v


def lowtide_columns(columns: list[str]) -> list[str]:
    """The select list's columns of a lowtide result: without an aggregate row's bounds and revision."""
    if columns[:2] == list(ADDED) and columns[-1] == "revision":
        return columns[2:-1]
    return columns


def compared(number: int, columns: list[str], values: list[Any]) -> tuple[Any, ...]:
    """A row's values (in the select list's order, ``columns`` lowtide's names for them) as query
    ``number``'s comparison reads them."""
    if number in DECIDING:
        return tuple(values[columns.index(c)] for c in DECIDING[number])
    return tuple(values)


def lowtide_rows(number: int, columns: list[str], rows: Iterable[Mapping[str, Any]]) -> Rows:
    """lowtide's result rows of query ``number`` (``columns``: :func:`lowtide_columns`) as compared."""
    return in_order(number, columns, ([r[c] for c in columns] for r in rows))


def in_order(number: int, columns: list[str], rows: Iterable[Sequence[Any]]) -> Rows:
    """Rows of values in the select list's order (``columns``: lowtide's names for them) as
    compared: a mean that Flink truncates, truncated."""
    truncated = TRUNCATED.get(number, ())
    return Counter(
        compared(
            number,
            columns,
            [_truncated(v) if c in truncated else value(v) for c, v in zip(columns, row, strict=True)],
        )
        for row in rows
    )


def _truncated(mean: float) -> int:
    """A mean of integers as Java's long division gives it: toward zero. Rounded to 7 places
    first: a mean that is a whole number may come out of float arithmetic a hair below it, and a
    mean of up to 10^6 integers is a whole number or at least 10^-6 away from one."""
    return int(round(mean, 7))


def flink_rows(
    folder: Path, number: int, disorder_ms: int, out: Path, columns: list[str], timeout: float = 1800
) -> tuple[float, Rows]:
    """Flink's answer to query ``number`` over the events in ``folder`` (bench/nexmark/
    flink_oracle.py at parallelism 2, in .venv-pyflink), as compared with lowtide's rows of
    ``columns``; and its seconds from submitting the query to the job's end."""
    done = subprocess.run(
        [
            *(str(FLINK_PYTHON), str(ORACLE), "--data", str(folder)),
            *("--query", str(QUERIES / f"q{number}.sql"), "--out", str(out)),
            *("--parallelism", "2", "--watermark-ms", str(disorder_ms)),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"Flink failed on q{number}: {done.stderr[-3000:]}")
    seconds = float(next(w for w in done.stderr.split() if w.startswith("seconds=")).split("=")[1])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line]
    return seconds, Counter(compared(number, columns, [value(v) for v in row.values()]) for row in rows)


def difference(ours: Rows, theirs: Rows, other: str = "Flink") -> str:
    """ "exact", or how the two multisets differ, with one row as an example."""
    if ours == theirs:
        return "exact"
    extra, missing = ours - theirs, theirs - ours
    first = next(iter(extra or missing))
    only = f"{sum(extra.values())} rows only in lowtide, {sum(missing.values())} only in {other}"
    return f"DIFFERENT: {only}, e.g. {first}"
