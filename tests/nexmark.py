"""Nexmark for the tests: its three streams, a small deterministic generator, its queries as the
nexmark project writes them for Flink SQL (tests/data/nexmark), and brute-force references.

The generator draws persons, auctions and bids over a few seconds of event time (prices from a
small range, so that maxima tie), and delivers each stream's events out of order: an event
arrives up to ``delay`` ms after its time, so punctuation ``now - delay`` is honest. The
references evaluate each query's definition over all the events at once, in plain Python, as
Flink defines it (inclusive BETWEEN, HOP's slide first, sessions that merge when they touch);
they share no code with lowtide. Where Flink leaves a choice (ROW_NUMBER over tied sort keys),
the reference accepts every answer Flink allows (``Ranked``); float results compare at 9
significant digits (``settled``), as lowtide and Python may round a mean differently.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

QUERIES = Path(__file__).parent / "data" / "nexmark"
BASE = 1_600_000_000_000  # ms, a multiple of every window below

# The columns of nexmark-flink's ddl_views.sql (its person, auction and bid views), as lowtide
# types them; bench/nexmark_engine.py reads the same file.
SCHEMAS: dict[str, dict[str, str]] = json.loads((QUERIES / "schemas.json").read_text(encoding="utf-8"))

Row = dict[str, Any]


def query(number: int) -> str:
    """Nexmark query ``number`` as Flink SQL users write it."""
    return (QUERIES / f"q{number}.sql").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Events:
    """Each stream's events (``dateTime`` and ``expires`` in ms) and their arrival times."""

    rows: dict[str, list[Row]]
    arrival: dict[str, list[int]]
    delay: int


