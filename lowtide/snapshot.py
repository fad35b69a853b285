"""State as plain data, and as bytes: what a checkpoint keeps of operators, the door and the front.

A snapshot is a :data:`State`: nested ``dict`` (``str`` keys) and ``list`` of numpy arrays (numeric
or fixed-width unicode, never object dtype) and Python ``int``, ``float``, ``bool``, ``str`` and
``None``. Configuration - window sizes, columns, compiled kernels, downstream links - is no state:
planning the same query again rebuilds it.

Saved forms (:class:`Versioned`): whatever a checkpoint keeps of an object is
``{"version": VERSION, "fields": {name: State}}``, named fields under the version of their
layout, the class's ``VERSION``. Every operator declares its fields in one place, the class
attribute ``STATE`` (:class:`Stateful`): public name -> the attribute holding it and how it is
kept (a :class:`Keep`), so renaming an attribute leaves the saved form as it is. Helpers holding
state (group tables, accumulators, stores) write their fields by hand, under versions of their
own. A saved form of another version is brought to this build's by the class's ``MIGRATIONS``
or refused in one line, never read as if it were this build's: see :meth:`Versioned.opened`.

Contract: on an object built like ``a`` (the same query planned again), ``b.restore(a.snapshot())``
makes ``b`` emit from then on exactly what ``a`` emits. ``snapshot`` copies (``a`` goes on
unchanged by it and does not change it); ``restore`` takes the arrays of its state over, so a
state is restored once. Snapshot and restore loop over fields and windows, never over tuples.

Bytes (:func:`pack`, :func:`unpack`), format version 1, integers little-endian::

    offset  0   8 bytes   magic b"LTSTATE\\0"
    offset  8   u32       format version (1)
    offset 12   u32       CRC-32 of every byte from offset 16 on
    offset 16   u64       total length in bytes (prefix included)
    offset 24   u64       header length H
    offset 32   H bytes   header, UTF-8 JSON: {"root": node, "arrays": [[dtype, shape], ...]}
    offset 32+H           the bytes of each array in header order, C order, back to back

A header node is JSON ``null``, ``true``/``false``, an integer, a string, a list of nodes, or an
object with one key: ``{"dict": {name: node}}``, ``{"float": float.hex(x)}`` (exact: NaN and
infinities too) or ``{"array": i}`` (every array is referred to exactly once). A dtype is numpy's
``dtype.str`` of kind b, i, u, f, c or U. Nothing is ever unpickled: damaged, truncated or
foreign bytes raise :class:`~lowtide.errors.CorruptState` with a one-line reason.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt

from lowtide.errors import CorruptState

State: TypeAlias = bool | int | float | str | npt.NDArray[Any] | list["State"] | dict[str, "State"] | None

MAGIC = b"LTSTATE\0"
VERSION = 1
_PREFIX = struct.Struct("<8sIIQQ")  # magic, version, CRC-32, total length, header length
_CHECKED = 16  # the CRC covers the lengths, the header and the arrays
_KINDS = "biufcU"  # numpy dtype kinds a state array may have
_DTYPE = re.compile(r"[<>|=][biufcU][0-9]{1,6}")
_MAX_DIMS = 32


# -- bytes --------------------------------------------------------------------------------------------
def pack(state: State) -> bytes:
    """``state`` as bytes (see the module docstring). Raises ``TypeError`` for a value that is no
    State (a numpy scalar, a tuple, an object array, a non-str key): a bug in a ``snapshot``."""
    return b"".join(pack_parts(state))


def pack_parts(state: State) -> list[bytes | memoryview]:
    """The bytes of :func:`pack` as pieces, the arrays' own memory among them (written one after
    another, they make the same file without a copy of the whole state)."""
    arrays: list[npt.NDArray[Any]] = []
    root = _encode(state, arrays, "state")
    meta = [[a.dtype.str, list(a.shape)] for a in arrays]
    header = json.dumps({"root": root, "arrays": meta}, separators=(",", ":"), allow_nan=False).encode()
    parts: list[bytes | memoryview] = [header]
    parts += [np.ascontiguousarray(a).data.cast("B") for a in arrays if a.size]
    total = _PREFIX.size + sum(len(part) for part in parts)
    lengths = _PREFIX.pack(MAGIC, VERSION, 0, total, len(header))[_CHECKED:]
    crc = zlib.crc32(lengths)
    for part in parts:
        crc = zlib.crc32(part, crc)
    return [_PREFIX.pack(MAGIC, VERSION, crc, total, len(header)), *parts]


def unpack(data: bytes) -> State:
    """The State :func:`pack` made ``data`` from; raises ``CorruptState`` for anything else."""
    if len(data) < _PREFIX.size:
        raise CorruptState(
            f"state is truncated: {len(data)} bytes, shorter than its {_PREFIX.size}-byte prefix"
        )
    magic, version, crc, total, header_size = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CorruptState("not a lowtide state: its first bytes are not the magic b'LTSTATE\\0'")
    if version != VERSION:
        raise CorruptState(
            f"state format version {version} is not supported (this build reads version {VERSION})"
        )
    if len(data) != total:
        how = "truncated" if len(data) < total else "followed by extra bytes"
        raise CorruptState(f"state is {how}: {len(data)} bytes, its prefix says {total}")
    if zlib.crc32(memoryview(data)[_CHECKED:]) != crc:
        raise CorruptState("state is damaged: its CRC-32 does not match its bytes")
    end = _PREFIX.size + header_size
    if end > total:
        raise CorruptState(f"state header of {header_size} bytes runs past the end of the state")
    try:
        header = json.loads(bytes(data[_PREFIX.size : end]).decode("utf-8"), parse_constant=_no_constant)
        if not (isinstance(header, dict) and header.keys() == {"root", "arrays"}):
            raise CorruptState("state header is not {root, arrays}")
        arrays = _read_arrays(header["arrays"], data, end)
        used: set[int] = set()
        state = _decode(header["root"], arrays, used)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, too many digits, too deep
        raise CorruptState(f"state header cannot be read: {type(exc).__name__}") from None
    if len(used) != len(arrays):
        raise CorruptState(f"state header refers to {len(used)} of its {len(arrays)} arrays")
    return state


def _no_constant(name: str) -> Any:
    raise CorruptState(f"state header holds the bare constant {name}")


def _encode(value: State, arrays: list[npt.NDArray[Any]], where: str) -> Any:
    # Exact types: a numpy scalar (np.float64 is a float) would come back as a Python one.
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if isinstance(value, float) and kind is float:
        return {"float": value.hex()}
    if isinstance(value, np.ndarray):
        dtype = value.dtype
        if dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise TypeError(f"{where}: an array of dtype {dtype} is no State (numeric or unicode only)")
        arrays.append(value)
        return {"array": len(arrays) - 1}
    if isinstance(value, list) and kind is list:
        return [_encode(item, arrays, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict) and kind is dict:
        bad = next((key for key in value if type(key) is not str), None)
        if bad is not None:
            raise TypeError(f"{where}: key {bad!r} is not a str")
        return {"dict": {key: _encode(item, arrays, f"{where}.{key}") for key, item in value.items()}}
    raise TypeError(f"{where}: a {kind.__name__} is no State")


def _read_arrays(meta: Any, data: bytes, offset: int) -> list[npt.NDArray[Any]]:
    if type(meta) is not list:
        raise CorruptState("state header: arrays is not a list")
    arrays = []
    for i, entry in enumerate(meta):
        if not (type(entry) is list and len(entry) == 2 and type(entry[0]) is str and type(entry[1]) is list):
            raise CorruptState(f"state header: array {i} is not [dtype, shape]")
        text, shape = entry
        try:
            dtype = np.dtype(text) if _DTYPE.fullmatch(text) else None
        except TypeError:  # a width numpy does not have, as in <i3
            dtype = None
        if dtype is None or dtype.itemsize == 0:
            raise CorruptState(
                f"state header: array {i} has the dtype {text[:20]!r}, not a numeric or unicode one"
            )
        if len(shape) > _MAX_DIMS or any(type(n) is not int or n < 0 for n in shape):
            raise CorruptState(f"state header: array {i} has the shape {shape[:_MAX_DIMS]}")
        size = math.prod(shape) * dtype.itemsize
        if offset + size > len(data):
            raise CorruptState(f"state header: array {i} of {size} bytes runs past the end of the state")
        flat = np.frombuffer(data, dtype, math.prod(shape), offset) if size else np.empty(0, dtype)
        arrays.append(flat.reshape(shape).astype(dtype.newbyteorder("=")))  # a writable copy
        offset += size
    if offset != len(data):
        raise CorruptState(f"state holds {len(data) - offset} bytes after its last array")
    return arrays


def _decode(node: Any, arrays: list[npt.NDArray[Any]], used: set[int]) -> State:
    kind = type(node)
    if node is None or kind in (bool, int, str):
        scalar: State = node
        return scalar
    if kind is list:
        return [_decode(item, arrays, used) for item in node]
    if kind is dict and len(node) == 1:
        ((tag, value),) = node.items()
        if tag == "dict" and type(value) is dict:
            return {key: _decode(item, arrays, used) for key, item in value.items()}
        if tag == "float" and type(value) is str:
            try:
                return float.fromhex(value)
            except ValueError:
                raise CorruptState(f"state header: {value[:30]!r} is not a hexadecimal float") from None
        if tag == "array" and type(value) is int and 0 <= value < len(arrays) and value not in used:
            used.add(value)
            return arrays[value]
    raise CorruptState(f"state header: unexpected node {json.dumps(node)[:40]}")


# -- reading a State ------------------------------------------------------------------------------------
def as_dict(state: State, where: str) -> dict[str, State]:
    if type(state) is not dict:
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not a dict")
    return state


def fields(state: State, names: Sequence[str] | Mapping[str, Any], where: str) -> dict[str, State]:
    """``state`` as a dict holding exactly ``names``."""
    found = as_dict(state, where)
    if found.keys() != set(names):
        missing, extra = sorted(set(names) - found.keys()), sorted(found.keys() - set(names))
        raise CorruptState(f"state of {where} lacks {missing} and has {extra}: saved by another plan?")
    return found


def as_list(state: State, where: str) -> list[State]:
    if type(state) is not list:
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not a list")
    return state


def as_int(state: State, where: str) -> int:
    if type(state) is not int:
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not an int")
    return state


def as_float(state: State, where: str) -> float:
    if type(state) is not float:
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not a float")
    return state


def as_bool(state: State, where: str) -> bool:
    if type(state) is not bool:
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not a bool")
    return state


def as_str(state: State, where: str) -> str:
    if type(state) is not str:
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not a str")
    return state


def as_array(state: State, where: str, dtype: Any = None, ndim: int | None = None) -> npt.NDArray[Any]:
    """An array of ``dtype`` (any dtype of its kind for unicode) and ``ndim`` dimensions, C
    contiguous and writable (copied only if it is not)."""
    if not isinstance(state, np.ndarray):
        raise CorruptState(f"state of {where} is a {type(state).__name__}, not an array")
    if dtype is not None:
        want = np.dtype(dtype)
        if state.dtype != want and not (want.kind == "U" and state.dtype.kind == "U"):
            raise CorruptState(f"state of {where} is an array of {state.dtype}, not of {want}")
    if ndim is not None and state.ndim != ndim:
        raise CorruptState(f"state of {where} has {state.ndim} dimensions, not {ndim}")
    return np.require(state, requirements=["C", "W", "A"])


# -- saved forms ----------------------------------------------------------------------------------------
Migration: TypeAlias = Callable[[dict[str, State]], dict[str, State]]


def _as_saved(fields: dict[str, State]) -> dict[str, State]:
    """Version 0 of a helper, saved before state versions: the same fields, without the envelope."""
    return fields


class Versioned(ABC):
    """An object a checkpoint keeps, as the fields of its saved form under the class's ``VERSION``.

    A class bumps ``VERSION`` whenever its saved form changes - a field added, dropped, renamed,
    kept another way or meaning something else - and then either adds a step to ``MIGRATIONS``
    (``{N: fields of version N -> fields of version N + 1}``) or lets states of version N be
    refused. A ``VERSION`` covers the fields a class inherits (a change to ``Operator.STATE`` bumps
    every operator's); helpers restored as one field (:data:`NESTED`, :data:`EACH`) have their own.
    """

    VERSION: ClassVar[int] = 1
    MIGRATIONS: ClassVar[Mapping[int, Migration]] = MappingProxyType({0: _as_saved})

    def snapshot(self) -> State:
        return {"version": self.VERSION, "fields": self.save_fields()}

    def restore(self, state: State, where: str | None = None) -> None:
        """Put this object where ``snapshot`` took ``state``; raises ``CorruptState`` naming
        ``where`` (default: its ``label``, else its class) and the field for a state that is not
        of this class or of no version this build reads (the object is then partly restored)."""
        where = where if where is not None else str(getattr(self, "label", type(self).__name__))
        self.load_fields(self.opened(state, where), where)

    @classmethod
    def opened(cls, state: State, where: str) -> dict[str, State]:
        """The fields of the saved form ``state`` in this build's layout: as saved under
        ``VERSION``, or brought forward from an older version by ``MIGRATIONS`` one step at a time
        (a state without version is version 0, saved before there were any)."""
        found = as_dict(state, where)
        if found.keys() == {"version", "fields"}:
            saved, named = as_int(found["version"], f"{where}.version"), as_dict(found["fields"], where)
        else:
            saved, named = 0, found
        version = saved
        while version != cls.VERSION:
            step = cls.MIGRATIONS.get(version) if version < cls.VERSION else None
            if step is None:
                raise CorruptState(
                    f"checkpoint of {where} has state version {saved}, this build reads {cls.VERSION}"
                )
            named, version = step(named), version + 1
        return named

    @abstractmethod
    def save_fields(self) -> dict[str, State]:
        """The fields of the saved form: copies, never views of live values."""

    @abstractmethod
    def load_fields(self, saved: dict[str, State], where: str) -> None:
        """Take the fields of a saved form of this ``VERSION``, checking every one: a field that
        is damaged or of another plan raises ``CorruptState`` naming ``where`` and the field."""


# -- declaring state ------------------------------------------------------------------------------------
class Keep(ABC):
    """How one field is kept: saved as State, loaded back in place of its attribute's fresh value."""

    def at(self, attribute: str) -> Field:
        """The field kept this way in ``attribute``, a name the saved form does not depend on."""
        return Field(attribute, self)

    @abstractmethod
    def save(self, value: Any) -> State:
        """The attribute as State: a copy, never a view of the live value."""

    @abstractmethod
    def load(self, fresh: Any, state: State, where: str) -> Any:
        """The attribute's value from ``state``; ``fresh`` is its value in the new operator."""


class _Int(Keep):
    def save(self, value: Any) -> State:
        return int(value)

    def load(self, fresh: Any, state: State, where: str) -> Any:
        return as_int(state, where)


class _Float(Keep):
    def save(self, value: Any) -> State:
        return float(value)

    def load(self, fresh: Any, state: State, where: str) -> Any:
        return as_float(state, where)


class _Optional(Keep):
    """``None`` or what ``inner`` keeps."""

    def __init__(self, inner: Keep) -> None:
        self.inner = inner

    def save(self, value: Any) -> State:
        return None if value is None else self.inner.save(value)

    def load(self, fresh: Any, state: State, where: str) -> Any:
        return None if state is None else self.inner.load(fresh, state, where)


class _Array(Keep):
    """A numpy array of the fresh value's dtype and dimensions."""

    def save(self, value: Any) -> State:
        return np.array(value, copy=True)

    def load(self, fresh: Any, state: State, where: str) -> Any:
        like = fresh if isinstance(fresh, np.ndarray) else None
        return as_array(
            state, where, like.dtype if like is not None else None, like.ndim if like is not None else None
        )


class _Ints(Keep):
    """A ``list[int]``, as one int64 array."""

    def save(self, value: Any) -> State:
        return np.array(value, dtype=np.int64).reshape(-1)

    def load(self, fresh: Any, state: State, where: str) -> Any:
        values: list[int] = as_array(state, where, np.int64, 1).tolist()
        return values


class _IntMap(Keep):
    """A ``dict[int, int]``, as its keys and values in insertion order."""

    def save(self, value: Any) -> State:
        return {
            "keys": np.fromiter(value.keys(), np.int64, len(value)),
            "values": np.fromiter(value.values(), np.int64, len(value)),
        }

    def load(self, fresh: Any, state: State, where: str) -> Any:
        found = fields(state, ("keys", "values"), where)
        keys = as_array(found["keys"], f"{where}.keys", np.int64, 1)
        values = as_array(found["values"], f"{where}.values", np.int64, 1)
        if keys.shape != values.shape:
            raise CorruptState(f"state of {where} has {keys.shape[0]} keys and {values.shape[0]} values")
        return dict(zip(keys.tolist(), values.tolist(), strict=True))


class MapOf(Keep):
    """A ``dict[int, X]`` whose values ``inner`` keeps, in insertion order."""

    def __init__(self, inner: Keep) -> None:
        self.inner = inner

    def save(self, value: Any) -> State:
        return {
            "keys": np.fromiter(value.keys(), np.int64, len(value)),
            "values": [self.inner.save(item) for item in value.values()],
        }

    def load(self, fresh: Any, state: State, where: str) -> Any:
        found = fields(state, ("keys", "values"), where)
        keys = as_array(found["keys"], f"{where}.keys", np.int64, 1).tolist()
        values = as_list(found["values"], f"{where}.values")
        if len(keys) != len(values):
            raise CorruptState(f"state of {where} has {len(keys)} keys and {len(values)} values")
        return {k: self.inner.load(None, v, f"{where}[{k}]") for k, v in zip(keys, values, strict=True)}


class _Nested(Keep):
    """A :class:`Versioned` helper, restored in place (whatever refers to it still does);
    ``None`` when the operator has none."""

    def save(self, value: Any) -> State:
        return None if value is None else value.snapshot()

    def load(self, fresh: Any, state: State, where: str) -> Any:
        if fresh is None or state is None:
            if fresh is not state:
                raise CorruptState(f"state of {where} does not match the operator: saved by another plan?")
            return None
        fresh.restore(state, where)
        return fresh


class _Each(Keep):
    """A tuple (or list) of :class:`Versioned` helpers, each restored in place."""

    def save(self, value: Any) -> State:
        return [item.snapshot() for item in value]

    def load(self, fresh: Any, state: State, where: str) -> Any:
        items = as_list(state, where)
        if len(items) != len(fresh):
            raise CorruptState(f"state of {where} holds {len(items)} parts, the operator {len(fresh)}")
        for i, (helper, part) in enumerate(zip(fresh, items, strict=True)):
            helper.restore(part, f"{where}[{i}]")
        return fresh


class _Data(Keep):
    """Plain data already (dicts, lists, arrays, scalars): copied both ways."""

    def save(self, value: Any) -> State:
        copy: State = _copied(value)
        return copy

    def load(self, fresh: Any, state: State, where: str) -> Any:
        if type(state) is not type(fresh):
            raise CorruptState(f"state of {where} is a {type(state).__name__}, not a {type(fresh).__name__}")
        return _copied(state)


def _copied(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    return value


INT = _Int()
FLOAT = _Float()
OPTIONAL_INT = _Optional(INT)
ARRAY = _Array()
OPTIONAL_ARRAY = _Optional(ARRAY)
INTS = _Ints()
INT_MAP = _IntMap()
NESTED = _Nested()
EACH = _Each()
DATA = _Data()


@dataclass(frozen=True)
class Field:
    """A field of a saved form: the attribute holding it, and how it is kept."""

    attribute: str
    keep: Keep


def declare(*bases: Mapping[str, Field], **declared: Keep | Field) -> Mapping[str, Field]:
    """A ``STATE`` declaration: the fields of ``bases``, then ``declared`` by their public names;
    ``name=KEEP`` keeps the attribute ``name``, ``name=KEEP.at("_attribute")`` a private one."""
    merged: dict[str, Field] = {}
    for base in bases:
        merged.update(base)
    for name, how in declared.items():
        if name.startswith("_"):
            raise ValueError(f"state field {name!r}: a saved name is public ({name[1:]}=KEEP.at({name!r}))")
        merged[name] = how if isinstance(how, Field) else Field(name, how)
    return MappingProxyType(merged)


def _unprivate(fields: dict[str, State]) -> dict[str, State]:
    """Version 0 of a :class:`Stateful`: its fields were saved under the names of their
    attributes, which version 1 made public by dropping the leading underscore (``_mode`` ->
    ``mode``)."""
    return {name.removeprefix("_"): value for name, value in fields.items()}


class Stateful(Versioned):
    """A saved form declared in ``STATE`` (public name -> :class:`Field`) under ``VERSION``,
    declared together: a class that declares ``STATE`` declares its ``VERSION``."""

    STATE: ClassVar[Mapping[str, Field]] = MappingProxyType({})
    MIGRATIONS: ClassVar[Mapping[int, Migration]] = MappingProxyType({0: _unprivate})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "STATE" in vars(cls) and "VERSION" not in vars(cls):
            raise TypeError(f"{cls.__name__} declares STATE without the VERSION of that saved form")

    def save_fields(self) -> dict[str, State]:
        return {name: field.keep.save(getattr(self, field.attribute)) for name, field in self.STATE.items()}

    def load_fields(self, saved: dict[str, State], where: str) -> None:
        found = fields(saved, self.STATE, where)
        self.adopt(
            {
                name: field.keep.load(getattr(self, field.attribute), found[name], f"{where}.{name}")
                for name, field in self.STATE.items()
            },
            where,
        )

    def adopt(self, saved: Mapping[str, Any], where: str) -> None:
        """The restore hook, called once every field of a saved form is read and checked
        (``saved``: by public name): each value becomes the attribute its field names. A class
        whose state is more than its fields (a cache of them, an invariant across them) extends
        it; ``where`` names this object in its errors."""
        for name, value in saved.items():
            setattr(self, self.STATE[name].attribute, value)
