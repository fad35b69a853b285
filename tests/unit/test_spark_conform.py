"""The Spark sink's pure parts: Spark's Arrow types onto a stream's schema, punctuation modes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lowtide.clients._conform import Layout, conform
from lowtide.clients.spark import PunctuationMode
from lowtide.errors import InvalidArgument, SchemaMismatch
from lowtide.punctuation.generators import duration_units
from lowtide.punctuation.model import NO_PROGRESS

INFO = {"name": "Main", "schema": {"k": "string", "len": "int32", "ts": "timestamp[ms]"}, "progressing": "ts"}


def spark_like(ts_us: list[int | None]) -> pa.Table:
    """What ``DataFrame.toArrow()`` gives: timestamps in microseconds, UTC, longs as int64."""
    n = len(ts_us)
    return pa.table(
        {
            "k": pa.array([f"k{i}" for i in range(n)]),
            "len": pa.array(range(n), pa.int32()),
            "ts": pa.array(ts_us, pa.timestamp("us", tz="UTC")),
        }
    )


def test_spark_timestamps_floor_to_the_stream_unit() -> None:
    out = conform(spark_like([1_999, 2_000, -1]), Layout.of(INFO))
    assert out.table.column("ts").type == pa.timestamp("ms")
    assert out.table.column("ts").cast(pa.int64()).to_pylist() == [1, 2, -1]
    assert out.max_event == 2
    assert out.table.column_names == ["k", "len", "ts"]


def test_spark_timestamps_into_an_integer_attribute_count_milliseconds() -> None:
    layout = Layout.of({**INFO, "schema": {**INFO["schema"], "ts": "int64"}})
    out = conform(spark_like([5_000_000]), layout)
    assert out.table.column("ts").type == pa.int64()
    assert out.table.column("ts").to_pylist() == [5_000]


def test_spark_longs_are_already_in_the_attribute_unit() -> None:
    table = spark_like([0]).set_column(2, "ts", pa.array([1_700_000_000_123], pa.int64()))
    out = conform(table, Layout.of(INFO))
    assert out.max_event == 1_700_000_000_123


def test_nulls_stay_nulls_for_the_server_to_reject() -> None:
    out = conform(spark_like([None, 3_000]), Layout.of(INFO))
    assert out.table.column("ts").null_count == 1
    assert out.max_event == 3


def test_the_watermark_column_is_read_not_sent() -> None:
    table = spark_like([10_000, 20_000]).append_column("wm", pa.array([4_000, 9_000], pa.timestamp("us")))
    out = conform(table, Layout.of(INFO), watermark_column="wm")
    assert out.watermark == 9
    assert "wm" not in out.table.column_names


def test_columns_the_stream_lacks_or_needs_are_named() -> None:
    with pytest.raises(SchemaMismatch, match=r"has column\(s\) 'extra' that stream 'Main' has not"):
        conform(spark_like([1]).append_column("extra", pa.array([1])), Layout.of(INFO))
    with pytest.raises(SchemaMismatch, match=r"lacks column\(s\) 'len'"):
        conform(spark_like([1]).drop_columns(["len"]), Layout.of(INFO))
    with pytest.raises(SchemaMismatch, match="lacks its punctuation column 'wm'"):
        conform(spark_like([1]), Layout.of(INFO), watermark_column="wm")


def test_an_empty_batch_has_no_event_time() -> None:
    out = conform(spark_like([]), Layout.of(INFO))
    assert (out.table.num_rows, out.max_event) == (0, NO_PROGRESS)


@pytest.mark.parametrize(
    ("spec", "mode"),
    [
        ("watermark:10 seconds", PunctuationMode("watermark", delay="10 seconds")),
        ("watermark", PunctuationMode("watermark", delay="0")),
        ("column:wm", PunctuationMode("column", column="wm")),
        ("none", PunctuationMode("none")),
    ],
)
def test_punctuation_modes(spec: str, mode: PunctuationMode) -> None:
    assert PunctuationMode.parse(spec) == mode


@pytest.mark.parametrize("spec", ["watermark:-5s", "watermark:soon", "column:", "none:1", "ordered"])
def test_bad_punctuation_modes_say_why(spec: str) -> None:
    with pytest.raises(InvalidArgument):
        PunctuationMode.parse(spec)


def test_spark_style_durations() -> None:
    assert duration_units("10 seconds", 1.0) == 10_000
    assert duration_units("1 minute", 1_000.0) == 60
    assert duration_units("250 milliseconds", 1e-3) == 250_000
    assert duration_units("7", 1e-3) == 7  # a bare integer is in the attribute's units
