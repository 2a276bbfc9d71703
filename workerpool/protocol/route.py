"""The route frame: what the router needs from a request, in fixed binary fields.

A request's JSON header says everything about it, but the router reads only its method, its
deadline and whether it may share a forward pass, and decoding JSON for that cost more than the
rest of routing it. So every request (protocol version 2) starts with a route frame that
repeats those facts where ``struct`` reads them in a microsecond:

    offset  size  field
    0       1     version, 2
    1       1     method: 0 infer, 1 info
    2       1     form: 0 goes alone, 1 one array, 2 texts, 3 an HTTP body
    3       1     flags: bit 0 set when a deadline is given
    4       4     count: the array's axes (form 1) or the texts (form 2), else 0
    8       8     deadline_ms (float64), 0 when none is given
    16      ...   form 1 only: the dtype (numpy's ``dtype.str``, NUL-padded to 4 bytes), each
                  axis as a uint64, then the array's name in UTF-8 (nothing when unnamed)

Little-endian throughout. The router trusts it only for routing; the worker rebuilds it from
the header (:func:`route_for`) and refuses a request whose route frame differs, so a frame
that lies fails its own request and no other.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping
from enum import IntEnum
from typing import Any

from .terms import (
    DTYPE_CODES,
    MAX_HEADER_BYTES,
    MAX_RANK,
    MAX_TEXTS,
    METHODS,
    VERSION,
    ProtocolError,
)

HEAD = struct.Struct("<BBBBId")
DTYPE_BYTES = 4
AXIS = struct.Struct("<Q")
DEADLINE_GIVEN = 1
ARRAY_TAIL = HEAD.size + DTYPE_BYTES  # where a form-1 frame's axes begin
FLAGS_AT, DEADLINE_AT = 3, 8  # the fields only the router reads: the worker reads the header's
DTYPES = {code.encode().ljust(DTYPE_BYTES, b"\0") for code in DTYPE_CODES}
JSON_STARTS = (b"{", b"\xef\xbb\xbf", b" ", b"\t", b"\r", b"\n")  # a JSON object, a BOM, white space


class Form(IntEnum):
    """How a request may batch, as far as the router needs to know."""

    ALONE = 0  # several arrays or none: it goes alone
    ARRAY = 1  # one array, which stacks with arrays of its dtype, trailing axes and name
    TEXTS = 2
    HTTP = 3  # an HTTP body the worker decodes: it batches by count


FORMS = tuple(Form)  # by value: read_route runs per request, and Form(value) or max(Form) cost microseconds


class Route:
    """A route frame, read."""

    __slots__ = ("count", "deadline", "form", "frame", "method")

    def __init__(self, frame: bytes, method: str, form: Form, count: int, deadline: float | None) -> None:
        self.frame = frame
        self.method = method
        self.form = form
        self.count = count
        self.deadline = deadline  # seconds, or None

    def first_axis(self) -> int:
        """A form-1 request's first axis (its rows, when the model's batch axis is first)."""
        return AXIS.unpack_from(self.frame, ARRAY_TAIL)[0]

    def array_key(self, *, past_first_axis: bool) -> bytes:
        """What a form-1 request must share with another to stack: its form, dtype, name and
        axes, all of them or those past the first. The form keeps it apart from every key of
        another form, whatever bytes the client wrote."""
        form = self.frame[2:3]
        if not past_first_axis:
            return form + self.frame[HEAD.size:]
        return form + self.frame[HEAD.size:ARRAY_TAIL] + self.frame[ARRAY_TAIL + AXIS.size:]


def read_route(frame: Any) -> Route:
    """The route frame ``frame``, checked as far as it can be without its header."""
    if len(frame) > MAX_HEADER_BYTES:  # before copying it: a name is bounded by the header too
        raise ProtocolError(f"the route frame is {len(frame)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    data = bytes(frame)
    if is_json(data):
        raise ProtocolError(f"a JSON header where the route frame belongs: a protocol version 1 "
                            f"request; this server speaks version {VERSION} (docs/protocol.md): "
                            "upgrade the client")
    if len(data) < HEAD.size:
        raise ProtocolError(f"the route frame is {len(data)} bytes, shorter than its {HEAD.size}-byte head")
    version, method, form, flags, count, deadline_ms = HEAD.unpack_from(data)
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this server speaks {VERSION})")
    if method >= len(METHODS) or form >= len(FORMS) or flags & ~DEADLINE_GIVEN:
        raise ProtocolError(f"the route frame has method {method}, form {form}, flags {flags}: "
                            "not all of them are defined")
    if flags and not 0 <= deadline_ms <= sys.float_info.max:
        raise ProtocolError("the route frame's deadline_ms must be a non-negative number")
    if form == Form.ARRAY:
        if count > MAX_RANK or len(data) < ARRAY_TAIL + count * AXIS.size:
            raise ProtocolError(f"the route frame of one array of {count} axes is {len(data)} bytes")
        if data[HEAD.size:ARRAY_TAIL] not in DTYPES:
            raise ProtocolError(f"the route frame's dtype {data[HEAD.size:ARRAY_TAIL]!r} is not one of "
                                f"{', '.join(DTYPE_CODES)}")
    elif len(data) != HEAD.size or (form == Form.TEXTS) != (count > 0) or count > MAX_TEXTS:
        raise ProtocolError(f"the route frame of form {form} is {len(data)} bytes with count {count}")
    return Route(data, METHODS[method], FORMS[form], count, deadline_ms / 1000.0 if flags else None)


def route_for(header: Mapping[str, Any]) -> bytes:
    """The route frame of a request with this header, already checked (``decode_request``):
    what the client sends, and what the worker holds the received one against."""
    deadline = header.get("deadline_ms")
    flags, deadline_ms = (0, 0.0) if deadline is None else (DEADLINE_GIVEN, float(deadline))
    method = METHODS.index(header["method"])
    if "http" in header:
        return HEAD.pack(VERSION, method, Form.HTTP, flags, 0, deadline_ms)
    if "text" in header:
        return HEAD.pack(VERSION, method, Form.TEXTS, flags, len(header["text"]), deadline_ms)
    arrays = header.get("arrays", [])
    if len(arrays) != 1:
        return HEAD.pack(VERSION, method, Form.ALONE, flags, 0, deadline_ms)
    shape = arrays[0]["shape"]
    dtype = arrays[0]["dtype"].encode().ljust(DTYPE_BYTES, b"\0")
    name = arrays[0].get("name") or ""  # null, as some encoders write it, is no name
    return b"".join((HEAD.pack(VERSION, method, Form.ARRAY, flags, len(shape), deadline_ms), dtype,
                     *(AXIS.pack(size) for size in shape), name.encode("utf-8", "surrogatepass")))


def same_routing(expected: bytes, received: bytes) -> bool:
    """Whether a received route frame routes as ``expected`` does: all but the deadline, which
    is its sender's own business (the worker reads the header's) and need not be the very same
    float64 that the header's decimal gives."""
    return expected[:FLAGS_AT] == received[:FLAGS_AT] \
        and expected[FLAGS_AT + 1:DEADLINE_AT] == received[FLAGS_AT + 1:DEADLINE_AT] \
        and expected[HEAD.size:] == received[HEAD.size:]


def is_json(data: bytes) -> bool:
    """Whether a frame where a route frame belongs begins as a JSON header does (a protocol
    version 1 request)."""
    return data.startswith(JSON_STARTS)
