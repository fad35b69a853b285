"""The engine-wide string dictionary: strings become int64 codes as their batch applies.

One pool serves every stream and query of an engine, so equal strings have equal codes across
streams: joins and predicates compare codes, never strings. ``NULL_CODE`` stands for a missing
string. Invariants:

* **Only what applies is added.** A batch holds its strings as :class:`Uncoded` columns until it
  applies; :meth:`StringPool.look` finds, before that, what it would add (its limits are checked
  and its late tuples judged on that, see :class:`Coding`), and :meth:`StringPool.commit` adds it
  as it applies (what is still new then, within the limits again). Changes apply in one order
  (the input log's, at replay too), so a string gets the same code at every replay (unless
  strings a server's front computes came in between: see below), and a batch refused, or cut
  short by its producer, adds nothing.
* **Only what is used is added.** A batch adds the strings its rows hold, never the unused
  entries of a dictionary-encoded column (the door also leaves out the columns no query reads:
  see :mod:`lowtide.schema`).
* **Every string has a holder.** The streams whose batches were coded with it (each stream has
  one of 63 holder bits; past 63 streams, streams share bits), query literals and the strings
  queries compute (pinned: never released). A code names one string for as long as any holder holds it.
* **Releasing a stream frees what only it held**: nothing alive references those codes (a stream
  is dropped only after every query reading it, and a query's state holds codes of the streams
  it reads only). A bit shared by several streams is released with the last of them. Freed
  codes are given out again, lowest first.
* **Limits are per stream** (:class:`PoolLimits`): each stream is charged for the strings it
  added, in strings and in the bytes they take in memory (:func:`cost`); a batch that would take
  its stream past either is refused whole with :class:`~lowtide.errors.ResourceExhausted`, and
  adds nothing. So a producer of one stream cannot fill the pool for the others. A string a
  dropped stream added that others still hold is charged to none from then on.

A worker's pool is a *mirror*: it takes the front's codes (:meth:`StringPool.adopt`) and
forgets them when told (:meth:`StringPool.forget`); it never gives out codes itself, so a server
makes the strings queries compute at its front (:meth:`StringPool.codes`). Workers decode strings
only for a string column's ``heavy_hitters``; otherwise they need the codes of pinned strings
alone (:meth:`StringPool.pinned`: query literals, computed strings). The front codes computed
strings as results come back, not in the input log's order: those it pins while a checkpoint
waits for its barriers are saved with the checkpoint's output side and pinned again over its
snapshot of the pool (:meth:`StringPool.pin_held`).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from lowtide.errors import CorruptState, ResourceExhausted
from lowtide.snapshot import State, as_array, as_dict, as_int

NULL_CODE = -1
_NOT_FOUND = -(1 << 62)  # what a look-up of a string the pool lacks answers (below every code)
NO_OWNER = -1  # a string no stream is charged for (a literal's, or a dropped stream's)
_HOLDER_BITS = 63  # bits 0..62 name streams; bit 63 pins
_PINNED = np.uint64(1 << 63)
_FORMAT = 3  # of the snapshot: 3 adds each string's owner; 2 had none (loaded charged to none);
# format 1 (no "format" key) had no codes or holders either: loaded pinned
# What a string held costs the front besides the string object itself: its dict entry and code (an
# int object), a slot in each per-code array (values, holders, owners, costs) with their growth's
# slack, and what coding its batch leaves behind in the allocators. Measured by
# bench/string_pool_memory.py (CPython 3.11, x86-64): 2 million strings of 16 ASCII characters
# (objects of 65 bytes) grew a server's front by 231 to 255 bytes each over runs: charged 257.
ENTRY_BYTES = 192

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class PoolLimits:
    """The most strings, and bytes of memory (:func:`cost`), one stream may add to the pool."""

    max_strings: int
    max_bytes: int


def cost(value: str) -> int:
    """The bytes holding ``value`` in the front's pool takes: the string object (as CPython lays
    it out: 1, 2 or 4 bytes a character) and its entry (:data:`ENTRY_BYTES`)."""
    return sys.getsizeof(value) + ENTRY_BYTES


def _costs(values: Collection[str]) -> I64:
    return np.fromiter(map(sys.getsizeof, values), np.int64, len(values)) + ENTRY_BYTES


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


@dataclass(frozen=True)
class Uncoded:
    """A string column of a batch not yet applied: the distinct strings its rows use (a null
    entry of a client's dictionary stays None), each row's index among them (-1: a null row), and
    which rows of the batch they are (None: all of them)."""

    strings: list[str | None]
    rows: I64
    where: Mask | None = None

    @staticmethod
    def of(values: pa.Array | pa.ChunkedArray, where: Mask | None = None) -> Uncoded:
        """The rows ``where`` (None: all) of an Arrow string column (plain or dictionary-encoded).
        The Python loop runs over the distinct strings, not over rows."""
        if where is not None:
            values = values.filter(pa.array(where))
        dictionary, rows = _used(values)
        return Uncoded(dictionary.to_pylist(), rows, where)

    def codes(self, mapping: I64) -> I64:
        """Every row's code, given each distinct string's (``NULL_CODE`` where no row of it is)."""
        codes = np.append(mapping, NULL_CODE)[self.rows]  # a null row's -1 takes the last
        if self.where is None:
            return codes
        full = np.full(self.where.shape[0], NULL_CODE, np.int64)
        full[self.where] = codes
        return full


@dataclass(frozen=True)
class Coding:
    """How the string columns of one batch's parts code, as :meth:`StringPool.look` found the
    pool: each distinct string's code, or for a string new to the pool its *provisional* code
    ``-2 - k`` (``new[k]``: new strings in order of first use, with what each costs).
    Provisional codes compare as codes do (equal strings, equal codes; never a held string's),
    so the door judges late tuples on them before the batch applies. A coding holds until the
    pool releases a holder (a freed code may name another string then): the door looks a batch
    up again once its :class:`~lowtide.door.Epoch` moved past a release."""

    holder: str | None
    columns: list[dict[str, Uncoded]]  # per part
    found: list[dict[str, I64]]  # per part, per column: each distinct string's code
    new: list[str]
    costs: I64  # of each new string

    def provisional(self) -> list[dict[str, I64]]:
        """Each part's columns, with provisional codes for the strings new to the pool."""
        return [
            {name: u.codes(found[name]) for name, u in part.items()}
            for part, found in zip(self.columns, self.found, strict=True)
        ]


def _packed(values: Sequence[str]) -> dict[str, State]:
    """Strings as UTF-8 bytes cut at offsets (no Python objects in a snapshot)."""
    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return {"offsets": offsets, "bytes": np.frombuffer(b"".join(encoded), np.uint8).copy()}


def _unpacked(saved: Mapping[str, State]) -> list[str]:
    """The strings of a :func:`_packed`; CorruptState where it is not one."""
    offsets = as_array(saved["offsets"], "string offsets", np.int64, 1)
    data = as_array(saved["bytes"], "string bytes", np.uint8, 1).tobytes()
    if len(offsets) == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != len(data):
        raise CorruptState("strings: offsets do not cut the bytes")
    try:
        return [data[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise(offsets)]
    except UnicodeDecodeError as exc:  # refused as damaged state, never skipped: no string is lost
        raise CorruptState(f"strings: not UTF-8: {exc}") from None


class StringPool:
    def __init__(self, mirrored: bool = False, mirror: bool = False) -> None:
        """``mirrored``: workers mirror this pool (the front's): it keeps the codes added (or
        pinned) since :meth:`take_unsent` last ran. ``mirror``: this is a worker's mirror, which
        gives no code out, not even for computed strings (:meth:`codes`)."""
        self.mirror = mirror
        self._codes: dict[str, int] = {}
        self._values = np.empty(1024, dtype=object)  # None: a free code
        self._holders = np.zeros(1024, dtype=np.uint64)  # bit per holder; 0: free (or a mirror's)
        self._owners = np.full(1024, NO_OWNER, dtype=np.int32)  # the stream charged for each code
        self._next = 0  # every code below is held or free
        self._free: list[int] = []  # free codes below _next, the lowest last
        self._bits: dict[str, int] = {}  # holder (stream) -> its bit
        self._owner_ids: dict[str, int] = {}  # stream -> its owner id (in _owners)
        self._charged: dict[str, tuple[int, int]] = {}  # stream -> (strings, bytes) it owns
        self._unsent: list[int] | None = [] if mirrored else None
        self.bytes = 0  # what the strings held cost (see cost; a mirror's stays 0)
        # While a server's checkpoint waits for its barriers: the codes computed strings pinned
        # (its output side saves them with :meth:`held`; see lowtide.server.checkpoint_coordinator).
        self.recording: list[int] | None = None

    def __len__(self) -> int:
        return len(self._codes)

    def charged(self, stream: str) -> tuple[int, int]:
        """The strings ``stream`` is charged for, and their bytes (see :class:`PoolLimits`)."""
        return self._charged.get(stream, (0, 0))

    def strings(self) -> dict[str, int]:
        """Every string held, with its code (a copy)."""
        return dict(self._codes)

    # -- adding ---------------------------------------------------------------------------------
    def code(self, value: str) -> int:
        """The code of one string, added when new and pinned (a query's literal)."""
        found = self._codes.get(value)
        if found is None:
            added = self._allocate(1)
            self._put(added, [value])  # charged to no stream
            self.bytes += cost(value)
            found = int(added[0])
        elif not self._holders[found] & _PINNED and self._unsent is not None:
            self._unsent.append(found)  # a mirror of literals alone lacks it
        self._holders[found] |= _PINNED
        return found

    def codes(self, values: Sequence[str]) -> I64:
        """The codes of strings a query computes (``DATE_FORMAT``, ``SPLIT_INDEX``), each added
        when new and pinned as :meth:`code` pins a literal: a computed string may be in a query's
        state or result for as long as the query runs, and names no stream that could release it.
        One dictionary look-up per string. The codes pinned only now go to :attr:`recording`."""
        if self.mirror:  # a server computes strings at its front (lowtide.server.partitioning)
            raise RuntimeError("a worker's string pool mirrors the front's and gives no code out")
        found = self._find(values)
        missing = np.flatnonzero(found == _NOT_FOUND)
        if missing.size:
            absent = [values[i] for i in missing.tolist()]
            new = list(dict.fromkeys(absent))
            self._put(self._allocate(len(new)), new)  # charged to no stream, as a literal
            self.bytes += int(_costs(new).sum())
            found[missing] = self._find(absent)
        pinned = np.unique(found[(self._holders[found] & _PINNED) == 0]).tolist()
        if pinned:
            self._holders[pinned] |= _PINNED
            if self._unsent is not None:  # a mirror of literals alone lacks those pinned only now
                self._unsent.extend(pinned)
            if self.recording is not None:
                self.recording.extend(pinned)
        return found

    def encode(
        self,
        columns: Mapping[str, pa.Array | pa.ChunkedArray],
        holder: str | None = None,
        limits: PoolLimits | None = None,
    ) -> dict[str, I64]:
        """Codes for Arrow string columns (plain or dictionary-encoded), all or none, at once:
        :meth:`look`, :meth:`check` against ``limits`` (None: none), :meth:`commit`."""
        coding = self.look(holder, [{name: Uncoded.of(values) for name, values in columns.items()}])
        if limits is not None:
            self.check(coding, limits)
        return self.commit(coding)[0]

    def look(self, holder: str | None, columns: Sequence[Mapping[str, Uncoded]]) -> Coding:
        """How the string columns of a batch's parts would code now, for ``holder`` (a stream;
        None: pinned). Nothing changes."""
        # New strings in order of first use. No Python object is kept per string (an int, say):
        # many short-lived objects among the strings the pool keeps fragment the front's heap.
        new: dict[str | None, None] = {}
        found: list[dict[str, I64]] = []
        for part in columns:
            codes: dict[str, I64] = {}
            for name, u in part.items():
                got = self._find(u.strings)
                missing = np.flatnonzero(got == _NOT_FOUND)
                if missing.size:  # new strings (or a null dictionary entry: it finds nothing)
                    fresh = np.array(u.strings, dtype=object)[missing].tolist()
                    new.update(dict.fromkeys(fresh))
                    new.pop(None, None)
                    k = pc.index_in(pa.array(fresh, pa.string()), value_set=pa.array(list(new), pa.string()))
                    got[missing] = -2 - np.asarray(pc.fill_null(k, -1), np.int64)  # a null entry: NULL_CODE
                codes[name] = got
            found.append(codes)
        strings: list[str] = list(new)  # type: ignore[arg-type]
        return Coding(holder, [dict(p) for p in columns], found, strings, _costs(strings))

    def _find(self, strings: Sequence[str | None]) -> I64:
        """The code of each string, ``_NOT_FOUND`` where it has none (C-level look-ups)."""
        return np.fromiter(
            map(self._codes.get, strings, itertools.repeat(_NOT_FOUND)),  # type: ignore[arg-type]
            np.int64,
            len(strings),
        )

    def check(self, coding: Coding, limits: PoolLimits) -> None:
        """ResourceExhausted if what ``coding`` adds would take its stream past ``limits``."""
        self._within(coding.holder, len(coding.new), int(coding.costs.sum()), limits)

    def _within(self, holder: str | None, n_new: int, new_bytes: int, limits: PoolLimits) -> None:
        if not n_new or holder is None:
            return
        held, held_bytes = self.charged(holder)
        if held + n_new > limits.max_strings:
            raise ResourceExhausted(
                f"the batch adds {n_new} strings to the {held} stream {holder!r} added, over the "
                f"string pool's limit of {limits.max_strings} a stream (max_strings)"
            )
        if held_bytes + new_bytes > limits.max_bytes:
            raise ResourceExhausted(
                f"the batch adds {new_bytes} bytes of strings to the {held_bytes} stream {holder!r} "
                f"added, over the string pool's limit of {limits.max_bytes} a stream (max_string_bytes: "
                f"each string's object and {ENTRY_BYTES} bytes of entry)"
            )

    def commit(self, coding: Coding, limits: PoolLimits | None = None) -> list[dict[str, I64]]:
        """Add what ``coding`` found new (charged to its holder), make its holder hold every
        string it uses, and return each part's code columns; all or nothing. ``coding`` was
        looked up since the pool last released a holder (see :class:`Coding`); other batches
        may have added some of its new strings since: only those still new are added, and
        checked against ``limits`` (None: none) as :meth:`check` would check them now."""
        holder = coding.holder
        final = self._find(coding.new)  # another batch may have added some since the look-up
        todo = np.flatnonzero(final == _NOT_FOUND)
        costs = coding.costs[todo]
        if limits is not None:
            self._within(holder, todo.size, int(costs.sum()), limits)
        if todo.size:
            codes = self._allocate(todo.size)
            values = coding.new if todo.size == len(coding.new) else [coding.new[k] for k in todo.tolist()]
            self._put(codes, values)
            self._owners[codes] = NO_OWNER if holder is None else self._owner_of(holder)
            self.bytes += int(costs.sum())
            if holder is not None:
                strings, size = self.charged(holder)
                self._charged[holder] = (strings + len(codes), size + int(costs.sum()))
            final[todo] = codes
        bit = self._bit(holder) if any(coding.columns) else _PINNED
        out: list[dict[str, I64]] = []
        for part, found in zip(coding.columns, coding.found, strict=True):
            coded: dict[str, I64] = {}
            for name, u in part.items():
                mapping = looked = found[name]
                provisional = looked <= -2
                if provisional.any():
                    mapping = np.where(provisional, final[np.where(provisional, -2 - looked, 0)], looked)
                self._holders[mapping[mapping >= 0]] |= bit
                coded[name] = u.codes(mapping)
            out.append(coded)
        return out

    def _owner_of(self, holder: str) -> int:
        owner = self._owner_ids.get(holder)
        if owner is None:
            owner = self._owner_ids[holder] = max(self._owner_ids.values(), default=-1) + 1
        return owner

    def _bit(self, holder: str | None) -> np.uint64:
        if holder is None:
            return _PINNED
        bit = self._bits.get(holder)
        if bit is None:
            users = {b: 0 for b in range(_HOLDER_BITS)}
            for b in self._bits.values():
                users[b] += 1
            bit = self._bits[holder] = min(range(_HOLDER_BITS), key=lambda b: users[b])
        return np.uint64(1 << bit)

    def _allocate(self, n: int) -> I64:
        """``n`` codes to give out, in order: free ones lowest first, then new ones."""
        reused = self._free[max(0, len(self._free) - n) :][::-1]
        del self._free[len(self._free) - len(reused) :]
        fresh = np.arange(self._next, self._next + n - len(reused), dtype=np.int64)
        return np.concatenate([np.array(reused, np.int64), fresh])

    def _put(self, codes: I64, values: Sequence[str]) -> None:
        """Name ``codes`` by ``values`` (free codes; holders, owners and costs are the caller's)."""
        top = int(codes.max()) + 1 if len(codes) else 0
        if top > len(self._values):
            grow = max(top, 2 * len(self._values)) - len(self._values)
            self._values = np.concatenate([self._values, np.empty(grow, dtype=object)])
            self._holders = np.concatenate([self._holders, np.zeros(grow, np.uint64)])
            self._owners = np.concatenate([self._owners, np.full(grow, NO_OWNER, np.int32)])
        objects = np.empty(len(values), dtype=object)
        objects[:] = values
        self._values[codes] = objects
        ints = codes.tolist()  # the dict keeps them; the unsent list shares them
        self._codes.update(zip(values, ints, strict=True))
        self._next = max(self._next, top)
        if self._unsent is not None:
            self._unsent.extend(ints)

    # -- releasing ------------------------------------------------------------------------------
    def release(self, holder: str) -> I64:
        """``holder`` (a dropped stream) holds nothing any more, and is charged for nothing;
        returns the codes freed: the strings nothing else held."""
        self._charged.pop(holder, None)
        owner = self._owner_ids.pop(holder, None)
        if owner is not None:  # what it added and others hold is charged to none from now on
            owners = self._owners[: self._next]
            owners[owners == owner] = NO_OWNER
        bit = self._bits.pop(holder, None)
        if bit is None or bit in self._bits.values():  # a stream sharing its bit still holds them
            return np.empty(0, np.int64)
        mask = np.uint64(1 << bit)
        held = self._holders[: self._next]
        had = (held & mask) != 0
        held[had] &= ~mask
        freed = np.flatnonzero(had & (held == 0))
        gone = self._values[freed].tolist()
        for value in gone:
            del self._codes[value]
        self._values[freed] = None
        self._owners[freed] = NO_OWNER
        self.bytes -= int(_costs(gone).sum())
        if freed.size:
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
            self._owners = self._owners[:size].copy()

    # -- a mirror -------------------------------------------------------------------------------
    def take_unsent(self) -> list[int]:
        """The codes added (or pinned) since the last call and still held, once each (what a
        mirror lacks)."""
        if not self._unsent:
            return []
        unsent, self._unsent = self._unsent, []
        return [c for c in dict.fromkeys(unsent) if self._values[c] is not None]

    def pinned(self, codes: Sequence[int]) -> list[int]:
        """Those of held ``codes`` a query literal pinned."""
        at = np.asarray(codes, dtype=np.int64)
        pinned: list[int] = at[(self._holders[at] & _PINNED) != 0].tolist()
        return pinned

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
            self._put(np.array([code], np.int64), [value])

    def forget(self, codes: Sequence[int]) -> None:
        """Forget the strings of ``codes`` (the front released them); unknown codes are skipped."""
        for code in codes:
            value = self._values[code] if 0 <= code < len(self._values) else None
            if value is not None:
                del self._codes[value]
                self._values[code] = None

    # -- checkpoints ----------------------------------------------------------------------------
    def snapshot(self) -> State:
        """Every string held with its code, holders and owner, as UTF-8 bytes and offsets (no
        Python objects); the holders' bits and the owners' ids by name."""
        codes = np.array(self.entries(), dtype=np.int64)
        return {
            "format": _FORMAT,
            "codes": codes,
            "holders": self._holders[codes].copy(),
            "bits": dict(self._bits),
            "owners": self._owners[codes].copy(),
            "owner_ids": dict(self._owner_ids),
            **_packed(self.values(codes.tolist())),
        }

    def restore(self, state: State) -> None:
        """Take the codes, holders and owners of a :meth:`snapshot`, into an empty pool. A
        snapshot of format 2 (no owners) loads with every string charged to none; one of format 1
        (strings in code order, no holders) with every string pinned."""
        if len(self):
            raise ValueError("a pool restores only while empty")
        saved = as_dict(state, "strings")
        values = _unpacked(saved)
        n = len(values)
        owners, owner_ids = np.full(n, NO_OWNER, np.int32), {}
        if "format" not in saved:
            codes, holders, bits = np.arange(n, dtype=np.int64), np.full(n, _PINNED, np.uint64), {}
        else:
            form = as_int(saved["format"], "strings format")
            if form not in (2, _FORMAT):
                raise CorruptState(f"strings: format {form}, not 2 or {_FORMAT}")
            codes = as_array(saved["codes"], "string codes", np.int64, 1)
            holders = as_array(saved["holders"], "string holders", np.uint64, 1)
            bits = {
                name: as_int(b, "holder bit") for name, b in as_dict(saved["bits"], "holder bits").items()
            }
            if form == _FORMAT:
                owners = as_array(saved["owners"], "string owners", np.int32, 1)
                owner_ids = {
                    name: as_int(o, "owner id")
                    for name, o in as_dict(saved["owner_ids"], "owner ids").items()
                }
        if len(codes) != n or len(holders) != n or (n and (codes.min() < 0 or np.any(holders == 0))):
            raise CorruptState("strings: codes, holders and strings do not match")
        if (
            len(set(values)) != n
            or len(np.unique(codes)) != n
            or not all(0 <= b < _HOLDER_BITS for b in bits.values())
        ):
            raise CorruptState("strings: a string, code or holder bit appears twice or out of range")
        ids = np.array(sorted(owner_ids.values()), np.int32)
        known = np.isin(owners, ids) | (owners == NO_OWNER)
        if len(owners) != n or len(np.unique(ids)) != len(ids) or np.any(ids < 0) or not known.all():
            raise CorruptState("strings: an owner is unknown, or named twice")
        costs = _costs(values)
        self._put(codes, values)
        self._holders[codes], self._owners[codes] = holders, owners
        self._bits, self._owner_ids = bits, owner_ids
        owned = owners != NO_OWNER
        present, which = np.unique(owners[owned], return_inverse=True)
        strings = np.bincount(which, minlength=len(present)).tolist()
        sizes = np.bincount(which, costs[owned], len(present)).astype(np.int64).tolist()
        charged = {owner: (n, size) for owner, n, size in zip(present.tolist(), strings, sizes, strict=True)}
        self._charged = {name: charged[owner] for name, owner in owner_ids.items() if owner in charged}
        self.bytes = int(costs.sum())
        self._free = np.flatnonzero(self._holders[: self._next] == 0)[::-1].tolist()

    def held(self, codes: Sequence[int]) -> State:
        """Held ``codes`` with their strings (those :attr:`recording` took, say), for
        :meth:`pin_held`."""
        unique = np.unique(np.asarray(codes, dtype=np.int64))
        return {"codes": unique, **_packed(self.values(unique.tolist()))}

    def pin_held(self, state: State) -> None:
        """Pin the strings of a :meth:`held`, each under its code, over a :meth:`restore`: those
        computed strings a server's output side pinned while its checkpoint waited (a code it
        recorded names its string in the checkpoint's results that reach workers again). No
        stream released a code meanwhile (a dropped stream abandons the checkpoint), so a string
        the snapshot holds has the code recorded, and a code recorded for a new one is free."""
        saved = as_dict(state, "pinned strings")
        codes = as_array(saved["codes"], "pinned codes", np.int64, 1)
        values = _unpacked(saved)
        if len(codes) != len(values) or (len(codes) and codes.min() < 0):
            raise CorruptState("pinned strings: codes and strings do not match")
        for code, value in zip(codes.tolist(), values, strict=True):
            known = self._codes.get(value)
            if known is None and not (code < len(self._values) and self._values[code] is not None):
                self._put(np.array([code], np.int64), [value])
                self.bytes += cost(value)
            elif known != code:
                raise CorruptState(f"pinned strings: {value!r} is not code {code} of the snapshot's")
            elif not self._holders[code] & _PINNED and self._unsent is not None:
                self._unsent.append(code)  # a mirror of literals alone lacks it
            self._holders[code] |= _PINNED
        self._free = np.flatnonzero(self._holders[: self._next] == 0)[::-1].tolist()

    # -- decoding -------------------------------------------------------------------------------
    def decode(self, codes: I64) -> pa.Array:
        """An Arrow string array for codes (``NULL_CODE`` becomes null)."""
        null = codes == NULL_CODE
        strings = self._values[np.where(null, 0, codes)]
        return pa.array(strings, type=pa.string(), mask=null if null.any() else None)
