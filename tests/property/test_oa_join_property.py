"""OA-Join against a nested-loop join under random order, splits, interleaving and punctuation."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.oa_join import Band, JoinSide, OAJoin, Tumbling
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS, Punctuation

Tup = tuple[int, int, int]  # ts, key a, key b

COLUMNS = {0: "S0", 1: "S1"}


class Checker(Operator):
    """Collects output pairs and checks rows against the punctuation emitted before them."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[npt.NDArray[np.int64]] = []
        self.last = {"S0.t": NO_PROGRESS, "S1.t": NO_PROGRESS}

    def process(self, batch: Batch, port: int = 0) -> None:
        assert batch.n > 0 and not batch.late
        for name, bound in self.last.items():
            assert int(batch[name].min()) >= bound, (name, bound)
        self.chunks.append(pair_codes(batch["S0.id"], batch["S1.id"]))

    def pairs(self) -> list[int]:
        """The output (left id, right id) pairs as a sorted list of codes: a multiset."""
        return sorted(np.concatenate([np.zeros(0, np.int64), *self.chunks]).tolist())

    def punctuate(self, punctuation: Punctuation, port: int = 0) -> None:
        assert punctuation.attribute in self.last
        assert punctuation.value > self.last[punctuation.attribute]  # rising, never repeated
        self.last[punctuation.attribute] = punctuation.value


