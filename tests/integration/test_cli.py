"""The ``lowtide`` command end to end, as subprocesses against a real server."""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from server_harness import lowtide_command

from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS

pytestmark = pytest.mark.integration

TIMEOUT = 120


def lowtide(
    target: str, *args: str, stdin: str | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*lowtide_command(), "--server", target, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(target: str, *args: str, timeout: float = TIMEOUT) -> str:
    done = lowtide(target, *args, timeout=timeout)
    assert done.returncode == 0, f"lowtide {' '.join(args)} exited {done.returncode}: {done.stderr}"
    return done.stdout


def fails(target: str, *args: str, code: int = 1) -> str:
    """Runs a command that must fail; returns its single stderr line."""
    done = lowtide(target, *args)
    assert done.returncode == code, f"exit {done.returncode}, stderr {done.stderr!r}"
    lines = done.stderr.strip().splitlines()
    if code == 1:
        assert len(lines) == 1, f"expected one line on stderr, got {done.stderr!r}"
        assert lines[0].startswith("lowtide: ")
    return lines[-1]


def rows(n: int, offset: int, key: str) -> list[dict[str, object]]:
    return [{"srcIP": f"{key}{i % 3:02d}", "len": 40 + i, "ts": offset + i * 7} for i in range(n)]


def write_files(folder: Path) -> dict[str, list[dict[str, object]]]:
    data = {"csv": rows(300, 0, "10."), "jsonl": rows(200, 3, "11."), "parquet": rows(500, 5, "12.")}
    with (folder / "data.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["srcIP", "len", "ts"])
        writer.writeheader()
        writer.writerows(data["csv"])
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data["jsonl"]))
    pq.write_table(pa.Table.from_pylist(data["parquet"]), folder / "data.parquet")
    return data


