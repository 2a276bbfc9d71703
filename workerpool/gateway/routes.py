"""What the front door answers, socket-free: a request in, a response or a call to the router out.

- Routes: the Open Inference Protocol's (``/v2/...``, Triton's ``/v2/repository/index`` too),
  OpenAI's ``/v1/embeddings`` and ``/v1/models``, and the operations endpoint's (``/metrics``,
  ``/healthz``, ``/readyz``). Every served model has its own (``/v2/models/NAME``), and OpenAI's
  ``model`` field picks one.
- The models' descriptions are answered here from the signatures the supervisor holds; a KServe
  inference is passed to the router with its body unread (``codecs.http_call``): the worker
  decodes it, and its reply comes back as the response body. An OpenAI request's body is read
  here, so that its texts can spread over the workers; each part's worker writes its share of
  the response, which is put together here.
- With a token, every route but the probes and ``/metrics`` needs ``Authorization: Bearer
  TOKEN``, compared in constant time.
- Every error is JSON: ``{"error": message}`` on KServe's routes, OpenAI's error object on
  ``/v1``, with the status of its code in the error taxonomy.
"""

from __future__ import annotations

import hmac
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..codecs import kserve, openai, rerank, tei
from ..codecs.http_call import (
    KSERVE,
    OPENAI,
    TEXTS,
    HttpReply,
    read_reply,
    request_frames,
    text_request_frames,
)
from ..codecs.text_calls import CLASSIFY, EMBED, Finish, TextRequest
from ..codecs.view import ModelState, ModelView, view_of
from ..errors import ErrorCode, RemoteError
from ..protocol import messages as protocol
from ..router.replies import UNKNOWN_MODEL
from ..units import MiB
from .http11 import Refusal, Request