def pair_codes(left_ids: npt.NDArray[np.int64], right_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return left_ids.astype(np.int64) * 2**20 + right_ids


def matches(window: Band | Tumbling, left: Tup, right: Tup, n_keys: int) -> bool:
    if left[1 : 1 + n_keys] != right[1 : 1 + n_keys]:
        return False
    if isinstance(window, Band):
        return left[0] - window.r1 <= right[0] <= left[0] + window.r0
    return left[0] // window.d == right[0] // window.d


tuples = st.lists(
    st.tuples(st.integers(-20, 40), st.integers(0, 2), st.integers(0, 1)), min_size=0, max_size=40
)
windows = st.one_of(
    st.builds(Band, st.integers(0, 8), st.integers(0, 8)),
    st.builds(Tumbling, st.integers(1, 12)),
)


@settings(max_examples=200, deadline=None)
@given(left=tuples, right=tuples, window=windows, n_keys=st.integers(0, 2), data=st.data())
def test_oa_join_equals_nested_loop(
    left: list[Tup], right: list[Tup], window: Band | Tumbling, n_keys: int, data: st.DataObject
) -> None:
    keys = ("a", "b")[:n_keys]
    sides = [JoinSide(COLUMNS[p], ("id", "t", *keys), "t", keys) for p in (0, 1)]
    join = OAJoin(sides[0], sides[1], window)
    checker = Checker()
    join.connect(checker)

    inputs = (left, right)
    pos = [0, 0]  # next tuple to send per port
    bound = [NO_PROGRESS, NO_PROGRESS]  # punctuation sent per port

    def punctuate(port: int) -> None:  # honest: at most the smallest ts still to come on the port
        rest = [r[0] for r in inputs[port][pos[port] :]]
        top = min(rest) if rest else 45
        if top >= bound[port]:
            bound[port] = data.draw(st.integers(max(bound[port], -25), top))
            join.punctuate(Punctuation(bound[port], "t"), port)

    while pos[0] < len(left) or pos[1] < len(right):
        port = data.draw(st.sampled_from([p for p in (0, 1) if pos[p] < len(inputs[p])]))
        rows = inputs[port]
        size = data.draw(st.integers(1, len(rows) - pos[port]))
        chunk = rows[pos[port] : pos[port] + size]
        ids = np.arange(pos[port], pos[port] + size, dtype=np.int64) + 1000 * port
        cols = {"id": ids, "t": np.array([r[0] for r in chunk], np.int64)}
        cols["a"] = np.array([r[1] for r in chunk], np.int64)
        cols["b"] = np.array([r[2] for r in chunk], np.int64)
        cols["other"] = np.zeros(size, np.int64)
        join.process(Batch(cols, size), port)
        pos[port] += size
        for p in (0, 1):
            if data.draw(st.booleans()):
                punctuate(p)
    first = data.draw(st.integers(0, 1))
    for port in (first, 1 - first):
        if data.draw(st.booleans()):
            punctuate(port)
        join.punctuate(Punctuation(END_OF_STREAM, "t"), port)

    expected = sorted(
        i * 2**20 + 1000 + j
        for i, lt in enumerate(left)
        for j, rt in enumerate(right)
        if matches(window, lt, rt, n_keys)
    )
    assert checker.pairs() == expected
    assert checker.last == {"S0.t": END_OF_STREAM, "S1.t": END_OF_STREAM}
    assert join.open_windows() == 0
    assert join.tuples_in == len(left) + len(right)
    assert join.tuples_out == len(expected)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.tuples(st.integers(0, 2500), st.integers(0, 2500)),
    span=st.integers(1, 3000),
    n_keys=st.integers(0, 2),
    window=st.one_of(
        st.builds(Band, st.integers(0, 300), st.integers(0, 300)), st.builds(Tumbling, st.integers(1, 400))
    ),
)
def test_oa_join_large_batches_equal_nested_loop(
    seed: int, sizes: tuple[int, int], span: int, n_keys: int, window: Band | Tumbling
) -> None:
    """Thousands of disordered tuples: exercises index growth, compaction and buffer growth."""
    rng = np.random.default_rng(seed)
    keys = ("a", "b")[:n_keys]
    join = OAJoin(*(JoinSide(COLUMNS[p], ("id", "t", *keys), "t", keys) for p in (0, 1)), window)
    checker = Checker()
    join.connect(checker)
    streams = []
    for port, n in enumerate(sizes):
        arrival = np.sort(rng.integers(0, span, n))
        ts = arrival - rng.integers(0, 50, n) * (rng.random(n) < 0.3) - span // 2
        cols = {"id": np.arange(n, dtype=np.int64) + 10_000 * port, "t": ts.astype(np.int64)}
        cols["a"] = rng.integers(0, 4, n)
        cols["b"] = rng.integers(0, 2, n)
        cuts = np.sort(rng.integers(0, n + 1, rng.integers(0, 12)))
        streams.append((cols, [0, *cuts.tolist(), n]))
    pending = [1, 1]
    sent = [NO_PROGRESS, NO_PROGRESS]
    while pending[0] < len(streams[0][1]) or pending[1] < len(streams[1][1]):
        live = [p for p in (0, 1) if pending[p] < len(streams[p][1])]
        port = live[int(rng.integers(0, len(live)))]
        cols, cuts = streams[port]
        lo, hi = cuts[pending[port] - 1], cuts[pending[port]]
        pending[port] += 1
        if hi > lo:
            join.process(Batch({c: v[lo:hi] for c, v in cols.items()}, hi - lo), port)
        rest = cols["t"][hi:]
        if rest.size:  # honest and never regressing: the smallest ts to come, or a little less
            sent[port] = max(sent[port], int(rest.min()) - int(rng.integers(0, 3)))
            join.punctuate(Punctuation(sent[port], "t"), port)
    for port in (0, 1):
        join.punctuate(Punctuation(END_OF_STREAM, "t"), port)

    (left, _), (right, _) = streams
    ok = np.ones((sizes[0], sizes[1]), bool)
    for k in keys:
        ok &= left[k][:, None] == right[k][None, :]
    lt, rt = left["t"][:, None], right["t"][None, :]
    if isinstance(window, Band):
        ok &= (lt - window.r1 <= rt) & (rt <= lt + window.r0)
    else:
        ok &= lt // window.d == rt // window.d
    li, ri = np.nonzero(ok)
    assert checker.pairs() == sorted(pair_codes(left["id"][li], right["id"][ri]).tolist())
    assert join.open_windows() == 0
