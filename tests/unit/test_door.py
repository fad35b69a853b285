"""The door and its runners: a batch is judged late once; the same door runs graphs anywhere.

The second half runs the server's ProcessRunner over a transport whose workers are objects in
this process (what a Ray transport would replace with actors): the dispatch, the ordered meld and
the worker code are the server's own, and the output equals the in-process engine's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lowtide import Engine, InvalidArgument, LateTuple, ManualClock
from lowtide.door import Door
from lowtide.handles import Item
from lowtide.server import messages as msg
from lowtide.server.process_runner import ProcessRunner
from lowtide.server.transport import Arrays
from lowtide.server.worker_process import Worker
from lowtide.stream import Stream
from lowtide.strings import StringPool

SCHEMA = {"key": "string", "value": "int64", "ts": "int64"}
WINDOWED = "SELECT key, sum(value) AS total [RANGE 10, SLIDE 5, WA ts] FROM S GROUP BY key"


def rows(ts: list[int], keys: list[str] | None = None) -> pa.Table:
    keys = keys or [f"k{t % 3}" for t in ts]
    return pa.table({"key": keys, "value": list(range(len(ts))), "ts": ts})


def engine_with_strict_query() -> Engine:
    engine = Engine(clock=ManualClock())
    engine.create_stream("S", SCHEMA)
    engine.register_query(WINDOWED, name="q", late="error")
    return engine


def count_late_masks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often any stream computes which tuples are behind punctuation, from now on."""
    calls = [0]
    late_mask = Stream.late_mask

    def counted(self: Stream, batch: Any) -> Any:
        calls[0] += 1
        return late_mask(self, batch)

    monkeypatch.setattr(Stream, "late_mask", counted)
    return calls


def test_a_checked_batch_applies_as_judged_when_nothing_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = engine_with_strict_query()
    engine.punctuate("S", 20)
    calls = count_late_masks(monkeypatch)
    parts = [engine.admit("S", rows([25, 30])), engine.admit("S", rows([40]))]
    checked = engine.check_batch("S", parts)
    engine.push_admitted("S", checked)
    assert calls[0] == 2  # once per part, at the check only
    assert engine.stats()["streams"]["S"]["ingested"] == 3
    engine.push("S", rows([50]))  # in process: judged once, where it applies
    assert calls[0] == 3


def test_a_change_between_the_check_and_the_application_judges_the_batch_again() -> None:
    engine = engine_with_strict_query()
    checked = engine.check_batch("S", [engine.admit("S", rows([12, 14]))])  # on time: progress is none
    engine.punctuate("S", 20)  # now both tuples are late for the query's windows
    with pytest.raises(LateTuple):
        engine.push_admitted("S", checked)
    assert engine.stats()["streams"]["S"]["ingested"] == 0  # nothing applied


def test_a_judgement_holds_for_its_own_stream_and_source_only() -> None:
    engine = engine_with_strict_query()
    engine.create_stream("T", SCHEMA)
    checked = engine.check_batch("S", [engine.admit("S", rows([5]))], source="a")
    assert checked.current("S", "a", engine.epoch)
    assert not checked.current("S", "b", engine.epoch)
    assert not checked.current("T", "a", engine.epoch)
    engine.create_stream("U", SCHEMA)  # a change to the catalog
    assert not checked.current("S", "a", engine.epoch)


def test_the_epoch_moves_with_what_the_judgement_reads_only() -> None:
    """A batch that moves no progress leaves the epoch where it was (the batches judged before
    it apply as judged); progress that moves, and a change to the catalog, move it."""
    engine = engine_with_strict_query()
    engine.create_stream("T", SCHEMA, punctuation="bounded:5")  # its batches move progress
    start = engine.epoch
    engine.push("S", rows([1, 2]), "a")
    engine.push("S", rows([3]), "b")
    engine.punctuate("S", 10, "a")  # b promised nothing yet: the stream's progress stays
    assert engine.epoch == start
    engine.punctuate("S", 10, "b")
    moved = engine.epoch
    assert moved.progress > start.progress and moved.admits_like(start)
    engine.push("T", rows([20]))  # T's progress moves to 15
    assert engine.epoch.progress > moved.progress and engine.epoch.admits_like(start)
    engine.close_source("S", "a")
    assert not engine.epoch.admits_like(start)


def test_a_batch_applied_between_the_check_and_the_application_needs_no_judging_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = engine_with_strict_query()
    engine.punctuate("S", 20)
    first = engine.check_batch("S", [engine.admit("S", rows([25]))])
    second = engine.check_batch("S", [engine.admit("S", rows([30], ["new"]))], "b")
    calls = count_late_masks(monkeypatch)
    engine.push_admitted("S", second, "b")
    engine.push_admitted("S", first)
    assert calls[0] == 0  # explicit punctuation: neither batch moved progress
    assert engine.stats()["streams"]["S"]["ingested"] == 2


