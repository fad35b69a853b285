"""The engine-wide string dictionary: strings become int64 codes at the door.

One pool serves every stream and query of an engine, so equal strings have equal codes across
streams: joins and predicates compare codes, never strings. Codes are dense, start at 0 and are
never reused; ``NULL_CODE`` stands for a missing string. The pool only grows (its size is the
number of distinct strings ever seen), which is what keeps codes stable for the engine's life.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from lowtide.operators.state import State

NULL_CODE = -1


class StringPool:
    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._values = np.empty(1024, dtype=object)
        self._next = 0

    def __len__(self) -> int:
        return len(self._codes)

    def code(self, value: str) -> int:
        """The code of one string, added to the pool when new (predicates use this)."""
        found = self._codes.get(value)
        if found is not None:
            return found
        code = self._next
        self._store(value, code)
        return code

    def values(self, start: int, stop: int) -> list[str]:
        """The strings of codes ``start..stop-1`` (a mirror copies new entries from these)."""
        return list(self._values[start:stop])

    def adopt(self, codes: dict[str, int]) -> None:
        """Take another pool's codes for these strings (a worker mirrors the front's literals)."""
        for value, code in codes.items():
            if self._codes.get(value, code) != code:
                raise ValueError(f"string {value!r} already has code {self._codes[value]}, not {code}")
            self._store(value, code)

    def snapshot(self) -> State:
        """Every string in code order, as UTF-8 bytes and offsets (no Python objects)."""
        encoded = [v.encode("utf-8", "surrogatepass") for v in self.values(0, len(self))]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return {"offsets": offsets, "bytes": np.frombuffer(b"".join(encoded), np.uint8).copy()}

    def restore(self, state: State) -> None:
        """Take the codes of a :meth:`snapshot` (before anything else gives out codes)."""
        from lowtide.operators.state import as_array, as_dict  # clients load this module: no engine

        saved = as_dict(state, "strings")
        offsets = as_array(saved["offsets"], "string offsets", np.int64, 1)
        data = as_array(saved["bytes"], "string bytes", np.uint8, 1).tobytes()
        values = [data[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise(offsets)]
        self.adopt({value: code for code, value in enumerate(values)})

    def _store(self, value: str, code: int) -> None:
        if code >= len(self._values):
            grown = np.empty(max(code + 1, 2 * len(self._values)), dtype=object)
            grown[: len(self._values)] = self._values
            self._values = grown
        self._values[code] = value
        self._codes[value] = code
        self._next = max(self._next, code + 1)

    def encode(self, values: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
        """Codes for an Arrow string array; the Python loop runs over distinct values only."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not pa.types.is_dictionary(values.type):
            values = pc.dictionary_encode(values)
        dictionary = values.dictionary.to_pylist()
        found = list(map(self._codes.get, dictionary))  # C-level lookups; None marks a new string
        if None in found:  # a null among the dictionary's values (Arrow allows it) is a null string
            found = [
                NULL_CODE if s is None else self.code(s) if c is None else c
                for s, c in zip(dictionary, found, strict=True)
            ]
        mapping = np.array(found, dtype=np.int64)
        indices = values.indices
        if indices.null_count:
            filled = pc.fill_null(indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            out = np.where(filled >= 0, mapping[np.maximum(filled, 0)], NULL_CODE)
            return np.asarray(out, dtype=np.int64)
        return np.asarray(mapping[indices.to_numpy(zero_copy_only=False)], dtype=np.int64)

    def decode(self, codes: npt.NDArray[np.int64]) -> pa.Array:
        """An Arrow string array for codes (``NULL_CODE`` becomes null)."""
        null = codes == NULL_CODE
        strings = self._values[np.where(null, 0, codes)]
        return pa.array(strings, type=pa.string(), mask=null if null.any() else None)