TEI = "tei"  # the shape of TEI's errors
RERANK = "rerank"  # a route's need: a classifier of one label
RETRY_AFTER = "1"
MAX_TIMEOUT_SECONDS = 1e9  # a Timeout header past this (some 31 years) is refused, not rounded to infinity
SECONDS = re.compile(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?")  # a plain decimal number, as HTTP spells one
MAX_SIZE_DIGITS = 18  # Inference-Header-Content-Length: more digits than any body could need
MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
ROUTES = [(re.compile(pattern + "$"), method, name) for pattern, method, name in [
    (r"/v2/health/live", "GET", "live"), (r"/v2/health/ready", "GET", "ready"),
    (r"/v2", "GET", "server"), (MODEL, "GET", "model"), (MODEL + "/ready", "GET", "model_ready"),
    (MODEL + "/infer", "POST", "infer"), (r"/v1/embeddings", "POST", "embeddings"),
    (r"/v1/models", "GET", "models"), (r"/v2/repository/index", "POST", "repository"),
    (r"/metrics", "GET", "ops"), (r"/healthz", "GET", "ops"), (r"/readyz", "GET", "ops"),
    (MODEL + "/config", "GET", "model_config"),
    (r"/embed", "POST", "embed"), (r"/rerank", "POST", "rerank"), (r"/predict", "POST", "predict"),
    (r"/tokenize", "POST", "tokenize"), (r"/", "POST", "root"), (r"/info", "GET", "info"),
    (r"/health", "GET", "health"), (r"/v1/rerank", "POST", "rerank_v1"), (r"/v2/rerank", "POST", "rerank_v2"),
]]
MAX_ROUTES_KEPT = 256  # distinct method and path pairs whose route is remembered
OPEN_ROUTES = {"live", "ready", "ops", "health"}  # probes and metrics need no token
# The text APIs' routes: their bodies read here, and the task of the model each needs (None: any
# model of texts). TEI's POST / is /predict for a classifier, else /embed, as TEI routes it.
TEXT_ROUTES: dict[str, str | None] = {"embeddings": EMBED, "embed": EMBED, "rerank": RERANK, "predict": CLASSIFY,
                                      "tokenize": None, "root": None, "rerank_v1": RERANK, "rerank_v2": RERANK}
BODY_ROUTES = {"infer", *TEXT_ROUTES}
# A text API's body is parsed on the supervisor's loop (its texts then spread over the workers):
# bounded as TEI bounds its payloads, so that one body stalls the others little (1024 texts of
# 2 KB parse in about 2 ms here; 2 MiB of nested empty lists, the worst JSON, in 0.15 s).
TEXT_BODY_BYTES = 2 * MiB
TEI_PATHS = {"/embed", "/rerank", "/predict", "/tokenize", "/", "/info", "/health"}
OPS_PATHS = {"live": "/healthz", "ready": "/readyz"}
OpsAnswer = Callable[[str], tuple[int, str, bytes]]
Describe = Callable[[], Mapping[str, ModelState]]
Unready = Callable[[str], str | None]  # why a served model is not ready, or None


@dataclass
class Reply:
    """A response to write: its status, body and headers; ``close`` ends the connection after it."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False
    refused: tuple[str, ErrorCode, str] | None = None  # an inference answered here: model ("": unknown), code, route


@dataclass(frozen=True)
class Forward:
    """An inference for the router: the frames to hand it, the API its answer is written in, the
    model it is for, its route's name, the shape of its errors (:func:`error_reply`) and, for a
    text API, how its response body is joined from the parts' shares."""

    frames: list[Any]
    api: str
    model: str
    route: str
    request_id: str
    errors: str = KSERVE
    finish: Finish | None = None


class Routes:
    """The routes over the served models; ``describe`` gives each one's signature and generation
    as the supervisor knows them, ``unready`` why one is not ready, ``ops`` the operations
    routes' answers."""

    def __init__(self, describe: Describe, unready: Unready, ops: OpsAnswer, *, token: bytes | None) -> None:
        self.token = token
        self._describe = describe
        self._unready = unready
        self._ops = ops
        self._views: dict[str, ModelView] = {}
        self._routed: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}  # the paths seen, matched once

    def admit(self, request: Request) -> None:
        """Refuse a head before its body is read: without the token a route needs, or a body
        with no length or in a coding we do not take."""
        try:
            name, _ = self._route(request)
        except Refusal:  # no such route or method: answered so once the request is whole
            return
        if self.token is not None and name not in OPEN_ROUTES:
            self._authenticate(request)
        if name not in BODY_ROUTES:
            return
        if name in TEXT_ROUTES:
            _check_text_body(request.content_length or 0)
        if request.content_length is None and not request.chunked:
            raise Refusal(411, "a request body needs Content-Length (or chunked transfer encoding)")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise Refusal(415, f"Content-Encoding {encoding[:100]} is not taken: send the body as it is")

    def answer(self, request: Request, request_id: str) -> Reply | Forward:
        """What to do with a whole request, known as ``request_id``: a response to write, or an
        inference to forward. An inference refused here carries its model, code and route, for
        the count of answers."""
        name = None
        try:
            name, match = self._route(request)
            if self.token is not None and name not in OPEN_ROUTES:
                self._authenticate(request)
            decision = self._handle(name, match, request, request_id)
        except Refusal as exc:
            decision = error_reply(exc.status, exc.message, errors_of(request.path), exc.headers, request_id)
            if name in BODY_ROUTES and exc.status != 401:
                decision.refused = (UNKNOWN_MODEL, _code_of(exc.status), name)
        return decision

    def answer_forwarded(self, forward: Forward, frames: list[Any]) -> Reply:
        """The response to an inference, from the router's reply frames."""
        try:
            reply = read_reply(frames)
        except protocol.ProtocolError as exc:
            return error_reply(500, f"internal: a malformed reply from a worker: {exc}", forward.errors,
                               request_id=forward.request_id)
        if reply.code is not None:
            return code_reply(reply, forward.errors, forward.request_id)
        if forward.finish is not None:
            return Reply(200, forward.finish(reply.bodies, reply.tokens))
        headers = {} if reply.head is None else {"Inference-Header-Content-Length": str(reply.head)}
        return Reply(200, reply.bodies[0], reply.content_type, headers)

    def _route(self, request: Request) -> tuple[str, dict[str, str]]:
        key = (request.method, request.path)
        found = self._routed.get(key)
        if found is None:
            found = _route(request)  # raises for no route: those are not kept
            if len(self._routed) >= MAX_ROUTES_KEPT:
                self._routed.clear()
            self._routed[key] = found
        return found

    def _handle(self, name: str, match: dict[str, str], request: Request, request_id: str) -> Reply | Forward:
        if name in OPS_PATHS or name == "ops":
            return _ops_reply(self._ops(OPS_PATHS.get(name, request.path)))
        if name == "server":
            return _json({"name": "workerpool", "version": __version__, "extensions": kserve.EXTENSIONS})
        states = self._describe()
        if name == "models":
            return _json({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "workerpool"}
                                                     for model in states]})
        if name == "repository":
            return _json([{"name": model, "version": str(state.generation),
                           "state": "UNAVAILABLE" if self._unready(model) else "READY",
                           "reason": self._unready(model) or ""} for model, state in states.items()])
        if name in TEXT_ROUTES:
            return self._texts(name, request, states, request_id)
        if name == "health":
            return _ops_reply(self._ops("/readyz"))
        if name == "info":
            return _json(tei.info(self._chosen(states, None, None, "/info"), protocol.MAX_TEXTS))
        view = self._resolve(states, match["name"], match.get("version"))
        if name == "model":
            return _json(kserve.model_metadata(view))
        if name == "model_config":
            return _json(kserve.model_config(view))
        if name == "model_ready":
            unready = self._unready(view.name)
            return _ops_reply((503, "text/plain; charset=utf-8", f"{unready}\n".encode()) if unready
                              else (200, "text/plain; charset=utf-8", b"ready\n"))
        frames = request_frames(request_id, KSERVE, view.name, request.body, head=_header_length(request),
                                deadline=_timeout_header(request))
        return Forward(frames, KSERVE, view.name, name, request_id)

    def _texts(self, route: str, request: Request, states: Mapping[str, ModelState],
               request_id: str) -> Forward | Reply:
        """A text API's request: its body read here, its texts handed on as a request of texts."""
        deadline = _timeout_header(request)
        errors = errors_of(request.path)
        _check_text_body(len(request.body))  # a chunked body, whose length its head did not say
        named: Any = None
        try:
            document, named = openai.requested_model(request.body)
            view = self._chosen(states, named, TEXT_ROUTES[route], request.path)
            named = view.name
            texts = _read_texts(route, view, document)
            api = OPENAI if route == "embeddings" else TEXTS
            frames = text_request_frames(request_id, api, named, texts.texts, deadline=deadline, **texts.options)
        except RemoteError as exc:
            code = ErrorCode.read(exc.code.encode())
            refused = error_reply(_status_of(code, errors, door=True), exc.message, errors, request_id=request_id)
            refused.refused = (named if isinstance(named, str) and named in states else UNKNOWN_MODEL, code, route)
            return refused
        return Forward(frames, api, named, route, request_id, errors, texts.finish)

    def _chosen(self, states: Mapping[str, ModelState], named: Any, task: str | None, path: str) -> ModelView:
        """The model a text API's request is for: the one it names, else the only one served;
        on TEI's routes, which name none, else the only one that has the route's ``task`` (None:
        any model of texts; for ``/predict``, a classifier of several labels before a
        cross-encoder)."""
        if named is None and len(states) == 1:
            named = next(iter(states))
        elif named is None and path in TEI_PATHS:
            fitting = [name for name, state in states.items() if _has_task(state.signature, task)]
            if task == CLASSIFY and len(fitting) > 1:
                fitting = [name for name in fitting if len(states[name].signature.get("labels") or ()) > 1]
            named = fitting[0] if len(fitting) == 1 else None
        if not isinstance(named, str) or named not in states:
            listed = ", ".join(map(repr, states))
            hint = " (GET /v2/models/NAME describes each)" if path == "/info" else \
                " ('model' in the body)" if path in TEI_PATHS else ""
            raise Refusal(404, f"the model {str(named)[:100]!r} does not exist here; this server serves {listed}"
                          if named is not None else f"name a model: this server serves {listed}{hint}")
        return self._view(named, states[named])

    def _view(self, name: str, state: ModelState) -> ModelView:
        view = self._views.get(name)
        if view is None or view.version != state.generation:
            view = self._views[name] = view_of(name, {**state.signature, "model": state.kind}, state.generation,
                                               state.max_batch)
        return view

    def _resolve(self, states: Mapping[str, ModelState], name: str, version: str | None) -> ModelView:
        state = states.get(name)
        if state is None:
            raise Refusal(404, f"no model named {name!r} is served here; this server serves "
                          f"{', '.join(map(repr, states))}")
        view = self._view(name, state)
        if version is not None and version != str(view.version):
            raise Refusal(404, f"model {name!r} serves version {view.version}, not {version!r}")
        return view

    def _authenticate(self, request: Request) -> None:
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        assert self.token is not None
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode("latin-1"), self.token):
            raise Refusal(401, "this server needs Authorization: Bearer TOKEN (--http-token-file)",
                          headers={"WWW-Authenticate": "Bearer"})


