"""The calls of staged batches: Stage, CommitStaged, AbortStaged (see :mod:`.staging`).

Invariant: a batch id applies once per ``(stream, source)``, whichever way it came (Ingest or a
commit), and a commit applies all the parts it names or none of them. A part is checked as it
is staged, as Ingest checks a batch (Arrow validated in full, the stream's schema, the row and
message limits), so that a commit of checked parts fails only on what changed since (the stream
dropped, the string pool full, a tuple late under ``late='error'``). A part is kept only once the
message marked ``last`` arrived: gRPC ends the requests of a call cut short (a message over the
limit, a cancel) as if the client had sent them all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from lowtide.door import DEFAULT_SOURCE
from lowtide.errors import InvalidArgument, NotFound
from lowtide.ipc import read_ipc
from lowtide.names import check_source
from lowtide.proto import lowtide_pb2 as pb
from lowtide.server import input_log as records
from lowtide.server.front import Front
from lowtide.server.staging import BatchKey, check_part_name


def _batch_key(front: Front, stream: str, source: str, batch_id: int, call: str) -> BatchKey:
    if not stream:
        raise NotFound(f"{call} must name the stream")
    front.door.low_watermark(stream)  # NotFound for an unknown stream
    check_source(source)
    if batch_id < 1:
        raise InvalidArgument(f"{call} needs a batch_id of 1 or more")
    return stream, source, batch_id


def _applied(front: Front, key: BatchKey) -> bool:
    stream, source, batch_id = key
    known = front.applied.get((stream, source))
    return known is not None and batch_id in known


async def stage(
    front: Front, requests: AsyncIterator[Any], decoded: Callable[[Any], Any]
) -> pb.StageResponse:
    """Stage one part from every message of the call; nothing is kept if the call fails."""
    key: BatchKey | None = None
    name = ""
    duplicate = ended = False
    payloads: list[bytes] = []
    rows = reserved = 0
    try:
        async for message in requests:
            request: pb.StageRequest = decoded(message)
            if ended:
                raise InvalidArgument("a Stage message came after the one marked last: nothing was staged")
            if key is None:
                source = request.source or DEFAULT_SOURCE
                key = _batch_key(front, request.stream, source, request.batch_id, "the first Stage message")
                name = request.part
                check_part_name(name)
                duplicate = _applied(front, key)
            ended = request.last
            if duplicate or not request.arrow:
                continue  # a batch applied before: its rows are not read
            front.staging.reserve(len(request.arrow))
            reserved += len(request.arrow)
            table = read_ipc(request.arrow, front.door.limits.max_batch_rows)
            rows += front.door.check(key[0], table, validated=True)
            payloads.append(request.arrow)
        if key is None:
            raise InvalidArgument("a Stage call needs at least one message")
        if not ended:  # gRPC ends the stream of a call cut short as if the client had ended it
            raise InvalidArgument("the Stage call ended before a message marked last: nothing was staged")
        if not duplicate:
            await front.staging.stage(key, name, payloads)
            reserved = 0  # the part holds them now
        return pb.StageResponse(tuples=0 if duplicate else rows, duplicate=duplicate)
    finally:
        front.staging.release(reserved)


async def commit_staged(front: Front, request: pb.CommitStagedRequest) -> pb.CommitStagedResponse:
    """Apply the named parts as one batch under its id (skipped if applied before), drop the
    batch's staged parts, then raise the source's punctuation if the request asks."""
    source = request.source or DEFAULT_SOURCE
    key = _batch_key(front, request.stream, source, request.batch_id, "CommitStaged")
    stream, _, batch_id = key
    names = list(request.parts)
    for name in names:
        check_part_name(name)
    if len(set(names)) != len(names):
        raise InvalidArgument(f"CommitStaged names a part twice in batch {batch_id}")
    duplicate = _applied(front, key)
    rows = 0
    if not duplicate:
        payloads = front.staging.payloads(key, names)
        epoch = front.door.epoch
        limit = front.door.limits.max_batch_rows
        admitted = [front.door.admit(stream, read_ipc(p, limit), validated=True) for p in payloads]
        if sum(batch.n for batch in admitted):
            batch = (batch_id, payloads, admitted, epoch)
            rows = await front.submit_batch(stream, source, *batch)
            duplicate = rows == 0  # applied meanwhile, by another commit
        else:
            # No row to apply, but the id is logged as applied all the same: its parts go below,
            # so a retried commit must find the batch applied (duplicate), not its parts missing.
            await front.submit(records.BatchRecord(time.time(), stream, source, batch_id, ()))
    front.staging.discard(key)
    held = front.door.source_punctuation(stream, source)
    if request.HasField("punctuation") and request.punctuation > held:
        value = front.door.check_punctuation(stream, request.punctuation, source)
        await front.submit(records.PunctuateRecord(time.time(), stream, source, value))
    low = front.door.low_watermark(stream)
    return pb.CommitStagedResponse(tuples=rows, duplicate=duplicate, low_watermark=low)


def abort_staged(front: Front, request: pb.AbortStagedRequest) -> pb.AbortStagedResponse:
    source = request.source or DEFAULT_SOURCE
    key = _batch_key(front, request.stream, source, request.batch_id, "AbortStaged")
    return pb.AbortStagedResponse(parts=front.staging.discard(key))


__all__ = ["abort_staged", "commit_staged", "stage"]
