"""The state codec (lowtide.snapshot): exact round trips, and a clear error for any damage.

``unpack(pack(s))`` gives ``s`` back exactly - dtypes, shapes, int64 extremes, NaN, -0.0, empty
arrays, key order. Bytes cut short, flipped anywhere, of another version, or with a forged header
that passes the checksum raise ``CorruptState`` with a one-line reason, never anything else. A
state restored into operators it does not fit raises ``CorruptState`` too.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from planning import Context, plan_query

from lowtide.errors import CorruptState
from lowtide.punctuation.model import END_OF_STREAM, NO_PROGRESS
from lowtide.punctuation.policies import LatePolicy
from lowtide.query import parse_query
from lowtide.query.plan_state import restore_plan, snapshot_plan
from lowtide.schema import Schema
from lowtide.snapshot import MAGIC, VERSION, State, pack, unpack
from lowtide.strings import StringPool

I64 = np.iinfo(np.int64)
DTYPES = st.sampled_from(["<i1", "<i4", ">i8", "<u8", "<f4", ">f8", "<c16", "|b1", "<U3", ">U1"])
arrays = DTYPES.flatmap(
    lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0))
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([NO_PROGRESS, END_OF_STREAM, I64.min, I64.max, 0, -1]),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    arrays,
)
states = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


def assert_same(a: Any, b: Any) -> None:
    """Equal as values and as types: arrays bit for bit (in native byte order), floats by bits."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert b.dtype == a.dtype.newbyteorder("=") and b.shape == a.shape
        assert b.tobytes() == a.astype(b.dtype).tobytes()
        assert b.flags.writeable and b.flags.c_contiguous
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)  # key order too
        for key in a:
            assert_same(a[key], b[key])
    else:
        assert a == b


@settings(max_examples=300, deadline=None)
@given(state=states)
def test_unpack_gives_back_exactly_what_was_packed(state: State) -> None:
    assert_same(state, unpack(pack(state)))


def test_extremes_round_trip() -> None:
    state: State = {
        "bounds": np.array([I64.min, I64.max, 0], np.int64),
        "floats": np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324], np.float64),
        "empty": np.zeros((0, 3), np.int64),
        "scalar": np.array(7, np.uint64),
        "text": np.array(["", "naïve", "𝄞"]),
        "values": [NO_PROGRESS, END_OF_STREAM, 2**100, math.nan, -0.0, math.inf, None, True, ""],
    }
    assert_same(state, unpack(pack(state)))


@pytest.mark.parametrize(
    "bad",
    [np.int64(3), np.float64(1.5), (1, 2), np.array([object()]), {1: 2}, {"k": {3}}, np.zeros(2, "M8[s]")],
)
def test_pack_refuses_what_is_no_state(bad: Any) -> None:
    with pytest.raises(TypeError):
        pack({"field": bad})


SAMPLE: State = {
    "ints": np.arange(5, dtype=np.int64),
    "x": [1.5, "a", None],
    "nested": {"t": np.array(["ab"])},
}


def reason(data: bytes) -> str:
    with pytest.raises(CorruptState) as caught:
        unpack(data)
    text = str(caught.value)
    assert text and "\n" not in text
    return text


def test_every_truncation_is_a_clear_error() -> None:
    data = pack(SAMPLE)
    for size in range(len(data)):
        assert "truncated" in reason(data[:size])
    assert "extra bytes" in reason(data + b"\0")


def test_every_flipped_byte_is_a_clear_error() -> None:
    data = pack(SAMPLE)
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x5A
        reason(bytes(damaged))


def test_unknown_version_and_foreign_bytes() -> None:
    data = bytearray(pack(SAMPLE))
    struct.pack_into("<I", data, 8, VERSION + 1)
    assert f"version {VERSION + 1} is not supported" in reason(bytes(data))
    assert "not a lowtide state" in reason(b"\x80\x04\x95" + bytes(40))  # a pickle's opening bytes
    assert "truncated" in reason(b"")