def _route(request: Request) -> tuple[str, dict[str, str]]:
    allowed = []
    for pattern, method, name in ROUTES:
        found = pattern.match(request.path)
        if found is not None:
            if request.method == method or (method == "GET" and request.method == "HEAD"):
                return name, {k: v for k, v in found.groupdict().items() if v is not None}
            allowed.append(method)
    if allowed:
        raise Refusal(405, f"{request.path[:200]} takes {' or '.join(allowed)}, not {request.method}",
                      headers={"Allow": ", ".join(allowed)})
    raise Refusal(404, f"no route {request.path[:200]}: see /v2 (KServe v2), /v1/embeddings and /v1/rerank "
                  "(OpenAI, Cohere, Jina), /embed, /rerank, /predict, /tokenize and /info (TEI), /metrics, "
                  "/healthz and /readyz")


def _header_length(request: Request) -> int | None:
    text = request.headers.get("inference-header-content-length")
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_SIZE_DIGITS):
        raise Refusal(400, f"Inference-Header-Content-Length {text[:40]!r} is not a size")
    return int(text)


def _timeout_header(request: Request) -> float | None:
    text = request.headers.get("timeout")
    if text is None:
        return None
    value = float(text) if SECONDS.fullmatch(text.strip()) else -1.0
    if not (math.isfinite(value) and 0 <= value <= MAX_TIMEOUT_SECONDS):
        raise Refusal(400, f"the Timeout header {text[:40]!r} is not a number of seconds from 0 to "
                      f"{MAX_TIMEOUT_SECONDS:g}")
    return value


