"""The Open Inference Protocol (KServe v2) over HTTP/REST: request and response bodies.

A body is JSON, or with the binary tensor data extension JSON of ``Inference-Header-Content-Length``
bytes followed by the tensors' raw bytes in the order of the inputs that give
``parameters.binary_data_size``. Sizes are checked against what the shape and datatype need
before anything is allocated; BYTES elements are a 4-byte little-endian length and the bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadRequest
from ..models.contract import TEXT
from ..protocol.messages import (
    MAX_ARRAYS,
    MAX_EXTENT,
    MAX_RANK,
    ProtocolError,
    encode_texts,
    extent,
    strict_json,
)
from .view import Answer, ModelView, Tensor

DATATYPES = {"BOOL": "|b1", "UINT8": "|u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
             "INT8": "|i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
             "FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}
BYTES = "BYTES"
NUMPY_TO_DATATYPE = {code: name for name, code in DATATYPES.items()}
ELEMENT_LENGTH = struct.Struct("<I")
EXTENSIONS = ["binary_tensor_data", "parameters"]
MAX_TIMEOUT_US = 10**15  # about 31 years: beyond it a timeout is no timeout, and a float loses it


@dataclass
class InferRequest:
    """A decoded request: named arrays (or texts), the outputs asked for, the id to echo."""

    id: Any
    inputs: dict[str, np.ndarray] | list[str]
    outputs: dict[str, bool] = field(default_factory=dict)  # name: as binary data; empty: all
    binary_output: bool = False  # the request's binary_data_output
    timeout: float | None = None  # seconds, from parameters.timeout (microseconds)


def datatype_of(tensor: Tensor) -> str | None:
    if tensor.dtype == TEXT:
        return BYTES
    return NUMPY_TO_DATATYPE.get(tensor.dtype or "")


def model_metadata(view: ModelView) -> dict[str, Any]:
    def described(tensor: Tensor) -> dict[str, Any]:
        return {"name": tensor.name, "datatype": datatype_of(tensor) or "", "shape": _dims(tensor)}

    facts = view.text_facts()
    return {"name": view.name, "versions": [str(view.version)], "platform": f"workerpool_{view.kind}",
            "inputs": [described(t) for t in view.inputs], "outputs": [described(t) for t in view.outputs],
            **({"parameters": facts} if facts else {})}


def model_config(view: ModelView) -> dict[str, Any]:
    """Triton's model configuration (``GET /v2/models/NAME/config``, what ``tritonclient``'s
    ``get_model_config`` reads): inputs and outputs with Triton's type names and full shapes
    (``max_batch_size`` 0: the batch axis, -1, is among the dims)."""
    def described(tensor: Tensor) -> dict[str, Any]:
        datatype = datatype_of(tensor)
        return {"name": tensor.name, "data_type": f"TYPE_{'STRING' if datatype == 'BYTES' else datatype}"
                if datatype else "TYPE_INVALID", "dims": _dims(tensor)}

    return {"name": view.name, "platform": "", "backend": f"workerpool_{view.kind}",
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
            "input": [described(t) for t in view.inputs], "output": [described(t) for t in view.outputs]}


def _dims(tensor: Tensor) -> list[int]:
    """A tensor's shape as KServe and Triton write it: -1 for an axis of any size."""
    return [-1 if size is None else size for size in tensor.shape] if tensor.shape else [-1]


def decode_infer(body: bytes | memoryview, header_length: int | None, view: ModelView) -> InferRequest:
    """The request in ``body``; ``BadRequest`` says what is wrong with it."""
    if header_length is None:
        header_length = len(body)
    elif header_length > len(body):
        raise BadRequest(f"Inference-Header-Content-Length {header_length} is past the body's "
                         f"{len(body)} bytes")
    document = json_object(body[:header_length])
    binary = memoryview(body)[header_length:]
    entries = document.get("inputs")
    if not isinstance(entries, list) or not entries or len(entries) > MAX_ARRAYS:
        raise BadRequest(f"'inputs' must be a list of 1 to {MAX_ARRAYS} tensors")
    parameters = _object(document.get("parameters", {}), "parameters")
    inputs: dict[str, np.ndarray | list[str]] = {}
    offset = 0
    for entry in entries:
        name, value, used = _tensor(_object(entry, "an input"), binary[offset:], view)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = value
        offset += used
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data follow the last input's")
    return InferRequest(document.get("id"), _texts_or_arrays(inputs, view), _outputs(document, view),
                        _flag(parameters, "binary_data_output"), _timeout(parameters))


