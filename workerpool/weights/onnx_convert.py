"""An ONNX model as Burnpack tensors, for ``convert``: its initializers and its graph without them.

The layout is :mod:`workerpool.models.onnx_layout`'s. What it costs: the weights stored inside
the ``.onnx`` file are parsed with the graph (protobuf has no other way), so they are held once
for the whole conversion, twice for the moment the file's bytes are parsed (a protobuf file is
at most 2 GiB) and a tensor twice while it is written; weights stored as external data are
read from their file one tensor at a time, when the writer reaches them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper

from .. import burnpack
from ..burnpack import dtypes
from ..errors import exception_text
from ..models import onnx_layout
from .sources import ConvertError, Tensors, read_values

# ONNX element types and the Burn dtype each is stored as; any other is refused by name.
ONNX_DTYPES = {
    TensorProto.FLOAT: "F32", TensorProto.FLOAT16: "F16", TensorProto.DOUBLE: "F64",
    TensorProto.BFLOAT16: "BF16", TensorProto.INT64: "I64", TensorProto.INT32: "I32",
    TensorProto.INT16: "I16", TensorProto.INT8: "I8", TensorProto.UINT64: "U64",
    TensorProto.UINT32: "U32", TensorProto.UINT16: "U16", TensorProto.UINT8: "U8",
    TensorProto.BOOL: "Bool(Native)",
}
# Integer initializers small enough keep their data in the graph too (see onnx_layout).
INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                           TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})


def onnx_tensors(path: str) -> tuple[Tensors, dict[str, str]]:
    """The graph of the model at ``path`` without its weights, as the ``uint8`` tensor
    ``GRAPH_TENSOR``, then each initializer under its name, read only when written; and the
    metadata the graph implies."""
    model = _parse(path)
    graph = model.graph
    if not graph.initializer and not graph.node:
        raise ConvertError(f"{path}: the ONNX graph has no initializers and no nodes")
    if graph.sparse_initializer:
        raise ConvertError(f"{path}: sparse initializers ({graph.sparse_initializer[0].name}) are "
                           "not supported")
    initializers = list(graph.initializer)  # still readable once the graph lets go of them below
    tensors = [(tensor.name, _initializer(path, tensor)) for tensor in initializers]
    graph.ClearField("initializer")
    for original, (_, tensor) in zip(initializers, tensors):
        if original.data_type in INTEGER_TYPES and (tensor.nbytes or 0) <= onnx_layout.INLINE_BYTES:
            graph.initializer.append(numpy_helper.from_array(tensor.load(), original.name))
        else:
            _add_placeholder(graph, original, tensor)
    encoded = np.frombuffer(model.SerializeToString(), dtype=np.uint8)
    graph_tensor = burnpack.Deferred(dtypes.BY_NAME["U8"], encoded.shape, lambda: encoded)
    declared = {name: [np.dtype(getattr(tensor.dtype, "numpy", tensor.dtype)).str, list(tensor.shape)]
                for name, tensor in tensors}
    metadata = {**_lookups(graph), onnx_layout.INITIALIZERS_KEY: json.dumps(declared)}
    return [(onnx_layout.GRAPH_TENSOR, graph_tensor), *tensors], metadata


def _lookups(graph: Any) -> dict[str, str]:
    """The metadata naming the graph inputs that index an initializer directly (a ``Gather``
    on it), with that table and axis: what a worker checks token ids against."""
    inputs = {value.name for value in graph.input}
    tables = {tensor.name for tensor in graph.initializer}
    lookups = {}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in tables \
                and node.input[1] in inputs:
            axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
            lookups[node.input[1]] = [node.input[0], axis]
    return {onnx_layout.LOOKUPS_KEY: json.dumps(lookups)} if lookups else {}


def _parse(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConvertError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as exc:
        raise ConvertError(f"{path}: not an ONNX model: {exception_text(exc)}") from exc
    return model


def _add_placeholder(graph: Any, original: Any, tensor: burnpack.Deferred) -> None:
    """``original`` again, its data an external-data entry naming the placeholder file."""
    entry = graph.initializer.add(name=original.name, data_type=original.data_type,
                                  dims=original.dims, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", onnx_layout.PLACEHOLDER), ("offset", "0"),
                       ("length", str(tensor.nbytes))):
        entry.external_data.add(key=key, value=value)


def _initializer(path: str, tensor: Any) -> burnpack.Deferred:
    where = f"{path}: initializer {tensor.name}"
    if tensor.name == onnx_layout.GRAPH_TENSOR:
        raise ConvertError(f"{where}: the name is the one workerpool keeps for the graph")
    burn = ONNX_DTYPES.get(tensor.data_type)
    if burn is None:
        known = tensor.data_type in TensorProto.DataType.values()
        kind = TensorProto.DataType.Name(tensor.data_type) if known else f"number {tensor.data_type}"
        raise ConvertError(f"{where} has ONNX type {kind}, which Burnpack cannot store (supported: "
                           f"{', '.join(TensorProto.DataType.Name(t) for t in ONNX_DTYPES)})")
    dtype, shape = dtypes.BY_NAME[burn], tuple(tensor.dims)
    if any(size < 0 for size in shape):
        raise ConvertError(f"{where}: negative dimension in shape {list(shape)}")
    nbytes = math.prod(shape) * dtype.numpy.itemsize
    if tensor.data_location == TensorProto.EXTERNAL:
        load = _external(path, where, tensor, dtype, shape, nbytes)
    else:
        load = _embedded(where, tensor, dtype)
    return burnpack.Deferred(dtype, shape, load, nbytes)


def _embedded(where: str, tensor: Any, dtype: dtypes.DType) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        try:
            array = numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as exc:
            raise ConvertError(f"{where}: cannot read its data: {exception_text(exc)}") from exc
        return array.view(dtype.numpy)  # the same bytes: bfloat16 as the uint16 Burnpack holds
    return load


def _external(path: str, where: str, tensor: Any, dtype: dtypes.DType, shape: tuple[int, ...],
              nbytes: int) -> Callable[[], np.ndarray]:
    """Where the tensor's bytes are, checked now (the file beside the model, long enough);
    read when the writer calls."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    if not location or os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise ConvertError(f"{where}: external data location {location!r} is not a file beside "
                           "the model")
    try:
        offset, length = int(entries.get("offset", "0")), int(entries.get("length", nbytes))
    except ValueError:
        raise ConvertError(f"{where}: external data offset or length is not a number") from None
    if offset < 0 or length != nbytes:
        raise ConvertError(f"{where}: external data of {length} bytes, its shape {list(shape)} "
                           f"needs {nbytes}")
    file = os.path.join(os.path.dirname(path), location)
    try:
        size = os.path.getsize(file)
    except OSError as exc:
        raise ConvertError(f"{where}: external data file {file}: {exc.strerror or exc}") from exc
    if size < offset + nbytes:
        raise ConvertError(f"{where}: external data file {file} holds {size} bytes, the tensor "
                           f"ends at byte {offset + nbytes}")

    return lambda: read_values(file, offset, dtype.numpy, shape, where)