def _check_text_body(size: int) -> None:
    """Refuse a text API's body over :data:`TEXT_BODY_BYTES` (the front door parses it)."""
    if size > TEXT_BODY_BYTES:
        raise Refusal(413, f"a body of {size} bytes: the text APIs' bodies are read by the front door, at most "
                      f"{TEXT_BODY_BYTES} bytes: send fewer texts a request")


def _has_task(signature: Mapping[str, Any], task: str | None) -> bool:
    """Whether a model can answer a route of ``task`` (None: any model of texts; ``rerank``: a
    classifier of one label, a cross-encoder)."""
    if task == RERANK:
        return signature.get("task") == CLASSIFY and len(signature.get("labels") or ()) == 1
    return signature.get("task") == task if task is not None else "task" in signature


def _read_texts(route: str, view: ModelView, document: dict[str, Any]) -> TextRequest:
    """A text API's request, read by its route's codec."""
    if route == "embeddings":
        return openai.decode_embeddings(document, view)
    if route in ("rerank_v1", "rerank_v2"):
        return rerank.read(document, view, 1 if route == "rerank_v1" else 2)
    if route == "root":
        route = "predict" if view.task == CLASSIFY else "embed"
    readers = {"embed": tei.read_embed, "rerank": tei.read_rerank, "predict": tei.read_predict,
               "tokenize": tei.read_tokenize}
    return readers[route](document, view)


