"""lowtide.clients.nexmark: Nexmark's events as nexmark-flink's generator models them (the
cycle of 1 person, 3 auctions and 46 bids, its ids, hot keys, channels and strings), the same
bytes for the same seed, and arrivals whose disorder stays within the bound that the
punctuation it gives (and that of its batches) relies on.

The expected figures come from the model's definitions (nexmark-flink's generator at 6b3646c),
derived in the comments; at ``rate=1000`` each event has its own millisecond, so an event's
number is its ``dateTime - base_ms`` and what came before it is what has a smaller time.
"""

from __future__ import annotations

import io
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lowtide.clients import nexmark as gen

ROOT = Path(__file__).resolve().parents[2]
BASE = 1_600_000_000_000


@cache
def events(n: int = 50_000, seed: int = 0, rate: int = 10_000, disorder_ms: int = 0) -> Any:
    return gen.generate(n, seed=seed, rate=rate, disorder_ms=disorder_ms, base_ms=BASE)


def ints(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.cast(column, pa.int64()).to_numpy())


def strings(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_pylist(), dtype=object)


def test_columns_and_types_are_those_of_schemas_json() -> None:
    expected = json.loads((ROOT / "tests/data/nexmark/schemas.json").read_text(encoding="utf-8"))
    got = events(1_000).tables
    assert list(got) == list(expected)
    for stream, columns in expected.items():
        assert [(f.name, str(f.type)) for f in got[stream].schema] == list(columns.items())


