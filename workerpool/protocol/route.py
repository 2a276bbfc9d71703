"""The route frame: what the router needs from a request, in fixed binary fields.

A request's JSON header says everything about it, but the router reads only its method, its
deadline, the model it is for, how it may share a forward pass and how it splits into parts,
and decoding JSON for that cost more than the rest of routing it. So every request (protocol
version 3) starts with a route frame that repeats those facts where ``struct`` reads them in a
microsecond:

    offset  size  field
    0       1     version, 3
    1       1     method: 0 infer, 1 info
    2       1     form: 0 goes alone, 1 one array, 2 texts, 3 an HTTP body
    3       1     flags: bit 0 set when a deadline is given
    4       4     count: the array's axes (form 1) or the texts (form 2), else 0
    8       8     deadline_ms (float64), 0 when none is given
    16      1     the model name's length in bytes, 0 when the request names none
    17      ...   the model's name (ASCII), then:
                  form 1: the dtype (numpy's ``dtype.str``, NUL-padded to 4 bytes), each axis
                  as a uint64, then the array's name in UTF-8 (nothing when unnamed);
                  form 2: each text's length in bytes of UTF-8, as a uint32

Little-endian throughout. The router trusts it only for routing; the worker rebuilds it from
the header (:func:`route_for`; a text request's lengths from the text frame they cut) and
refuses a request whose route frame differs, so a frame that lies fails its own request and no
other.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Mapping, Sequence
from enum import IntEnum
from itertools import accumulate
from typing import Any

from ..config.models import is_model_name
from .terms import (
    DTYPE_CODES,
    MAX_HEADER_BYTES,
    MAX_RANK,
    MAX_TEXTS,
    METHODS,
    VERSION,
    ProtocolError,
)

HEAD = struct.Struct("<BBBBIdB")
DTYPE_BYTES = 4
AXIS = struct.Struct("<Q")
LENGTH = struct.Struct("<I")  # one text's bytes
DEADLINE_GIVEN = 1
FLAGS_AT, DEADLINE_AT, DEADLINE_END = 3, 8, 16  # the fields only the router reads: the worker reads the header's
DTYPES = {code.encode().ljust(DTYPE_BYTES, b"\0") for code in DTYPE_CODES}
JSON_STARTS = (b"{", b"\xef\xbb\xbf", b" ", b"\t", b"\r", b"\n")  # a JSON object, a BOM, white space


class Form(IntEnum):
    """How a request may batch, as far as the router needs to know."""

    ALONE = 0  # several arrays or none: it goes alone
    ARRAY = 1  # one array, which stacks with arrays of its dtype, trailing axes and name
    TEXTS = 2  # texts, each of which may run on a worker of its own
    HTTP = 3  # an HTTP body the worker decodes: it batches by count


FORMS = tuple(Form)  # by value: read_route runs per request, and Form(value) or max(Form) cost microseconds
# The frames of a request that may share a pass: its route frame, its header, then its one
# array, its texts or its body (a request of another form, or with other frames, goes alone).
BATCHED_FRAMES = 3
FRAMES = {Form.ARRAY: BATCHED_FRAMES, Form.TEXTS: BATCHED_FRAMES, Form.HTTP: BATCHED_FRAMES}


class Route:
    """A route frame, read. ``model`` is the name the request gives (b"": none); ``tail`` is
    where the form's own fields begin."""

    __slots__ = ("count", "deadline", "form", "frame", "method", "model", "tail")

    def __init__(self, frame: bytes, method: str, form: Form, count: int, deadline: float | None,
                 model: bytes, tail: int) -> None:
        self.frame = frame
        self.method = method
        self.form = form
        self.count = count
        self.deadline = deadline  # seconds, or None
        self.model = model
        self.tail = tail

    def first_axis(self) -> int:
        """A form-1 request's first axis (its rows, when the model's batch axis is first)."""
        return AXIS.unpack_from(self.frame, self.tail + DTYPE_BYTES)[0]

    def array_key(self, *, past_first_axis: bool) -> bytes:
        """What a form-1 request must share with another to stack: its form, dtype, name and
        axes, all of them or those past the first. The form keeps it apart from every key of
        another form, whatever bytes the client wrote."""
        form, axes = self.frame[2:3], self.tail + DTYPE_BYTES
        if not past_first_axis:
            return form + self.frame[self.tail:]
        return form + self.frame[self.tail:axes] + self.frame[axes + AXIS.size:]

    def data_bytes(self) -> int | None:
        """The bytes its one data frame must hold: a form-1 array's, or a form-2 request's
        texts'; None for another form."""
        if self.form == Form.TEXTS:
            return sum(self.text_lengths())
        if self.form != Form.ARRAY:
            return None
        itemsize = int(self.frame[self.tail + 2:self.tail + DTYPE_BYTES].rstrip(b"\0"))  # "<f4": 4
        axes = struct.unpack_from(f"<{self.count}Q", self.frame, self.tail + DTYPE_BYTES)
        return math.prod(axes) * itemsize

    def text_lengths(self) -> tuple[int, ...]:
        """A form-2 request's texts' lengths in bytes, in order."""
        return struct.unpack_from(f"<{self.count}I", self.frame, self.tail)

    def text_offsets(self) -> list[int]:
        """Where each text of a form-2 request begins in its text frame, and where the last ends."""
        return [0, *accumulate(self.text_lengths())]


