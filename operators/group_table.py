"""Group table: composite int64 keys to dense group ids, one numba probe per tuple.

Keys are rows of an int64 matrix ``[n, k]`` (strings are already codes, floats are bit patterns,
bools are 0/1). Group ids are dense and assigned in first-seen order, so aggregate state can be
plain arrays indexed by group id. ``compact`` drops groups the caller no longer needs and
renumbers the rest, which keeps the table bounded by the groups of open windows.

Specialisation (as in Grulich et al., "Grizzly: Efficient Stream Processing Through Adaptive Query
Compilation" (SIGMOD 2020)): a single integer key whose values all fall in a small range (at most
``DENSE_SPAN`` wide, as ports, protocols, small ids and dictionary codes do) is looked up in a
direct array ``index[key - base]`` instead of being hashed and probed. The guard is the range, and
the memory it takes for the groups it holds: the first batch with a key outside any range that
small, or that leaves the index more than ``DENSE_SLOTS_PER_GROUP`` slots a group (beyond the
``DENSE_FREE_SLOTS`` any table may take), turns the table into the hash table for good, with the
same group ids. So a few keys spread wide (a thousand ports out of 65,536) cost what their groups
do, not a 512 KiB index each query.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import numpy.typing as npt

from lowtide.errors import CorruptState
from lowtide.snapshot import State, Versioned, as_array, as_bool, as_int, fields

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_EMPTY = -1
DENSE_SPAN = 1 << 16  # widest key range looked up directly (a 512 KiB index)
DENSE_FREE_SLOTS = 1 << 12  # index slots (32 KiB) a direct lookup may take however few its groups
DENSE_SLOTS_PER_GROUP = 8  # ... and beyond that, at most this many a group


@nb.njit(cache=True, nogil=True, inline="always")
def _hash_row(keys: I64, i: int) -> np.uint64:
    h = np.uint64(0x9E3779B97F4A7C15)
    for j in range(keys.shape[1]):
        x = np.uint64(keys[i, j]) + h
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h = x ^ (x >> np.uint64(31))
    return h


@nb.njit(cache=True, nogil=True)
def hash_rows(keys: I64) -> U64:
    """The splitmix64 hash of each key row (all its columns together), as the table probes it.

    keys [n, k] int64, read only (k may be 0). Returns a new [n] uint64 array. Cost O(n * k).
    """
    out = np.empty(keys.shape[0], np.uint64)
    for i in range(keys.shape[0]):
        out[i] = _hash_row(keys, i)
    return out


@nb.njit(cache=True, nogil=True)
def _lookup_or_insert(keys: I64, slots: I64, stored: I64, n_groups: int, out: I64) -> int:
    """Group id of each key row, inserting new keys; returns the new number of groups.

    keys    [n, k] int64, read only.
    slots   [capacity] int64 open-addressing table of group ids (-1 empty); capacity is a power of
            two at least twice the final number of groups (the caller guarantees it). Mutated.
    stored  [capacity_groups, k] int64 key of each group id; rows past n_groups are written. Mutated.
    out     [n] int64 group ids, written.
    Cost: O(n * k) expected.
    """
    mask = np.uint64(slots.shape[0] - 1)
    k = keys.shape[1]
    for i in range(keys.shape[0]):
        s = _hash_row(keys, i) & mask
        while True:
            g = slots[s]
            if g == _EMPTY:
                for j in range(k):
                    stored[n_groups, j] = keys[i, j]
                slots[s] = n_groups
                out[i] = n_groups
                n_groups += 1
                break
            same = True
            for j in range(k):
                if stored[g, j] != keys[i, j]:
                    same = False
                    break
            if same:
                out[i] = g
                break
            s = (s + np.uint64(1)) & mask
    return n_groups


@nb.njit(cache=True, nogil=True)
def _key_range(keys: I64) -> tuple[int, int]:
    """Smallest and largest key of ``keys`` ``[n, 1]`` (n > 0), in one pass."""
    lo = hi = keys[0, 0]
    for i in range(keys.shape[0]):
        lo = min(lo, keys[i, 0])
        hi = max(hi, keys[i, 0])
    return lo, hi


@nb.njit(cache=True, nogil=True)
def _dense_lookup_or_insert(keys: I64, base: int, index: I64, stored: I64, n_groups: int, out: I64) -> int:
    """Group id of each key of ``keys`` ``[n, 1]``, inserting new keys; returns the new number of
    groups. ``index[key - base]`` is the group id of ``key`` or -1 (every key is in range: the
    caller checked). ``index``, ``stored`` (rows past n_groups) and ``out`` are written. O(n)."""
    for i in range(keys.shape[0]):
        slot = keys[i, 0] - base
        g = index[slot]
        if g == _EMPTY:
            g = n_groups
            stored[g, 0] = keys[i, 0]
            index[slot] = g
            n_groups += 1
        out[i] = g
    return n_groups


@nb.njit(cache=True, nogil=True)
def _rebuild(stored: I64, n_groups: int, slots: I64) -> None:
    """Re-insert group ids ``0..n_groups-1`` into an empty ``slots`` table (mutated)."""
    mask = np.uint64(slots.shape[0] - 1)
    for g in range(n_groups):
        s = _hash_row(stored, g) & mask
        while slots[s] != _EMPTY:
            s = (s + np.uint64(1)) & mask
        slots[s] = g


class GroupTable(Versioned):
    """Maps key rows to dense group ids; ``keys()`` gives the key of every id."""

    VERSION = 1

    def __init__(self, width: int) -> None:
        self.width = width
        self.n_groups = 0
        self._stored = np.empty((64, width), dtype=np.int64)
        self._slots = np.full(128, _EMPTY, dtype=np.int64)
        # Direct lookup while the keys fit a small range (single-column keys only).
        self.dense = width == 1
        self._base = 0
        self._index = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return self.n_groups

    @property
    def keys(self) -> I64:
        """``[n_groups, width]`` key of each group id (a view; do not keep across inserts)."""
        return self._stored[: self.n_groups]

    def nbytes(self) -> int:
        return int(self._stored.nbytes + self._slots.nbytes + self._index.nbytes)

    def ids(self, keys: I64) -> I64:
        """Group id of every row of ``keys`` ``[n, width]``, adding new keys."""
        n = keys.shape[0]
        need = self.n_groups + n
        if need > self._stored.shape[0]:
            grown = np.empty((max(need, 2 * self._stored.shape[0]), self.width), dtype=np.int64)
            grown[: self.n_groups] = self._stored[: self.n_groups]
            self._stored = grown
        out = np.empty(n, dtype=np.int64)
        if self.dense and n and self._fits(keys, need):
            self.n_groups = _dense_lookup_or_insert(
                keys, self._base, self._index, self._stored, self.n_groups, out
            )
            if not self._compact_enough(self._index.shape[0], self.n_groups):
                self._leave_dense()  # the batch held fewer distinct keys than rows
        else:
            if 2 * need > self._slots.shape[0]:
                self._resize(1 << int(2 * need - 1).bit_length())
            self.n_groups = _lookup_or_insert(keys, self._slots, self._stored, self.n_groups, out)
            # Shrink the probe table back when a huge batch inflated it but added few groups.
            if self._slots.shape[0] > 8 * max(self.n_groups, 64):
                self._resize(1 << int(2 * max(self.n_groups, 64) - 1).bit_length())
        if self._stored.shape[0] > 8 * max(self.n_groups, 64):  # ... and the keys' array, grown for every row
            self._stored = self._stored[: max(64, 2 * self.n_groups)].copy()
        return out

    def _fits(self, keys: I64, groups: int) -> bool:
        """Whether ``keys`` can be looked up directly, the table then holding at most ``groups``
        groups: re-bases the index to cover them, or (the guard) leaves dense lookup for good
        when no small range holds every key, or its index would be too sparse."""
        lo, hi = _key_range(keys)
        have = self._stored[: self.n_groups, 0]
        if self._index.shape[0] and self._base <= lo and hi < self._base + self._index.shape[0]:
            return True
        lo, hi = min(lo, int(have.min(initial=lo))), max(hi, int(have.max(initial=hi)))
        if hi - lo >= DENSE_SPAN or not self._compact_enough(hi - lo + 1, groups):
            self._leave_dense()
            return False
        self._base = lo
        self._index = np.full(min(DENSE_SPAN, max(64, 2 * (hi - lo + 1))), _EMPTY, dtype=np.int64)
        self._index[have - lo] = np.arange(self.n_groups)
        return True

    @staticmethod
    def _compact_enough(slots: int, groups: int) -> bool:
        """Whether a direct index of ``slots`` is worth its memory for ``groups`` groups."""
        return slots <= max(DENSE_FREE_SLOTS, DENSE_SLOTS_PER_GROUP * groups)

    def _leave_dense(self) -> None:
        self.dense = False
        self._index = np.empty(0, dtype=np.int64)
        self._resize(max(128, 1 << int(2 * max(self.n_groups, 1) - 1).bit_length()))

    def compact(self, keep: npt.NDArray[np.bool_]) -> I64:
        """Keep the groups where ``keep`` is true; returns old id -> new id (-1 if dropped)."""
        remap = np.full(self.n_groups, -1, dtype=np.int64)
        kept = np.flatnonzero(keep[: self.n_groups])
        remap[kept] = np.arange(kept.shape[0])
        self._stored[: kept.shape[0]] = self._stored[kept]
        self.n_groups = int(kept.shape[0])
        if self.dense:
            self._index[:] = _EMPTY
            self._index[self._stored[: self.n_groups, 0] - self._base] = np.arange(self.n_groups)
        else:
            self._resize(max(128, 1 << int(2 * max(self.n_groups, 1) - 1).bit_length()))
        return remap

    def _resize(self, capacity: int) -> None:
        self._slots = np.full(capacity, _EMPTY, dtype=np.int64)
        _rebuild(self._stored, self.n_groups, self._slots)

    def save_fields(self) -> dict[str, State]:
        """The key of every group id, and the range of the direct lookup (``span`` 0: none)."""
        return {"keys": self.keys.copy(), "dense": self.dense, "base": self._base, "span": len(self._index)}

    def load_fields(self, saved: dict[str, State], where: str) -> None:
        found = fields(saved, ("keys", "dense", "base", "span"), where)
        keys = as_array(found["keys"], f"{where}.keys", np.int64, 2)
        dense, base = as_bool(found["dense"], f"{where}.dense"), as_int(found["base"], f"{where}.base")
        span, n = as_int(found["span"], f"{where}.span"), keys.shape[0]
        if keys.shape[1] != self.width or (dense and self.width != 1):
            raise CorruptState(f"state of {where} has keys of width {keys.shape[1]}, not {self.width}")
        if dense and not (
            0 <= span <= DENSE_SPAN and (n == 0 or (base <= keys.min() and keys.max() < base + span))
        ):
            raise CorruptState(f"state of {where} has keys outside its direct range of {span} from {base}")
        self._stored = np.empty((max(64, n), self.width), dtype=np.int64)
        self._stored[:n] = keys
        self.n_groups, self.dense, self._base = n, dense, base
        self._index = np.empty(0, dtype=np.int64)
        if dense and span:
            self._index = np.full(span, _EMPTY, dtype=np.int64)
            self._index[keys[:, 0] - base] = np.arange(n)
        if dense:  # the probe table is unused: leaving dense lookup rebuilds it from the keys
            self._slots = np.full(128, _EMPTY, dtype=np.int64)
        else:
            self._resize(max(128, 1 << int(2 * max(n, 1) - 1).bit_length()))