def errors_of(path: str) -> str:
    """The shape of a path's errors: OpenAI's object on /v1 (Jina's and Cohere's clients read
    its message too), TEI's on TEI's routes, else KServe's ``{"error"}``."""
    if path.startswith("/v1/"):
        return OPENAI
    return TEI if path in TEI_PATHS else KSERVE


def _status_of(code: ErrorCode, errors: str, *, door: bool = False) -> int:
    """The status of an error code on a route: on TEI's, a worker's ``bad_request`` (an input
    it cannot run: over the model's limit, say) is 413 and the door's (a body it cannot read
    as the route needs) 422, as TEI answers them."""
    if errors != TEI or code != ErrorCode.BAD_REQUEST:
        return code.http_status
    return 422 if door else 413


def outcome_of(reply: Reply) -> str:
    """``ok`` or the error code of a response the front door gave itself."""
    if reply.refused is not None:
        return reply.refused[1]
    return "ok" if reply.status < 400 else _code_of(reply.status)


def _code_of(status: int) -> ErrorCode:
    """The error code of a refusal answered with ``status``, for the count of answers by code."""
    return ErrorCode.MODEL_NOT_FOUND if status == 404 else ErrorCode.BAD_REQUEST if status < 500 else ErrorCode.INTERNAL


def code_reply(reply: HttpReply, errors: str, request_id: str | None = None) -> Reply:
    """The response to an error the router or a worker answered with, in the route's shape."""
    code = reply.code or ErrorCode.INTERNAL
    plain = code in (ErrorCode.BAD_REQUEST, ErrorCode.MODEL_NOT_FOUND)
    headers = {"Retry-After": RETRY_AFTER} if code.http_status in (429, 503) else {}
    message = reply.message if plain else f"{code}: {reply.message}"
    answer = error_reply(_status_of(code, errors), message, errors, headers, request_id)
    answer.close = code == ErrorCode.SHUTTING_DOWN  # nothing more on this connection: it races the exit
    return answer


def error_reply(status: int, message: str, errors: str, headers: dict[str, str] | None = None,
                request_id: str | None = None) -> Reply:
    """An error response in the shape of ``errors``: OpenAI's object, TEI's or KServe's, with
    ``request_id`` beside the error, for a client to quote. One whose request body may be left
    unread closes the connection (a TEI 413 is a refusal of a body read whole)."""
    if errors == OPENAI:
        kind = "invalid_request_error" if status < 500 else "server_error"
        code = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}.get(status)
        document = openai.error_object(message, kind, code)
    elif errors == TEI:
        document = tei.error_object(message, status)
    else:
        document = {"error": message}
    if request_id is not None:
        document["request_id"] = request_id
    body = json.dumps(document).encode()
    unread = status in (408, 411, 415) or (status == 413 and errors != TEI)
    return Reply(status, body, headers=dict(headers or {}), close=unread or status >= 505)


def _json(document: Any) -> Reply:
    return Reply(200, json.dumps(document).encode())


def _ops_reply(answer: tuple[int, str, bytes]) -> Reply:
    status, content_type, body = answer
    return Reply(status, body, content_type)
