"""The staging area of staged batches (server/staging.py), without a server: a part staged again
replaces the old one, a commit reads the named parts in its order or fails naming the missing one,
the byte budget refuses what does not fit and changes nothing, parts expire by the clock they are
given, and with a directory each part is a file a fresh area loads at start - except a batch
applied meanwhile, a damaged file and a ``.tmp`` a crash left behind."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from lowtide.errors import InvalidArgument, NotFound, ResourceExhausted
from lowtide.server import staging as staging_module
from lowtide.server.staging import MAX_PART_NAME, BatchKey, StagingArea, check_part_name

KEY: BatchKey = ("s", "src", 7)
OTHER: BatchKey = ("s", "src", 8)
TIMEOUT = 60.0


def area(directory: Path | None = None, max_bytes: int = 1 << 20) -> StagingArea:
    return StagingArea(directory, False, TIMEOUT, max_bytes)


def stage(staging: StagingArea, key: BatchKey, name: str, *payloads: bytes) -> None:
    """As the Stage call does: reserve the part's bytes, then keep it."""
    for payload in payloads:
        staging.reserve(len(payload))
    asyncio.run(staging.stage(key, name, list(payloads)))


@pytest.mark.parametrize("directory", [False, True], ids=["memory", "directory"])
def test_a_part_staged_again_replaces_the_old_one(tmp_path: Path, directory: bool) -> None:
    staging = area(tmp_path / "staging" if directory else None)
    if staging.directory is not None:
        staging.directory.mkdir()
    stage(staging, KEY, "p0", b"a" * 100, b"b" * 50)
    stage(staging, KEY, "p1", b"c" * 10)
    assert (staging.bytes, staging.parts) == (160, 2)
    stage(staging, KEY, "p0", b"d" * 30)  # the task ran again
    assert (staging.bytes, staging.parts) == (40, 2)
    assert staging.payloads(KEY, ["p0", "p1"]) == [b"d" * 30, b"c" * 10]
    if staging.directory is not None:
        assert len(list(staging.directory.iterdir())) == 2  # one file per part, replaced whole


def test_payloads_come_in_the_named_order_and_a_missing_part_is_named(tmp_path: Path) -> None:
    staging = area()
    stage(staging, KEY, "p0", b"0a", b"0b")
    stage(staging, KEY, "p1", b"1")
    stage(staging, KEY, "p2", b"2")
    stage(staging, OTHER, "p3", b"other batch")
    assert staging.payloads(KEY, ["p2", "p0", "p1"]) == [b"2", b"0a", b"0b", b"1"]
    assert staging.payloads(KEY, ["p1"]) == [b"1"]  # a subset: reading takes nothing away
    with pytest.raises(NotFound) as missing:
        staging.payloads(KEY, ["p0", "p3", "p9"])
    reason = str(missing.value)
    assert "'p3'" in reason and "batch 7 of stream 's' source 'src'" in reason, reason
    assert "3 staged" in reason and "\n" not in reason, reason
    with pytest.raises(NotFound, match="'p0'"):
        staging.payloads(("s", "src", 99), ["p0"])
    assert staging.parts == 4


def test_discard_drops_every_part_of_one_batch_only(tmp_path: Path) -> None:
    staging = area(tmp_path)
    stage(staging, KEY, "p0", b"x" * 10)
    stage(staging, KEY, "p1", b"y" * 20)
    stage(staging, OTHER, "p0", b"z" * 5)
    assert staging.discard(KEY) == 2
    assert (staging.bytes, staging.parts, list(staging.batches)) == (5, 1, [OTHER])
    assert list(tmp_path.iterdir()) == [staging.batches[OTHER]["p0"].path]
    assert staging.discard(KEY) == 0  # again: nothing left, no error


def test_expire_drops_only_parts_older_than_the_timeout(tmp_path: Path) -> None:
    staging = area(tmp_path)
    stage(staging, KEY, "old", b"o" * 10)
    stage(staging, OTHER, "new", b"n" * 20)
    old, new = staging.batches[KEY]["old"], staging.batches[OTHER]["new"]
    new.staged_at = old.staged_at + 30  # staged half a timeout later
    assert staging.expire(old.staged_at + TIMEOUT) == 0  # exactly the timeout: still kept
    assert staging.expire(old.staged_at + TIMEOUT + 1) == 1
    assert (staging.bytes, staging.parts, staging.expired) == (20, 1, 1)
    assert old.path is not None and not old.path.exists()
    assert new.path is not None and new.path.exists()
    assert staging.expire(new.staged_at + TIMEOUT + 1) == 1
    assert (staging.bytes, staging.parts, staging.expired, staging.batches) == (0, 0, 2, {})
    assert list(tmp_path.iterdir()) == []