def forged(header: Any, body: bytes = b"", text: bytes = b"") -> bytes:
    """Bytes with a correct prefix and checksum around any header (or header ``text``): only the
    parser stands guard."""
    text = text or json.dumps(header).encode()
    total = 32 + len(text) + len(body)
    rest = struct.pack("<QQ", total, len(text)) + text + body
    return MAGIC + struct.pack("<II", VERSION, zlib.crc32(rest)) + rest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["dict", "float", "array", "x"]), inner, max_size=2)
    ),
    max_leaves=10,
)
metas = st.lists(
    st.tuples(
        st.sampled_from(["<i8", "|b1", "<U2", "|O", "<V8", "<M8", "i8", "<i99999999"]),
        st.lists(st.integers(-1, 3), max_size=3),
    ).map(list),
    max_size=2,
)


@settings(max_examples=400, deadline=None)
@given(root=json_values, meta=metas | json_values, body=st.binary(max_size=24))
def test_forged_headers_decode_or_raise_corrupt_state(root: Any, meta: Any, body: bytes) -> None:
    try:
        unpack(forged({"root": root, "arrays": meta}, body))
    except CorruptState as exc:
        assert str(exc) and "\n" not in str(exc)


def test_forged_headers_that_would_alias_or_hide_arrays() -> None:
    body = np.arange(2, dtype=np.int64).tobytes()
    twice = {"root": [{"array": 0}, {"array": 0}], "arrays": [["<i8", [2]]]}
    assert "unexpected node" in reason(forged(twice, body))  # one array under two names
    unused = {"root": None, "arrays": [["<i8", [2]]]}
    assert "refers to 0 of its 1 arrays" in reason(forged(unused, body))
    huge = {"root": {"array": 0}, "arrays": [["<i8", [2**40, 2**40]]]}
    assert "runs past the end" in reason(forged(huge, body))
    for dtype in ("<i3", "<U0", "|O8", "<V8"):
        assert "not a numeric or unicode one" in reason(
            forged({"root": {"array": 0}, "arrays": [[dtype, [2]]]}, body)
        )
    assert "cannot be read" in reason(forged(None, text=b'{"root": ' + b"9" * 5000 + b', "arrays": []}'))
    assert "cannot be read" in reason(forged(None, text=b"[" * 100_000))
    assert "bare constant NaN" in reason(forged({"root": float("nan"), "arrays": []}))


# -- a state restored where it does not fit ---------------------------------------------------------
SCHEMA = Schema.of({"k": "int64", "v": "int64", "ts": "int64"}, "ts")


def plan(sql: str) -> Any:
    ctx = Context(lambda name: SCHEMA, StringPool(), LatePolicy.DROP, None, lambda batch, fields: None)
    planned = plan_query(parse_query(sql), ctx)
    planned.start()
    return planned


def test_a_state_restores_only_into_its_own_plan() -> None:
    tumbling = "SELECT k, sum(v) AS s [RANGE 10, WA ts] FROM A GROUP BY k"
    state = unpack(pack(snapshot_plan(plan(tumbling))))
    restore_plan(plan(tumbling), state)  # its own: fine
    with pytest.raises(CorruptState, match="holds 3 operators, it has 2"):
        restore_plan(plan("SELECT k, ts FROM A"), state)
    with pytest.raises(CorruptState, match="operator 1 of the plan is a Select, its state a Bucket's"):
        restore_plan(plan("SELECT k, ts FROM A WHERE v > 1"), state)
    assert isinstance(state, dict) and isinstance(state["operators"], list)
    wid = state["operators"][2]
    assert isinstance(wid, dict) and isinstance(wid["state"], dict)
    assert isinstance(wid["state"]["fields"], dict)
    del wid["state"]["fields"]["retained_from"]
    with pytest.raises(CorruptState, match=r"WID Aggregate lacks \['retained_from'\]"):
        restore_plan(plan(tumbling), state)