def _bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    one, two = (gen.generate(20_000, seed=3, rate=5_000, disorder_ms=200) for _ in range(2))
    other = gen.generate(20_000, seed=4, rate=5_000, disorder_ms=200)
    for stream in ("person", "auction", "bid"):
        assert _bytes(one.tables[stream]) == _bytes(two.tables[stream])
        assert _bytes(one.tables[stream]) != _bytes(other.tables[stream])
        assert np.array_equal(one.arrival_ms[stream], two.arrival_ms[stream])
    for field in ("stream", "row", "punctuation_ms"):
        assert np.array_equal(getattr(one, field), getattr(two, field))
    gen.write_parquet(one, tmp_path / "one")
    gen.write_parquet(two, tmp_path / "two")
    for name in ("person.parquet", "auction.parquet", "bid.parquet", "params.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    params = json.loads((tmp_path / "one/params.json").read_text(encoding="utf-8"))
    assert params["seed"] == 3 and params["rate"] == 5_000 and params["disorder_ms"] == 200
    assert pq.read_table(tmp_path / "one/bid.parquet").equals(one.tables["bid"])


def test_each_cycle_of_50_events_is_1_person_3_auctions_46_bids() -> None:
    ev = events(50_010, rate=1_000)  # 1000 cycles, then 1 person, 3 auctions and 6 bids
    assert {s: t.num_rows for s, t in ev.tables.items()} == {"person": 1_001, "auction": 3_003, "bid": 46_006}
    number = {s: np.sort(ints(t["dateTime"]) - BASE) for s, t in ev.tables.items()}
    assert np.array_equal(np.sort(np.concatenate(list(number.values()))), np.arange(50_010))
    assert set(number["person"] % 50) == {0}
    assert set(number["auction"] % 50) == {1, 2, 3}
    assert set(number["bid"] % 50) == set(range(4, 50))
    # Persons and auctions take the next id, from 1000, in event order.
    for stream in ("person", "auction"):
        table = ev.tables[stream]
        by_time = np.argsort(ints(table["dateTime"]))
        assert np.array_equal(table["id"].to_numpy()[by_time], 1_000 + np.arange(table.num_rows))


def test_event_time_follows_the_event_number_at_the_rate() -> None:
    ev = events(30_000, rate=3_000)
    got = np.sort(np.concatenate([ints(t["dateTime"]) for t in ev.tables.values()]))
    # Java: baseTime + (long) (n * (1e6 / rate)) / 1000, n = 0, 1, ...
    expected = [BASE + int(n * (1_000_000.0 / 3_000)) // 1000 for n in range(30_000)]
    assert got.tolist() == expected


def test_hot_keys_take_the_shares_the_ratios_give() -> None:
    ev = events()
    # A bid is on the hot auction (the first of the current batch of 100 auctions, an id that is
    # a multiple of 100 as 1000 is) when nextInt(hotAuctionRatio = 2) > 0: 1/2. Otherwise it is
    # uniform over the last 101 auctions and the next 10, 111 ids, and over a residue of the
    # last auction modulo 100 these hold 1.11 multiples of 100 on average: 1.11 / 111 = 1/100.
    # So 1/2 + 1/2 * 1/100 = 0.505 of bids name a multiple of 100 (standard error 0.0023).
    assert abs(np.mean(ev.bid["auction"].to_numpy() % 100 == 0) - 0.505) < 0.01
    # The hot bidder (second person of the current batch of 100: id % 100 == 1) when
    # nextInt(hotBiddersRatio = 4) > 0: 3/4; else one of the last 1000 persons and the next 10,
    # 1 in 100 of them with that residue: 3/4 + 1/4 * 1/100 = 0.7525 (standard error 0.002).
    assert abs(np.mean(ev.bid["bidder"].to_numpy() % 100 == 1) - 0.7525) < 0.01
    # The hot seller (the first person of the batch: id % 100 == 0), hotSellersRatio = 4:
    # 0.7525 likewise, over 3000 auctions (standard error 0.008).
    assert abs(np.mean(ev.auction["seller"].to_numpy() % 100 == 0) - 0.7525) < 0.025
    # The hot channels, when nextInt(2) > 0: half the bids, a quarter each.
    channel = strings(ev.bid["channel"])
    for name in ("Google", "Facebook", "Baidu", "Apple"):
        assert abs(np.mean(channel == name) - 0.125) < 0.01


def _latest(created: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The last id (less 1000) created at or before each of ``at``: ids are 1000 + the rank in
    time (checked above)."""
    return np.searchsorted(np.sort(created), at, side="right") - 1


def test_sellers_bidders_and_auctions_refer_as_the_model_allows() -> None:
    ev = events(rate=1_000, disorder_ms=400)
    person_t, auction_t = ints(ev.person["dateTime"]), ints(ev.auction["dateTime"])
    # An auction's seller and a bid's bidder: the hot one (the first or second person of the
    # current batch of 100, at most 1 ahead) or one of the last 1000 persons or the next 10
    # (PERSON_ID_LEAD: persons not yet generated).
    for table, column in ((ev.auction, "seller"), (ev.bid, "bidder")):
        latest = _latest(person_t, ints(table["dateTime"]))
        base0 = table[column].to_numpy() - 1_000
        assert np.all(base0 <= latest + 10)
        assert np.all(base0 >= np.maximum(latest - 999, 0))
        assert np.mean(base0 <= latest) > 0.98  # ahead: 1/4 * 10/1010 at most, and the hot bidder
    # A bid's auction: the hot one (the first of the current batch of 100) or one of the last
    # 101 or the next 10 (AUCTION_ID_LEAD); the in-flight window is the last 100.
    latest = _latest(auction_t, ints(ev.bid["dateTime"]))
    base0 = ev.bid["auction"].to_numpy() - 1_000
    assert np.all((base0 >= np.maximum(latest - 100, 0)) & (base0 <= latest + 10))
    # Not generated yet: 1/2 (not hot) * 10/111 = 0.045.
    assert abs(np.mean(base0 > latest) - 0.045) < 0.01


def test_q9_join_finds_most_bids_an_open_auction() -> None:
    ev = events()
    auction = ev.auction.select(["id", "dateTime", "expires"]).rename_columns(["auction", "opens", "expires"])
    joined = ev.bid.select(["auction", "dateTime"]).join(auction, "auction")
    at, opens, expires = (
        ints(joined[c].combine_chunks().fill_null(0)) for c in ("dateTime", "opens", "expires")
    )
    hit = np.count_nonzero((opens <= at) & (at <= expires)) / ev.bid.num_rows
    # An auction lasts uniform [1, 2h] ms, h the time 100 auctions take (1666 events, 166 ms
    # here). A bid on the hot auction (1/2) comes at an age uniform over [0, h]: it is open with
    # chance 1 - E[age] / 2h = 3/4. Other bids (1/2) name one of 101 auctions of ages uniform
    # over [0, h] (open: 3/4) or one of 10 not yet open: 1/2 * 3/4 + 1/2 * 101/111 * 3/4 = 0.716.
    # The 30 hot auctions' lengths alone make its standard error about 0.03.
    assert 0.64 < hit < 0.79


def test_columns_take_the_model_values() -> None:
    ev = events()
    person, auction, bid = ev.person, ev.auction, ev.bid
    firsts = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"]
    lasts = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
    assert set(strings(person["name"])) <= {f"{f} {last}" for f in firsts for last in lasts}
    cities = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle"]
    assert set(strings(person["city"])) == {*cities, "Kent", "Cheyenne"}
    assert set(strings(person["state"])) == {"AZ", "CA", "ID", "OR", "WA", "WY"}
    assert all(re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", c) for c in strings(person["creditCard"]))
    # nextString(7) "@" nextString(5) ".com": 3 to 6 and 3 to 4 letters or spaces, trimmed.
    assert all(
        re.fullmatch(r"([a-z][a-z ]{0,4}[a-z]|[a-z]?)@([a-z][a-z ]{0,2}[a-z]|[a-z]?)\.com", e)
        for e in strings(person["emailAddress"])
    )
    assert set(auction["category"].to_numpy()) == {10, 11, 12, 13, 14}
    # Prices are round(10^U(0,6) * 100): 100 to 10^8; the reserve adds one to the initial bid.
    for price in (bid["price"].to_numpy(), auction["initialBid"].to_numpy()):
        assert price.min() >= 100 and price.max() <= 10**8
        assert abs(np.mean(np.log10(price)) - 5) < 0.05  # log10 uniform over [2, 8]
    assert np.all(auction["reserve"].to_numpy() - auction["initialBid"].to_numpy() >= 100)
    length = ints(auction["expires"]) - ints(auction["dateTime"])
    assert length.min() >= 1 and length.max() <= 2 * 167  # h: 1666 events at 10/ms
    assert abs(length.mean() - 166.5) < 10
    # A bid's extra: (100 - 32) +- round(0.2 * 68) = 54 + nextInt(28): mean 67.5.
    extra = pc.binary_length(bid["extra"]).to_numpy()
    assert extra.min() == 54 and extra.max() == 81 and abs(extra.mean() - 67.5) < 0.3
    assert set("".join(strings(bid["extra"][:1000]))) <= set("abcdefghijklmnopqrstuvwxyz")


def _java_abs_reverse(i: int) -> int:
    """Math.abs(Integer.reverse(i)), which leaves Integer.MIN_VALUE as it is."""
    bits = int(f"{i:032b}"[::-1], 2)
    signed = bits - (1 << 32) if bits >= 1 << 31 else bits
    return signed if signed == -(1 << 31) else abs(signed)


def test_channels_and_urls_are_those_of_the_bid_generator() -> None:
    bid = events().bid
    base = r"https://www\.nexmark\.com/[a-z_]{3,4}/[a-z_]{3,4}/[a-z_]{3,4}/item\.htm\?query=1"
    url_of: dict[str, set[str]] = {}
    for channel, url in zip(strings(bid["channel"]), strings(bid["url"]), strict=True):
        url_of.setdefault(channel, set()).add(url)
    assert all(len(urls) == 1 for urls in url_of.values())  # each channel has one url
    with_id = 0
    for channel, (url,) in url_of.items():
        if channel in ("Google", "Facebook", "Baidu", "Apple"):
            assert re.fullmatch(base, url)
            continue
        i = int(channel.removeprefix("channel-"))
        assert 0 <= i < 10_000
        match = re.fullmatch(f"({base})(&channel_id=(-?\\d+))?", url)
        assert match is not None
        if match.group(3) is not None:
            assert int(match.group(3)) == _java_abs_reverse(i)
            with_id += 1
    cached = len(url_of) - 4
    assert cached > 9_000  # 23,000 draws of 10,000 channels
    assert abs(with_id / cached - 0.9) < 0.02  # nextInt(10) > 0


def _in_arrival_order(ev: Any) -> np.ndarray:
    times = [ints(ev.tables[s]["dateTime"]) for s in ("person", "auction", "bid")]
    return np.array([times[s][r] for s, r in zip(ev.stream, ev.row, strict=True)])


@pytest.mark.parametrize("disorder_ms", [0, 300])
def test_arrivals_stay_within_the_disorder_bound(disorder_ms: int) -> None:
    ev = events(disorder_ms=disorder_ms)
    for index, stream in enumerate(("person", "auction", "bid")):
        arrival, time = ev.arrival_ms[stream], ints(ev.tables[stream]["dateTime"])
        assert np.all(np.diff(arrival) >= 0)
        assert np.all((arrival >= time) & (arrival <= time + disorder_ms))
        rows = ev.row[ev.stream == index]  # each row of the table once, in its order
        assert np.array_equal(rows, np.arange(ev.tables[stream].num_rows))
    time = _in_arrival_order(ev)
    punctuation = ev.punctuation_ms
    assert np.all(np.diff(punctuation) >= 0)
    assert np.array_equal(punctuation, np.maximum.accumulate(time) - disorder_ms)
    # Honest: every later arrival, in any stream, is at or above the punctuation before it.
    still_to_come = np.minimum.accumulate(time[::-1])[::-1]
    assert np.all(still_to_come[1:] >= punctuation[:-1])
    behind = np.maximum.accumulate(time) - time
    if disorder_ms:
        assert disorder_ms * 0.9 < behind.max() <= disorder_ms  # the disorder uses its room
    else:
        assert behind.max() == 0


@pytest.mark.parametrize("size", [1, 7_000, 60_000])
def test_batches_cover_the_streams_in_order_with_honest_punctuation(size: int) -> None:
    ev = events(n=5_000 if size == 1 else 50_000, disorder_ms=300)
    got = list(gen.batches(ev, size))
    for stream, table in ev.tables.items():
        parts = [t for s, t, _ in got if s == stream]
        assert pa.concat_tables(parts).equals(table)
    punctuation = np.array([p for _, _, p in got])
    assert np.all(np.diff(punctuation) >= 0)
    least_to_come = np.minimum.accumulate([int(ints(t["dateTime"]).min()) for _, t, _ in got][::-1])[::-1]
    assert np.all(least_to_come[1:] >= punctuation[:-1])
    time = _in_arrival_order(ev)
    assert punctuation[-1] == time.max() - 300
    # Each run of ``size`` arrivals gives at most one batch a stream.
    assert len(got) <= 3 * -(-ev.events // size)
    assert max(t.num_rows for _, t, _ in got) <= size