def test_reserving_past_max_bytes_is_refused_and_changes_nothing() -> None:
    staging = area(max_bytes=100)
    stage(staging, KEY, "p0", b"a" * 60)
    with pytest.raises(ResourceExhausted) as refused:
        staging.reserve(41)
    reason = str(refused.value)
    assert "max_staged_bytes (100)" in reason and "60 bytes are staged" in reason and "\n" not in reason
    assert (staging.bytes, staging.parts) == (60, 1)
    staging.reserve(40)  # exactly up to the limit fits
    staging.release(40)
    assert staging.bytes == 60
    assert staging.payloads(KEY, ["p0"]) == [b"a" * 60]


@pytest.mark.parametrize("name", ["", "x" * (MAX_PART_NAME + 1), "é" * (MAX_PART_NAME // 2 + 1), "a\x00b"])
def test_a_part_name_is_1_to_256_bytes_without_nul(name: str) -> None:
    with pytest.raises(InvalidArgument, match="1 to 256 bytes"):
        check_part_name(name)


def test_part_names_at_the_limits_pass() -> None:
    check_part_name("p")
    check_part_name("x" * MAX_PART_NAME)
    check_part_name("é" * (MAX_PART_NAME // 2))


def test_parts_in_files_are_loaded_by_a_fresh_area(tmp_path: Path) -> None:
    directory = tmp_path / "staging"
    directory.mkdir()
    first = area(directory)
    payloads = {name: [bytes(range(256)) * (i + 1), b"tail %d" % i] for i, name in enumerate(["p0", "p1"])}
    for name, parts in payloads.items():
        stage(first, KEY, name, *parts)
    stage(first, OTHER, "applied", b"of a batch applied before the files went")
    stage(first, ("s", "src", 9), "damaged", b"d" * 64)
    assert first.batches[KEY]["p0"].payloads is None  # in its file, not in memory
    files = sorted(path.name for path in directory.iterdir())
    assert len(files) == 4 and all(name.endswith(".part") for name in files), files

    damaged = first.batches[("s", "src", 9)]["damaged"].path
    assert damaged is not None
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte: the CRC no longer matches
    damaged.write_bytes(bytes(data))
    leftover = directory / (files[0] + ".3.tmp")  # a write a crash cut short
    leftover.write_bytes(b"half a part")

    again = area(directory)
    kept, dropped = again.load(lambda key: key == OTHER)
    assert (kept, dropped) == (2, 1)
    assert list(again.batches) == [KEY] and sorted(again.batches[KEY]) == ["p0", "p1"]
    for name, parts in payloads.items():
        assert again.payloads(KEY, [name]) == parts, name
    assert again.bytes == sum(len(p) for parts in payloads.values() for p in parts)
    assert set(directory.iterdir()) == {part.path for part in again.batches[KEY].values()}
    # What was loaded commits and goes like what was staged here.
    assert again.discard(KEY) == 2
    assert (again.bytes, list(directory.iterdir())) == (0, [])


def test_load_makes_the_directory_if_missing(tmp_path: Path) -> None:
    staging = area(tmp_path / "staging")
    assert staging.load(lambda key: False) == (0, 0)
    assert (tmp_path / "staging").is_dir()


def test_a_file_cut_short_is_dropped_at_load(tmp_path: Path) -> None:
    first = area(tmp_path)
    stage(first, KEY, "p0", b"x" * 100)
    path = first.batches[KEY]["p0"].path
    assert path is not None
    path.write_bytes(path.read_bytes()[:50])
    again = area(tmp_path)
    assert again.load(lambda key: False) == (0, 1)
    assert (again.parts, again.bytes, list(tmp_path.iterdir())) == (0, 0, [])


def test_a_cancelled_stage_changes_no_file_and_no_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Stage call cancelled while its part's file is being written (the client gave up, the
    connection dropped) keeps nothing: the part staged before under that name stays as it was, in
    memory and on disk, and a start finds only it."""
    staging = area(tmp_path)
    stage(staging, KEY, "p0", b"first")
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    entered, release, written = threading.Event(), threading.Event(), threading.Event()
    real = staging_module._write

    def held(*args: Any) -> None:
        entered.set()
        release.wait(30)
        try:
            real(*args)
        finally:
            written.set()

    monkeypatch.setattr(staging_module, "_write", held)

    async def cancelled() -> None:
        staging.reserve(len(b"second"))
        task = asyncio.create_task(staging.stage(KEY, "p0", [b"second"]))
        assert await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        staging.release(len(b"second"))  # as the call's end does
        release.set()
        assert await asyncio.to_thread(written.wait, 30)

    # asyncio.run shuts the executor down before it returns: the write is over, and the
    # removal of its temporary file (a callback of the write) ran before it.
    asyncio.run(cancelled())
    assert (staging.bytes, staging.parts) == (len(b"first"), 1)
    assert staging.payloads(KEY, ["p0"]) == [b"first"]
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before  # no temporary left
    again = area(tmp_path)
    assert again.load(lambda key: False) == (1, 0)
    assert again.payloads(KEY, ["p0"]) == [b"first"]