def generate(seed: int, seconds: int = 40, bids_per_second: int = 25, delay: int = 1500) -> Events:
    rng = random.Random(seed)
    span = seconds * 1000
    people = [1000 + i for i in range(max(4, seconds // 2))]
    rows: dict[str, list[Row]] = {"person": [], "auction": [], "bid": []}
    for pid in people:
        rows["person"].append(
            {
                "id": pid,
                "name": rng.choice(["ann", "bob", "cy", "di"]),
                "emailAddress": f"p{pid}@x.org",
                "creditCard": f"{pid:04d}",
                "city": rng.choice(["Boise", "Bend", "Davis"]),
                "state": rng.choice(["OR", "ID", "CA", "WA"]),
                "dateTime": BASE + rng.randrange(span),
                "extra": "",
            }
        )
    auctions = [2000 + i for i in range(max(4, seconds))]
    for aid in auctions:
        start = BASE + rng.randrange(span)
        rows["auction"].append(
            {
                "id": aid,
                "itemName": f"item{aid}",
                "description": "d",
                "initialBid": rng.randrange(1, 10),
                "reserve": rng.randrange(10, 20),
                "dateTime": start,
                "expires": start + rng.randrange(1000, 15000),
                "seller": rng.choice(people),
                "category": rng.randrange(10, 13),
                "extra": "",
            }
        )
    for _ in range(seconds * bids_per_second):
        rows["bid"].append(
            {
                "auction": rng.choice(auctions),
                "bidder": rng.choice(people),
                "price": rng.choice([rng.randrange(1, 60), rng.randrange(5_000, 2_000_000)]),
                "channel": rng.choice(["apple", "google", "baidu"]),
                "url": f"https://x.org/a/{rng.randrange(3)}/b{rng.randrange(3)}/c",
                "dateTime": BASE + rng.randrange(span),
                "extra": rng.choice(["", "cc", "abc"]),
            }
        )
    arrival = {s: [r["dateTime"] + rng.randrange(delay + 1) for r in rs] for s, rs in rows.items()}
    return Events(rows, arrival, delay)


def deliveries(events: Events, seed: int, most: int = 40) -> Iterator[tuple[str, list[Row], int]]:
    """``(stream, rows, punctuation)`` in arrival order, batches of 1 to ``most`` rows of one
    stream; the punctuation holds for every stream once the batch is in."""
    rng = random.Random(seed)
    order = sorted(
        ((t, s, i) for s, ts in events.arrival.items() for i, t in enumerate(ts)),
        key=lambda x: (x[0], x[1], x[2]),
    )
    at = 0
    while at < len(order):
        stream = order[at][1]
        end = at
        limit = at + rng.randrange(1, most + 1)
        while end < len(order) and end < limit and order[end][1] == stream:
            end += 1
        now = order[end - 1][0]
        yield stream, [events.rows[stream][i] for _, _, i in order[at:end]], now - events.delay
        at = end


def arrow(stream: str, rows: list[Row]) -> Any:
    """``rows`` of ``stream`` as an Arrow table of its schema."""
    import pyarrow as pa

    types = {"int64": pa.int64(), "string": pa.string(), "timestamp[ms]": pa.timestamp("ms")}
    return pa.Table.from_pylist(rows, schema=pa.schema([(c, types[t]) for c, t in SCHEMAS[stream].items()]))


def ms(value: Any) -> Any:
    """A result value as the references write it: timestamps as epoch milliseconds."""
    if isinstance(value, datetime):
        return int(value.replace(tzinfo=value.tzinfo or UTC).timestamp() * 1000)
    return value


def settled(value: Any) -> Any:
    """``value``, a float rounded to 9 significant digits: a mean's last bits depend on how it
    is summed, and results must compare as equal."""
    return float(f"{value:.9g}") if isinstance(value, float) else value


def multiset(rows: list[Row], columns: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(settled(ms(r[c])) for c in columns) for r in rows)


# ---- references (Flink's definitions) -----------------------------------------------------------

# The result columns each reference gives, by query.
COLUMNS: dict[int, list[str]] = {
    4: ["category", "AVG(Q.final)"],
    5: ["auction", "num"],
    7: ["auction", "price", "bidder", "dateTime", "extra"],
    8: ["id", "name", "starttime"],
    9: [*SCHEMAS["auction"], "auction", "bidder", "price", "bid_dateTime", "bid_extra"],
    11: ["bidder", "bid_count", "starttime", "endtime"],
    18: [*SCHEMAS["bid"]],
    19: [*SCHEMAS["bid"], "rank_number"],
}


class Ranked(Counter[tuple[Any, ...]]):
    """``ROW_NUMBER() OVER (PARTITION BY partition ORDER BY order) <= n`` over ``rows``, as Flink
    defines it: rows whose sort keys tie are numbered in any order, so at rank ``n`` any of them may
    be kept. The counts are one such answer (ties broken by the row); equality accepts any answer
    that keeps, of each partition, rows whose keys are its ``n`` best, no row more often than the
    partition holds it (numbered 1, 2, ... in key order, the number last, if ``numbered``)."""

    def __init__(
        self,
        rows: Iterable[tuple[Any, ...]],
        partition: Callable[[tuple[Any, ...]], Any],
        order: Callable[[tuple[Any, ...]], Any],
        n: int,
        numbered: bool,
    ) -> None:
        super().__init__()
        self.partition, self.order, self.n, self.numbered = partition, order, n, numbered
        self.groups: dict[Any, Counter[tuple[Any, ...]]] = defaultdict(Counter)
        for row in rows:
            self.groups[partition(row)][row] += 1
        for group in self.groups.values():
            kept = sorted(group.elements(), key=lambda r: (order(r), r))[:n]
            for rank, row in enumerate(kept, 1):
                self[(*row, rank) if numbered else row] += 1

    # Python tries a subclass's reflected __eq__ first, so ``multiset(...) == Ranked(...)`` lands here.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Counter):
            return NotImplemented
        picked: dict[Any, list[tuple[Any, ...]]] = defaultdict(list)
        for row in other.elements():
            picked[self.partition(row[:-1] if self.numbered else row)].append(row)
        return picked.keys() <= self.groups.keys() and all(
            self._allows(group, picked[key]) for key, group in self.groups.items()
        )

    def _allows(self, group: Counter[tuple[Any, ...]], picked: list[tuple[Any, ...]]) -> bool:
        best = sorted(map(self.order, group.elements()))[: self.n]
        if self.numbered:
            picked.sort(key=lambda r: r[-1])
            if [r[-1] for r in picked] != list(range(1, len(best) + 1)):
                return False
            picked = [r[:-1] for r in picked]
        else:
            picked.sort(key=self.order)
        return [self.order(r) for r in picked] == best and not Counter(picked) - group


def hop_windows(ts: int, slide: int, size: int) -> list[int]:
    """The starts of the HOP windows [s, s + size) that hold ts (s a multiple of slide)."""
    first = (ts - size) // slide * slide + slide
    return list(range(first, ts + 1, slide)) if first <= ts else []


def q5(events: Events) -> Counter[tuple[Any, ...]]:
    counts: Counter[tuple[int, int]] = Counter()
    for b in events.rows["bid"]:
        for start in hop_windows(b["dateTime"], 2000, 10000):
            counts[(start, b["auction"])] += 1
    best: dict[int, int] = defaultdict(int)
    for (start, _), n in counts.items():
        best[start] = max(best[start], n)
    return Counter((auction, n) for (start, auction), n in counts.items() if n >= best[start])


def q7(events: Events) -> Counter[tuple[Any, ...]]:
    top: dict[int, int] = {}
    for b in events.rows["bid"]:
        end = b["dateTime"] // 10000 * 10000 + 10000
        top[end] = max(top.get(end, b["price"]), b["price"])
    out: Counter[tuple[Any, ...]] = Counter()
    for b in events.rows["bid"]:
        for end, price in top.items():
            if b["price"] == price and end - 10000 <= b["dateTime"] <= end:
                out[(b["auction"], b["price"], b["bidder"], b["dateTime"], b["extra"])] += 1
    return out


def q8(events: Events) -> Counter[tuple[Any, ...]]:
    people = {(p["id"], p["name"], p["dateTime"] // 10000 * 10000) for p in events.rows["person"]}
    sellers = {(a["seller"], a["dateTime"] // 10000 * 10000) for a in events.rows["auction"]}
    return Counter((pid, name, start) for pid, name, start in people if (pid, start) in sellers)


def q11(events: Events, gap: int = 10000) -> Counter[tuple[Any, ...]]:
    """Flink's sessions: [t, t + gap) per tuple, merged while they intersect (touching included)."""
    by_bidder: dict[int, list[int]] = defaultdict(list)
    for b in events.rows["bid"]:
        by_bidder[b["bidder"]].append(b["dateTime"])
    out: Counter[tuple[Any, ...]] = Counter()
    for bidder, times in by_bidder.items():
        times.sort()
        start, last, n = times[0], times[0], 1
        for t in times[1:]:
            if t <= last + gap:
                last, n = t, n + 1
            else:
                out[(bidder, n, start, last + gap)] += 1
                start, last, n = t, t, 1
        out[(bidder, n, start, last + gap)] += 1
    return out


def _auction_bids(events: Events) -> Iterator[tuple[Row, Row]]:
    """``auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires``."""
    bids: dict[int, list[Row]] = defaultdict(list)
    for b in events.rows["bid"]:
        bids[b["auction"]].append(b)
    for a in events.rows["auction"]:
        for b in bids[a["id"]]:
            if a["dateTime"] <= b["dateTime"] <= a["expires"]:
                yield a, b


def q4(events: Events) -> Counter[tuple[Any, ...]]:
    final: dict[tuple[int, int], int] = {}
    for a, b in _auction_bids(events):
        key = (a["id"], a["category"])
        final[key] = max(final.get(key, b["price"]), b["price"])
    by_category: dict[int, list[int]] = defaultdict(list)
    for (_, category), price in final.items():
        by_category[category].append(price)
    return Counter((category, settled(sum(ps) / len(ps))) for category, ps in by_category.items())


def q9(events: Events) -> Ranked:
    rows = (
        (
            *(a[c] for c in SCHEMAS["auction"]),
            b["auction"],
            b["bidder"],
            b["price"],
            b["dateTime"],
            b["extra"],
        )
        for a, b in _auction_bids(events)
    )
    return Ranked(rows, partition=lambda r: r[0], order=lambda r: (-r[12], r[13]), n=1, numbered=False)


def q18(events: Events) -> Ranked:
    rows = (tuple(b[c] for c in SCHEMAS["bid"]) for b in events.rows["bid"])
    return Ranked(rows, partition=lambda r: (r[1], r[0]), order=lambda r: -r[5], n=1, numbered=False)


def q19(events: Events) -> Ranked:
    rows = (tuple(b[c] for c in SCHEMAS["bid"]) for b in events.rows["bid"])
    return Ranked(rows, partition=lambda r: r[0], order=lambda r: -r[2], n=10, numbered=True)