def _texts_or_arrays(inputs: dict[str, np.ndarray | list[str]], view: ModelView) -> dict[str, np.ndarray] | list[str]:
    texts = [value for value in inputs.values() if isinstance(value, list)]
    if not texts:
        return inputs  # type: ignore[return-value]  # no input was texts
    if len(inputs) > 1:
        raise BadRequest("a request gives texts or arrays, not both")
    try:
        encode_texts(texts[0])  # 1 to MAX_TEXTS of them, each valid Unicode
    except ProtocolError as exc:
        raise BadRequest(str(exc)) from None
    return texts[0]


def _tensor(entry: dict[str, Any], binary: memoryview, view: ModelView) -> tuple[str, Any, int]:
    """One input: its name, its array or texts, and the binary bytes it took."""
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    if not isinstance(name, str):
        raise BadRequest("every input needs a 'name'")
    declared = view.input(name)
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of at most {MAX_RANK} sizes >= 0")
    if extent(shape, 1) > MAX_EXTENT:  # before any product: a hostile shape overflows int64
        raise BadRequest(f"input {name!r}: shape {shape} spans more than {MAX_EXTENT} elements")
    count = math.prod(shape)
    size = _object(entry.get("parameters", {}), f"input {name!r}'s parameters").get("binary_data_size")
    if size is not None and (type(size) is not int or not 0 <= size <= len(binary)):
        raise BadRequest(f"input {name!r}: binary_data_size {size!r} is not a size within the "
                         f"{len(binary)} bytes of binary data left")
    if datatype == BYTES:
        if declared.dtype != TEXT:
            raise BadRequest(f"input {name!r} takes {datatype_of(declared)}, not BYTES")
        if len(shape) != 1 and not (len(shape) == 2 and shape[1] == 1):
            raise BadRequest(f"input {name!r}: texts are a BYTES tensor of shape [N] or [N, 1] (as Triton's "
                             f"text models take them), not {shape}")
        return name, _texts(name, entry, binary[:size] if size is not None else None, count), size or 0
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise BadRequest(f"input {name!r}: datatype {datatype!r} is not one of "
                         f"{', '.join([*DATATYPES, BYTES])}")
    accepted = {declared.dtype, *declared.also_accepted} - {None}
    if accepted and dtype not in accepted:
        names = {BYTES if d == TEXT else NUMPY_TO_DATATYPE.get(str(d)) for d in accepted}
        wanted = " or ".join(sorted(filter(None, names)))  # texts are BYTES
        raise BadRequest(f"input {name!r} takes {wanted}, not {datatype}")
    if size is not None:
        needed = count * np.dtype(dtype).itemsize
        if size != needed:
            raise BadRequest(f"input {name!r}: {datatype} {shape} needs {needed} bytes, "
                             f"binary_data_size is {size}")
        return name, np.frombuffer(binary[:size], dtype=dtype).reshape(shape), size
    return name, _json_array(name, entry.get("data"), dtype, shape, count), 0


