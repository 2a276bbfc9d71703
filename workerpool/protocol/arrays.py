"""Arrays on the wire: each array a raw frame of C-order little-endian bytes, described in the
header by its dtype (from a short allow-list), shape and name; a frame whose length is not
exactly what its descriptor gives is refused, and nothing is allocated before it is checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .terms import DTYPE_CODES, MAX_ARRAYS, MAX_EXTENT, MAX_RANK, ProtocolError

ALLOWED_DTYPES = {code: np.dtype(code) for code in DTYPE_CODES}

Inputs = np.ndarray | Mapping[str, np.ndarray] | Sequence[str]
Part = tuple[int, int]  # the rows or texts [start, stop) of a request that a message carries


def buffer_of(frame: Any) -> memoryview:
    """A received frame's bytes without a copy (a ``zmq.Frame``, or bytes)."""
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def pack_arrays(payload: Inputs | None) -> tuple[list[dict[str, Any]], list[Any]]:
    """Descriptors and C-contiguous little-endian buffers for a payload (no copy when possible)."""
    if payload is None:
        return [], []
    if is_text(payload):
        raise ProtocolError("texts are sent as a request of texts (encode_request), not as arrays")
    items = payload.items() if isinstance(payload, Mapping) else [(None, payload)]
    descriptors, buffers = [], []
    for name, value in items:
        array = np.asarray(value)
        if array.dtype.newbyteorder("<").str not in ALLOWED_DTYPES:
            raise ProtocolError(f"dtype {array.dtype} cannot be sent; use a numeric or bool dtype")
        # np.asarray, not np.ascontiguousarray: the latter turns shape () into shape (1,).
        array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
        if array.ndim > MAX_RANK or extent(array.shape, array.itemsize) > MAX_EXTENT:
            raise ProtocolError(
                f"shape {list(array.shape)} cannot be sent: at most {MAX_RANK} axes spanning at most "
                f"{MAX_EXTENT} bytes"
            )
        descriptor: dict[str, Any] = {"dtype": array.dtype.str, "shape": list(array.shape)}
        if name is not None:
            descriptor["name"] = str(name)
        descriptors.append(descriptor)
        buffers.append(array if array.nbytes else b"")
    return descriptors, buffers


def unpack_arrays(descriptors: Any, frames: Sequence[Any],
                  part: Part | None = None) -> tuple[list[np.ndarray], list[str | None]]:
    """Read-only array views of ``frames``, checked against their descriptors; with ``part``,
    the one frame holds only those rows of the array described."""
    if not isinstance(descriptors, list) or len(descriptors) > MAX_ARRAYS:
        raise ProtocolError(f"'arrays' must be a list of at most {MAX_ARRAYS} descriptors")
    if len(descriptors) != len(frames):
        raise ProtocolError(f"header describes {len(descriptors)} arrays but {len(frames)} frames follow")
    arrays, names = [], []
    for index, (descriptor, frame) in enumerate(zip(descriptors, frames)):
        dtype, shape, name = _check_descriptor(index, descriptor)
        if part is not None:
            shape = [part[1] - part[0], *shape[1:]]
        buffer = buffer_of(frame)
        expected = math.prod(shape) * dtype.itemsize
        if buffer.nbytes != expected:
            raise ProtocolError(
                f"array {index}: {dtype.str} {shape} needs {expected} bytes, frame has {buffer.nbytes}"
            )
        array = np.frombuffer(buffer, dtype=dtype, count=math.prod(shape)).reshape(shape)
        array.flags.writeable = False
        arrays.append(array)
        names.append(name)
    if len(names) > 1 and (None in names or len(set(names)) != len(names)):
        raise ProtocolError("arrays must be one unnamed array or named arrays with distinct names")
    return arrays, names


def _check_descriptor(index: int, descriptor: Any) -> tuple[np.dtype, list[int], str | None]:
    if not isinstance(descriptor, dict):
        raise ProtocolError(f"array {index}: descriptor is not an object")
    code = descriptor.get("dtype")
    dtype = ALLOWED_DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise ProtocolError(
            f"array {index}: dtype {descriptor.get('dtype')!r} is not one of {sorted(ALLOWED_DTYPES)}"
        )
    shape = descriptor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise ProtocolError(f"array {index}: shape must be a list of at most {MAX_RANK} sizes >= 0")
    if extent(shape, dtype.itemsize) > MAX_EXTENT:
        raise ProtocolError(
            f"array {index}: its shape spans more than {MAX_EXTENT} bytes "
            "(a zero-size axis counted as one)"
        )
    name = descriptor.get("name")
    if name is not None and not isinstance(name, str):
        raise ProtocolError(f"array {index}: name must be a string")
    return dtype, shape, name


def extent(shape: Sequence[int], itemsize: int) -> int:
    """Bytes that ``shape`` (sizes >= 0) spans with each zero-size axis counted as one: numpy
    refuses an empty array whose other axes multiply past its index range.

    Stops multiplying once past :data:`MAX_EXTENT`, so a hostile shape costs no big-integer work.
    """
    span = itemsize
    for size in shape:
        span *= size or 1
        if span > MAX_EXTENT:
            break
    return span


def is_text(payload: Any) -> bool:
    """Whether ``payload`` is texts: a list or tuple whose items are all strings."""
    return isinstance(payload, list | tuple) and all(isinstance(item, str) for item in payload)
