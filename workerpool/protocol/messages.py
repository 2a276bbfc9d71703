"""The wire protocol (docs/protocol.md): a request is a route frame (route.py), a JSON
header and one raw frame per array; a reply is a JSON header and its arrays.

Nothing here unpickles or evaluates what arrives: headers are JSON, arrays are raw bytes whose
dtype comes from a short allow-list and whose length must match the declared shape exactly.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..units import MS_PER_SECOND
from .route import read_route, route_for, same_routing

# The terms are read from here by the rest of the code, as ``protocol.VERSION`` and the like.
from .terms import (
    DTYPE_CODES,
    MAX_ARRAYS,
    MAX_EXTENT,
    MAX_HEADER_BYTES,
    MAX_NESTING,
    MAX_RANK,
    MAX_TEXTS,
    METHOD_INFER,
    METHOD_INFO,  # noqa: F401
    METHODS,
    MIN_MESSAGE_SIZE,  # noqa: F401
    VERSION,
    ProtocolError,
)

ROUTING_ID_BYTES = 5  # the id a ROUTER gives a peer that sets none

# Router <-> worker commands: the first frame of every backend message.
READY = b"READY"
HEARTBEAT = b"HB"
REQUEST = b"REQ"
BATCH = b"BATCH"  # router: stride, then several requests (client, route, header, arrays) for one pass
REPLY = b"REP"
STOP = b"STOP"
RELOAD = b"RELOAD"
RELOADED = b"RELOADED"
BYE = b"BYE"  # worker: I am leaving; answered with STOP once nothing is in flight
WHO = b"WHO"  # router: I do not know you (it restarted); answered with READY
REFUSE = b"REFUSE"  # router: your model does not fit mine; the worker exits

ALLOWED_DTYPES = {code: np.dtype(code) for code in DTYPE_CODES}

Inputs = np.ndarray | Mapping[str, np.ndarray] | Sequence[str]


@dataclass
class Message:
    """A decoded request or reply: its JSON header and its arrays (names may be None)."""

    header: dict[str, Any]
    arrays: list[np.ndarray] = field(default_factory=list)
    names: list[str | None] = field(default_factory=list)
    body: Any = None  # an HTTP request's body, as its front door received it (``"http"`` in the header)

    @property
    def id(self) -> Any:
        return self.header.get("id")

    def payload(self) -> np.ndarray | dict[str, np.ndarray] | list[str] | None:
        """Texts as a list, one unnamed array as itself, named arrays as a dict, nothing as None."""
        if "text" in self.header:
            return list(self.header["text"])
        if not self.arrays:
            return None
        if len(self.arrays) == 1 and self.names[0] is None:
            return self.arrays[0]
        # Past the lone unnamed array every name is a str: ``unpack_arrays`` refuses other mixes.
        return dict(zip(cast(list[str], self.names), self.arrays))


def encode_header(header: Mapping[str, Any]) -> bytes:
    return _COMPACT.encode(header).encode()


def decode_header(frame: Any) -> dict[str, Any]:
    """Parse a JSON header frame; refuse anything but a bounded JSON object."""
    data = bytes(frame.buffer) if hasattr(frame, "buffer") else bytes(frame)
    if len(data) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {len(data)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = strict_json(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    # The id is the one value echoed back, and it must stay encodable (Python's JSON recurses).
    if _nesting(header.get("id")) >= MAX_NESTING:  # the header object is the first level
        raise ProtocolError(f"the request id nests deeper than {MAX_NESTING} levels")
    return header


def strict_json(data: bytes | str) -> Any:
    """JSON as the standard has it: no ``NaN`` or ``Infinity``, no number beyond a float's
    range (Python's own parser takes all three). ValueError or RecursionError otherwise."""
    # One decoder for every call: json.loads with hooks builds a new one each time, which costs
    # more than decoding a request's header. Bytes are read as json.loads reads them (UTF-8,
    # with or without a BOM, or UTF-16 or 32).
    if isinstance(data, bytes | bytearray):
        data = bytes(data).decode(json.detect_encoding(data), "surrogatepass")
    return _STRICT.decode(data)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python accepts NaN and Infinity; JSON does not


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


_STRICT = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # json.dumps would build one a call


def _nesting(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((item, depth + 1) for item in value)
    return deepest


def pack_arrays(payload: Inputs | None) -> tuple[list[dict[str, Any]], list[Any]]:
    """Descriptors and C-contiguous little-endian buffers for a payload (no copy when possible)."""
    if payload is None:
        return [], []
    if is_text(payload):
        raise ProtocolError("texts are sent in the request header (encode_request), not as arrays")
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


def payload_bytes(payload: Inputs | None) -> int:
    """The most bytes a request for ``payload`` can take: its arrays', and the route frame and
    header at their limits (texts travel in the header)."""
    if payload is None or is_text(payload):
        arrays: list[Any] = []
    else:
        arrays = list(payload.values()) if isinstance(payload, Mapping) else [payload]
    return sum(np.asarray(array).nbytes for array in arrays) + 2 * MAX_HEADER_BYTES


def request_bytes(frames: Sequence[Any]) -> int:
    """The bytes of a request's frames, as the server counts them against its limit; its
    routing id (5 bytes, as libzmq makes them) included."""
    return ROUTING_ID_BYTES + sum(memoryview(frame).nbytes for frame in frames)


def unpack_arrays(descriptors: Any, frames: Sequence[Any]) -> tuple[list[np.ndarray], list[str | None]]:
    """Read-only array views of ``frames``, checked against their descriptors."""
    if not isinstance(descriptors, list) or len(descriptors) > MAX_ARRAYS:
        raise ProtocolError(f"'arrays' must be a list of at most {MAX_ARRAYS} descriptors")
    if len(descriptors) != len(frames):
        raise ProtocolError(f"header describes {len(descriptors)} arrays but {len(frames)} frames follow")
    arrays, names = [], []
    for index, (descriptor, frame) in enumerate(zip(descriptors, frames)):
        dtype, shape, name = _check_descriptor(index, descriptor)
        buffer = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
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


def encode_request(
    request_id: Any, payload: Inputs | None, *, method: str = METHOD_INFER, deadline_ms: float | None = None
) -> list[Any]:
    """The frames a client sends: the empty delimiter a DEALER needs for REQ peers, the route
    frame, the header, the arrays. A list of strings is sent as texts (``"text"`` in the header)."""
    text = is_text(payload)
    descriptors, buffers = pack_arrays(None if text else payload)
    header: dict[str, Any] = {"v": VERSION, "id": request_id, "method": method, "arrays": descriptors}
    if text:
        header["text"] = checked_text(list(cast(Sequence[str], payload)))
    if deadline_ms is not None:
        header["deadline_ms"] = deadline_ms
    encoded = encode_header(header)
    if len(encoded) > MAX_HEADER_BYTES:  # the server could not even read its id to answer it
        what = "texts travel in it: send fewer or shorter" if text else \
            "each array's name, dtype and shape travel in it: send fewer arrays"
        raise ProtocolError(f"the request header would be {len(encoded)} bytes, over the "
                            f"{MAX_HEADER_BYTES}-byte limit ({what})")
    return [b"", route_for(header), encoded, *buffers]


def decode_request(frames: Sequence[Any]) -> Message:
    """Validate a request (route frame, header frame, then array frames) as a worker receives
    it: the route frame must be the one its header gives."""
    if len(frames) < 2:
        raise ProtocolError("a request is a route frame, a header frame, then array frames")
    header = decode_header(frames[1])
    request_id = header.get("id")
    if header.get("v") != VERSION:
        raise ProtocolError(
            f"unsupported protocol version {header.get('v')!r} (this server speaks {VERSION})", request_id
        )
    if header.get("method") not in METHODS:
        raise ProtocolError(
            f"unknown method {header.get('method')!r}; methods are {', '.join(METHODS)}", request_id
        )
    try:
        route = read_route(frames[0])
        deadline_of(header)
        if "http" in header:
            message = _http_request(header, frames[2:])
        else:
            arrays, names = unpack_arrays(header.get("arrays", []), frames[2:])
            if "text" in header:
                checked_text(header["text"])
                if arrays:
                    raise ProtocolError("a request carries texts or arrays, not both")
            message = Message(header, arrays, names)
        if not same_routing(route_for(header), route.frame):
            raise ProtocolError("the route frame does not repeat what the header says (method, "
                                "texts, or the one array's dtype, shape and name)")
    except ProtocolError as exc:
        raise ProtocolError(str(exc), request_id) from None
    return message


def _http_request(header: dict[str, Any], bodies: Sequence[Any]) -> Message:
    """A request the HTTP front door passed on: its header says how to read the one body frame
    (``workerpool.codecs.http_call``), which the worker decodes."""
    if not isinstance(header["http"], dict) or len(bodies) != 1 or header.get("arrays", []) != [] \
            or "text" in header:
        raise ProtocolError("an HTTP request is a header whose 'http' is an object, then its body frame")
    return Message(header, body=bodies[0])


def is_text(payload: Any) -> bool:
    """Whether ``payload`` is texts: a list or tuple whose items are all strings."""
    return isinstance(payload, list | tuple) and all(isinstance(item, str) for item in payload)


def checked_text(text: Any) -> list[str]:
    """``text`` when it is 1 to ``MAX_TEXTS`` valid Unicode strings; else ``ProtocolError``."""
    if not isinstance(text, list) or not 0 < len(text) <= MAX_TEXTS \
            or not all(isinstance(item, str) for item in text):
        raise ProtocolError(f"'text' must be a list of 1 to {MAX_TEXTS} strings")
    for item in text:
        try:
            item.encode()
        except UnicodeEncodeError:  # JSON can spell a lone surrogate, which is no text
            raise ProtocolError("'text' holds a string that is not valid Unicode (a lone "
                                "surrogate)") from None
    return text


def deadline_of(header: Mapping[str, Any]) -> float | None:
    """The request's time budget in seconds, or None; invalid values are a protocol error."""
    value = header.get("deadline_ms")
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= sys.float_info.max:
        raise ProtocolError("deadline_ms must be a non-negative number of milliseconds")
    return value / MS_PER_SECOND


def encode_reply(
    request_id: Any,
    payload: Inputs | None = None,
    *,
    worker_pid: int | None = None,
    generation: int | None = None,
    info: Mapping[str, Any] | None = None,
) -> list[Any]:
    """A successful reply: header frame then the output arrays."""
    descriptors, buffers = pack_arrays(payload)
    header: dict[str, Any] = {
        "v": VERSION,
        "id": request_id,
        "status": "ok",
        "arrays": descriptors,
        "worker_pid": worker_pid,
        "generation": generation,
    }
    if info is not None:
        header["info"] = dict(info)
    return [encode_header(header), *buffers]


def encode_error(
    request_id: Any, code: str, message: str, *, worker_pid: int | None = None, generation: int | None = None
) -> list[bytes]:
    header = {
        "v": VERSION,
        "id": request_id,
        "status": "error",
        "error": {"code": code, "message": message},
        "arrays": [],
        "worker_pid": worker_pid,
        "generation": generation,
    }
    return [encode_header(header)]


def decode_reply(frames: Sequence[Any]) -> Message:
    """Validate a reply as a client receives it (after the empty delimiter)."""
    if not frames:
        raise ProtocolError("reply has no header frame")
    header = decode_header(frames[0])
    if header.get("status") not in ("ok", "error"):
        raise ProtocolError(f"reply has unknown status {header.get('status')!r}")
    arrays, names = unpack_arrays(header.get("arrays", []), frames[1:])
    return Message(header, arrays, names)


def request_id_of(frame: Any) -> Any:
    """Best-effort request id from a header frame, for error replies to malformed requests."""
    try:
        return decode_header(frame).get("id")
    except ProtocolError:
        return None