def test_progress_a_batch_moved_judges_the_batches_checked_before_it_again() -> None:
    engine = Engine(clock=ManualClock())
    engine.create_stream("S", SCHEMA, punctuation="ordered")  # each batch promises its largest ts
    engine.register_query(WINDOWED, name="q", late="error")
    checked = engine.check_batch("S", [engine.admit("S", rows([12]))], "a")  # on time now
    engine.push("S", rows([40]), "b")  # the stream's progress is 40: 12 is late for the windows
    with pytest.raises(LateTuple):
        engine.push_admitted("S", checked, "a")


def test_a_querys_result_stream_takes_no_rows_punctuation_or_close() -> None:
    """Only the query feeds its result stream: nobody else may move its progress (a query over
    it would drop rows as late) or end it."""
    engine = engine_with_strict_query()
    result = pa.table({"window_start": [0], "key": ["k"], "total": [1]})
    refused = pytest.raises(InvalidArgument, match="'q' is the result stream of a query and takes no input")
    for source in ("p", "q"):  # "q": the query's own source on its result stream
        with refused:
            engine.push("q", result, source)
        with refused:
            engine.punctuate("q", 5, source)
        with refused:
            engine.close_source("q", source)
    engine.push("S", rows([1, 7]))
    engine.punctuate("S", 20)
    assert [type(item).__name__ for item in engine.poll("q")] == ["Table", "Punctuation"]


class ObjectWorkers:
    """A WorkerTransport whose workers are :class:`Worker` objects in this process: each message
    is handled when posted, and the answers go straight back to the runner."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.runner: ProcessRunner | None = None
        self.workers = [Worker(self._outbound(i)) for i in range(size)]

    def _outbound(self, index: int) -> Any:
        transport = self

        class Outbound:
            def send(self, message: msg.ToFront, arrays: Arrays | None = None) -> None:
                assert transport.runner is not None
                if isinstance(
                    message,
                    msg.ResultMessage
                    | msg.PunctuatedMessage
                    | msg.LateMessage
                    | msg.EpochMessage
                    | msg.FailedMessage,
                ):
                    transport.runner.on_worker_message(index, message, dict(arrays or {}))
                elif isinstance(message, msg.ReleasedMessage | msg.StatsMessage):
                    transport.runner.on_worker_message(index, message, {})

        return Outbound()

    def start(self) -> None:
        pass

    def post(self, worker: int, message: msg.ToWorker, arrays: Arrays | None = None) -> None:
        copied = {name: np.array(values) for name, values in (arrays or {}).items()}  # as a channel does
        assert self.workers[worker].handle(message, copied)

    def broadcast(self, message: msg.ToWorker) -> None:
        for worker in range(self.size):
            self.post(worker, message)

    async def wait_for_room(self) -> None:
        pass

    async def idle(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def door_over_objects(workers: int) -> Door[ProcessRunner]:
    transport = ObjectWorkers(workers)
    pool = StringPool(mirrored=True)
    runner = ProcessRunner(transport, pool)
    transport.runner = runner
    return Door(runner, pool, ManualClock(), collapses_late_markers=False)


def result_rows(items: list[Item]) -> list[dict[str, Any]]:
    tables = [item for item in items if isinstance(item, pa.Table)]
    found = pa.concat_tables(tables).to_pylist() if tables else []
    return sorted(found, key=lambda row: sorted(row.items()))


@pytest.mark.parametrize("workers", [1, 3])
def test_the_process_runner_over_another_transport_answers_as_the_engine(workers: int) -> None:
    door, engine = door_over_objects(workers), Engine(clock=ManualClock())
    for target in (door, engine):
        target.create_stream("S", SCHEMA, sources=["a", "b"])
        target.register_query(WINDOWED, name="q")
        target.register_query("SELECT key, value FROM S WHERE value > 1", name="passing")
        target.push("S", rows([1, 3, 7, 12]), source="a")
        target.push("S", rows([2, 9, 11], ["k9", "k1", "k9"]), source="b")
        target.punctuate("S", 15, source="a")
        target.punctuate("S", 15, source="b")
        target.push("S", rows([4]), source="a")  # late: to the late side stream
        target.close_source("S", "a")
        target.close_source("S", "b")
    for query in ("q", "passing"):
        assert result_rows(door.poll(query)) == result_rows(engine.poll(query))
    late = [item for item in door.poll("q.late") if isinstance(item, pa.Table)]
    assert [row["ts"] for table in late for row in table.to_pylist()] == [4]
    assert "the query" in door.explain(WINDOWED)  # the runner says where a query runs


def test_the_process_runner_says_which_queries_each_worker_holds_and_their_state() -> None:
    door = door_over_objects(3)
    runner = door.runner
    door.create_stream("S", SCHEMA)
    door.register_query(WINDOWED, name="split")  # grouped: split over every worker
    door.register_query("SELECT sum(value) AS total [RANGE 10, SLIDE 5, WA ts] FROM S", name="single")
    door.register_query(WINDOWED, name="failed")
    door.push("S", rows(list(range(1, 30)), [f"k{i}" for i in range(29)]))  # windows stay open
    runner.fail(runner.queries["failed"], "gone")  # its operators are dropped on every worker
    runner.request_stats()
    hosted = [runner.hosted(worker) for worker in range(3)]
    assert all(set(on) <= {"split", "single"} and "split" in on for on in hosted), hosted
    assert [w for w, on in enumerate(hosted) if "single" in on] == runner.queries["single"].workers
    for query in ("split", "single"):
        held = [on[query] for on in hosted if query in on]
        assert sum(held) == runner.state_bytes(query) > 0, (query, held)  # the metric's figure, split
    assert sum(1 for on in hosted if on["split"] > 0) > 1  # the groups' state is on several workers


def test_workers_hold_the_strings_of_literals_unless_a_query_decodes_strings() -> None:
    """Workers send codes; the front decodes them. Their pools hold the query literals' strings
    alone, and the whole pool only while a query runs that decodes strings (heavy_hitters of a
    string column ranks its hits by text); the results are the engine's either way."""
    door, engine = door_over_objects(2), Engine(clock=ManualClock())
    pools = [worker.pool for worker in door.runner.workers.workers]  # type: ignore[attr-defined]
    hitters = "SELECT heavy_hitters(key, 0.3) AS hot [RANGE 10, SLIDE 10, WA ts] FROM S"
    for target in (door, engine):
        target.create_stream("S", SCHEMA)
        target.register_query(WINDOWED.replace("FROM S", "FROM S WHERE key != 'lit'"), name="q")
        target.push("S", rows([1, 2, 3], ["a", "b", "lit"]))
    assert [len(pool) for pool in pools] == [1, 1] and len(door.pool) == 3  # "lit" alone
    for target in (door, engine):
        target.register_query(hitters, name="hot")
        target.push("S", rows([4, 5, 6], ["c", "c", "a"]))
    assert [pool.strings() for pool in pools] == [door.pool.strings()] * 2  # mirrored whole
    for target in (door, engine):
        target.punctuate("S", 10)
    for query in ("q", "hot"):
        assert result_rows(door.poll(query)) == result_rows(engine.poll(query))
    door.drop_query("hot")
    assert [set(pool.strings()) for pool in pools] == [{"lit"}] * 2
    door.push("S", rows([12], ["d"]))
    assert [len(pool) for pool in pools] == [1, 1] and "d" in door.pool.strings()