def test_cli_end_to_end(target: str, fresh: Callable[[str], str], tmp_path: Path) -> None:
    stream, query = fresh("Main"), fresh("q")
    sql = f"SELECT srcIP, count(*) AS n [RANGE 1 second, SLIDE 1 second, WA ts] FROM {stream} GROUP BY srcIP"
    data = write_files(tmp_path)

    assert ok(target, "stream", "create", stream, "--schema", "srcIP:string,len:int32,ts:timestamp[ms]",
              "--sources", "csv,jsonl,parquet") == ""  # fmt: skip
    assert "Aggregate" in ok(target, "query", "explain", sql)
    assert ok(target, "query", "register", sql, "--name", query).strip() == query
    for fmt in ("csv", "jsonl", "parquet"):
        done = lowtide(target, "send", stream, str(tmp_path / f"data.{fmt}"), "--source", fmt,
                       "--punctuation", "end", "--batch-rows", "128")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"sent {len(data[fmt])} tuples" in done.stderr

    every = [r for part in data.values() for r in part]
    want = Counter((int(r["ts"]) // 1000 * 1000, r["srcIP"]) for r in every)  # type: ignore[call-overload]
    out = ok(target, "tail", query, "--from-oldest", "--format", "jsonl", "--limit", str(len(want)))
    got = [json.loads(line) for line in out.splitlines()]
    assert len(got) == len(want)
    assert Counter({(r["window_start"], r["srcIP"]): r["n"] for r in got}) == want

    out = ok(target, "tail", query, "--from-oldest", "--format", "csv", "--limit", "2", "--show-punctuation")
    lines = out.splitlines()
    assert lines[0] == "window_start,window_end,srcIP,n,revision"
    assert len([line for line in lines[1:] if not line.startswith("#")]) == 2
    assert "n" in ok(target, "tail", query, "--from-oldest", "--limit", "1")  # table

    streams = json.loads(ok(target, "stream", "list", "--format", "json"))
    info = next(s for s in streams if s["name"] == stream)
    assert info["tuples_ingested"] == len(every)
    assert info["schema"] == {"srcIP": "string", "len": "int32", "ts": "timestamp[ms]"}
    assert stream in ok(target, "stream", "list")
    queries = json.loads(ok(target, "query", "list", "--format", "json"))
    assert next(q for q in queries if q["name"] == query)["results"] == len(want)
    assert query in ok(target, "query", "list")


def test_tail_after_send_prints_each_window_once_and_exits_at_end(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """The README's order: send, then tail; rows of both workers come as one sorted table."""
    stream, query = fresh("Main"), fresh("q")
    sql = f"SELECT srcIP, count(*) AS n [RANGE 1 minute, WA ts] FROM {stream} GROUP BY srcIP"
    ok(target, "stream", "create", stream, "--schema", "srcIP:string,ts:timestamp[ms]", "--sources", "a")
    ok(target, "query", "register", sql, "--name", query)
    hosts = [f"10.0.0.{i}" for i in range(40)]  # hashed over both workers
    lines = ["srcIP,ts", *(f"{h},{t}" for t in (1_000, 61_000, 62_000) for h in hosts)]
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    ok(target, "send", stream, str(tmp_path / "in.csv"), "--source", "a", "--punctuation", "end")

    out = ok(target, "tail", query, "--show-punctuation").splitlines()  # exits: end of stream
    header, *rows = [line.split() for line in out if line and not line.startswith("--")]
    assert header == ["window_start", "window_end", "srcIP", "n", "revision"]
    minute = "1970-01-01T00:01:00"
    want = [["1970-01-01T00:00:00", minute, h, "1", "0"] for h in sorted(hosts)]
    want += [[minute, "1970-01-01T00:02:00", h, "2", "0"] for h in sorted(hosts)]
    assert rows == want  # one table, each window once, in window then group order
    end = re.fullmatch(r"-- punctuation window_end = end \(offset (\d+)\) --", out[-2])
    assert end is not None and out[-1] == "", out[-2:]
    # From an offset: the end-of-stream marker alone, under the same offset.
    resumed = ok(target, "tail", query, "--from-offset", end[1], "--show-punctuation", "--format", "jsonl")
    assert [json.loads(line) for line in resumed.splitlines()] == [
        {"punctuation": "end", "attribute": "window_end", "offset": int(end[1])}
    ]

    raw = [json.loads(line) for line in ok(target, "tail", query, "--format", "jsonl").splitlines()]
    assert [(r["window_start"], r["srcIP"]) for r in raw] == [
        (w, h) for w in (0, 60_000) for h in sorted(hosts)
    ]
    iso = ok(target, "tail", query, "--format", "jsonl", "--time-format", "iso", "--limit", "1")
    assert json.loads(iso)["window_end"] == minute

    assert "read by query" in fails(target, "stream", "drop", stream)
    assert ok(target, "query", "drop", query) == ""
    assert ok(target, "stream", "drop", stream) == ""


def test_cli_send_punctuation_value_and_stdin_sql(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64", "--idle-timeout", "60")
    path = tmp_path / "rows.ndjson"
    path.write_text("".join(json.dumps({"k": "007", "ts": i}) for i in range(5)).replace("}{", "}\n{") + "\n")
    done = lowtide(target, "send", stream, str(path), "--punctuation", "3")
    assert done.returncode == 0, done.stderr
    info = next(
        s for s in json.loads(ok(target, "stream", "list", "--format", "json")) if s["name"] == stream
    )
    assert (info["tuples_ingested"], info["low_watermark"]) == (5, 3)
    sql = f"SELECT k, count(*) [RANGE 10, WA ts] FROM {stream} GROUP BY k"
    name = lowtide(target, "query", "register", "-", stdin=sql).stdout.strip()
    assert name
    ok(target, "query", "drop", name)
    ok(target, "stream", "drop", stream)


def test_cli_errors_are_one_line(target: str, fresh: Callable[[str], str], tmp_path: Path) -> None:
    stream = fresh("S")
    assert "unknown stream" in fails(target, "stream", "drop", stream)
    assert "unknown query" in fails(target, "query", "drop", stream)
    assert "line 1, column 1" in fails(target, "query", "register", "SELEC x FROM y")
    assert "unknown column type" in fails(target, "stream", "create", stream, "--schema", "k:strin,ts:int64")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64")
    assert "already exists" in fails(target, "stream", "create", stream, "--schema", "k:string,ts:int64")
    assert "cannot read" in fails(target, "send", stream, str(tmp_path / "missing.csv"))
    assert "cannot tell the format" in fails(target, "send", stream, str(tmp_path / "data.txt"))
    bad = tmp_path / "bad.csv"
    bad.write_text("k,ts,extra\na,1,2\n")
    assert "unknown column" in fails(target, "send", stream, str(bad))
    assert "unknown query" in fails(target, "tail", fresh("q"))
    typo = stream[:1] + "X" + stream[2:]  # one letter off: the stream it meant is named
    assert f"unknown stream '{typo}' (did you mean '{stream}'?)" in fails(target, "send", typo, str(bad))
    assert fails("127.0.0.1:1", "stream", "list") == (
        "lowtide: no lowtide server is reachable at 127.0.0.1:1: connection refused; is it running?"
    )
    assert "--schema" in fails(target, "stream", "create", stream, code=2)  # usage error: argparse
    assert "positive integer" in fails(target, "send", stream, str(bad), "--batch-rows", "0", code=2)
    assert "expected a number of seconds above 0, got '0'" in fails(
        target, "--timeout", "0", "stream", "list", code=2
    )
    sql = f"SELECT count(*) AS n [RANGE 10, WA ts] FROM {stream}"
    assert fails(target, "query", "register", sql, "--allowed-lateness", "5") == (
        "lowtide: --allowed-lateness needs --late update (under --late drop no window is kept past its "
        "punctuation: late tuples are dropped (into <query>.late)); add --late update, or leave "
        "--allowed-lateness out"
    )
    assert all(q["sql"] != sql for q in json.loads(ok(target, "query", "list", "--format", "json")))
    ok(target, "stream", "drop", stream)


def test_send_names_a_bad_value_by_its_column_and_its_row_from_1(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """As ``send --help`` says: rows count from 1, the header not counted; the column by name."""
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "srcIP:string,len:int32,ts:timestamp[ms]")
    bad = tmp_path / "bad.csv"
    bad.write_text("srcIP,len,ts\n10.0.0.1,sixty,1700000000000\n")
    assert fails(target, "send", stream, str(bad)) == (
        f"lowtide: cannot read {bad}: row 1, column 'len': 'sixty' is not an int32"
    )
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"srcIP": "10.0.0.1", "len": "sixty", "ts": 1700000000000}) + "\n")
    assert fails(target, "send", stream, str(one)) == (
        f"lowtide: cannot read {one}: row 1, column 'len': a JSON string is not an int32"
    )
    assert stream_info(target, stream)["tuples_ingested"] == 0
    ok(target, "stream", "drop", stream)


def test_send_punctuation_takes_an_iso_time_in_the_attributes_unit(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream, numbers = fresh("S"), fresh("S")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:timestamp[ms]")
    ok(target, "stream", "create", numbers, "--schema", "k:string,ts:int64")
    path = tmp_path / "rows.csv"
    path.write_text("k,ts\na,2023-11-14T22:13:20\n")
    # A time finer than the attribute's unit, or a time for an integer attribute: nothing is sent.
    assert fails(target, "send", stream, str(path), "--punctuation", "2023-11-14T22:14:30.0001") == (
        "lowtide: --punctuation on 'ts' (timestamp[ms]): expected an integer (ms since 1970-01-01 UTC) or "
        "an ISO 8601 time to the ms at most, got '2023-11-14T22:14:30.0001'"
    )
    assert fails(target, "send", numbers, str(path), "--punctuation", "2023-11-14T22:14:30") == (
        f"lowtide: --punctuation '2023-11-14T22:14:30' is a time, but stream {numbers!r} progresses on "
        "'ts' (int64): give an integer"
    )
    assert stream_info(target, stream)["tuples_ingested"] == 0
    done = lowtide(target, "send", stream, str(path), "--punctuation", "2023-11-14T22:14:30")
    assert done.returncode == 0, done.stderr
    info = stream_info(target, stream)
    assert (info["tuples_ingested"], info["low_watermark"]) == (1, 1_700_000_070_000)
    done = lowtide(target, "send", stream, str(path), "--punctuation", "2023-11-14T23:15:00+01:00")
    assert done.returncode == 0, done.stderr  # the same file again: its batch is skipped
    assert stream_info(target, stream)["low_watermark"] == 1_700_000_100_000
    ok(target, "stream", "drop", stream)
    ok(target, "stream", "drop", numbers)


def test_query_explain_takes_a_registered_querys_name(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream, query = fresh("S"), fresh("sessions")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64")
    sql = f"SELECT k, count(*) AS n [SESSION 10, WA ts] FROM {stream} GROUP BY k"
    ok(target, "query", "register", sql, "--name", query)
    plan = ok(target, "query", "explain", sql)
    assert "Session" in plan or "Aggregate" in plan
    assert ok(target, "query", "explain", query) == plan
    other = fresh("nothing")
    error = fails(target, "query", "explain", other)
    assert error.startswith(f"lowtide: unknown query {other!r}") and error.endswith(
        "; explain takes a query's text, or a registered query's name"
    )
    ok(target, "query", "drop", query)
    ok(target, "stream", "drop", stream)


def test_send_behind_the_punctuation_says_so_and_to_an_ended_stream_is_refused(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream, query = fresh("S"), fresh("q")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64", "--sources", "a")
    ok(target, "query", "register", f"SELECT count(*) AS n [RANGE 10, WA ts] FROM {stream}", "--name", query)
    on_time = tmp_path / "on_time.csv"
    on_time.write_text("k,ts\n" + "".join(f"a,{t}\n" for t in range(0, 100, 7)))
    ok(target, "send", stream, str(on_time), "--source", "a", "--punctuation", "100")

    behind = tmp_path / "behind.csv"
    behind.write_text("k,ts\n" + "".join(f"b,{t}\n" for t in range(1, 16)))
    done = lowtide(target, "send", stream, str(behind), "--source", "a")
    assert done.returncode == 1, done.stderr
    sent, error = done.stderr.strip().splitlines()
    assert sent.startswith(f"sent 15 tuples in 1 batches to {stream}")
    assert error.startswith(
        f"lowtide: all 15 tuples were behind the punctuation of stream {stream!r} (100, its low watermark "
        "when the send began): the server took them"
    )
    assert "(--late drop: dropped, kept in <query>.late; --late update: the windows still kept" in error
    assert stream_info(target, stream)["tuples_ingested"] == 15 + 15

    some = tmp_path / "some.csv"
    some.write_text("k,ts\n" + "".join(f"c,{t}\n" for t in range(95, 105)))
    done = lowtide(target, "send", stream, str(some), "--source", "a", "--punctuation", "end")
    assert done.returncode == 0, done.stderr
    sent, warning = done.stderr.strip().splitlines()
    assert sent.startswith(f"sent 10 tuples in 1 batches to {stream}")
    assert warning.startswith(
        f"lowtide: warning: 5 of 10 tuples were behind the punctuation of stream {stream!r} (100, "
    )
    info = stream_info(target, stream)
    assert (info["tuples_ingested"], info["low_watermark"]) == (40, END_OF_STREAM)

    later = tmp_path / "later.csv"
    later.write_text("k,ts\n" + "".join(f"d,{t}\n" for t in range(200, 215)))
    # The stream has ended: its closed source takes nothing, a new one's rows are all behind.
    assert fails(target, "send", stream, str(later), "--source", "a").endswith(
        f"was rejected: source 'a' of stream {stream!r} is closed"
    )
    assert stream_info(target, stream)["tuples_ingested"] == 40
    done = lowtide(target, "send", stream, str(later), "--source", "b")
    assert done.returncode == 1, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"lowtide: all 15 tuples were behind the punctuation of stream {stream!r} (end, ")
    )
    # A repeat of a send that closed its source, all of it applied before: done, exit 0.
    again = lowtide(target, "send", stream, str(some), "--source", "a", "--punctuation", "end")
    assert again.returncode == 0, again.stderr
    assert "1 batches applied before were skipped" in again.stderr
    ok(target, "query", "drop", query)
    ok(target, "stream", "drop", stream)


def stream_info(target: str, stream: str) -> dict[str, object]:
    streams = json.loads(ok(target, "stream", "list", "--format", "json"))
    info: dict[str, object] = next(s for s in streams if s["name"] == stream)
    return info


def test_send_csv_needs_a_header_row_or_no_header(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """A first line of data is not taken for a header: the file is refused, saying what it needs."""
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "srcIP:string,len:int32,ts:timestamp[ms]")
    needs = "a CSV file needs a header row naming the stream's columns (srcIP, len, ts)"
    one = tmp_path / "one.csv"
    one.write_text("10.0.0.1,60,1700000000000\n")
    two = tmp_path / "two.csv"
    two.write_text("10.0.0.1,60,1700000000000\n10.0.0.2,61,1700000000001\n")
    for path in (one, two):
        error = fails(target, "send", stream, str(path))
        assert "its first line names no column of the stream (10.0.0.1, 60, 1700000000000)" in error
        assert needs in error and "--no-header" in error
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert f"{empty}: it is empty: {needs}" in fails(target, "send", stream, str(empty))
    lacking = tmp_path / "lacking.csv"
    lacking.write_text("srcIP,ts\n10.0.0.1,1\n")
    assert "its header lacks column(s) 'len': the stream's columns are srcIP, len, ts" in fails(
        target, "send", stream, str(lacking)
    )
    assert stream_info(target, stream)["tuples_ingested"] == 0

    done = lowtide(target, "send", stream, str(two), "--no-header")
    assert done.returncode == 0, done.stderr
    assert "sent 2 tuples" in done.stderr
    header_only = tmp_path / "header.csv"
    header_only.write_text("ts,len,srcIP\n")  # any order; no rows: nothing to send
    done = lowtide(target, "send", stream, str(header_only))
    assert done.returncode == 0, done.stderr
    assert "sent 0 tuples" in done.stderr and "has no rows" in done.stderr
    assert stream_info(target, stream)["tuples_ingested"] == 2


def test_send_twice_applies_the_file_once(target: str, fresh: Callable[[str], str], tmp_path: Path) -> None:
    """Batch ids from the file's content: a repeated send (punctuation too) changes nothing."""
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64", "--sources", "a,b")
    first = tmp_path / "first.csv"
    first.write_text("k,ts\n" + "".join(f"x,{t}\n" for t in range(7)))
    sent = "--batch-rows", "3", "--source", "a", "--punctuation", "5"
    done = lowtide(target, "send", stream, str(first), *sent)
    assert done.returncode == 0, done.stderr
    assert "sent 7 tuples in 3 batches" in done.stderr
    again = lowtide(target, "send", stream, str(first), *sent)
    assert again.returncode == 0, again.stderr
    assert (
        "sent 0 tuples in 0 batches" in again.stderr
        and "3 batches applied before were skipped" in again.stderr
    )
    info = stream_info(target, stream)
    assert info["tuples_ingested"] == 7
    assert info["source_punctuation"] == {"a": 5, "b": NO_PROGRESS}

    # The same rows from source b are b's; another file is new data; its batches do not collide.
    assert (
        "sent 7 tuples"
        in lowtide(target, "send", stream, str(first), "--batch-rows", "3", "--source", "b").stderr
    )
    second = tmp_path / "second.csv"
    second.write_text("k,ts\n" + "".join(f"y,{t}\n" for t in range(5, 12)))
    assert "sent 7 tuples" in lowtide(target, "send", stream, str(second), *sent).stderr
    assert stream_info(target, stream)["tuples_ingested"] == 21

    # --punctuation end twice: the second closes a closed source, and that is no error.
    for _ in range(2):
        done = lowtide(target, "send", stream, str(second), *sent[:4], "--punctuation", "end")
        assert done.returncode == 0, done.stderr
    assert stream_info(target, stream)["tuples_ingested"] == 21

    # A resumed send under explicit ids: what the first part applied is skipped.
    part = tmp_path / "part.jsonl"
    part.write_text("".join(json.dumps({"k": "z", "ts": 100 + t}) + "\n" for t in range(4)))
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json.dumps({"k": "z", "ts": 100 + t}) + "\n" for t in range(10)))
    base = "--batch-rows", "2", "--source", "b", "--batch-id-base", "1000"
    assert "sent 4 tuples in 2 batches" in lowtide(target, "send", stream, str(part), *base).stderr
    resumed = lowtide(target, "send", stream, str(whole), *base).stderr
    assert "sent 6 tuples in 3 batches" in resumed and "2 batches applied before were skipped" in resumed
    assert stream_info(target, stream)["tuples_ingested"] == 31
    ok(target, "stream", "drop", stream)


