"""The few facts the ``onnx`` model reads from a graph's protobuf bytes itself.

Workers use onnxruntime alone, which tells a session's inputs and outputs but not the
initializers it expects: those (name, dtype, shape) are read here, so that each is matched
with the file's tensor before onnxruntime is handed a view of it, and so that a missing one is
named instead of failing on the empty placeholder file. So are the graph inputs that index an
initializer directly (a ``Gather`` on an embedding table), whose ids can be checked against
its rows before the run. Only the top-level graph is read, with the fields of ``onnx.proto``
these need.

onnxruntime's shape inference reads the values of some inputs when it loads a graph (the axes
of Unsqueeze, the shape of Reshape): :func:`with_inline` writes such small integer
initializers back into the graph, since an external-data entry gives it no values to read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .base import ModelError

# onnx.proto field numbers.
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT = 1, 5, 11
NODE_INPUT, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 4, 5, 7
ATTRIBUTE_NAME, ATTRIBUTE_INT = 1, 3
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_NAME, TENSOR_RAW_DATA = 1, 2, 8, 9
TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION, EXTERNAL = 13, 14, 1
VALUE_INFO_NAME = 1
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5

# TensorProto.DataType to the numpy dtype of the file's tensor; others are refused.
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
          7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


@dataclass(frozen=True)
class Initializer:
    name: str
    data_type: int
    shape: tuple[int, ...]
    external: bool  # its data is elsewhere (the file's tensor), not in the graph


@dataclass(frozen=True)
class Graph:
    initializers: dict[str, Initializer]
    lookups: dict[str, tuple[str, int]]  # graph input -> (table it indexes, along that axis)


def read(data: bytes) -> Graph:
    """The initializers of the graph in ``data`` and its inputs that index them (see module)."""
    try:
        return _graph(_only(data, MODEL_GRAPH))
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise ModelError(f"onnx: the graph is not a readable ONNX model: {exc}") from None


def _graph(graph: bytes) -> Graph:
    fields = list(_fields(graph))
    initializers = {init.name: init for init in
                    (_initializer(v) for n, v in fields if n == GRAPH_INITIALIZER)}
    inputs = {_text(_only(v, VALUE_INFO_NAME)) for n, v in fields if n == GRAPH_INPUT}
    lookups = {}
    for node in (list(_fields(_message(v))) for n, v in fields if n == GRAPH_NODE):
        names = [_text(v) for n, v in node if n == NODE_INPUT]
        op = [_text(v) for n, v in node if n in (NODE_OP_TYPE, NODE_DOMAIN)]
        if op in (["Gather"], ["Gather", ""]) and len(names) == 2 and names[0] in initializers \
                and names[1] in inputs:
            rank = max(1, len(initializers[names[0]].shape))
            lookups[names[1]] = (names[0], _attribute(node, "axis") % rank)
    return Graph(initializers, lookups)


def _initializer(data: bytes | int) -> Initializer:
    name, data_type, dims, external = "", 1, [], False
    for number, value in _fields(_message(data)):
        if number == TENSOR_DATA_LOCATION:
            external = value == EXTERNAL
        elif number == TENSOR_NAME:
            name = _text(value)
        elif number == TENSOR_DATA_TYPE:
            data_type = _int(value)
        elif number == TENSOR_DIMS:
            dims.extend(_packed(value) if isinstance(value, bytes) else [_int(value)])
    return Initializer(name, data_type, tuple(dims), external)


def with_inline(data: bytes, values: dict[str, bytes]) -> bytes:
    """The model in ``data`` with the initializers named in ``values`` holding those bytes as
    their data instead of an external-data entry. Every other field is kept byte for byte."""
    def tensor(value: bytes) -> bytes:
        name = _text(_only(value, TENSOR_NAME))
        if name not in values:
            return value
        return _rebuilt(value, {TENSOR_EXTERNAL_DATA: None, TENSOR_DATA_LOCATION: None}) \
            + _field(TENSOR_RAW_DATA, values[name])

    return _rebuilt(data, {MODEL_GRAPH: lambda graph: _rebuilt(graph, {GRAPH_INITIALIZER: tensor})})


def _rebuilt(data: bytes, changes: dict[int, Callable[[bytes], bytes] | None]) -> bytes:
    """A message with the fields numbered in ``changes`` dropped (None) or rewritten."""
    out = []
    for number, value, raw in _spans(data):
        change = changes.get(number, _keep)
        if change is not None:
            out.append(raw if change is _keep else _field(number, change(_message(value))))
    return b"".join(out)


def _keep(value: bytes) -> bytes:
    return value


def _field(number: int, value: bytes) -> bytes:
    return _varint_bytes(number << 3 | LENGTH_DELIMITED) + _varint_bytes(len(value)) + value


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _attribute(fields: list[tuple[int, bytes | int]], wanted: str) -> int:
    """An int attribute of a node (0 when absent, as ``axis`` defaults)."""
    for number, value in fields:
        if number == NODE_ATTRIBUTE and isinstance(value, bytes):
            attribute = dict(_fields(value))
            if _text(attribute.get(ATTRIBUTE_NAME, b"")) == wanted:
                return _int(attribute.get(ATTRIBUTE_INT, 0))
    return 0


def _only(data: bytes | int, wanted: int) -> bytes:
    for number, value in _fields(_message(data)):
        if number == wanted and isinstance(value, bytes):
            return value
    raise ValueError(f"field {wanted} is missing")


def _message(value: bytes | int) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError("a message field is a varint")
    return value


def _fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """The (field number, value) pairs of one protobuf message: varints as ints, the rest as
    bytes."""
    return ((number, value) for number, value, _ in _spans(data))


def _spans(data: bytes) -> Iterator[tuple[int, bytes | int, bytes]]:
    """Each field of one message: its number, its value and its encoded bytes."""
    position = 0
    while position < len(data):
        start = position
        key, position = _varint(data, position)
        wire = key & 7
        if wire == VARINT:
            value, position = _varint(data, position)
            yield key >> 3, value, data[start:position]
            continue
        if wire == LENGTH_DELIMITED:
            length, position = _varint(data, position)
        elif wire in (FIXED64, FIXED32):
            length = 8 if wire == FIXED64 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if position + length > len(data):
            raise ValueError("a field runs past the end of its message")
        yield key >> 3, data[position:position + length], data[start:position + length]
        position += length


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]  # IndexError: truncated
        value |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise ValueError("a varint is longer than 10 bytes")


def _packed(data: bytes) -> list[int]:
    values, position = [], 0
    while position < len(data):
        value, position = _varint(data, position)
        values.append(_int(value))
    return values


def _int(value: bytes | int) -> int:
    """A varint as the signed int64 it encodes."""
    if not isinstance(value, int):
        raise ValueError("an integer field is not a varint")
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value: bytes | int) -> str:
    if not isinstance(value, bytes):
        raise ValueError("a string field is a varint")
    return value.decode()
