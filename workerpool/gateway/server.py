"""The HTTP front door's server: aiohttp's low-level server, its routes, and the limits that
keep a client from costing more than its share.

- Routes: the Open Inference Protocol's (``/v2/...``), OpenAI's ``/v1/embeddings`` and
  ``/v1/models``, and the operations endpoint's (``/metrics``, ``/healthz``, ``/readyz``).
- Limits: at most ``max_connections`` connections (more are answered 503); aiohttp's
  own on the request line and on headers (count and size, answered 400); a request's head must
  arrive within the client timeout (``--http-timeout``), and an idle connection is closed after
  it; a body over ``max_body`` is answered 413 before it is read; a body may not pause longer
  than the client timeout (408); the bodies held at once are bounded in bytes (503 past that).
- With a token file, every route but the probes and ``/metrics`` needs ``Authorization:
  Bearer TOKEN``, compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import __version__
from ..errors import BadRequest, RemoteError, ShuttingDown
from ..logs import Throttle
from . import kserve, openai
from .dataplane import DataPlane, ModelNotFound
from .ops import OpsRoutes
from .upstream import NoReply

log = logging.getLogger(__name__)

MAX_HEADERS = 100
MAX_FIELD_BYTES = 8190
RETRY_AFTER = "1"
WARN_INTERVAL = 10.0  # seconds between warnings about refused connections
REFUSED_LINGER = 1.0  # seconds a refused connection is read from before it is closed
STATUS_OF_CODE = {"bad_request": 400, "overloaded": 429, "deadline_exceeded": 504,
                  "request_timeout": 504, "shutting_down": 503, "worker_failed": 500, "internal": 500}
MODEL = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
ROUTES = [(re.compile(pattern + "$"), method, name) for pattern, method, name in [
    (r"/v2/health/live", "GET", "live"), (r"/v2/health/ready", "GET", "ready"),
    (r"/v2", "GET", "server"), (MODEL, "GET", "model"), (MODEL + "/ready", "GET", "model_ready"),
    (MODEL + "/infer", "POST", "infer"), (r"/v1/embeddings", "POST", "embeddings"),
    (r"/v1/models", "GET", "models"),
    (r"/metrics", "GET", "ops"), (r"/healthz", "GET", "ops"), (r"/readyz", "GET", "ops"),
]]
OPEN_ROUTES = {"live", "ready", "ops"}  # probes and metrics need no token


class HttpError(Exception):
    """An answer other than 200, with its status and message."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Gateway:
    """The routes over one data plane."""

    def __init__(self, plane: DataPlane, ops: OpsRoutes, *, max_body: int, max_buffered: int,
                 token: bytes | None, client_timeout: float) -> None:
        self.plane = plane
        self.client_timeout = client_timeout
        self.ops = ops
        self.max_body = max_body
        self.max_buffered = max_buffered
        self.buffered = 0
        self.token = token
        self._handlers: dict[str, Callable[[web.BaseRequest, dict[str, str]], Awaitable[web.StreamResponse]]] = {
            "live": lambda r, m: self.ops.get("/healthz"), "ready": lambda r, m: self.ops.get("/readyz"),
            "ops": lambda r, m: self.ops.get(r.path), "server": self._server, "model": self._model,
            "model_ready": self._model_ready, "infer": self._infer, "embeddings": self._embeddings,
            "models": self._models,
        }

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        openai_route = request.path.startswith("/v1/")
        try:
            name, match = self._route(request)
            if self.token is not None and name not in OPEN_ROUTES:
                self._authenticate(request)
            return await self._handlers[name](request, match)
        except HttpError as exc:
            return _error(exc, openai_route)
        except BadRequest as exc:
            return _error(HttpError(400, exc.message), openai_route)
        except ModelNotFound as exc:
            return _error(HttpError(404, str(exc)), openai_route)
        except RemoteError as exc:
            status = STATUS_OF_CODE.get(exc.code, 500)
            headers = {"Retry-After": RETRY_AFTER} if status in (429, 503) else None
            if isinstance(exc, ShuttingDown):  # nothing more on this connection: it races the exit
                headers = {**(headers or {}), "Connection": "close"}
            return _error(HttpError(status, f"{exc.code}: {exc.message}", headers=headers), openai_route)
        except NoReply as exc:
            return _error(HttpError(503, str(exc), headers={"Retry-After": RETRY_AFTER}), openai_route)

    def _route(self, request: web.BaseRequest) -> tuple[str, dict[str, str]]:
        allowed = []
        for pattern, method, name in ROUTES:
            found = pattern.match(request.path)
            if found is not None:
                if request.method == method or (method == "GET" and request.method == "HEAD"):
                    return name, {k: v for k, v in found.groupdict().items() if v is not None}
                allowed.append(method)
        if allowed:
            raise HttpError(405, f"{request.path} takes {' or '.join(allowed)}, not {request.method}",
                            headers={"Allow": ", ".join(allowed)})
        raise HttpError(404, f"no route {request.path}: see /v2 (KServe v2), /v1/embeddings, "
                        "/metrics, /healthz and /readyz")

    def _authenticate(self, request: web.BaseRequest) -> None:
        given = request.headers.get("Authorization", "")
        scheme, _, credential = given.partition(" ")
        assert self.token is not None
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), self.token):
            raise HttpError(401, "this server needs Authorization: Bearer TOKEN (--http-token-file)",
                            headers={"WWW-Authenticate": "Bearer"})

    async def _server(self, request: web.BaseRequest, match: dict[str, str]) -> web.Response:
        return _json({"name": "workerpool", "version": __version__, "extensions": kserve.EXTENSIONS})

    async def _model(self, request: web.BaseRequest, match: dict[str, str]) -> web.Response:
        view = self.plane.resolve(match["name"], match.get("version"))
        return _json(kserve.model_metadata(view))

    async def _model_ready(self, request: web.BaseRequest, match: dict[str, str]) -> web.Response:
        self.plane.resolve(match["name"], match.get("version"))
        return await self.ops.get("/readyz")

    async def _models(self, request: web.BaseRequest, match: dict[str, str]) -> web.Response:
        return _json({"object": "list", "data": [{"id": self.plane.model_name, "object": "model",
                                                  "owned_by": "workerpool"}]})

    async def _infer(self, request: web.BaseRequest, match: dict[str, str]) -> web.Response:
        view = self.plane.resolve(match["name"], match.get("version"))
        async with self._body(request) as body:
            decoded = kserve.decode_infer(body, _header_length(request), view)
        deadline = _earliest(_timeout_header(request), decoded.timeout)
        answer = await self.plane.infer(_lane(request), view, decoded.inputs, deadline=deadline)
        data, head = kserve.encode_infer(decoded, view, answer)
        if head is None:
            return web.Response(body=data, content_type="application/json")
        return web.Response(body=data, content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(head)})

    async def _embeddings(self, request: web.BaseRequest, match: dict[str, str]) -> web.Response:
        view = self.plane.model()
        async with self._body(request) as body:
            texts, encoding = openai.decode_embeddings(body, view)
        answer = await self.plane.infer(_lane(request), view, texts, deadline=_timeout_header(request))
        return web.Response(body=openai.encode_embeddings(view, answer, encoding), content_type="application/json")

    def _body(self, request: web.BaseRequest) -> _Body:
        return _Body(self, request)


