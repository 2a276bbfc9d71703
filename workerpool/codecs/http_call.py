"""An HTTP request on its way through the router, both ends: the front door wraps the body it
received in a small header (``request_frames``), the worker decodes the body against its model
(``decode_call``) and encodes the response body around the outputs (``HttpCall.reply``), and
the front door writes the status line and headers around the worker's bytes (``read_reply``).

So the supervisor never parses a request's tensors: a large body costs the worker that runs
it, and stalls no other client. The header is the wire protocol's (``"http"`` in it), with the
body as its one frame. A text API's request is the exception: the front door reads its JSON
(texts cost little to read beside what embedding them costs) and sends its texts as a request
of texts (``text_request_frames``), which the router spreads over the workers; each part's
worker writes its share of the response body, which the front door joins.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadRequest, DeadlineExceeded, ErrorCode
from ..models.texts import Texts, Tokenized
from ..protocol import messages as protocol
from ..protocol.route import route_for
from . import kserve, openai, tei, text_calls
from .view import UNNAMED_OUTPUT, Answer, ModelView, wire_inputs

KSERVE = "kserve"
OPENAI = "openai"
TEXTS = "texts"  # TEI's routes and rerank: what the worker writes is tei.write's
APIS = (KSERVE, OPENAI, TEXTS)
TEXT_APIS = (OPENAI, TEXTS)  # read at the front door, their texts spread over the workers
JSON = "application/json"
BINARY = "application/octet-stream"


def _header(request_id: Any, api: str, model: str, deadline: float | None, **http: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"v": protocol.VERSION, "id": request_id, "method": protocol.METHOD_INFER,
                              "model": model, "http": {"api": api, "model": model, "at": time.time(), **http}}
    if deadline is not None:
        header["deadline_ms"] = deadline * 1000.0
    return header


def request_frames(request_id: Any, api: str, model: str, body: Any, *, head: int | None,
                   deadline: float | None) -> list[Any]:
    """The frames of one HTTP request for the router: the route frame, the header, then the
    body as received. ``head`` is KServe's Inference-Header-Content-Length; ``deadline``
    seconds, or None."""
    header = _header(request_id, api, model, deadline, head=head)
    return [route_for(header), protocol.encode_header(header), body]


def text_request_frames(request_id: Any, api: str, model: str, texts: list[str], *,
                        deadline: float | None, **options: Any) -> list[Any]:
    """The frames of a text API's request for the router, its texts read by the front door:
    a request of texts, with what the API's answer needs (``options``) in its header. Raises
    ``BadRequest`` for texts the wire cannot carry."""
    if not 0 < len(texts) <= protocol.MAX_TEXTS:
        raise BadRequest(f"a request takes 1 to {protocol.MAX_TEXTS} texts, not {len(texts)}")
    try:
        encoded = protocol.encode_texts(texts)
    except protocol.ProtocolError as exc:
        raise BadRequest(str(exc)) from None
    header = _header(request_id, api, model, deadline, **options)
    header["arrays"], header["texts"] = [], len(encoded)
    return [route_for(header, [len(text) for text in encoded]), protocol.encode_header(header), b"".join(encoded)]


@dataclass(frozen=True)
class HttpReply:
    """A worker's answer to an HTTP request: the body (a text API's: each part's share of it,
    and the tokens they held), its type and (binary KServe) the JSON part's length; or the
    error code and message when ``code`` is set."""

    bodies: list[bytes]
    content_type: str = JSON
    head: int | None = None
    code: ErrorCode | None = None
    message: str = ""
    tokens: int = 0


def read_reply(frames: Sequence[Any]) -> HttpReply:
    """What the front door writes for a reply (the router's frames after the client's key): a
    header and a body, one pair for each part of a request the router spread; or an error."""
    header = protocol.decode_header(frames[0])
    error = header.get("error")
    if header.get("status") == "error" and isinstance(error, dict):
        code = ErrorCode.read(str(error.get("code", "")).encode())
        return HttpReply([], code=code, message=str(error.get("message", "")))
    if header.get("status") != "ok" or len(frames) % 2:
        raise protocol.ProtocolError("a reply to an HTTP request is neither bodies nor an error")
    headers = [header, *(protocol.decode_header(frame) for frame in frames[2::2])]
    https = [http for part in headers if part.get("status") == "ok" and isinstance(http := part.get("http"), dict)]
    if len(https) != len(headers):
        raise protocol.ProtocolError("a reply to an HTTP request is neither bodies nor an error")
    tokens = sum(http.get("tokens", 0) for http in https if type(http.get("tokens", 0)) is int)
    head = https[0].get("head")
    binary = len(frames) == 2 and type(head) is int and 0 <= head <= len(frames[1])
    return HttpReply([bytes(frame) for frame in frames[1::2]], BINARY if binary else JSON,
                     head if binary else None, tokens=tokens)


@dataclass
class HttpCall:
    """A decoded HTTP request in a worker: what the model runs on, and how to answer."""

    id: Any
    view: ModelView
    payload: np.ndarray | dict[str, np.ndarray] | list[str] | Texts
    request: kserve.InferRequest | None = None  # KServe's outputs asked for
    options: dict[str, Any] = field(default_factory=dict)  # a text API's: how its answer is written
    first: int = 0  # a text API's part: the index of its first text in the client's request

    def reply(self, outcome: Any, *, worker_pid: int, generation: int) -> list[Any]:
        """The reply frames for the model's outputs; ``BadRequest`` when they cannot be written
        as asked (an output JSON cannot carry), ``ProtocolError`` for a dtype no API has."""
        outputs = outcome if isinstance(outcome, dict) else {UNNAMED_OUTPUT: outcome}
        answer = Answer({name: _sendable(array) for name, array in outputs.items()}, generation, worker_pid)
        http: dict[str, Any] = {"head": None}
        if self.request is not None:
            body, http["head"] = kserve.encode_infer(self.request, self.view, answer)
        elif self.options.get("op") is None:
            body, http["tokens"] = openai.encode_items(answer, self.first, self.options)
        else:
            body, http["tokens"] = tei.write(answer, self.first, self.options, self.view.labels)
        return self._frames(body, http, worker_pid, generation)

    @property
    def tokenizes(self) -> bool:
        """Whether it asks for its texts' tokens (TEI's /tokenize), not for the model's outputs."""
        return self.options.get("op") == "tokenize"

    def reply_tokens(self, tokenized: Tokenized, *, worker_pid: int, generation: int) -> list[Any]:
        """The reply frames for the tokens of :attr:`tokenizes`' texts."""
        assert isinstance(self.payload, list)
        body = tei.write_tokens(tokenized.encodings, self.payload)
        return self._frames(body, {"head": None, "tokens": sum(tokenized.lengths)}, worker_pid, generation)

    def _frames(self, body: bytes, http: dict[str, Any], worker_pid: int, generation: int) -> list[Any]:
        header = {"v": protocol.VERSION, "id": self.id, "status": "ok", "arrays": [],
                  "worker_pid": worker_pid, "generation": generation, "http": http}
        return [protocol.encode_header(header), body]


