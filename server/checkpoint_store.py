"""Checkpoints of ``--state-dir``: the whole server at one position of the input log.

A checkpoint at position ``seq`` holds what applying the log's records ``0 .. seq-1`` built: the
front's door and catalog (``front.state``) and every worker's operator state
(``worker-<i>.state``), so recovery restores it and replays the log from ``seq`` on, never from
the start. The log before the oldest checkpoint kept is removed.

It is taken without stopping ingestion (Chandy-Lamport, as Flink's barriers): the front saves
its door and sends every worker a barrier behind everything it has sent; each worker, when the
barrier reaches it, forks a child that writes its operators' state as of that moment and echoes
the barrier at once (it pauses only for the fork, see :mod:`lowtide.server.snapshot_writer`).
The output side - melds, hubs, the result streams that feed other queries - is saved when the
last echo is in: by then exactly the output of the records before ``seq`` has been released (see
:mod:`lowtide.server.ordered_meld`). What the result streams sent to workers between the barrier and
that moment is saved with it and sent again at restore. The manifest follows once every worker
has reported its file written, with the size and CRC-32 it reported.

Layout: ``D/checkpoints/<seq>/`` holding the state files and ``MANIFEST.json`` (written last,
atomically: the CRC-32 and size of every file, and how far the input log reached, fsynced just
before: see :class:`~lowtide.server.input_log.Extent`). A directory without a manifest is a
checkpoint a crash interrupted: ignored, and removed once a start has recovered. A file that
does not match the manifest makes recovery fall back to the previous checkpoint, saying which
file; with none left to fall back to, the start stops naming the file (never a silent empty
start). Loading changes nothing in ``D``.
"""

from __future__ import annotations

import json
import shutil
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowtide.errors import CorruptState, StartupFailure
from lowtide.server.files import write_atomically, write_parts_atomically
from lowtide.server.input_log import Extent
from lowtide.snapshot import State, unpack

MANIFEST = "MANIFEST.json"
FRONT = "front.state"


def worker_file(worker: int) -> str:
    return f"worker-{worker}.state"


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read back whole: its front state and where its workers' files are."""

    seq: int  # the first log record it does not cover
    directory: Path
    front: State
    workers: int

    def worker_path(self, worker: int) -> Path:
        return self.directory / worker_file(worker)


class CheckpointStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def begin(self, seq: int) -> Path:
        """An empty directory for the checkpoint at ``seq``."""
        target = self.directory / f"{seq:020d}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        return target

    def commit(
        self,
        seq: int,
        front: list[bytes | memoryview],
        workers: Sequence[tuple[int, int]],
        log: tuple[int, str, int],
    ) -> int:
        """Write the front's state and the manifest: from here on the checkpoint counts.
        ``workers``: the size and CRC-32 of each worker's file as its writer reported them (read
        back, a large state would hold up the front); ``log``: how far the input log reaches, on
        disk (``InputLog.sync_extent``). Returns the checkpoint's bytes."""
        target = self.directory / f"{seq:020d}"
        written = [write_parts_atomically(target / FRONT, front), *workers]
        names = [FRONT, *(worker_file(w) for w in range(len(workers)))]
        files = {name: {"bytes": n, "crc32": crc} for name, (n, crc) in zip(names, written, strict=True)}
        records, segment, size = log
        manifest = {
            "seq": seq,
            "workers": len(workers),
            "files": files,
            "log": {"records": records, "segment": segment, "bytes": size},
        }
        manifest["crc32"] = _crc(manifest)
        write_atomically(target / MANIFEST, json.dumps(manifest, indent=1).encode())
        return sum(size for size, _ in written)

    def abandon(self, seq: int) -> None:
        shutil.rmtree(self.directory / f"{seq:020d}", ignore_errors=True)

    def _directories(self) -> list[Path]:
        return sorted(self.directory.iterdir(), reverse=True) if self.directory.is_dir() else []

    def complete(self) -> list[Path]:
        """Checkpoint directories with a manifest, newest first."""
        return [path for path in self._directories() if (path / MANIFEST).exists()]

    def remove_interrupted(self) -> None:
        """Remove the directories without a manifest: checkpoints a crash interrupted, never
        counted. Only once a start has recovered (a missing manifest may be damage that stopped
        it), and before any checkpoint begins."""
        for path in self._directories():
            if not (path / MANIFEST).exists():
                shutil.rmtree(path, ignore_errors=True)

    def extent(self) -> Extent | None:
        """The furthest the input log reached by what any readable manifest says: the log must
        reach as far at recovery."""
        found: list[Extent] = []
        for path in self.complete():
            try:
                found.append(_extent(path / MANIFEST))
            except (OSError, ValueError, KeyError, TypeError, CorruptState):
                continue  # an unreadable manifest: load() falls back past it, saying so
        return max(found, key=lambda extent: extent.records, default=None)

    def load(self, workers: int) -> LoadedCheckpoint | None:
        """The newest checkpoint whose files are whole, falling back past damaged ones."""
        damaged: list[str] = []
        for path in self.complete():
            try:
                checkpoint = _read(path)
            except (OSError, ValueError, KeyError, TypeError, CorruptState) as exc:
                damaged.append(str(exc))
                print(f"lowtide: checkpoint {path} is damaged ({exc}); falling back", file=sys.stderr)
                continue
            if checkpoint.workers != workers:
                raise StartupFailure(
                    f"the checkpoint {path} was taken with {checkpoint.workers} workers; start with "
                    f"--workers {checkpoint.workers}"
                )
            return checkpoint
        if damaged:
            raise StartupFailure(f"no whole checkpoint left: {damaged[0]}")
        return None

    def prune(self, keep: int = 2) -> int | None:
        """Keep the newest ``keep`` checkpoints; the log position the oldest kept one needs."""
        kept = self.complete()
        for path in kept[keep:]:
            shutil.rmtree(path, ignore_errors=True)
        return int(kept[:keep][-1].name) if kept else None


def _crc(manifest: dict[str, Any]) -> int:
    """The CRC-32 of a manifest's content (all but its own ``crc32``), in one canonical form."""
    content = {k: v for k, v in manifest.items() if k != "crc32"}
    return zlib.crc32(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())


def _manifest(path: Path) -> dict[str, Any]:
    """A manifest, checked: its own CRC-32 (an older lowtide's has none), and a worker file for
    each worker it counts, no more, no fewer (a damaged digit in ``workers`` still parses)."""
    manifest: dict[str, Any] = json.loads(path.read_text())
    if "crc32" in manifest and manifest["crc32"] != _crc(manifest):
        raise CorruptState(f"{path} fails its CRC")
    workers = int(manifest["workers"])
    expected = {FRONT, *(worker_file(w) for w in range(workers))}
    if workers < 0 or set(manifest["files"]) != expected:
        raise CorruptState(f"{path} counts {workers} workers but lists the files {sorted(manifest['files'])}")
    return manifest


def _extent(manifest_path: Path) -> Extent:
    manifest = _manifest(manifest_path)
    if "log" not in manifest:  # an older lowtide's: the log held the records before the checkpoint
        return Extent(int(manifest["seq"]), "", 0, manifest_path)
    log = manifest["log"]
    return Extent(int(log["records"]), str(log["segment"]), int(log["bytes"]), manifest_path)


def _read(path: Path) -> LoadedCheckpoint:
    manifest = _manifest(path / MANIFEST)
    seq = int(manifest["seq"])
    if f"{seq:020d}" != path.name:  # a damaged digit still parses: the log would replay from it
        raise CorruptState(f"{path / MANIFEST} names checkpoint {seq}, not the one of its directory")
    for name, expected in manifest["files"].items():
        data = (path / name).read_bytes()
        if len(data) != expected["bytes"] or zlib.crc32(data) != expected["crc32"]:
            raise CorruptState(f"{path / name} does not match its manifest")
    front = unpack((path / FRONT).read_bytes())
    return LoadedCheckpoint(seq, path, front, int(manifest["workers"]))
