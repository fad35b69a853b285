"""Nexmark's events as nexmark-flink's generator models them, in numpy, with bounded disorder:
what ``lowtide nexmark`` sends to a server and bench/nexmark.py gives lowtide and Flink alike.

The model is github.com/nexmark/nexmark at 6b3646c, nexmark-flink's ``generator`` package
(GeneratorConfig, NexmarkGenerator, model/*Generator) with NexmarkConfiguration's defaults:

- Event number ``e`` (0, 1, ...) is a person, an auction or a bid by its place in a cycle of 50:
  1 person, then 3 auctions, then 46 bids. Its time is ``base_ms + int(e * 1e6 / rate) // 1000``.
- Persons and auctions take the next id (from 1000). An auction's seller is, 3 times in 4, the
  hot seller (the first person of the current batch of 100), else one of the last 1000 persons
  or the next 10 (a person not generated yet: the model's lead). A bid is, 1 time in 2, on the
  hot auction (the first of the current batch of 100 auctions), else on one of the last 101
  auctions (the 100 in flight and the newest) or the next 10; its bidder is, 3 times in 4, the
  hot bidder (the second person of the current batch of 100), else drawn as a seller is.
- Prices are ``round(10 ** U(0, 6) * 100)``; an auction's reserve is its initial bid plus a price,
  its category one of 10..14, its length uniform in ``[1, 2 * horizon]`` ms, the horizon being the
  event time the next 100 auctions take. Channels: half the bids on Google, Facebook, Baidu or
  Apple with a fixed url each, the others on one of 10,000 ``channel-i``, 9 in 10 of whose urls
  carry ``&channel_id=<abs(Integer.reverse(i))>``. Names, cities, states, credit cards, emails,
  item names and descriptions come from the model's lists and string shapes; each row's ``extra``
  pads it to the model's average size (person 200, auction 500, bid 100 bytes), cut from one
  reusable MiB of random letters.

Java's random streams are not reproduced: every draw comes from numpy generators seeded by
``seed``, so ``generate`` is a function of its arguments. Where the model deviates from its own
comment, the comment wins: nexmark-flink adds FIRST_PERSON_ID to a bid's bidder twice, naming
persons 1000 ids ahead; here a bidder is a person id as a seller is.

Disorder, which nexmark's source does not make (it emits in event-number order): event ``e``
arrives at ``dateTime + d`` ms, ``d`` uniform in ``[0, disorder_ms]``, ties in event-number order.
So every event arriving after another has ``dateTime >= its own arrival - disorder_ms >= the
other's arrival - disorder_ms >= every dateTime arrived so far - disorder_ms``: the punctuation
after each arrival is the largest ``dateTime`` so far, in any stream, minus ``disorder_ms``, the
watermark ``dateTime - disorder_ms`` of nexmark's ddl over its one source of all three streams
(Flink reading each stream on its own holds each stream's watermark at or below it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

STREAMS: tuple[str, str, str] = ("person", "auction", "bid")
PERSON, AUCTION, BID = 0, 1, 2  # indices into STREAMS

# nexmark-flink's ddl_views.sql, as tests/data/nexmark/schemas.json types it.
SCHEMAS: dict[str, pa.Schema] = {
    "person": pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("emailAddress", pa.string()),
            ("creditCard", pa.string()),
            ("city", pa.string()),
            ("state", pa.string()),
            ("dateTime", pa.timestamp("ms")),
            ("extra", pa.string()),
        ]
    ),
    "auction": pa.schema(
        [
            ("id", pa.int64()),
            ("itemName", pa.string()),
            ("description", pa.string()),
            ("initialBid", pa.int64()),
            ("reserve", pa.int64()),
            ("dateTime", pa.timestamp("ms")),
            ("expires", pa.timestamp("ms")),
            ("seller", pa.int64()),
            ("category", pa.int64()),
            ("extra", pa.string()),
        ]
    ),
    "bid": pa.schema(
        [
            ("auction", pa.int64()),
            ("bidder", pa.int64()),
            ("price", pa.int64()),
            ("channel", pa.string()),
            ("url", pa.string()),
            ("dateTime", pa.timestamp("ms")),
            ("extra", pa.string()),
        ]
    ),
}

# GeneratorConfig and NexmarkConfiguration's defaults.
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID = 1000, 1000, 10
NUM_ACTIVE_PEOPLE, NUM_IN_FLIGHT_AUCTIONS = 1000, 100
HOT_AUCTION_RATIO, HOT_SELLERS_RATIO, HOT_BIDDERS_RATIO = 2, 4, 4
AVG_PERSON_BYTES, AVG_AUCTION_BYTES, AVG_BID_BYTES = 200, 500, 100
# The model's constants (PersonGenerator, AuctionGenerator, BidGenerator, StringsGenerator).
PERSON_ID_LEAD = AUCTION_ID_LEAD = 10
HOT_BATCH = 100  # HOT_SELLER_RATIO, HOT_AUCTION_RATIO, HOT_BIDDER_RATIO of the model classes
NUM_CATEGORIES = 5
CHANNELS_NUMBER = 10_000
HOT_CHANNELS_RATIO = 2
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
MIN_STRING_LENGTH = 3
REUSABLE_EXTRA_BYTES = 1 << 20
# Rows per Arrow chunk of a string column: its offsets are int32, and no row here nears 2 KiB.
CHUNK_ROWS = 1 << 20
CARD_BYTES = 19  # "%04d %04d %04d %04d"

Columns = dict[str, pa.ChunkedArray | np.ndarray]


@dataclass(frozen=True)
class Events:
    """Nexmark's three streams, each a table in arrival order, and how their arrivals interleave.

    ``stream[k]`` (an index into STREAMS) and ``row[k]`` (a row of that stream's table) are the
    k-th arrival overall; ``punctuation_ms[k]`` is honest after it: no row arriving later, in any
    stream, has ``dateTime`` below it.
    """

    events: int
    seed: int
    rate: int
    disorder_ms: int
    base_ms: int
    tables: dict[str, pa.Table]
    arrival_ms: dict[str, np.ndarray]  # each row's arrival, by stream, in its table's order
    stream: np.ndarray
    row: np.ndarray
    punctuation_ms: np.ndarray

    @property
    def person(self) -> pa.Table:
        return self.tables["person"]

    @property
    def auction(self) -> pa.Table:
        return self.tables["auction"]

    @property
    def bid(self) -> pa.Table:
        return self.tables["bid"]

    def params(self) -> dict[str, int]:
        return {
            "events": self.events,
            "seed": self.seed,
            "rate": self.rate,
            "disorder_ms": self.disorder_ms,
            "base_ms": self.base_ms,
        }


def generate(
    events: int, seed: int = 0, rate: int = 10_000, disorder_ms: int = 0, base_ms: int = 1_600_000_000_000
) -> Events:
    """``events`` Nexmark events at ``rate`` per second of event time from ``base_ms``, each
    arriving up to ``disorder_ms`` after its time (the module docstring has the model)."""
    if events < 0 or rate <= 0 or disorder_ms < 0:
        raise ValueError(f"need events >= 0, rate > 0, disorder_ms >= 0: {events}, {rate}, {disorder_ms}")
    statics, delays, *draws = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5))
    number = np.arange(events, dtype=np.int64)
    times = _time(number, rate, base_ms)
    arrival = times + delays.integers(0, disorder_ms + 1, events)
    merged = np.argsort(arrival, kind="stable")  # event numbers in arrival order
    offset = merged % TOTAL_PROPORTION
    kind = np.where(
        offset < PERSON_PROPORTION,
        PERSON,
        np.where(offset < PERSON_PROPORTION + AUCTION_PROPORTION, AUCTION, BID),
    )
    kind = kind.astype(np.int8)
    row = np.empty(events, dtype=np.int64)
    reusable = _letters(statics, REUSABLE_EXTRA_BYTES)
    channels, urls = _channels(statics)
    makers: dict[int, Callable[[np.ndarray], Columns]] = {
        PERSON: lambda e: _persons(e, draws[PERSON], reusable),
        AUCTION: lambda e: _auctions(e, rate, base_ms, draws[AUCTION], reusable),
        BID: lambda e: _bids(e, draws[BID], reusable, channels, urls),
    }
    tables: dict[str, pa.Table] = {}
    arrivals: dict[str, np.ndarray] = {}
    for index, name in enumerate(STREAMS):
        mine = kind == index
        row[mine] = np.arange(np.count_nonzero(mine))
        numbers = merged[mine]
        columns = makers[index](numbers)
        columns["dateTime"] = times[numbers].astype("datetime64[ms]")
        schema = SCHEMAS[name]
        tables[name] = pa.table([columns[f.name] for f in schema], schema=schema)
        arrivals[name] = arrival[numbers]
    punctuation = np.maximum.accumulate(times[merged]) - disorder_ms
    return Events(events, seed, rate, disorder_ms, base_ms, tables, arrivals, kind, row, punctuation)


def write_parquet(events: Events, directory: str | Path) -> None:
    """person.parquet, auction.parquet and bid.parquet (rows in arrival order) and params.json
    (``generate``'s arguments and each stream's row count) in ``directory``."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in events.tables.items():
        pq.write_table(table, folder / f"{name}.parquet")
    params: dict[str, object] = {**events.params(), "rows": {n: t.num_rows for n, t in events.tables.items()}}
    (folder / "params.json").write_text(json.dumps(params, indent=2) + "\n", encoding="utf-8")


def batches(events: Events, size: int) -> Iterator[tuple[str, pa.Table, int]]:
    """``(stream, table, punctuation_ms)`` in arrival order: the arrivals are cut into runs of
    ``size`` (all streams counted), and each run gives one batch a stream it holds rows of (that
    stream's next rows, persons first, bids last). Each ``punctuation_ms`` is honest for all three
    streams after its batch: the run's last punctuation, or below it the least ``dateTime`` of the
    run's batches still to come."""
    if size <= 0:
        raise ValueError(f"batch size must be positive: {size}")
    times = {name: pc.cast(t["dateTime"], pa.int64()).to_numpy() for name, t in events.tables.items()}
    done = dict.fromkeys(STREAMS, 0)
    for start in range(0, events.events, size):
        end = min(start + size, events.events)
        counts = np.bincount(events.stream[start:end], minlength=len(STREAMS))
        present = [i for i in range(len(STREAMS)) if counts[i]]
        last = int(events.punctuation_ms[end - 1])
        for place, index in enumerate(present):
            name = STREAMS[index]
            first, stop = done[name], done[name] + int(counts[index])
            done[name] = stop
            after = [
                times[STREAMS[i]][done[STREAMS[i]] : done[STREAMS[i]] + counts[i]]
                for i in present[place + 1 :]
            ]
            punctuation = min([last] + [int(t.min()) for t in after])
            yield name, events.tables[name].slice(first, stop - first), punctuation


def _time(number: np.ndarray, rate: int, base_ms: int) -> np.ndarray:
    """GeneratorConfig.timestampForEvent: ``(long) (e * interEventDelayUs) / 1000``."""
    return base_ms + (number * (1_000_000.0 / rate)).astype(np.int64) // 1000


def _last_person(number: np.ndarray) -> np.ndarray:
    """PersonGenerator.lastBase0PersonId: the person of this cycle (which comes first in it)."""
    epoch, offset = np.divmod(number, TOTAL_PROPORTION)
    return epoch * PERSON_PROPORTION + np.minimum(offset, PERSON_PROPORTION - 1)


def _last_auction(number: np.ndarray) -> np.ndarray:
    """AuctionGenerator.lastBase0AuctionId, for auctions and bids (a cycle's auctions precede its
    bids)."""
    epoch, offset = np.divmod(number, TOTAL_PROPORTION)
    last: np.ndarray = epoch * AUCTION_PROPORTION + np.minimum(
        offset - PERSON_PROPORTION, AUCTION_PROPORTION - 1
    )
    return last


def _some_person(last: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """PersonGenerator.nextBase0PersonId: one of the last NUM_ACTIVE_PEOPLE or the next
    PERSON_ID_LEAD."""
    people = last + 1
    active = np.minimum(people, NUM_ACTIVE_PEOPLE)
    person: np.ndarray = people - active + rng.integers(0, active + PERSON_ID_LEAD)
    return person


def _hot_or(ratio: int, hot: np.ndarray, other: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``hot`` where ``nextInt(ratio) > 0`` (1 - 1/ratio of the rows), else ``other``."""
    return np.where(rng.integers(0, ratio, len(hot)) > 0, hot, other)


def _price(rng: np.random.Generator, n: int) -> np.ndarray:
    """PriceGenerator.nextPrice, Math.round being floor(x + 0.5)."""
    return np.floor(10.0 ** (rng.random(n) * 6.0) * 100.0 + 0.5).astype(np.int64)


def _letters(rng: np.random.Generator, n: int, special: int | None = None) -> np.ndarray:
    """``n`` random lowercase letters; with ``special``, each is that byte with chance 1/13
    (StringsGenerator.nextString)."""
    chars = rng.integers(ord("a"), ord("z") + 1, n, dtype=np.uint8)
    if special is not None:
        chars[rng.integers(0, 13, n) == 0] = special
    return chars


def _pack(lengths: np.ndarray, fill: Callable[[int], np.ndarray]) -> pa.ChunkedArray:
    """Strings of ``lengths`` bytes, ``fill(n)`` giving each chunk's ``n`` bytes end to end."""
    chunks = []
    for start in range(0, len(lengths), CHUNK_ROWS):
        part = lengths[start : start + CHUNK_ROWS]
        offsets = np.zeros(len(part) + 1, dtype=np.int32)
        np.cumsum(part, out=offsets[1:])
        data = fill(int(offsets[-1]))
        chunks.append(pa.StringArray.from_buffers(len(part), pa.py_buffer(offsets), pa.py_buffer(data)))
    return pa.chunked_array(chunks, pa.string())


def _take(values: pa.Array, index: np.ndarray) -> pa.ChunkedArray:
    """``values[index]``, chunked as ``_pack`` chunks."""
    return pa.chunked_array(
        [values.take(index[s : s + CHUNK_ROWS]) for s in range(0, len(index), CHUNK_ROWS)], pa.string()
    )


def _next_string(rng: np.random.Generator, n: int, max_length: int, special: str = " ") -> pa.ChunkedArray:
    """StringsGenerator.nextString: 3 to ``max_length - 1`` letters, some ``special``, trimmed."""
    lengths = MIN_STRING_LENGTH + rng.integers(0, max_length - MIN_STRING_LENGTH, n)
    strings = _pack(lengths, lambda k: _letters(rng, k, ord(special)))
    return pc.utf8_trim(strings, characters=" ") if special == " " else strings


def _lengths(strings: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.binary_length(strings).to_numpy(), dtype=np.int64)


def _extra(rng: np.random.Generator, size: np.ndarray, average: int, reusable: np.ndarray) -> pa.ChunkedArray:
    """StringsGenerator.nextExtra: padding to ``average`` bytes on average (none past it), as
    slices of the reusable letters (here consecutive ones, from a random place a chunk)."""
    want = np.maximum(average - size, 0)
    delta = np.floor(want * 0.2 + 0.5).astype(np.int64)
    lengths = want - delta + rng.integers(0, np.maximum(2 * delta, 1)) * (delta > 0)

    def fill(n: int) -> np.ndarray:
        return np.resize(np.roll(reusable, -int(rng.integers(0, len(reusable)))), n)

    return _pack(lengths, fill)


def _strings(values: tuple[str, ...] | list[str]) -> pa.Array:
    return pa.array(values, pa.string())


def _channels(rng: np.random.Generator) -> tuple[pa.Array, pa.Array]:
    """BidGenerator's channels and their urls: the 4 hot ones, then its cache of CHANNELS_NUMBER."""
    urls = _base_urls(rng, len(HOT_CHANNELS) + CHANNELS_NUMBER)
    i = np.arange(CHANNELS_NUMBER, dtype=np.int64)
    reversed_bits = np.zeros(CHANNELS_NUMBER, dtype=np.int64)
    for bit in range(32):
        reversed_bits |= ((i >> bit) & 1) << (31 - bit)
    signed = np.where(reversed_bits >= 1 << 31, reversed_bits - (1 << 32), reversed_bits)
    # Java's Math.abs leaves Integer.MIN_VALUE (channel 1's reversed bits) negative.
    channel_id = np.where(signed == -(1 << 31), signed, np.abs(signed))
    cached = urls[len(HOT_CHANNELS) :]
    with_id = pc.binary_join_element_wise(cached, pc.cast(pa.array(channel_id), pa.string()), "&channel_id=")
    cached = pc.if_else(pa.array(rng.integers(0, 10, CHANNELS_NUMBER) > 0), with_id, cached)
    names = pc.binary_join_element_wise("channel", pc.cast(pa.array(i), pa.string()), "-")
    channels = pa.concat_arrays([_strings(HOT_CHANNELS), names])
    return channels, pa.concat_arrays([urls[: len(HOT_CHANNELS)], cached])


def _base_urls(rng: np.random.Generator, n: int) -> pa.Array:
    """BidGenerator.getBaseUrl."""
    parts = [_next_string(rng, n, 5, "_") for _ in range(3)]
    joined = pc.binary_join_element_wise("https://www.nexmark.com", *parts, "item.htm?query=1", "/")
    return joined.combine_chunks()


def _persons(number: np.ndarray, rng: np.random.Generator, reusable: np.ndarray) -> Columns:
    """PersonGenerator.nextPerson."""
    n = len(number)
    names = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
    name = rng.integers(0, len(names), n)
    email = pc.binary_join_element_wise(_next_string(rng, n, 7), _next_string(rng, n, 5), "@")
    email = pc.binary_join_element_wise(email, ".com", "")
    city, state = rng.integers(0, len(US_CITIES), n), rng.integers(0, len(US_STATES), n)

    def cards(size: int) -> np.ndarray:
        """Four "%04d" numbers with spaces between, 19 bytes a card."""
        count = size // CARD_BYTES
        digits = rng.integers(0, 10_000, (count, 4, 1)) // np.array([1000, 100, 10, 1]) % 10 + ord("0")
        card = np.full((count, 4, 5), ord(" "), dtype=np.uint8)
        card[:, :, :4] = digits
        return card.reshape(count, 20)[:, :CARD_BYTES].reshape(-1)

    size = (
        8
        + np.array([len(s) for s in names])[name]
        + _lengths(email)
        + CARD_BYTES
        + np.array([len(s) for s in US_CITIES])[city]
        + np.array([len(s) for s in US_STATES])[state]
    )
    return {
        "id": _last_person(number) + FIRST_PERSON_ID,
        "name": _take(_strings(names), name),
        "emailAddress": email,
        "creditCard": _pack(np.full(n, CARD_BYTES, dtype=np.int64), cards),
        "city": _take(_strings(US_CITIES), city),
        "state": _take(_strings(US_STATES), state),
        "extra": _extra(rng, size, AVG_PERSON_BYTES, reusable),
    }


def _auctions(
    number: np.ndarray, rate: int, base_ms: int, rng: np.random.Generator, reusable: np.ndarray
) -> Columns:
    """AuctionGenerator.nextAuction."""
    n = len(number)
    last_person = _last_person(number)
    seller = _hot_or(
        HOT_SELLERS_RATIO, last_person // HOT_BATCH * HOT_BATCH, _some_person(last_person, rng), rng
    )
    initial = _price(rng, n)
    times = _time(number, rate, base_ms)
    # nextAuctionLengthMs: the event time until numInFlightAuctions more auctions, twice, at most.
    horizon = _time(number + NUM_IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION // AUCTION_PROPORTION, rate, base_ms)
    expires = times + 1 + rng.integers(0, np.maximum((horizon - times) * 2, 1))
    item, description = _next_string(rng, n, 20), _next_string(rng, n, 100)
    size = 8 + _lengths(item) + _lengths(description) + 5 * 8
    return {
        "id": _last_auction(number) + FIRST_AUCTION_ID,
        "itemName": item,
        "description": description,
        "initialBid": initial,
        "reserve": initial + _price(rng, n),
        "expires": expires.astype("datetime64[ms]"),
        "seller": seller + FIRST_PERSON_ID,
        "category": FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, n),
        "extra": _extra(rng, size, AVG_AUCTION_BYTES, reusable),
    }


def _bids(
    number: np.ndarray, rng: np.random.Generator, reusable: np.ndarray, channels: pa.Array, urls: pa.Array
) -> Columns:
    """BidGenerator.nextBid."""
    n = len(number)
    last_auction = _last_auction(number)
    low = np.maximum(last_auction - NUM_IN_FLIGHT_AUCTIONS, 0)
    in_flight = low + rng.integers(0, last_auction - low + 1 + AUCTION_ID_LEAD)
    auction = _hot_or(HOT_AUCTION_RATIO, last_auction // HOT_BATCH * HOT_BATCH, in_flight, rng)
    last_person = _last_person(number)
    # The hot bidder is the second person of the batch, so that it is not the hot seller.
    hot_bidder = last_person // HOT_BATCH * HOT_BATCH + 1
    bidder = _hot_or(HOT_BIDDERS_RATIO, hot_bidder, _some_person(last_person, rng), rng)
    hot = rng.integers(0, len(HOT_CHANNELS), n)
    channel = _hot_or(HOT_CHANNELS_RATIO, hot, len(HOT_CHANNELS) + rng.integers(0, CHANNELS_NUMBER, n), rng)
    return {
        "auction": auction + FIRST_AUCTION_ID,
        "bidder": bidder + FIRST_PERSON_ID,
        "price": _price(rng, n),
        "channel": _take(channels, channel),
        "url": _take(urls, channel),
        "extra": _extra(rng, np.full(n, 4 * 8), AVG_BID_BYTES, reusable),
    }