def decode_call(message: protocol.Message, view_for: Callable[[str], ModelView]) -> HttpCall:
    """Read an HTTP request's body against the model ``view_for(name)`` describes; raises the
    ``RemoteError`` its client is answered with."""
    http = message.header["http"]
    api, name, head, at = http.get("api"), http.get("model"), http.get("head"), http.get("at")
    if api not in APIS or not isinstance(name, str) or not (head is None or type(head) is int) \
            or type(at) not in (int, float) or (api in TEXT_APIS) != (message.texts is not None):
        raise BadRequest(f"the 'http' object of an HTTP request is malformed: {str(http)[:200]}")
    view = view_for(name)
    if message.texts is not None:  # read by the front door: its texts, or some of them
        options = openai.read_options(http) if api == OPENAI else _text_options(http)
        return HttpCall(message.id, view, text_calls.payload(message.texts, options), options=options,
                        first=message.first)
    body = protocol.buffer_of(message.body)
    request = kserve.decode_infer(body, head, view)
    if request.timeout is not None and time.time() - at > request.timeout:
        raise DeadlineExceeded(f"parameters.timeout of {request.timeout * 1e6:.0f} µs passed before a "
                               "worker took the request")
    payload = request.inputs if isinstance(request.inputs, list) else wire_inputs(view, request.inputs)
    return HttpCall(message.id, view, payload, request)


def _text_options(http: dict[str, Any]) -> dict[str, Any]:
    """The options of a request of the ``texts`` API (see :func:`tei.write`), checked."""
    if http.get("op") not in tei.OPS:
        raise BadRequest(f"the 'http' object of a request of texts names no known op: {str(http)[:200]}")
    return {name: http.get(name)
            for name in ("op", "raw", "pairs", "query", "truncate", "normalize", "dimensions", "special")}


def _sendable(array: Any) -> np.ndarray:
    """An output as the APIs write it: little-endian, of a dtype they name."""
    array = np.asarray(array)
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    if array.dtype.str not in kserve.NUMPY_TO_DATATYPE:
        raise protocol.ProtocolError(f"dtype {array.dtype} has no datatype in KServe v2")
    return array
