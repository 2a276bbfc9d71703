"""An HTTP request on its way through the router, both ends: the front door wraps the body it
received in a small header (``request_frames``), the worker decodes the body against its model
(``decode_call``) and encodes the response body around the outputs (``HttpCall.reply``), and
the front door writes the status line and headers around the worker's bytes (``read_reply``).

So the supervisor never parses a request's JSON or tensors: a large body costs the worker that
runs it, and stalls no other client. The header is the wire protocol's (``"http"`` in it), with
the body as its one frame.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadRequest, DeadlineExceeded, ErrorCode
from ..protocol import messages as protocol
from ..protocol.route import route_for
from . import kserve, openai
from .view import UNNAMED_OUTPUT, Answer, ModelView, wire_inputs

KSERVE = "kserve"
OPENAI = "openai"
APIS = (KSERVE, OPENAI)
JSON = "application/json"
BINARY = "application/octet-stream"


def request_frames(request_id: int, api: str, model: str, body: Any, *, head: int | None,
                   deadline: float | None) -> list[Any]:
    """The frames of one HTTP request for the router: the route frame, the header, then the
    body as received. ``head`` is KServe's Inference-Header-Content-Length; ``deadline``
    seconds, or None."""
    header: dict[str, Any] = {"v": protocol.VERSION, "id": request_id, "method": protocol.METHOD_INFER,
                              "http": {"api": api, "model": model, "head": head, "at": time.time()}}
    if deadline is not None:
        header["deadline_ms"] = deadline * 1000.0
    return [route_for(header), protocol.encode_header(header), body]


@dataclass(frozen=True)
class HttpReply:
    """A worker's answer to an HTTP request: the body, its type and (binary KServe) the JSON
    part's length; or the error code and message when ``code`` is set."""

    body: bytes
    content_type: str = JSON
    head: int | None = None
    code: ErrorCode | None = None
    message: str = ""


def read_reply(frames: Sequence[Any]) -> HttpReply:
    """What the front door writes for a reply (the router's frames after the client's key)."""
    header = protocol.decode_header(frames[0])
    http = header.get("http")
    if header.get("status") == "ok" and isinstance(http, dict) and len(frames) == 2:
        head = http.get("head")
        binary = type(head) is int and 0 <= head <= len(frames[1])
        return HttpReply(bytes(frames[1]), BINARY if binary else JSON, head if binary else None)
    error = header.get("error")
    if header.get("status") == "error" and isinstance(error, dict):
        code = ErrorCode.read(str(error.get("code", "")).encode())
        return HttpReply(b"", code=code, message=str(error.get("message", "")))
    raise protocol.ProtocolError("a reply to an HTTP request is neither a body nor an error")


@dataclass
class HttpCall:
    """A decoded HTTP request in a worker: what the model runs on, and how to answer."""

    id: Any
    view: ModelView
    payload: np.ndarray | dict[str, np.ndarray] | list[str]
    request: kserve.InferRequest | None = None  # KServe's outputs asked for
    encoding: str = "float"  # OpenAI's encoding_format

    def reply(self, outcome: Any, *, worker_pid: int, generation: int) -> list[Any]:
        """The reply frames for the model's outputs; ``BadRequest`` when they cannot be written
        as asked (an output JSON cannot carry), ``ProtocolError`` for a dtype no API has."""
        outputs = outcome if isinstance(outcome, dict) else {UNNAMED_OUTPUT: outcome}
        answer = Answer({name: _sendable(array) for name, array in outputs.items()}, generation, worker_pid)
        head = None
        if self.request is not None:
            body, head = kserve.encode_infer(self.request, self.view, answer)
        else:
            body = openai.encode_embeddings(self.view, answer, self.encoding)
        header = {"v": protocol.VERSION, "id": self.id, "status": "ok", "arrays": [],
                  "worker_pid": worker_pid, "generation": generation, "http": {"head": head}}
        return [protocol.encode_header(header), body]


def decode_call(message: protocol.Message, view_for: Callable[[str], ModelView]) -> HttpCall:
    """Read an HTTP request's body against the model ``view_for(name)`` describes; raises the
    ``RemoteError`` its client is answered with."""
    http = message.header["http"]
    api, name, head, at = http.get("api"), http.get("model"), http.get("head"), http.get("at")
    if api not in APIS or not isinstance(name, str) or not (head is None or type(head) is int) \
            or type(at) not in (int, float):
        raise BadRequest(f"the 'http' object of an HTTP request is malformed: {str(http)[:200]}")
    view = view_for(name)
    body = message.body.buffer if hasattr(message.body, "buffer") else memoryview(message.body)
    if api == OPENAI:
        texts, encoding = openai.decode_embeddings(body, view)
        return HttpCall(message.id, view, _texts(texts), encoding=encoding)
    request = kserve.decode_infer(body, head, view)
    if request.timeout is not None and time.time() - at > request.timeout:
        raise DeadlineExceeded(f"parameters.timeout of {request.timeout * 1e6:.0f} µs passed before a "
                               "worker took the request")
    payload = _texts(request.inputs) if isinstance(request.inputs, list) else wire_inputs(view, request.inputs)
    return HttpCall(message.id, view, payload, request)


def _texts(texts: list[str]) -> list[str]:
    if not 0 < len(texts) <= protocol.MAX_TEXTS:
        raise BadRequest(f"a request takes 1 to {protocol.MAX_TEXTS} texts, not {len(texts)}")
    try:
        return protocol.checked_text(texts)
    except protocol.ProtocolError as exc:
        raise BadRequest(str(exc)) from None


def _sendable(array: Any) -> np.ndarray:
    """An output as the APIs write it: little-endian, of a dtype they name."""
    array = np.asarray(array)
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    if array.dtype.str not in kserve.NUMPY_TO_DATATYPE:
        raise protocol.ProtocolError(f"dtype {array.dtype} has no datatype in KServe v2")
    return array
