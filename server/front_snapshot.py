"""What a checkpoint keeps of the front: the catalog and the door, then the output side.

The door (taken when the barrier leaves, at log position ``seq``): the string pool, the streams
as created (their ``CreateStream`` records) with each source's punctuation, the queries as
registered (their ``RegisterQuery`` records, with the slices each read), the applied batch ids.
The output side (taken when the last worker echoed the barrier): per query the meld's
punctuation, its counters, whether it failed, its result stream; per hub the next offset and the
retained items; what result streams sent to workers in between (see
:mod:`lowtide.server.checkpoint_store`), and the strings the front's last Projects made and
pinned in between, with their codes (those messages hold them; restored over the door's pool).
Plain data only (:mod:`lowtide.snapshot`): numbers, strings, numpy arrays; tables travel as
Arrow IPC bytes. It reads and restores the front through :class:`FrontParts` alone, never the
whole front.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from lowtide.handles import Item
from lowtide.ipc import read_ipc
from lowtide.punctuation.model import Punctuation
from lowtide.server import input_log as records
from lowtide.server.batches import AppliedBatches
from lowtide.server.hub import Hub
from lowtide.server.journal import Prepared, RestoredQuery
from lowtide.snapshot import State, as_array, as_dict, as_int, as_list, as_str

if TYPE_CHECKING:
    from lowtide.server.server_door import Recorded, ServerDoor


class FrontParts(Protocol):
    """What of the front a snapshot holds: the door, the catalog as created, the applied batch
    ids, the hubs; ``apply`` re-creates the catalog at restore."""

    door: ServerDoor
    catalog_streams: dict[str, records.CreateStreamRecord]
    catalog_queries: dict[str, records.RegisterQueryRecord]
    applied: dict[tuple[str, str], AppliedBatches]
    hubs: dict[str, Hub]

    def apply(self, record: records.Record, prepared: Prepared | None = None) -> Any: ...


# -- the door -------------------------------------------------------------------------------------
def door_state(front: FrontParts, seq: int) -> State:
    door = front.door
    return {
        "seq": seq,
        "strings": door.pool.snapshot(),
        "streams": [_fields(record) for record in front.catalog_streams.values()],
        "queries": [
            {"register": _fields(record), "share": door.share_of(name)}
            for name, record in front.catalog_queries.items()
        ],
        "progress": door.snapshot_progress(),
        "applied": [_ids_state(stream, source, ids) for (stream, source), ids in front.applied.items()],
    }


def _ids_state(stream: str, source: str, ids: AppliedBatches) -> State:
    lo, hi = ids.as_runs()
    return {"stream": stream, "source": source, "lo": np.array(lo, np.int64), "hi": np.array(hi, np.int64)}


def _fields(record: records.Record) -> dict[str, State]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(record).items()}


# -- the output side ------------------------------------------------------------------------------
def output_state(front: FrontParts, channel: list[Recorded], pinned: list[int]) -> State:
    door = front.door
    queries: dict[str, State] = {}
    for name, remote in door.remotes().items():
        running = door.query(name)
        queries[name] = {
            "meld": remote.meld.meld.snapshot(),
            "late_dropped": running.late_dropped,
            "results": running.sink.results,
            "failed": remote.failed,
            "inputs": [op.snapshot() for _, op in running.subscribers],
            "derived": running.derived.snapshot() if running.derived is not None else None,
        }
    return {
        "queries": queries,
        "hubs": {key: _hub_state(hub) for key, hub in front.hubs.items()},
        "channel": [
            {"worker": worker, "header": list(header), "arrays": dict(arrays) if arrays else None}
            for worker, header, arrays in channel
        ],
        "pinned": door.pool.held(pinned),
    }


def _hub_state(hub: Hub) -> State:
    items: list[State] = []
    for offset, item in hub.retained:
        if isinstance(item, Punctuation):
            items.append({"offset": offset, "value": item.value, "attribute": item.attribute})
        else:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, item.schema) as writer:
                writer.write_table(item)
            items.append({"offset": offset, "arrow": np.frombuffer(sink.getvalue(), np.uint8).copy()})
    return {"next": hub.next_offset, "items": items, "closed": hub.closed.status if hub.closed else None}


def _restore_hub(hub: Hub, state: State, live: bool) -> None:
    """A new hub takes the saved offset and items; a live one (a worker died) skips the items
    that come again."""
    saved = as_dict(state, "hub")
    next_offset = as_int(saved["next"], "hub next offset")
    if live:
        hub.remade = hub.next_offset - next_offset
        return
    retained: list[tuple[int, Item]] = []
    for entry in as_list(saved["items"], "hub items"):
        e = as_dict(entry, "hub item")
        item: Item
        if "arrow" in e:
            item = read_ipc(as_array(e["arrow"], "hub table", np.uint8, 1).tobytes())
        else:
            item = Punctuation(as_int(e["value"], "punctuation"), as_str(e["attribute"], "attribute"))
        retained.append((as_int(e["offset"], "offset"), item))
    hub.restore(next_offset, retained)


# -- restore --------------------------------------------------------------------------------------
def restore_catalog(front: FrontParts, door: State) -> None:
    """Streams and queries as they were at the checkpoint (queries post ``register`` to workers)."""
    saved = as_dict(door, "front door")
    front.door.pool.restore(saved["strings"])
    for entry in as_list(saved["streams"], "streams"):
        front.apply(records.CreateStreamRecord(**as_dict(entry, "create_stream")))  # type: ignore[arg-type]
    for entry in as_list(saved["queries"], "queries"):
        e = as_dict(entry, "query")
        record = records.RegisterQueryRecord(**as_dict(e["register"], "register_query"))  # type: ignore[arg-type]
        share = e["share"]
        front.apply(record, None if share is None else RestoredQuery(as_str(share, "share")))
    # Progress only now: a query registered on a stream that has progressed is punctuated at
    # once, which its restored operators have seen already.
    front.door.restore_progress(saved["progress"])
    for entry in as_list(saved["applied"], "applied"):
        e = as_dict(entry, "applied ids")
        ids = AppliedBatches.from_runs(
            [int(v) for v in as_array(e["lo"], "ids", np.int64, 1)],
            [int(v) for v in as_array(e["hi"], "ids", np.int64, 1)],
        )
        front.applied[(as_str(e["stream"], "stream"), as_str(e["source"], "source"))] = ids


def restore_output(front: FrontParts, output: State, live_hubs: bool) -> list[Recorded]:
    """Melds, counters, failures and hubs; returns the messages to send the workers again."""
    saved = as_dict(output, "front output")
    door = front.door
    if "pinned" in saved:  # (a checkpoint of an older lowtide has none)
        door.pool.pin_held(saved["pinned"])
    for name, entry in as_dict(saved["queries"], "queries").items():
        e = as_dict(entry, f"query {name}")
        remote = door.remotes()[name]
        running = door.query(name)
        remote.meld.meld.restore(e["meld"])
        running.late_dropped = as_int(e["late_dropped"], "late_dropped")
        running.sink.results = as_int(e["results"], "results")
        for (_, op), state in zip(running.subscribers, as_list(e["inputs"], "inputs"), strict=True):
            op.restore(state)
        if running.derived is not None and e["derived"] is not None:
            running.derived.restore(e["derived"])
        if e["failed"] is not None:
            door.fail_remote(name, as_str(e["failed"], "failure"))
    for key, state in as_dict(saved["hubs"], "hubs").items():
        hub = front.hubs.get(key)
        if hub is not None:
            _restore_hub(hub, state, live_hubs)
            closed = as_dict(state, "hub")["closed"]
            if closed is not None:
                hub.close(as_str(closed, "status"), door.remotes()[key.removesuffix(".late")].failed or "")
    return [
        (
            as_int(e["worker"], "worker"),
            tuple(as_list(e["header"], "header")),
            as_dict(e["arrays"], "arrays") if e["arrays"] is not None else None,
        )
        for e in (as_dict(m, "message") for m in as_list(saved["channel"], "channel"))
    ]
