"""The wire protocol (docs/protocol.md): a request is a route frame (route.py), a JSON
header and one raw frame per array (or one frame of texts); a reply is a JSON header and its
arrays.

Nothing here unpickles or evaluates what arrives: headers are JSON, arrays are raw bytes whose
dtype comes from a short allow-list and whose length must match the declared shape exactly.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..config.models import NAME_RULE, is_model_name, model_name_problem
from ..units import MS_PER_SECOND
from .arrays import (  # noqa: F401 - the rest of the code reads them as protocol.X
    ALLOWED_DTYPES,
    Inputs,
    Part,
    buffer_of,
    extent,
    is_text,
    pack_arrays,
    unpack_arrays,
)
from .route import BATCHED_FRAMES, Form, Route, read_route, route_for, same_routing

# The terms are read from here by the rest of the code, as ``protocol.VERSION`` and the like.
from .terms import (
    DTYPE_CODES,  # noqa: F401
    MAX_ARRAYS,  # noqa: F401
    MAX_EXTENT,  # noqa: F401
    MAX_HEADER_BYTES,
    MAX_NESTING,
    MAX_RANK,  # noqa: F401
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
BATCH = b"BATCH"  # router: the model, the stride, then several requests (client, part, route, header, data)
REPLY = b"REP"
STOP = b"STOP"
RELOAD = b"RELOAD"
RELOADED = b"RELOADED"
BYE = b"BYE"  # worker: I am leaving; answered with STOP once nothing is in flight
WHO = b"WHO"  # router: I do not know you (it restarted); answered with READY
REFUSE = b"REFUSE"  # router: your model does not fit mine; the worker exits
USAGE = b"USAGE"  # worker: after a message's replies, the texts it tokenized, their tokens and the seconds it took
_USAGE = struct.Struct("<IQd")



@dataclass
class Message:
    """A decoded request or reply: its JSON header and its arrays (names may be None), or its
    texts."""

    header: dict[str, Any]
    arrays: list[np.ndarray] = field(default_factory=list)
    names: list[str | None] = field(default_factory=list)
    body: Any = None  # an HTTP request's body, as its front door received it (``"http"`` in the header)
    texts: list[str] | None = None
    first: int = 0  # the index of its first row or text in the request it is a part of

    @property
    def id(self) -> Any:
        return self.header.get("id")

    def payload(self) -> np.ndarray | dict[str, np.ndarray] | list[str] | None:
        """Texts as a list, one unnamed array as itself, named arrays as a dict, nothing as None."""
        if self.texts is not None:
            return self.texts
        if not self.arrays:
            return None
        if len(self.arrays) == 1 and self.names[0] is None:
            return self.arrays[0]
        # Past the lone unnamed array every name is a str: ``unpack_arrays`` refuses other mixes.
        return dict(zip(cast(list[str], self.names), self.arrays))


# A message that hands a worker work: REQUEST, the model's name, then one request (its client,
# its part frame, its frames); or BATCH, the model's name, the stride, then that many frames for
# each of several requests, all of a form that may share a pass.
BATCH_STRIDE = 2 + BATCHED_FRAMES


def work_message(model: str, requests: Sequence[Sequence[Any]]) -> list[Any]:
    """The message that hands a worker ``requests`` of ``model``, each its client, its part
    frame and its frames (several: each of ``BATCHED_FRAMES`` frames)."""
    if len(requests) == 1:
        return [REQUEST, model.encode(), *requests[0]]
    return [BATCH, model.encode(), str(BATCH_STRIDE).encode(), *(frame for request in requests for frame in request)]


def usage_message(model: str, texts: int, tokens: int, seconds: float) -> list[bytes]:
    return [USAGE, model.encode(), _USAGE.pack(texts, tokens, seconds)]


def read_usage(frames: Sequence[Any]) -> tuple[str, int, int, float] | None:
    """The model, texts, tokens and seconds of a USAGE message; None when it is malformed."""
    if len(frames) != 3 or buffer_of(frames[2]).nbytes != _USAGE.size:
        return None
    texts, tokens, seconds = _USAGE.unpack(buffer_of(frames[2]))
    return bytes(buffer_of(frames[1])).decode("ascii", "replace"), texts, tokens, seconds


def read_work(frames: Sequence[Any]) -> tuple[str, list[Sequence[Any]]] | None:
    """The model and the requests (client, part frame, frames) of a REQUEST or BATCH message
    (its command included); None when it is malformed."""
    if len(frames) < 4:
        return None
    model = bytes(buffer_of(frames[1])).decode("ascii", "replace")
    if bytes(buffer_of(frames[0])) == REQUEST:
        return model, [frames[2:]]
    if bytes(buffer_of(frames[2])) != str(BATCH_STRIDE).encode() or (len(frames) - 3) % BATCH_STRIDE:
        return None
    return model, [frames[i:i + BATCH_STRIDE] for i in range(3, len(frames), BATCH_STRIDE)]


def encode_header(header: Mapping[str, Any]) -> bytes:
    return _COMPACT.encode(header).encode()


def decode_header(frame: Any) -> dict[str, Any]:
    """Parse a JSON header frame; refuse anything but a bounded JSON object."""
    data = bytes(buffer_of(frame))
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


def payload_bytes(payload: Inputs | None) -> int:
    """The most bytes a request for ``payload`` can take: its arrays' or texts', and the route
    frame and header at their limits."""
    if payload is None:
        return 2 * MAX_HEADER_BYTES
    if is_text(payload):
        return sum(len(str(text)) * 4 for text in payload) + 2 * MAX_HEADER_BYTES  # UTF-8's most
    arrays = list(payload.values()) if isinstance(payload, Mapping) else [payload]
    return sum(np.asarray(array).nbytes for array in arrays) + 2 * MAX_HEADER_BYTES


def request_bytes(frames: Sequence[Any]) -> int:
    """The bytes of a request's frames, as the server counts them against its limit; its
    routing id (5 bytes, as libzmq makes them) included."""
    return ROUTING_ID_BYTES + sum(memoryview(frame).nbytes for frame in frames)


def encode_request(
    request_id: Any, payload: Inputs | None, *, method: str = METHOD_INFER, deadline_ms: float | None = None,
    model: str | None = None,
) -> list[Any]:
    """The frames a client sends: the empty delimiter a DEALER needs for REQ peers, the route
    frame, the header, the arrays. A list of strings is sent as texts (``"texts"`` in the header,
    then one frame of their UTF-8, each text's length in the route frame). ``model`` names the
    model, for a server that serves several."""
    header: dict[str, Any] = {"v": VERSION, "id": request_id, "method": method}
    if model is not None:
        problem = model_name_problem(model)
        if problem is not None:
            raise ProtocolError(problem)
        header["model"] = model
    lengths: list[int] = []
    buffers: list[Any]
    if is_text(payload):
        encoded = encode_texts(list(cast(Sequence[str], payload)))
        lengths = [len(text) for text in encoded]
        header["arrays"], header["texts"] = [], len(encoded)
        buffers = [b"".join(encoded)]
    else:
        header["arrays"], buffers = pack_arrays(payload)
    if deadline_ms is not None:
        header["deadline_ms"] = deadline_ms
    encoded_header = encode_header(header)
    if len(encoded_header) > MAX_HEADER_BYTES:  # the server could not even read its id to answer it
        raise ProtocolError(f"the request header would be {len(encoded_header)} bytes, over the "
                            f"{MAX_HEADER_BYTES}-byte limit (each array's name, dtype and shape "
                            "travel in it: send fewer arrays)")
    return [b"", route_for(header, lengths), encoded_header, *buffers]


def encode_texts(texts: list[str]) -> list[bytes]:
    """Each text in UTF-8, when there are 1 to ``MAX_TEXTS`` valid Unicode strings; else
    ``ProtocolError``."""
    if not isinstance(texts, list) or not 0 < len(texts) <= MAX_TEXTS \
            or not all(isinstance(item, str) for item in texts):
        raise ProtocolError(f"texts must be a list of 1 to {MAX_TEXTS} strings")
    try:
        return [text.encode() for text in texts]
    except UnicodeEncodeError:  # JSON can spell a lone surrogate, which is no text
        raise ProtocolError("a text is not valid Unicode (a lone surrogate)") from None


def decode_request(frames: Sequence[Any], part: Part | None = None) -> Message:
    """Validate a request (route frame, header frame, then array frames) as a worker receives
    it: the route frame must be the one its header gives. ``part``: the frames after the header
    hold only those rows of its one array, or those of its texts (the router split it)."""
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
        _check_model(header)
        if part is not None and not _divisible(route, part):
            raise ProtocolError(f"rows {list(part)} of a request that has no such rows")
        if "text" in header:
            raise ProtocolError("texts travel in a frame of their own since protocol version 3, not "
                                "in the header's 'text'")
        if "texts" in header:
            message = _texts_request(header, route, frames[2:], part)
        elif "http" in header:
            message = _http_request(header, frames[2:])
        else:
            arrays, names = unpack_arrays(header.get("arrays", []), frames[2:], part)
            message = Message(header, arrays, names, first=part[0] if part else 0)
        lengths = route.text_lengths() if message.texts is not None else ()
        if not same_routing(route_for(header, lengths), route.frame):
            raise ProtocolError("the route frame does not repeat what the header says (method, model, "
                                "texts, or the one array's dtype, shape and name)")
    except ProtocolError as exc:
        raise ProtocolError(str(exc), request_id) from None
    return message


def _check_model(header: Mapping[str, Any]) -> None:
    model = header.get("model")
    if model is not None and not (isinstance(model, str) and is_model_name(model)):
        raise ProtocolError(f"'model' must be a model's name ({NAME_RULE}), not {str(model)[:60]!r}")


def _divisible(route: Route, part: Part) -> bool:
    """Whether ``part`` names rows a request of ``route`` has: its texts, or its one array's
    first axis."""
    start, stop = part
    if route.form == Form.TEXTS:
        total = route.count
    elif route.form == Form.ARRAY and route.count:
        total = route.first_axis()
    else:
        return False
    return 0 <= start < stop <= total


def _texts_request(header: dict[str, Any], route: Route, frames: Sequence[Any], part: Part | None) -> Message:
    """A request of texts: one frame of their UTF-8, cut by the lengths in the route frame."""
    count = header["texts"]
    if type(count) is not int or not 0 < count <= MAX_TEXTS or route.form != Form.TEXTS \
            or route.count != count:
        raise ProtocolError(f"'texts' must be the number of texts the route frame gives, 1 to {MAX_TEXTS}")
    if len(frames) != 1 or header.get("arrays", []) != []:
        raise ProtocolError("a request of texts has one frame after its header, their UTF-8")
    start, stop = part or (0, count)
    offsets = route.text_offsets()
    data = buffer_of(frames[0])
    base = offsets[start]
    if data.nbytes != offsets[stop] - base:
        raise ProtocolError(f"the texts' lengths add up to {offsets[stop] - base} bytes; their frame "
                            f"has {data.nbytes}")
    try:
        texts = [str(data[a - base:b - base], "utf-8")
                 for a, b in zip(offsets[start:stop], offsets[start + 1:stop + 1])]
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"a text is not valid UTF-8: {exc.reason}") from None
    return Message(header, texts=texts, first=start)


def _http_request(header: dict[str, Any], bodies: Sequence[Any]) -> Message:
    """A request the HTTP front door passed on: its header says how to read the one body frame
    (``workerpool.codecs.http_call``), which the worker decodes."""
    if not isinstance(header["http"], dict) or len(bodies) != 1 or header.get("arrays", []) != []:
        raise ProtocolError("an HTTP request is a header whose 'http' is an object, then its body frame")
    return Message(header, body=bodies[0])


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


def merge_replies(replies: Sequence[Sequence[Any]]) -> list[Any]:
    """One reply for a request whose parts were answered apart (``replies``, each a header
    frame and its arrays, in the order of the parts): every output's rows, part after part.

    The arrays are C-ordered, so rows after rows are their bytes one after the other. Raises
    ``ProtocolError`` when a part's reply is malformed (what a worker says is checked as a
    client's request is) or the parts' outputs do not line up (a model whose outputs for some
    rows differ in kind from those for others).
    """
    headers = [decode_header(reply[0]) for reply in replies]
    for header, reply in zip(headers, replies):
        unpack_arrays(header.get("arrays"), reply[1:])
    first = headers[0]
    merged = [dict(descriptor) for descriptor in first["arrays"]]
    for header in headers[1:]:
        arrays = header["arrays"]
        if len(arrays) != len(merged):
            raise ProtocolError("the parts of a request gave different outputs")
        for descriptor, other in zip(merged, arrays):
            if (other.get("name"), other["dtype"]) != (descriptor.get("name"), descriptor["dtype"]) \
                    or other["shape"][1:] != descriptor["shape"][1:] or not descriptor["shape"]:
                raise ProtocolError("the parts of a request gave different outputs")
            descriptor["shape"] = [descriptor["shape"][0] + other["shape"][0], *descriptor["shape"][1:]]
    header = {**headers[-1], "id": first.get("id"), "arrays": merged}
    joined = [b"".join(buffer_of(reply[1 + index]) for reply in replies) for index in range(len(merged))]
    return [encode_header(header), *joined]
