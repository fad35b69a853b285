"""A small checkpoint holding every operator kind, kept as bytes in tests/data/checkpoints/: how a
build reads the saved forms of the builds before it (tests/unit/test_state_versions.py).

:data:`QUERIES` plan to every operator (shared slices read by two queries, both join stores,
sessions and windows under late ``update``); :data:`EVENTS` is one fixed delivery over two
streams and three sources - tuples out of order, punctuation that leaves tuples behind it, a
source closed - written out by formulas, so that every build replays it alike. Results leave
slowly (:data:`FLUSH`: queued results are state too). At call :data:`CUT` the rig
(tests/checkpoint.py) checkpoints every plan and share as a worker does.

To write this build's checkpoint (after a ``VERSION`` is bumped: as ``v<N>``, the older ones kept,
their test saying whether they migrate or are refused)::

    .venv/bin/python tests/checkpoint_fixture.py tests/data/checkpoints/v1

``v0`` was written by lowtide 7a199f7, before state versions (fields under their attribute names,
no versions), with this file and ``tests/`` copied into ``git archive 7a199f7``'s tree laid out
as the package (``lowtide/`` holding ``operators``, ``punctuation``, ``server``, ``clients``,
``proto``) and put first on ``PYTHONPATH``; this build cannot write it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

from checkpoint import Registration, Rig
from strategies import SCHEMA, Close, Event, Punct, Push, Row, Sources

from lowtide.operators.result_queue import SlowFlush

SOURCES: Sources = {"A": ("a0", "a1"), "B": ("b0",)}
SCHEMAS = {name: SCHEMA for name in SOURCES}
FLUSH = SlowFlush(every=2, max_windows=2)
FILE = "every_operator.ltstate"
DATA = Path(__file__).parent / "data" / "checkpoints"

QUERIES = [
    Registration(
        "tumble", "SELECT k1, count(*) AS n, sum(v) AS s, max(f) AS m [RANGE 10, WA ts] FROM A GROUP BY k1"
    ),
    Registration(
        "landmark", "SELECT k2, count(*) AS n, min(v) AS lo [RANGE ALL, SLIDE 5, WA ts] FROM A GROUP BY k2"
    ),
    Registration(
        "rows", "SELECT k1, sum(v) AS s [RANGE 4 rows, SLIDE 2 rows, WA row-num, PA k1] FROM A GROUP BY k1"
    ),
    Registration(
        "paned", "SELECT k2, sum(v) AS s, count(*) AS n [RANGE 8, SLIDE 2, WA ts] FROM A GROUP BY k2"
    ),
    Registration("paned2", "SELECT k2, max(v) AS m [RANGE 12, SLIDE 2, WA ts] FROM A GROUP BY k2"),
    Registration(
        "adapt", "SELECT k1, median(v) AS md, count(*) AS n [RANGE 9, SLIDE 3, WA ts] FROM A GROUP BY k1"
    ),
    Registration(
        "fused",
        "SELECT k1, count(*) AS n, sum(v) AS s [RANGE 6, SLIDE 2, WA ts] FROM A WHERE v > 2 GROUP BY k1",
    ),
    Registration(
        "join",
        "SELECT A.k1, A.v, B.k1 AS bk, B.v AS bv, B.ts "
        "FROM A [RANGE 5, WA ts], B [RANGE 5, WA ts] WHERE A.k2 = B.k2",
    ),
    Registration(
        "until",
        "SELECT A.k2, A.v, B.v AS bv, B.ts FROM A, B "
        "WHERE A.k2 = B.k2 AND B.ts BETWEEN A.ts - 2 AND A.v + 10",
    ),
    Registration(
        "by_tuple",
        "SELECT k1, count(*) AS n, median(v) AS md "
        "[RANGE 6, RATTR ts, SLIDE 2 rows, SATTR row-num] FROM A GROUP BY k1",
    ),
    Registration("distinct", "SELECT DISTINCT k1, ts FROM A WHERE v > 2"),
    Registration(
        "top_n",
        "SELECT *, RANK() OVER (PARTITION BY window_start, window_end ORDER BY v DESC) AS r "
        "FROM TABLE(TUMBLE(TABLE A, DESCRIPTOR(ts), INTERVAL '5' MILLISECOND))",
    ),
    Registration("union", "SELECT k1 AS key, v + 1 AS w, f, ts FROM A UNION B WHERE v > 1 AND k2 != 0"),
    Registration(
        "session", "SELECT k1, count(*) AS n, sum(v) AS s [SESSION 4, WA ts] FROM A GROUP BY k1", "update", 6
    ),
    Registration(
        "revisions",
        "SELECT k2, count(*) AS n, sum(f) AS sf [RANGE 10, SLIDE 5, WA ts] FROM B GROUP BY k2",
        "update",
        10,
    ),
]


def row(i: int, lag: int) -> Row:
    """Tuple ``i``: keys, values and nulls by formula; ts about ``i // 2`` back by up to ``lag``."""
    return {
        "k1": ["a", "b", "c", None][i % 4],
        "k2": (i * 5) % 4 - 1,
        "v": (i * 7) % 26 - 5,
        "f": None if i % 9 == 0 else ((i * 11) % 121 - 40) / 4,
        "b": i % 3 == 0,
        "ts": i // 2 - (i * 13) % (lag + 1),
    }


def events() -> list[Event]:
    out: list[Event] = []
    for step in range(10):
        a = tuple(row(i, 6) for i in range(8 * step, 8 * step + 8))
        b = tuple(row(i + 3, 3) for i in range(4 * step, 4 * step + 4))
        out += [Push("A", ("a0", "a1")[step % 2], a), Push("B", "b0", b)]
        # Punctuation a little ahead of the tuples: the next batches leave some behind it (late).
        out += [Punct("A", "a0", 4 * step + 1), Punct("A", "a1", 4 * step), Punct("B", "b0", 2 * step + 1)]
        if step == 6:
            out.append(Close("A", "a1"))
    out += [Push("A", "a0", tuple(row(i, 40) for i in range(80, 86))), Close("A", "a0"), Close("B", "b0")]
    return out


EVENTS = events()
CUT = 23  # mid-stream: windows, sessions, join stores and queued results held open


def rig() -> Rig:
    """A rig with every query of :data:`QUERIES` registered."""
    made = Rig(SCHEMAS, SOURCES, FLUSH)
    for registration in QUERIES:
        made.register(registration)
    return made


def write(directory: Path) -> Path:
    """This build's checkpoint of the rig at :data:`CUT`, written into ``directory``."""
    made = rig()
    for event in EVENTS[:CUT]:
        made.apply(event)
    made.drain()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE
    path.write_bytes(made.checkpoint())
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} tests/data/checkpoints/v<N>")
    print(write(Path(sys.argv[1])))
