"""Write Burnpack files exactly as Burn's ``Writer`` does, atomically and one tensor at a time."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cbor2
import numpy as np

from ..atomic import replace_atomically
from . import dtypes
from .layout import (
    FORMAT_VERSION,
    HEADER,
    I64_MAX,
    I64_MIN,
    MAGIC,
    U32_MAX,
    U64_MAX,
    BurnpackError,
    align_up,
    aligned_data_start,
)


@dataclass(frozen=True)
class Deferred:
    """A tensor whose bytes are produced only when the writer reaches it.

    ``dtype`` is a numpy dtype or a :class:`~workerpool.burnpack.dtypes.DType` (for BF16,
    Flex32 or QFloat, whose arrays are ``uint16``, ``float32`` and ``uint8`` bytes). ``nbytes``
    is needed only for QFloat. ``load`` returns the array; it is called once, so a model
    larger than memory can be written one tensor at a time.
    """

    dtype: Any
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    nbytes: int | None = None


TensorSource = np.ndarray | Deferred


@dataclass(frozen=True)
class _Planned:
    name: str
    dtype: dtypes.DType
    shape: tuple[int, ...]
    nbytes: int
    start: int
    source: TensorSource


def write(
    path: str | os.PathLike,
    tensors: Mapping[str, TensorSource] | Iterable[tuple[str, TensorSource]],
    *,
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, int | float | bool] | None = None,
    param_ids: Mapping[str, int] | None = None,
) -> None:
    """Write tensors to ``path`` in Burn's aligned layout, in the order given.

    The file appears under ``path`` only once complete: it is written to a temporary file in
    the same directory, synced, and renamed over ``path``. On any failure the previous file is
    untouched and the temporary file removed.
    """
    path = os.fspath(path)
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    plan = _plan(path, items)
    blob = _encode_metadata(path, plan, metadata or {}, scalars or {}, param_ids or {})
    try:
        with replace_atomically(path) as f:
            f.write(HEADER.pack(MAGIC, FORMAT_VERSION, len(blob)))
            f.write(blob)
            data_start = aligned_data_start(len(blob))
            _pad_to(f, data_start)
            for entry in plan:
                _pad_to(f, data_start + entry.start)
                f.write(_payload(path, entry))
    except OSError as exc:
        raise BurnpackError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def _plan(path: str, items: list[tuple[str, TensorSource]]) -> list[_Planned]:
    plan: list[_Planned] = []
    seen: set[str] = set()
    offset = 0
    for name, source in items:
        if not isinstance(name, str):
            raise BurnpackError(f"{path}: tensor name {name!r} is not a string")
        if name in seen:
            raise BurnpackError(f"{path}: tensor name {name!r} appears twice")
        seen.add(name)
        dtype, shape, nbytes = _describe(path, name, source)
        start = align_up(offset)
        plan.append(_Planned(name, dtype, shape, nbytes, start, source))
        offset = start + nbytes
    return plan


def _describe(path: str, name: str, source: Any) -> tuple[dtypes.DType, tuple[int, ...], int]:
    if isinstance(source, Deferred):
        dtype = source.dtype if isinstance(source.dtype, dtypes.DType) else dtypes.from_numpy(source.dtype)
        shape = tuple(int(d) for d in source.shape)
        if dtype.itemsize is None:
            if source.nbytes is None:
                raise BurnpackError(f"{path}: tensor {name!r}: QFloat needs its byte length")
            return dtype, shape, source.nbytes
        nbytes = math.prod(shape) * dtype.itemsize
        if source.nbytes is not None and source.nbytes != nbytes:
            raise BurnpackError(
                f"{path}: tensor {name!r}: declared {source.nbytes} bytes, shape needs {nbytes}"
            )
        return dtype, shape, nbytes
    if isinstance(source, np.ndarray):
        return dtypes.from_numpy(source.dtype), source.shape, source.nbytes
    raise BurnpackError(f"{path}: tensor {name!r} is a {type(source).__name__}, not an array")


def _payload(path: str, entry: _Planned) -> memoryview:
    source = entry.source
    array = source.load() if isinstance(source, Deferred) else source
    if not isinstance(array, np.ndarray):
        raise BurnpackError(f"{path}: tensor {entry.name!r}: loader returned a {type(array).__name__}")
    if array.dtype.newbyteorder("<") != entry.dtype.numpy:
        raise BurnpackError(
            f"{path}: tensor {entry.name!r}: got a {array.dtype} array, declared {entry.dtype.name} "
            f"({entry.dtype.numpy})"
        )
    # np.asarray, not np.ascontiguousarray: the latter turns a scalar of shape () into shape (1,).
    array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    if array.nbytes != entry.nbytes or (entry.dtype.itemsize is not None and array.shape != entry.shape):
        raise BurnpackError(
            f"{path}: tensor {entry.name!r}: got {array.nbytes} bytes of shape {list(array.shape)}, "
            f"declared {entry.nbytes} bytes of shape {list(entry.shape)}"
        )
    # Flatten first: memoryview.cast refuses shapes with a zero dimension such as (3, 0).
    # ``.data`` is memoryview(array), typed as one: numpy declares the buffer protocol for 3.12+.
    return array.reshape(-1).view(np.uint8).data


def _encode_metadata(
    path: str,
    plan: list[_Planned],
    metadata: Mapping[str, str],
    scalars: Mapping[str, int | float | bool],
    param_ids: Mapping[str, int],
) -> bytes:
    # Burn's serde structs keep field order, and its BTreeMaps sort keys: mirror both.
    descriptors = {}
    for entry in sorted(plan, key=lambda e: e.name):
        descriptor: dict[str, Any] = {
            "dtype": entry.dtype.to_cbor(),
            "shape": list(entry.shape),
            "data_offsets": [entry.start, entry.start + entry.nbytes],
        }
        if entry.name in param_ids:
            param_id = param_ids[entry.name]
            if not (
                isinstance(param_id, int) and not isinstance(param_id, bool) and 0 <= param_id <= U64_MAX
            ):
                raise BurnpackError(f"{path}: tensor {entry.name!r}: param_id is not a u64")
            descriptor["param_id"] = param_id
        descriptors[entry.name] = descriptor
    document: dict[str, Any] = {"tensors": descriptors}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise BurnpackError(f"{path}: metadata keys and values must be strings")
        document["metadata"] = dict(sorted(metadata.items()))
    if scalars:
        if not all(isinstance(k, str) for k in scalars):
            raise BurnpackError(f"{path}: scalar names must be strings")
        document["scalars"] = {name: _scalar(path, name, value) for name, value in sorted(scalars.items())}
    blob = cbor2.dumps(document, encoders={float: _encode_float})
    if len(blob) > U32_MAX:
        raise BurnpackError(f"{path}: metadata of {len(blob)} bytes does not fit the header")
    return blob


def _scalar(path: str, name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, (bool, np.bool_)):
        return {"Bool": bool(value)}
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if I64_MIN <= value <= I64_MAX:
            return {"Int": value}
        if 0 <= value <= U64_MAX:
            return {"UInt": value}
    elif isinstance(value, (float, np.floating)):
        return {"Float": float(value)}
    raise BurnpackError(f"{path}: scalar {name!r} = {value!r} is not a bool, 64-bit int or float")


def _encode_float(encoder: cbor2.CBOREncoder, value: float) -> None:
    # ciborium writes the shortest width whose round trip gives back the same f64 bits, NaNs
    # included: -NaN (what x86 arithmetic produces) is f9 fe 00. cbor2's canonical mode writes
    # every NaN as f9 7e 00, so compare bits here instead.
    bits = struct.pack(">d", value)
    widths: tuple[tuple[bytes, str], ...] = ((b"\xf9", ">e"), (b"\xfa", ">f"))
    if math.isnan(value):
        # struct drops a NaN's payload in f16; the `half` crate keeps its sign and top 10 bits.
        raw = int.from_bytes(bits, "big")
        if raw & 1 << 51 and not raw & (1 << 42) - 1:
            half = (raw >> 48 & 0x8000) | 0x7C00 | (raw >> 42 & 0x3FF)
            encoder.write(b"\xf9" + half.to_bytes(2, "big"))
            return
        widths = widths[1:]
    for head, fmt in widths:
        try:
            packed = struct.pack(fmt, value)
        except OverflowError:
            continue
        if struct.pack(">d", struct.unpack(fmt, packed)[0]) == bits:
            encoder.write(head + packed)
            return
    encoder.write(b"\xfb" + bits)


def _pad_to(f: Any, position: int) -> None:
    gap = position - f.tell()
    if gap:
        f.write(bytes(gap))