class _Body:
    """A request's body, read within the limits and counted against the bytes held at once
    while the ``async with`` lasts."""

    def __init__(self, gateway: Gateway, request: web.BaseRequest) -> None:
        self.gateway, self.request, self.held = gateway, request, 0

    async def __aenter__(self) -> bytes:
        gateway, request = self.gateway, self.request
        length = request.content_length
        chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        if length is None and not chunked:
            raise HttpError(411, "a request body needs Content-Length (or chunked transfer encoding)")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            raise HttpError(415, f"Content-Encoding {encoding} is not taken: send the body as it is",
                            headers={"Connection": "close"})
        if length is not None and length > gateway.max_body:
            raise _too_large(length, gateway.max_body)
        self.held = length if length is not None else gateway.max_body
        if gateway.buffered + self.held > gateway.max_buffered:
            self.held = 0
            raise HttpError(503, "the server holds as many request bodies as it may; retry later",
                            headers={"Retry-After": RETRY_AFTER})
        gateway.buffered += self.held
        try:
            if request.headers.get("Expect", "").lower() == "100-continue":  # the client waits for this
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return await (self._read_exactly(length) if length is not None else self._read_chunked())
        except BaseException:  # no __aexit__ follows a failed __aenter__
            await self.__aexit__()
            raise

    async def _read_exactly(self, length: int) -> bytes:
        parts, left = [], length
        while left:
            part = await self._next(left)
            if not part:
                raise HttpError(400, "the request body ended before its Content-Length")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    async def _read_chunked(self) -> bytes:
        parts, size = [], 0
        while part := await self._next(self.gateway.max_body + 1 - size):
            parts.append(part)
            size += len(part)
            if size > self.gateway.max_body:
                raise _too_large(size, self.gateway.max_body)
        return b"".join(parts)

    async def _next(self, most: int) -> bytes:
        pause = self.gateway.client_timeout
        try:
            async with asyncio.timeout(pause):
                part = await self.request.content.read(most)
        except TimeoutError:
            raise HttpError(408, f"the request body stopped arriving for {pause:g}s (--http-timeout)",
                            headers={"Connection": "close"}) from None
        except (ConnectionError, aiohttp.ClientError, HttpProcessingError):  # gone, or a broken chunk
            raise HttpError(400, "the request body did not arrive whole", headers={"Connection": "close"}) from None
        return part

    async def __aexit__(self, *exc_info: object) -> None:
        self.gateway.buffered -= self.held
        self.held = 0