def _json_array(name: str, data: Any, dtype: str, shape: list[int], count: int) -> np.ndarray:
    """The array JSON ``data`` spell, as ``dtype``: numbers for a number type, booleans for
    BOOL, each within the type's range (numpy would read strings, and wrap or round what does
    not fit)."""
    if not isinstance(data, list):
        raise BadRequest(f"input {name!r} needs 'data' (or binary_data_size)")
    datatype = NUMPY_TO_DATATYPE[dtype]
    try:
        given = np.array(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input {name!r}: its data are not {datatype}: {exc}") from None
    if given.dtype.kind == "O" and any(item is None for item in given.ravel()):
        raise BadRequest(f"input {name!r}: its data hold null, which is no {datatype}")
    wanted = "b" if np.dtype(dtype).kind == "b" else "iuf"
    if given.size and given.dtype.kind not in wanted:
        what = "booleans" if wanted == "b" else "numbers"
        raise BadRequest(f"input {name!r}: its data must be {what} for {datatype}, not {given.dtype.kind!r} values")
    with np.errstate(over="ignore", invalid="ignore"):  # what does not fit is refused below
        array = given.astype(dtype)
    if array.size != count:
        raise BadRequest(f"input {name!r}: shape {shape} holds {count} elements, 'data' has {array.size}")
    if given.size and wanted != "b" and not _fits(given, array):
        raise BadRequest(f"input {name!r}: its data hold values {datatype} cannot hold")
    return array.reshape(shape)


def _fits(given: np.ndarray, array: np.ndarray) -> bool:
    """Whether ``array`` holds what ``given`` spelled: no value rounded to another integer,
    wrapped, or grown to infinity."""
    if array.dtype.kind == "f":
        return not (np.isinf(array) & np.isfinite(given)).any()
    with np.errstate(invalid="ignore"):
        return bool(np.array_equal(array.astype(given.dtype), given))


def _texts(name: str, entry: dict[str, Any], binary: memoryview | None, count: int) -> list[str]:
    if binary is None:
        data = entry.get("data")
        if isinstance(data, list) and all(isinstance(row, list) and len(row) == 1 for row in data):
            data = [row[0] for row in data]  # [N, 1] written nested
        if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
            raise BadRequest(f"input {name!r}: BYTES 'data' must be a list of strings")
        texts = data
    else:
        texts, offset = [], 0
        while offset < len(binary):
            if offset + ELEMENT_LENGTH.size > len(binary):
                raise BadRequest(f"input {name!r}: a BYTES element's length is cut off")
            length, = ELEMENT_LENGTH.unpack_from(binary, offset)
            offset += ELEMENT_LENGTH.size
            if offset + length > len(binary):
                raise BadRequest(f"input {name!r}: a BYTES element of {length} bytes is cut off")
            try:
                texts.append(str(binary[offset:offset + length], "utf-8"))
            except UnicodeDecodeError:
                raise BadRequest(f"input {name!r}: a BYTES element is not UTF-8 text") from None
            offset += length
    if len(texts) != count:
        raise BadRequest(f"input {name!r}: shape holds {count} elements, {len(texts)} were given")
    return texts


def _outputs(document: Mapping[str, Any], view: ModelView) -> dict[str, bool]:
    entries = document.get("outputs", [])
    if not isinstance(entries, list):
        raise BadRequest("'outputs' must be a list")
    known = {tensor.name for tensor in view.outputs}
    asked = {}
    for entry in entries:
        name = _object(entry, "an output").get("name")
        if not isinstance(name, str) or (known and name not in known):
            raise BadRequest(f"model {view.name!r} has no output {name!r}; its outputs are "
                             f"{', '.join(repr(n) for n in sorted(known))}")
        asked[name] = _flag(_object(entry.get("parameters", {}), "an output's parameters"), "binary_data")
    return asked


def encode_infer(request: InferRequest, view: ModelView, answer: Answer) -> tuple[bytes, int | None]:
    """The response body, and the JSON part's length when binary data follow it."""
    asked = request.outputs or dict.fromkeys(answer.outputs, request.binary_output)
    unknown = sorted(set(asked) - set(answer.outputs))
    if unknown:
        raise BadRequest(f"the model gave no output {unknown[0]!r} for this request")
    outputs, chunks = [], []
    for name, binary in asked.items():
        array = answer.outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": NUMPY_TO_DATATYPE[array.dtype.str],
                                 "shape": list(array.shape)}
        if binary or request.binary_output:
            data = np.ascontiguousarray(array).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = array.ravel().tolist()
        outputs.append(entry)
    document: dict[str, Any] = {"model_name": view.name, "model_version": str(answer.version or view.version),
                                "outputs": outputs}
    if request.id is not None:
        document["id"] = request.id
    if answer.worker_pid is not None:
        document["parameters"] = {"worker_pid": answer.worker_pid}
    try:
        head = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        raise BadRequest("an output holds NaN or infinity, which JSON cannot carry: ask for it as "
                         "binary data (parameters.binary_data)") from None
    return (head + b"".join(chunks), len(head)) if chunks else (head, None)


def json_object(data: bytes | memoryview, what: str = "the request") -> dict[str, Any]:
    """A request body's JSON object (standard JSON: no NaN, Infinity or out-of-range numbers)."""
    try:
        document = strict_json(bytes(data))
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the request is not valid JSON: {exc}") from None
    return _object(document, what)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


def _flag(parameters: Mapping[str, Any], key: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"parameter {key!r} must be true or false")
    return value


def _timeout(parameters: Mapping[str, Any]) -> float | None:
    value = parameters.get("timeout")
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_TIMEOUT_US:
        raise BadRequest(f"parameter 'timeout' must be a whole number of microseconds from 0 to {MAX_TIMEOUT_US}")
    return value / 1e6