class RecordingWorkers(ObjectWorkers):
    """ObjectWorkers that keep the columns of every batch posted: (input index, late, names)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.posted: list[tuple[int, bool, frozenset[str]]] = []

    def post(self, worker: int, message: msg.ToWorker, arrays: Arrays | None = None) -> None:
        if isinstance(message, msg.BatchMessage) and arrays:
            self.posted.append((message.input_index, message.late, frozenset(arrays)))
        super().post(worker, message, arrays)


def test_workers_get_the_columns_a_query_names_and_late_tuples_whole() -> None:
    """The front leaves out of on-time tuples the columns their query never names; a join, which
    keeps whole tuples, still answers as the engine, and late tuples reach the late side stream
    with every column."""
    schema = {"key": "string", "value": "int64", "pad": "string", "other": "int64", "ts": "int64"}
    join = "SELECT A.key, A.ts, B.value FROM A [RANGE 10, WA ts], B [RANGE 10, WA ts] WHERE A.key = B.key"
    transport = RecordingWorkers(2)
    runner = ProcessRunner(transport, StringPool(mirrored=True))
    transport.runner = runner
    door = Door(runner, runner.pool, ManualClock(), collapses_late_markers=False)
    engine = Engine(clock=ManualClock())

    def batch(ts: list[int]) -> pa.Table:
        n = len(ts)
        return pa.table(
            {"key": [f"k{t % 2}" for t in ts], "value": ts, "pad": ["x" * 20] * n, "other": [7] * n, "ts": ts}
        )

    for target in (door, engine):
        for stream in ("A", "B"):
            target.create_stream(stream, schema)
        target.register_query(join, name="q")
        target.push("A", batch([1, 2, 3, 12]))
        target.push("B", batch([2, 5, 11]))
        target.punctuate("A", 15)
        target.punctuate("B", 15)
        target.push("A", batch([4]))  # late
        target.close_source("A", "default")
        target.close_source("B", "default")
    assert result_rows(door.poll("q")) == result_rows(engine.poll("q"))
    on_time = {names for _, late, names in transport.posted if not late}
    assert on_time == {frozenset({"key", "value", "ts"})}, on_time
    assert {names for _, late, names in transport.posted if late} == {frozenset(schema)}
    late = [row for item in door.poll("q.late") if isinstance(item, pa.Table) for row in item.to_pylist()]
    assert [(row["ts"], row["pad"], row["other"]) for row in late] == [(4, "x" * 20, 7)]