def test_send_reads_timestamp_text_and_names_the_first_bad_row(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream, query = fresh("S"), fresh("q")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:timestamp[ms]", "--sources", "a")
    sql = f"SELECT count(*) AS n [RANGE 1 second, WA ts] FROM {stream}"
    ok(target, "query", "register", sql, "--name", query)
    mixed = tmp_path / "mixed.csv"
    mixed.write_text("k,ts\na,1700000000000\na,1700000000500\na,2023-11-14T22:13:21\na,1700000001000\n")
    assert fails(target, "send", stream, str(mixed), "--source", "a") == (
        f"lowtide: cannot read {mixed}: row 3: column 'ts' is timestamp[ms] written as integers "
        "(ms since 1970-01-01 UTC), as row 1 is; got '2023-11-14T22:13:21'"
    )
    # Found in a later batch and a later block too: rows count from the file's first.
    late = tmp_path / "late.csv"
    late.write_text("k,ts\n" + "a,2023-11-14T22:13:20.250Z\n" * 300_000 + "a,2023-11-14 22:13:20\n")
    assert "row 300001: column 'ts' is timestamp[ms] written as ISO 8601 times with a zone offset" in fails(
        target, "send", stream, str(late), "--source", "a", "--batch-rows", "1000"
    )
    fine = tmp_path / "fine.csv"  # 2023-11-14T22:13:20Z is 1700000000000 ms
    fine.write_text("k,ts\na,2023-11-14T22:13:20\na,2023-11-14 22:13:20.999\nb,2023-11-14T22:13:21.5\n")
    ok(target, "send", stream, str(fine), "--source", "a", "--punctuation", "end")
    out = ok(target, "tail", query, "--format", "jsonl")
    assert [(r["window_start"], r["n"]) for r in map(json.loads, out.splitlines())] == [
        (1_700_000_000_000, 2),
        (1_700_000_001_000, 1),
    ]
    assert stream_info(target, stream)["tuples_ingested"] == 3


def test_tail_a_query_without_a_window_prints_its_timestamps(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """Its output punctuation is on ``ts``, a timestamp[ms] column: every format prints the rows."""
    stream, query = fresh("Main"), fresh("q")
    ok(target, "stream", "create", stream, "--schema", "srcIP:string,len:int32,ts:timestamp[ms]")
    ok(target, "query", "register", f"SELECT srcIP, len, ts FROM {stream}", "--name", query)
    sent = [(f"10.0.0.{i}", 40 + i, 1_700_000_000_000 + 1000 * i) for i in range(5)]
    (tmp_path / "in.csv").write_text("srcIP,len,ts\n" + "".join(f"{a},{n},{t}\n" for a, n, t in sent))
    ok(target, "send", stream, str(tmp_path / "in.csv"), "--punctuation", "end")
    iso = [(a, n, (dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=t)).isoformat()) for a, n, t in sent]

    jsonl = ok(target, "tail", query, "--format", "jsonl").splitlines()
    assert [tuple(json.loads(line).values()) for line in jsonl] == iso
    assert ok(target, "tail", query, "--format", "csv").splitlines() == [
        "srcIP,len,ts",
        *(f"{a},{n},{t}" for a, n, t in iso),
    ]
    table = [line.split() for line in ok(target, "tail", query).splitlines() if line]
    assert table == [["srcIP", "len", "ts"], *([a, str(n), t] for a, n, t in iso)]


TAIL_WAIT = 60  # what used to hang fails in a minute, not TIMEOUT


def ended_with_late_rows(target: str, fresh: Callable[[str], str], tmp_path: Path) -> str:
    """A query whose only source closed, with 5 late tuples (ts 1..5 after punctuation 100)."""
    stream, query = fresh("Main"), fresh("q")
    ok(target, "stream", "create", stream, "--schema", "srcIP:string,ts:int64", "--sources", "a")
    sql = f"SELECT srcIP, count(*) AS n [RANGE 10, WA ts] FROM {stream} GROUP BY srcIP"
    ok(target, "query", "register", sql, "--name", query)
    (tmp_path / "on_time.csv").write_text("srcIP,ts\n" + "".join(f"10.0.0.1,{t}\n" for t in range(0, 100, 7)))
    (tmp_path / "late.csv").write_text("srcIP,ts\n" + "".join(f"10.0.0.{t},{t}\n" for t in range(1, 6)))
    ok(target, "send", stream, str(tmp_path / "on_time.csv"), "--source", "a", "--punctuation", "100")
    # Every row behind the punctuation: sent, and said to be (exit 1).
    done = lowtide(
        target, "send", stream, str(tmp_path / "late.csv"), "--source", "a", "--punctuation", "end"
    )
    assert done.returncode == 1 and "lowtide: all 5 tuples were behind the punctuation" in done.stderr
    return query


def test_tail_of_a_late_stream_prints_its_rows_and_ends(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    query = ended_with_late_rows(target, fresh, tmp_path)
    late = f"{query}.late"
    sent = [{"srcIP": f"10.0.0.{t}", "ts": t} for t in range(1, 6)]
    first = ok(target, "tail", late, "--format", "jsonl", "--limit", "3", timeout=TAIL_WAIT)
    shown = [json.loads(line) for line in first.splitlines()]
    assert len(shown) == 3 and all(row in sent for row in shown)
    whole = ok(target, "tail", late, "--format", "jsonl", "--show-punctuation", timeout=TAIL_WAIT)
    items = [json.loads(line) for line in whole.splitlines()]
    # Each worker's late rows in the order they came, the workers' in worker order.
    assert sorted((i for i in items if "ts" in i), key=lambda row: row["ts"]) == sent
    assert {i["attribute"] for i in items if "punctuation" in i} == {f"{query}.window_end"}
    assert items[-1]["punctuation"] == "end"


def test_tail_of_an_ended_query_from_now_or_past_its_end_exits_at_once(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    query = ended_with_late_rows(target, fresh, tmp_path)
    for name in (query, f"{query}.late"):
        whole = ok(target, "tail", name, "--format", "jsonl", "--show-punctuation", timeout=TAIL_WAIT)
        end = json.loads(whole.splitlines()[-1])
        assert end["punctuation"] == "end"
        assert ok(target, "tail", name, "--from-now", timeout=TAIL_WAIT) == ""
        for past in (end["offset"] + 1, end["offset"] + 50):
            assert ok(target, "tail", name, "--from-offset", str(past), timeout=TAIL_WAIT) == ""


def test_tail_prints_early_results_as_they_come_then_each_window_final_once(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    """EMIT EVERY's partial rows (final false) print while no punctuation has come; the final
    rows print once, after the partial rows of their window, when punctuation covers them."""
    stream, query = fresh("Early"), fresh("q")
    ok(target, "stream", "create", stream, "--schema", "srcIP:string,ts:int64", "--sources", "a")
    sql = f"SELECT srcIP, count(*) AS n [RANGE 100, WA ts, EMIT EVERY 100 ms] FROM {stream} GROUP BY srcIP"
    ok(target, "query", "register", sql, "--name", query)
    opened = "srcIP,ts\n" + "".join(f"10.0.0.1,{t}\n" for t in range(1, 6)) + "10.0.0.2,150\n"
    (tmp_path / "open.csv").write_text(opened)
    ok(target, "send", stream, str(tmp_path / "open.csv"), "--source", "a")  # no punctuation: all open
    shown = ok(target, "tail", query, "--format", "jsonl", "--limit", "2", timeout=TAIL_WAIT)
    early = [json.loads(line) for line in shown.splitlines()]
    assert len(early) == 2 and not any(row["final"] for row in early), early
    assert {(row["srcIP"], row["n"]) for row in early} <= {("10.0.0.1", 5), ("10.0.0.2", 1)}, early
    (tmp_path / "last.csv").write_text("srcIP,ts\n10.0.0.1,2\n")
    ok(target, "send", stream, str(tmp_path / "last.csv"), "--source", "a", "--punctuation", "end")
    whole = ok(target, "tail", query, "--format", "jsonl", "--show-punctuation", timeout=TAIL_WAIT)
    items = [json.loads(line) for line in whole.splitlines()]
    assert items[-1]["punctuation"] == "end"
    final = [row for row in items if row.get("final")]
    windows = [(r["srcIP"], r["window_start"], r["n"]) for r in final]
    assert windows == [("10.0.0.1", 0, 6), ("10.0.0.2", 100, 1)]
    for row in final:  # every partial row of a window comes before its final row
        index = items.index(row)
        partial = [i for i in items[index + 1 :] if i.get("srcIP") == row["srcIP"]]
        assert not partial, f"partial rows after the final row {row}: {partial}"


# -- lowtide source ---------------------------------------------------------------------------------
def source_list(target: str, stream: str, *options: str) -> list[list[str]]:
    """``source list``'s table rows (header first, blank cells kept as ""), then its last line."""
    *table, last = ok(target, "source", "list", stream, *options).splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", table[0])]
    cells = list(zip(starts, [*starts[1:], None], strict=True))
    return [*([line[a:b].strip() for a, b in cells] for line in table), [last]]


def test_source_list_shows_declared_and_seen_sources_and_which_hold_the_stream_back(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64", "--sources", "a,b")
    path = tmp_path / "rows.csv"
    path.write_text("k,ts\nx,10\n")
    done = lowtide(target, "send", stream, str(path), "--source", "c", "--punctuation", "50")
    assert done.returncode == 0 and "source 'c' is not declared" in done.stderr, done.stderr
    assert source_list(target, stream) == [
        ["source", "declared", "punctuation", "holds_back"],
        ["a", "yes", "none", "yes"],
        ["b", "yes", "none", "yes"],
        ["c", "no", "50", ""],
        ["low watermark: none"],
    ]
    assert ok(target, "source", "punctuate", stream, "a", "100").strip() == (
        f"source 'a' of stream {stream!r} punctuated at 100: low watermark none, held back by b"
    )
    assert ok(target, "source", "close", stream, "b").strip() == (
        f"source 'b' of stream {stream!r} closed: low watermark 50, held back by c"
    )
    assert source_list(target, stream)[1:] == [
        ["a", "yes", "100", ""],
        ["b", "yes", "closed", ""],
        ["c", "no", "50", "yes"],
        ["low watermark: 50"],
    ]
    assert json.loads(ok(target, "source", "list", stream, "--format", "json")) == {
        "stream": stream,
        "low_watermark": 50,
        "sources": [
            {"source": "a", "declared": True, "punctuation": 100, "holds_back": False},
            {"source": "b", "declared": True, "punctuation": "closed", "holds_back": False},
            {"source": "c", "declared": False, "punctuation": 50, "holds_back": True},
        ],
    }
    assert fails(target, "source", "list", fresh("S")).startswith("lowtide: unknown stream")
    ok(target, "stream", "drop", stream)


def test_source_punctuate_takes_an_iso_time_and_refuses_a_regressing_value(
    target: str, fresh: Callable[[str], str]
) -> None:
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:timestamp[ms]", "--sources", "a")
    assert ok(target, "source", "punctuate", stream, "a", "2023-11-14T22:14:30").strip() == (
        f"source 'a' of stream {stream!r} punctuated at 2023-11-14T22:14:30: "
        "low watermark 2023-11-14T22:14:30, held back by a"
    )
    assert stream_info(target, stream)["low_watermark"] == 1_700_000_070_000
    assert source_list(target, stream)[1:] == [["a", "yes", "2023-11-14T22:14:30", "yes"],
                                                ["low watermark: 2023-11-14T22:14:30"]]  # fmt: skip
    assert source_list(target, stream, "--time-format", "raw")[-1] == ["low watermark: 1700000070000"]
    listed = json.loads(ok(target, "source", "list", stream, "--format", "json", "--time-format", "iso"))
    assert (listed["low_watermark"], listed["sources"][0]["punctuation"]) == ("2023-11-14T22:14:30",) * 2

    # An integer is a count of the attribute's unit; a value below the source's last is refused.
    ok(target, "source", "punctuate", stream, "a", "1700000080000")
    error = fails(target, "source", "punctuate", stream, "a", "2023-11-14T22:14:00")
    assert error.startswith("lowtide: punctuation 1700000040000 of source 'a'"), error
    assert "goes back from 1700000080000" in error
    assert stream_info(target, stream)["source_punctuation"] == {"a": 1_700_000_080_000}
    assert "got 'end'; lowtide source close ends a source" in fails(
        target, "source", "punctuate", stream, "a", "end", code=2
    )
    ok(target, "stream", "drop", stream)


def test_source_close_ends_the_stream_once_every_source_closed_and_may_be_repeated(
    target: str, fresh: Callable[[str], str]
) -> None:
    stream, query = fresh("S"), fresh("q")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64", "--sources", "a,b")
    ok(target, "query", "register", f"SELECT count(*) AS n [RANGE 10, WA ts] FROM {stream}", "--name", query)
    assert ok(target, "source", "close", stream, "a").strip() == (
        f"source 'a' of stream {stream!r} closed: low watermark none, held back by b"
    )
    assert fails(target, "source", "close", stream, "c") == (
        f"lowtide: stream {stream!r}: unknown source 'c'; sources: a, b"
    )
    assert ok(target, "source", "close", stream, "b").strip() == (
        f"source 'b' of stream {stream!r} closed: low watermark end"
    )
    assert stream_info(target, stream)["low_watermark"] == END_OF_STREAM
    # The stream ended: the query's output ends, so tail exits.
    out = ok(target, "tail", query, "--format", "jsonl", "--show-punctuation", timeout=TAIL_WAIT)
    assert json.loads(out.splitlines()[-1])["punctuation"] == "end"
    assert ok(target, "source", "close", stream, "b").strip() == (
        f"source 'b' of stream {stream!r} was closed already: low watermark end"
    )
    assert fails(target, "source", "punctuate", stream, "a", "5") == (
        f"lowtide: source 'a' of stream {stream!r} is closed; it takes no punctuation"
    )
    ok(target, "query", "drop", query)
    ok(target, "stream", "drop", stream)


def test_send_without_source_to_a_stream_with_declared_sources_is_refused(
    target: str, fresh: Callable[[str], str], tmp_path: Path
) -> None:
    stream = fresh("S")
    ok(target, "stream", "create", stream, "--schema", "k:string,ts:int64", "--sources", "a,b")
    path = tmp_path / "rows.csv"
    path.write_text("k,ts\nx,1\n")
    assert fails(target, "send", stream, str(path), "--punctuation", "end") == (
        f"lowtide: stream {stream!r} declares sources a, b: name one with --source"
    )
    info = stream_info(target, stream)
    assert (info["tuples_ingested"], info["sources"]) == (0, ["a", "b"])
    # Named, even as 'default', it is sent (an undeclared source: with a warning).
    done = lowtide(target, "send", stream, str(path), "--source", "default")
    assert done.returncode == 0 and "source 'default' is not declared" in done.stderr, done.stderr
    assert stream_info(target, stream)["tuples_ingested"] == 1
    ok(target, "stream", "drop", stream)