def read_route(frame: Any) -> Route:
    """The route frame ``frame``, checked as far as it can be without its header."""
    if len(frame) > MAX_HEADER_BYTES:  # before copying it: a name is bounded by the header too
        raise ProtocolError(f"the route frame is {len(frame)} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    data = bytes(frame)
    if is_json(data):
        raise ProtocolError(f"a JSON header where the route frame belongs: a protocol version 1 "
                            f"request; this server speaks version {VERSION} (docs/protocol.md): "
                            "upgrade the client")
    if data[:1] and data[0] != VERSION:
        raise ProtocolError(f"unsupported protocol version {data[0]} (this server speaks {VERSION}): "
                            "run the same workerpool release on clients and servers")
    if len(data) < HEAD.size:
        raise ProtocolError(f"the route frame is {len(data)} bytes, shorter than its {HEAD.size}-byte head")
    _, method, form, flags, count, deadline_ms, named = HEAD.unpack_from(data)
    if method >= len(METHODS) or form >= len(FORMS) or flags & ~DEADLINE_GIVEN:
        raise ProtocolError(f"the route frame has method {method}, form {form}, flags {flags}: "
                            "not all of them are defined")
    if flags and not 0 <= deadline_ms <= sys.float_info.max:
        raise ProtocolError("the route frame's deadline_ms must be a non-negative number")
    tail = HEAD.size + named
    model = data[HEAD.size:tail]
    if len(model) != named or (named and not is_model_name(model.decode("latin-1"))):
        raise ProtocolError(f"the route frame's model name {model[:60]!r} is not a model's name")
    _check_tail(data, form, count, tail)
    return Route(data, METHODS[method], FORMS[form], count, deadline_ms / 1000.0 if flags else None,
                 model, tail)


def _check_tail(data: bytes, form: int, count: int, tail: int) -> None:
    """Refuse what follows the model's name when it is not what ``form`` has there."""
    if form == Form.ARRAY:
        if count > MAX_RANK or len(data) < tail + DTYPE_BYTES + count * AXIS.size:
            raise ProtocolError(f"the route frame of one array of {count} axes is {len(data)} bytes")
        if data[tail:tail + DTYPE_BYTES] not in DTYPES:
            raise ProtocolError(f"the route frame's dtype {data[tail:tail + DTYPE_BYTES]!r} is not one "
                                f"of {', '.join(DTYPE_CODES)}")
    elif form == Form.TEXTS:
        if not 0 < count <= MAX_TEXTS or len(data) != tail + count * LENGTH.size:
            raise ProtocolError(f"the route frame of {count} texts is {len(data)} bytes (a request "
                                f"holds 1 to {MAX_TEXTS} texts, each with its length)")
    elif len(data) != tail or count:
        raise ProtocolError(f"the route frame of form {form} is {len(data)} bytes with count {count}")


def route_for(header: Mapping[str, Any], text_lengths: Sequence[int] = ()) -> bytes:
    """The route frame of a request with this header, already checked (``decode_request``):
    what the client sends, and what the worker holds the received one against. A request of
    texts (``"texts"`` in the header) gives its texts' lengths in bytes too."""
    deadline = header.get("deadline_ms")
    flags, deadline_ms = (0, 0.0) if deadline is None else (DEADLINE_GIVEN, float(deadline))
    method = METHODS.index(header["method"])
    model = str(header.get("model") or "").encode("ascii", "replace")
    if "http" in header and "texts" not in header:
        return HEAD.pack(VERSION, method, Form.HTTP, flags, 0, deadline_ms, len(model)) + model
    if "texts" in header:
        head = HEAD.pack(VERSION, method, Form.TEXTS, flags, len(text_lengths), deadline_ms, len(model))
        return head + model + struct.pack(f"<{len(text_lengths)}I", *text_lengths)
    arrays = header.get("arrays", [])
    if len(arrays) != 1:
        return HEAD.pack(VERSION, method, Form.ALONE, flags, 0, deadline_ms, len(model)) + model
    shape = arrays[0]["shape"]
    dtype = arrays[0]["dtype"].encode().ljust(DTYPE_BYTES, b"\0")
    name = arrays[0].get("name") or ""  # null, as some encoders write it, is no name
    return b"".join((HEAD.pack(VERSION, method, Form.ARRAY, flags, len(shape), deadline_ms, len(model)),
                     model, dtype, *(AXIS.pack(size) for size in shape),
                     name.encode("utf-8", "surrogatepass")))


def same_routing(expected: bytes, received: bytes) -> bool:
    """Whether a received route frame routes as ``expected`` does: all but the deadline, which
    is its sender's own business (the worker reads the header's) and need not be the very same
    float64 that the header's decimal gives."""
    return expected[:FLAGS_AT] == received[:FLAGS_AT] \
        and expected[FLAGS_AT + 1:DEADLINE_AT] == received[FLAGS_AT + 1:DEADLINE_AT] \
        and expected[DEADLINE_END:] == received[DEADLINE_END:]


def is_json(data: bytes) -> bool:
    """Whether a frame where a route frame belongs begins as a JSON header does (a protocol
    version 1 request)."""
    return data.startswith(JSON_STARTS)
