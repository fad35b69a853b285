"""The engine-wide string dictionary: strings become int64 codes at the door.

One pool serves every stream and query of an engine, so equal strings have equal codes across
streams: joins and predicates compare codes, never strings. ``NULL_CODE`` stands for a missing
string. Invariants:

* **Only what is used is added.** A batch adds the strings its rows hold, never the unused
  entries of a dictionary-encoded column (the door also leaves out the columns no query reads:
  see :mod:`lowtide.schema`).
* **Every string has a holder.** The streams whose batches were coded with it (each stream has
  one of 63 holder bits; past 63 streams, streams share bits) and query literals (pinned: never
  released). A code names one string for as long as any holder holds it.
* **Releasing a stream frees what only it held**: nothing alive references those codes (a stream
  is dropped only after every query reading it, and a query's state holds codes of the streams
  it reads only). A bit shared by several streams is released with the last of them. Freed
  codes are given out again, lowest first.
* **Limits** (:class:`PoolLimits`): a batch whose new strings would take the pool past either
  is refused whole with :class:`~lowtide.errors.ResourceExhausted`, before any is added.

A worker's pool is a *mirror*: it takes the front's codes (:meth:`StringPool.adopt`) and
forgets them when told (:meth:`StringPool.forget`); it never gives out codes itself.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.errors import CorruptState, ResourceExhausted
from lowtide.snapshot import State, as_array, as_dict, as_int

NULL_CODE = -1
_HOLDER_BITS = 63  # bits 0..62 name streams; bit 63 pins
_PINNED = np.uint64(1 << 63)
_FORMAT = 2  # of the snapshot; format 1 (no "format" key) had no codes or holders: loaded pinned

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PoolLimits:
    """The most strings, and UTF-8 bytes of them, the pool may hold."""

    max_strings: int
    max_bytes: int


def _utf8(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _used(values: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, I64]:
    """The distinct strings the rows hold (a dictionary's unused entries left out) and each row's
    index among them (-1: a null row)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    sent = pa.types.is_dictionary(values.type)  # the client's dictionary: entries may go unused
    if not sent:
        values = pc.dictionary_encode(values)  # its dictionary holds exactly the values present
    dictionary = values.dictionary
    indices = values.indices
    if indices.null_count:
        indices = pc.fill_null(indices, -1)
    rows = np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    if not sent:
        return dictionary, rows
    seen = np.zeros(len(dictionary) + 1, np.bool_)  # the extra slot takes the nulls' -1
    seen[rows] = True
    used = np.flatnonzero(seen[:-1])
    if len(used) < len(dictionary):
        remap = np.full(len(dictionary) + 1, -1, np.int64)
        remap[used] = np.arange(len(used))
        rows, dictionary = remap[rows], dictionary.take(pa.array(used))
    return dictionary, rows


class StringPool:
    def __init__(self, mirrored: bool = False) -> None:
        """``mirrored``: workers mirror this pool (the front's): it keeps the codes added since
        :meth:`take_unsent` last ran."""
        self._codes: dict[str, int] = {}
        self._values = np.empty(1024, dtype=object)  # None: a free code
        self._holders = np.zeros(1024, dtype=np.uint64)  # bit per holder; 0: free (or a mirror's)
        self._next = 0  # every code below is held or free
        self._free: list[int] = []  # free codes below _next, the lowest last
        self._bits: dict[str, int] = {}  # holder (stream) -> its bit
        self._unsent: list[int] | None = [] if mirrored else None
        self.bytes = 0  # UTF-8 bytes of the strings held (a mirror's stays 0)
        self.releases = 0  # releases that freed codes: what was coded before may name others now

    def __len__(self) -> int:
        return len(self._codes)

    # -- adding ---------------------------------------------------------------------------------
    def code(self, value: str) -> int:
        """The code of one string, added when new and pinned (a query's literal)."""
        found = self._codes.get(value)
        if found is None:
            found = self._add(value)
            self.bytes += _utf8(value)
        self._holders[found] |= _PINNED
        return found

    def encode(
        self,
        columns: Mapping[str, pa.Array | pa.ChunkedArray],
        holder: str | None = None,
        limits: PoolLimits | None = None,
    ) -> dict[str, I64]:
        """Codes for Arrow string columns (plain or dictionary-encoded), all or none.

        ``holder`` (a stream; None: pinned) holds every string the rows use. New strings are
        added only if they keep the pool within ``limits``; else ResourceExhausted, nothing added.
        The Python loop runs over the distinct strings used, not over rows."""
        if not columns:
            return {}  # nothing held: a stream without strings takes no holder bit
        used = {name: _used(values) for name, values in columns.items()}
        looked: dict[str, tuple[list[str | None], list[int | None]]] = {}
        new: dict[str, None] = {}  # in order of first use, for codes that do not depend on hashing
        for name, (dictionary, _) in used.items():
            strings: list[str | None] = dictionary.to_pylist()
            # C-level lookups (a null dictionary entry looks up None, and finds nothing)
            found: list[int | None] = list(map(self._codes.get, strings))  # type: ignore[arg-type]
            looked[name] = (strings, found)
            if None in found:
                new.update(
                    (s, None) for s, c in zip(strings, found, strict=True) if c is None and s is not None
                )
        new_bytes = sum(map(_utf8, new))
        if limits is not None and new:
            self._check(len(new), new_bytes, limits)
        for value in new:
            self._add(value)
        self.bytes += new_bytes
        bit = self._bit(holder)
        out: dict[str, I64] = {}
        for name, (strings, found) in looked.items():
            mapping = np.array(
                [
                    NULL_CODE if s is None else self._codes[s] if c is None else c
                    for s, c in zip(strings, found, strict=True)
                ]
                + [NULL_CODE],  # where a null row's -1 lands
                dtype=np.int64,
            )
            self._holders[mapping[mapping >= 0]] |= bit
            out[name] = mapping[used[name][1]]
        return out

    def _check(self, n_new: int, new_bytes: int, limits: PoolLimits) -> None:
        if len(self) + n_new > limits.max_strings:
            raise ResourceExhausted(
                f"the batch adds {n_new} strings to the {len(self)} held, over the string pool's limit "
                f"of {limits.max_strings} (max_strings)"
            )
        if self.bytes + new_bytes > limits.max_bytes:
            raise ResourceExhausted(
                f"the batch adds {new_bytes} bytes of strings to the {self.bytes} held, over the string "
                f"pool's limit of {limits.max_bytes} (max_string_bytes)"
            )

    def _bit(self, holder: str | None) -> np.uint64:
        if holder is None:
            return _PINNED
        bit = self._bits.get(holder)
        if bit is None:
            users = Counter(self._bits.values())
            bit = self._bits[holder] = min(range(_HOLDER_BITS), key=lambda b: users[b])
        return np.uint64(1 << bit)

    def _add(self, value: str) -> int:
        code = self._free.pop() if self._free else self._next
        self._store(value, code)
        return code

    def _store(self, value: str, code: int) -> None:
        if code >= len(self._values):
            size = max(code + 1, 2 * len(self._values))
            self._values = np.concatenate([self._values, np.empty(size - len(self._values), dtype=object)])
            self._holders = np.concatenate([self._holders, np.zeros(size - len(self._holders), np.uint64)])
        self._values[code] = value
        self._codes[value] = code
        self._next = max(self._next, code + 1)
        if self._unsent is not None:
            self._unsent.append(code)

    # -- releasing ------------------------------------------------------------------------------
    def release(self, holder: str) -> I64:
        """``holder`` (a dropped stream) holds nothing any more; returns the codes freed: the
        strings nothing else held."""
        bit = self._bits.pop(holder, None)
        if bit is None or bit in self._bits.values():  # a stream sharing its bit still holds them
            return np.empty(0, np.int64)
        mask = np.uint64(1 << bit)
        held = self._holders[: self._next]
        had = (held & mask) != 0
        held[had] &= ~mask
        freed = np.flatnonzero(had & (held == 0))
        for code in freed.tolist():
            value = self._values[code]
            del self._codes[value]
            self._values[code] = None
            self.bytes -= _utf8(value)
        if freed.size:
            self.releases += 1
            self._compact()
        return freed

    def _compact(self) -> None:
        """Free codes at the top are forgotten, the arrays shrink to what is held."""
        held = np.flatnonzero(self._holders[: self._next])
        self._next = int(held[-1]) + 1 if held.size else 0
        self._free = np.flatnonzero(self._holders[: self._next] == 0)[::-1].tolist()
        size = max(1024, self._next)
        if len(self._values) > 2 * size:
            self._values, self._holders = self._values[:size].copy(), self._holders[:size].copy()

    # -- a mirror -------------------------------------------------------------------------------
    def take_unsent(self) -> list[int]:
        """The codes added since the last call and still held, once each (what a mirror lacks)."""
        if not self._unsent:
            return []
        unsent, self._unsent = self._unsent, []
        return [c for c in dict.fromkeys(unsent) if self._values[c] is not None]

    def entries(self) -> list[int]:
        """Every code held, in order (all a new mirror needs)."""
        return sorted(self._codes.values())

    def values(self, codes: Sequence[int]) -> list[str]:
        """The strings of held ``codes``."""
        return list(self._values[np.asarray(codes, dtype=np.int64)])

    def adopt(self, codes: Sequence[int], values: Sequence[str]) -> None:
        """Take the front's codes for these strings (a worker's mirror)."""
        for code, value in zip(codes, values, strict=True):
            known = self._codes.get(value)
            if known == code:
                continue
            if known is not None:
                raise ValueError(f"string {value!r} already has code {known}, not {code}")
            if code < len(self._values) and self._values[code] is not None:
                raise ValueError(f"code {code} already names {self._values[code]!r}, not {value!r}")
            self._store(value, code)

    def forget(self, codes: Sequence[int]) -> None:
        """Forget the strings of ``codes`` (the front released them); unknown codes are skipped."""
        for code in codes:
            value = self._values[code] if 0 <= code < len(self._values) else None
            if value is not None:
                del self._codes[value]
                self._values[code] = None

    # -- checkpoints ----------------------------------------------------------------------------
    def snapshot(self) -> State:
        """Every string held with its code and holders, as UTF-8 bytes and offsets (no Python
        objects); the holders' bits by name."""
        codes = np.array(self.entries(), dtype=np.int64)
        encoded = [v.encode("utf-8", "surrogatepass") for v in self.values(codes.tolist())]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return {
            "format": _FORMAT,
            "codes": codes,
            "holders": self._holders[codes].copy(),
            "bits": dict(self._bits),
            "offsets": offsets,
            "bytes": np.frombuffer(b"".join(encoded), np.uint8).copy(),
        }

    def restore(self, state: State) -> None:
        """Take the codes and holders of a :meth:`snapshot`, into an empty pool. A snapshot of
        format 1 (strings in code order, no holders) loads with every string pinned."""
        if len(self):
            raise ValueError("a pool restores only while empty")
        saved = as_dict(state, "strings")
        offsets = as_array(saved["offsets"], "string offsets", np.int64, 1)
        data = as_array(saved["bytes"], "string bytes", np.uint8, 1).tobytes()
        if len(offsets) == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != len(data):
            raise CorruptState("strings: offsets do not cut the bytes")
        try:
            values = [data[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise(offsets)]
        except UnicodeDecodeError as exc:
            raise CorruptState(f"strings: not UTF-8: {exc}") from None
        n = len(values)
        if "format" not in saved:
            codes, holders, bits = np.arange(n, dtype=np.int64), np.full(n, _PINNED, np.uint64), {}
        else:
            if as_int(saved["format"], "strings format") != _FORMAT:
                raise CorruptState(f"strings: format {saved['format']}, not {_FORMAT}")
            codes = as_array(saved["codes"], "string codes", np.int64, 1)
            holders = as_array(saved["holders"], "string holders", np.uint64, 1)
            bits = {
                name: as_int(b, "holder bit") for name, b in as_dict(saved["bits"], "holder bits").items()
            }
        if len(codes) != n or len(holders) != n or (n and (codes.min() < 0 or np.any(holders == 0))):
            raise CorruptState("strings: codes, holders and strings do not match")
        if (
            len(set(values)) != n
            or len(np.unique(codes)) != n
            or not all(0 <= b < _HOLDER_BITS for b in bits.values())
        ):
            raise CorruptState("strings: a string, code or holder bit appears twice or out of range")
        for code, value in zip(codes.tolist(), values, strict=True):
            self._store(value, code)
        self._holders[codes] = holders
        self._bits = bits
        self.bytes = len(data)
        self._free = np.flatnonzero(self._holders[: self._next] == 0)[::-1].tolist()

    # -- decoding -------------------------------------------------------------------------------
    def decode(self, codes: I64) -> pa.Array:
        """An Arrow string array for codes (``NULL_CODE`` becomes null)."""
        null = codes == NULL_CODE
        strings = self._values[np.where(null, 0, codes)]
        return pa.array(strings, type=pa.string(), mask=null if null.any() else None)