def _too_large(size: int, limit: int) -> HttpError:
    return HttpError(413, f"the request body is {size} bytes, over the {limit}-byte limit "
                     "(--max-message-size)", headers={"Connection": "close"})


def _lane(request: web.BaseRequest) -> bytes:
    """The connection the request came on: a client of its own to the router."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return repr(peer).encode()[:64]


def _header_length(request: web.BaseRequest) -> int | None:
    text = request.headers.get("Inference-Header-Content-Length")
    if text is None:
        return None
    if not text.isdigit():
        raise BadRequest(f"Inference-Header-Content-Length {text!r} is not a size")
    return int(text)


def _timeout_header(request: web.BaseRequest) -> float | None:
    text = request.headers.get("Timeout")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise BadRequest(f"the Timeout header {text!r} is not a number of seconds >= 0")
    return value


def _earliest(*timeouts: float | None) -> float | None:
    given = [t for t in timeouts if t is not None]
    return min(given) if given else None


def _json(document: Any) -> web.Response:
    return web.Response(body=json.dumps(document).encode(), content_type="application/json")


def _error(exc: HttpError, openai_route: bool) -> web.Response:
    if openai_route:
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        code = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}.get(exc.status)
        body = openai.error_body(exc.message, kind, code)
    else:
        body = json.dumps({"error": exc.message}).encode()
    response = web.Response(status=exc.status, body=body, content_type="application/json", headers=exc.headers)
    if exc.headers.get("Connection") == "close":  # its body unread, or the server going: no more on it
        response.force_close()
    return response


class _Refused(asyncio.Protocol):
    """A connection past the cap, answered 503 before aiohttp sees it. What the client sends
    is read and dropped until it closes, or for ``REFUSED_LINGER`` seconds: closing with its
    request unread would reset the connection, and the client could lose the answer. At most
    ``most`` linger at once (the descriptors left past the cap); past that a refused connection
    is closed once answered."""

    def __init__(self, answer: bytes, lingering: set[_Refused], most: int) -> None:
        self.answer = answer
        self.lingering = lingering
        self.most = most
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:  # uvloop's transports are no asyncio subclasses
        transport.write(self.answer)
        if len(self.lingering) >= self.most or not transport.can_write_eof():
            transport.close()
            return
        self.lingering.add(self)
        self.transport = transport
        transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSED_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lingering.discard(self)


class CappedServer(web.Server):
    """aiohttp's low-level server, answering connections past ``max_connections`` 503 as they arrive."""

    def __init__(self, handler: Any, *, max_connections: int, max_refused: int, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections
        self.max_refused = max_refused
        self.refused = 0
        self.lingering: set[_Refused] = set()
        self._warnings = Throttle(WARN_INTERVAL)

    def __call__(self) -> Any:
        if len(self.connections) < self.max_connections:
            return super().__call__()
        self.refused += 1
        if self._warnings.due():
            log.warning("%d HTTP connections open, at --max-connections: answering new ones 503 "
                        "(%d so far)", len(self.connections), self.refused)
        message = (f"{len(self.connections)} HTTP connections are open, at the server's "
                   f"--max-connections {self.max_connections}")
        answer = _plain_answer(503, "Service Unavailable", json.dumps({"error": message}).encode())
        return _Refused(answer, self.lingering, self.max_refused)


def _plain_answer(status: int, reason: str, body: bytes) -> bytes:
    """A whole HTTP/1.1 response that closes its connection, written without aiohttp."""
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Retry-After: {RETRY_AFTER}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class _QuietClientErrors(logging.Filter):
    """aiohttp logs each request its parser refuses (answered 400) with a traceback; a client's
    garbage is worth one line at debug level, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Error handling request"):
            log.debug("a malformed HTTP request was refused: %s", record.exc_info[1] if record.exc_info else "")
            return False
        return True


def make_server(gateway: Gateway, max_connections: int, max_refused: int) -> CappedServer:
    server_log = logging.getLogger("workerpool.gateway.aiohttp")
    server_log.addFilter(_QuietClientErrors())
    return CappedServer(gateway.handle, max_connections=max_connections, max_refused=max_refused,
                        keepalive_timeout=gateway.client_timeout,
                        max_headers=MAX_HEADERS, max_field_size=MAX_FIELD_BYTES,
                        max_line_size=MAX_FIELD_BYTES, access_log=None, logger=server_log,
                        auto_decompress=False)
