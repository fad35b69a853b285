"""What recovery of the input log tells apart (docs/design.md, "Durability"): a torn last frame is
dropped, and only once recovery has succeeded; damage anywhere else, a missing segment or a log
shorter than a checkpoint's manifest says stops the start naming the file, with the state directory
unchanged."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from state_files import files, frame_starts, record_starts, write_end

from lowtide.errors import StartupFailure
from lowtide.server import input_log
from lowtide.server.checkpoint_store import MANIFEST, CheckpointStore
from lowtide.server.input_log import (
    BatchRecord,
    Damaged,
    Extent,
    InputLog,
    PunctuateRecord,
    TornTail,
    encode,
    frame,
    segment_name,
)
from lowtide.server.journal import StateDirectory
from lowtide.snapshot import pack_parts

RECORDS = 20


def record(i: int) -> BatchRecord:
    return BatchRecord(float(i), "s", "a", i + 1, (bytes(range(256)) * 2,))


def filled(tmp_path: Path, segment_bytes: int = 1 << 20) -> Path:
    """A state directory whose log holds ``RECORDS`` records (each about 600 bytes)."""
    state = StateDirectory(str(tmp_path / "state"), "no")
    state.log.segment_bytes = segment_bytes
    assert list(state.log.replay()) == []
    state.log.recovered()
    for i in range(RECORDS):
        state.log.append(record(i))
    state.close()
    return state.path


def segments(state: Path) -> list[Path]:
    return sorted((state / "log").glob("*.seg"))


def replayed(state: Path, start: int = 0, extent: Extent | None = None) -> tuple[InputLog, list[int]]:
    log = InputLog(state / "log")
    return log, [seq for seq, _ in log.replay(start, extent)]


def refused(state: Path, match: str, start: int = 0, extent: Extent | None = None) -> None:
    """Recovery stops with ``match`` (a literal) and the directory is byte for byte as it was."""
    before = files(state)
    with pytest.raises(Damaged, match=re.escape(match)):
        replayed(state, start, extent)
    assert files(state) == before


def torn_frame(kind: str) -> bytes:
    """The bytes a crash can leave of the last write: a prefix of a frame, or its full length of
    wrong bytes (a power loss after the file grew, before its pages were written)."""
    whole = frame(encode(PunctuateRecord(99.0, "s", "a", 1000)))
    match kind:
        case "header cut":
            return whole[:5]
        case "payload cut":
            return whole[:-7]
        case "checksum":
            return whole[:-1] + bytes([whole[-1] ^ 0x55])
        case _:
            return bytes(len(whole))


@pytest.mark.parametrize("kind", ["header cut", "payload cut", "checksum", "zeros"])
def test_a_torn_last_frame_is_cut_off_only_once_recovered(tmp_path: Path, kind: str) -> None:
    state = filled(tmp_path)
    (segment,) = segments(state)
    whole = segment.read_bytes()
    torn = torn_frame(kind)
    segment.write_bytes(whole + torn)
    before = files(state)
    log, seqs = replayed(state)
    assert seqs == list(range(RECORDS))
    assert files(state) == before  # read, nothing changed yet
    cut = log.recovered()
    assert cut == TornTail(segment, len(whole), len(whole) + len(torn))
    assert cut is not None and cut.dropped == len(torn)
    assert segment.read_bytes() == whole
    log.append(record(RECORDS))  # appends follow the whole frames
    log.close()
    assert replayed(state)[1] == list(range(RECORDS + 1))


@pytest.mark.parametrize("segment_bytes", [1 << 20, 3000], ids=["one segment", "the last of five"])
def test_a_flipped_high_byte_of_a_length_mid_segment_is_damage(tmp_path: Path, segment_bytes: int) -> None:
    """The issue's case: the length now runs past the end of the file, as a torn write's does,
    but whole frames follow it."""
    state = filled(tmp_path, segment_bytes)
    segment = segments(state)[-1]
    data = bytearray(segment.read_bytes())
    starts = record_starts(bytes(data))
    at = starts[len(starts) // 2]
    data[at + 3] ^= 0x40  # the length's high byte (little-endian)
    segment.write_bytes(bytes(data))
    following = starts[len(starts) // 2 + 1]
    refused(
        state,
        f"the input log is damaged at byte {at} of {segment}: whole records follow it from byte {following}",
    )


def test_a_damaged_frame_before_the_last_is_damage(tmp_path: Path) -> None:
    state = filled(tmp_path)
    (segment,) = segments(state)
    data = bytearray(segment.read_bytes())
    at = record_starts(bytes(data))[5]
    data[at + 100] ^= 0xFF
    segment.write_bytes(bytes(data))
    refused(state, f"the input log is damaged at byte {at} of {segment}")


def extent_of(state: Path, manifest: Path) -> Extent:
    """What a manifest written now would say of the log (as the checkpoint coordinator writes it)."""
    last = segments(state)[-1]
    return Extent(RECORDS, last.name, last.stat().st_size, manifest)


def test_a_last_segment_cut_short_mid_file_is_refused_when_a_manifest_says_it_was_longer(
    tmp_path: Path,
) -> None:
    """Cut at a frame in the middle the log looks torn; the manifest written after the log was
    fsynced says how long it was."""
    state = filled(tmp_path)
    (segment,) = segments(state)
    manifest = state / "checkpoints" / "00000000000000000012" / MANIFEST
    extent = extent_of(state, manifest)
    data = segment.read_bytes()
    segment.write_bytes(data[: record_starts(data)[12] + 30])
    write_end(
        state / "log" / "end", 12, 0, record_starts(data)[12]
    )  # the manifest alone vouches (end: below)
    refused(
        state,
        f"the input log ends at record 12 in {segment}, but {manifest} was written when it held "
        f"{RECORDS} records, through byte {len(data)} of {segment}: a segment is missing or cut short",
        start=12,
        extent=extent,
    )
    # Without a manifest that says otherwise, the same bytes are a torn last write.
    assert replayed(state)[1] == list(range(12))


def test_missing_segments_and_a_missing_log_are_refused(tmp_path: Path) -> None:
    original = filled(tmp_path, segment_bytes=3000)
    first, middle, after, *_, last = segments(original)
    manifest = original / "checkpoints" / "00000000000000000008" / MANIFEST
    extent = extent_of(original, manifest)
    cases = {
        middle: f"the input log misses records {int(middle.stem)} to {int(after.stem) - 1} before ",
        last: "the input log misses the segment(s) after ",
        first: f"the input log begins at record {int(middle.stem)} in ",
    }
    for segment, match in cases.items():
        state = tmp_path / segment.stem
        shutil.copytree(original, state)
        (state / "log" / segment.name).unlink()
        refused(state, match, extent=extent)
    for segment in segments(original):
        segment.unlink()
    refused(original, f"the input log {original / 'log'} holds no segment (a log always holds one)")
    (original / "log" / "end").unlink()
    (original / "log").rmdir()
    refused(original, f"the input log {original / 'log'} is missing")


def test_a_deleted_last_segment_is_refused_without_a_manifest_by_the_seal_before_it(tmp_path: Path) -> None:
    """Each segment a newer one follows ends sealed: losing the newest segment(s) shows even
    where no manifest vouches for the log, while a crash in the middle of making the next
    segment (made, the one before not sealed yet) is no damage."""
    original = filled(tmp_path, segment_bytes=3000)
    *_, before_last, last = segments(original)
    for gone in ([last], [before_last, last]):
        state = tmp_path / f"without-{len(gone)}"
        shutil.copytree(original, state)
        for segment in gone:
            (state / "log" / segment.name).unlink()
        refused(state, f"the input log misses the segment(s) after {state / 'log'}/")
    unsealed = tmp_path / "unsealed"
    shutil.copytree(original, unsealed)
    last.unlink()
    sealed_at = before_last.read_bytes().rfind(b'{"kind":"seal"') - 12
    Path(unsealed / "log" / before_last.name).write_bytes(before_last.read_bytes()[:sealed_at])
    (unsealed / "log" / last.name).write_bytes(b"")  # made, then the crash: no seal, no record
    write_end(unsealed / "log" / "end", int(last.stem), int(before_last.stem), sealed_at)  # as then
    assert replayed(unsealed)[1] == list(range(int(last.stem)))


def checkpoints(state: Path, seqs: list[int]) -> CheckpointStore:
    """Checkpoints at ``seqs`` with empty state, their manifests saying the log held every record."""
    store = CheckpointStore(state / "checkpoints")
    last = segments(state)[-1]
    for seq in seqs:
        store.begin(seq)
        store.commit(seq, pack_parts({}), [], (RECORDS, last.name, last.stat().st_size))
    return store


def test_every_manifest_deleted_is_refused_and_the_checkpoints_stay(tmp_path: Path) -> None:
    """The log before the oldest checkpoint kept is gone: without a manifest nothing covers it,
    and the checkpoint directories (all that holds those records now) must survive the refusal."""
    state = filled(tmp_path, segment_bytes=3000)
    store = checkpoints(state, [8, 16])
    log, _ = replayed(state)
    log.recovered()
    log.truncate_before(8)
    log.close()
    begins = segments(state)[0]
    for path in store.complete():
        (path / MANIFEST).unlink()
    before = files(state)
    assert store.load(workers=0) is None
    assert store.extent() is None
    assert files(state) == before
    refused(state, f"the input log begins at record {int(begins.stem)} in {begins}, but no whole checkpoint")
    assert sorted(p.name for p in (state / "checkpoints").iterdir()) == [f"{8:020d}", f"{16:020d}"]
    store.remove_interrupted()  # what a start does once it has recovered
    assert list((state / "checkpoints").iterdir()) == []


def test_the_furthest_extent_any_manifest_records_counts_and_old_manifests_still_read(tmp_path: Path) -> None:
    state = filled(tmp_path)
    store = checkpoints(state, [8, 16])
    newest = state / "checkpoints" / f"{16:020d}" / MANIFEST
    assert store.extent() == Extent(RECORDS, segment_name(0), segments(state)[0].stat().st_size, newest)
    # A manifest of a lowtide before extents: the log held at least the records before its seq.
    for path in store.complete():
        manifest = json.loads((path / MANIFEST).read_text())
        del manifest["log"], manifest["crc32"]
        (path / MANIFEST).write_text(json.dumps(manifest))
    assert store.extent() == Extent(16, "", 0, newest)
    checkpoint = store.load(workers=0)
    assert checkpoint is not None and checkpoint.seq == 16


def test_a_new_state_directory_holds_a_log_of_one_empty_segment(tmp_path: Path) -> None:
    state = StateDirectory(str(tmp_path / "state"), "no")
    state.close()
    opening = files(state.path)[f"log/{segment_name(0)}"]
    assert opening is not None and record_starts(opening) == []  # the frame that names record 0
    end = files(state.path)["log/end"]
    assert end is not None and len(end) == 72  # two slots: the second says 0 records
    assert files(state.path) == {
        "lock": b"",
        "log": None,
        f"log/{segment_name(0)}": opening,
        "log/end": end,
        "lowtide-state.json": (state.path / "lowtide-state.json").read_bytes(),
    }
    # A first start a crash interrupted before the marker: still a new directory.
    (state.path / "lowtide-state.json").unlink()
    StateDirectory(str(state.path), "no").close()
    assert (state.path / "lowtide-state.json").exists()


def test_a_flipped_byte_in_the_last_acknowledged_record_is_damage_not_a_tear(tmp_path: Path) -> None:
    """The issue's case: every byte of the last record is there and its CRC fails. ``D/log/end``
    says it was written (acknowledged), so it is damage: before, the start cut it off as torn."""
    state = filled(tmp_path)
    (segment,) = segments(state)
    data = bytearray(segment.read_bytes())
    at = record_starts(bytes(data))[-1]
    data[at + 40] ^= 0x01
    segment.write_bytes(bytes(data))
    refused(state, f"the last record of {segment}, at byte {at}, fails its CRC: it was written whole")
    # On the operator's word it is given up, and counted, once recovery has succeeded.
    log = InputLog(state / "log", truncate_tail=True)
    assert [seq for seq, _ in log.replay()] == list(range(RECORDS - 1))
    assert files(state)[f"log/{segment.name}"] == bytes(data)
    assert log.recovered() == TornTail(segment, at, len(data), lost=1)
    log.close()
    assert segment.read_bytes() == bytes(data[:at])
    assert replayed(state)[1] == list(range(RECORDS - 1))  # and the end now says so


@pytest.mark.parametrize("cut", [0, 7, 12], ids=["to its opening", "at record 7", "at record 12"])
def test_a_log_cut_at_a_record_boundary_is_refused_by_its_end(tmp_path: Path, cut: int) -> None:
    """Cut where a record begins, the segment reads as a log that ended there; ``D/log/end``
    (rewritten as the log grows) says how far it reached. Before, such a start was silent."""
    state = filled(tmp_path)
    (segment,) = segments(state)
    data = segment.read_bytes()
    at = record_starts(data)[cut] if cut else frame_starts(data)[1]
    segment.write_bytes(data[:at])
    refused(
        state,
        f"the input log ends at record {cut} in {segment}, but {state / 'log' / 'end'} says {RECORDS} "
        f"records were written, through byte {len(data)} of {segment.name}: {RECORDS - cut} acknowledged "
        "records are missing",
    )
    log = InputLog(state / "log", truncate_tail=True)
    assert [seq for seq, _ in log.replay()] == list(range(cut))
    torn = log.recovered()
    assert torn is not None and torn.lost == RECORDS - cut
    log.append(record(cut))
    log.close()
    assert replayed(state)[1] == list(range(cut + 1))


def test_a_renamed_segment_is_refused(tmp_path: Path) -> None:
    """Each segment names its first record inside: renamed, every record's number would shift
    (before, 10 tuples came out twice)."""
    state = filled(tmp_path, segment_bytes=3000)
    first, second, *_ = segments(state)
    renamed = first.with_name(segment_name(1))
    first.rename(renamed)
    why = "(renamed, or its name damaged)"
    refused(state, f"{renamed} holds the records from 0 on: its name says 1 {why}", start=1)
    renamed.rename(first)
    earlier = second.with_name(segment_name(int(second.stem) - 1))
    second.rename(earlier)
    refused(
        state,
        f"{earlier} holds the records from {int(second.stem)} on: its name says {int(earlier.stem)} {why}",
    )


def test_the_end_file_reads_past_one_torn_slot_and_refuses_two(tmp_path: Path) -> None:
    state = filled(tmp_path)
    end = state / "log" / "end"
    data = bytearray(end.read_bytes())
    newest = (RECORDS + 3) % 2  # the slot written last: made, once recovered, once a record, at close
    data[newest * 36 + 3] ^= 0xFF  # a torn write of the newest slot: the one before counts
    end.write_bytes(bytes(data))
    assert replayed(state)[1] == list(range(RECORDS))
    data[(1 - newest) * 36 + 3] ^= 0xFF
    end.write_bytes(bytes(data))
    refused(state, f"{end}, which says how far the input log reached, is damaged")
    # Deleted with the log cut short, the cut would look like the log's end: the end file is
    # made with the log's first segment, so a log whose segments open with their number has one.
    end.unlink()
    (segment,) = segments(state)
    segment.write_bytes(segment.read_bytes()[: record_starts(segment.read_bytes())[10]])
    refused(state, f"{end}, which says how far the input log reached, is missing")


def test_a_directory_that_is_not_ours_is_left_exactly_as_it_was(tmp_path: Path) -> None:
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    before = files(foreign)
    with pytest.raises(StartupFailure, match="is not empty and holds no lowtide state"):
        StateDirectory(str(foreign), "no")
    assert files(foreign) == before  # no lock file left behind


def test_the_first_record_is_reported_durable_however_soon_its_fsync_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fsync = "always"``: the fsync thread starts with the first wait for a record; when its
    first fsync is over before the wait is even registered, the record is reported all the same
    (it once waited for the next record to be written)."""
    state = StateDirectory(str(tmp_path / "state"), "always")
    log = state.log
    log.recovered()
    idle = threading.Event()

    class Watched(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            idle.set()  # the thread has synced all there is and waits for more
            return super().wait(timeout)

    class Eager(threading.Thread):
        def start(self) -> None:  # returns once the thread has done its first round
            super().start()
            assert idle.wait(10)

    log._synced = Watched()
    monkeypatch.setattr(input_log, "threading", SimpleNamespace(Thread=Eager))

    async def durable() -> int:
        reported: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        log.when_durable(
            log.append(record(0)), lambda through: reported.done() or reported.set_result(through)
        )
        return await asyncio.wait_for(reported, 10)

    async def run() -> Any:
        try:
            return await durable()
        finally:
            state.close()  # while the loop runs: the fsync thread's last call lands on it

    assert asyncio.run(run()) == 0
