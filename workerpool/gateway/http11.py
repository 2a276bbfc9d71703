"""HTTP/1.1 framing, socket-free: bytes in, whole requests out; responses to bytes.

Parsing is httptools' (llhttp, the parser Node.js and uvicorn use), which already refuses the
framing attacks that smuggle one request inside another: Content-Length with Transfer-Encoding,
two Content-Lengths, signed or hex lengths, chunk sizes that overflow, bare LF, NUL or CR in a
target, folded headers. What llhttp lets through and a server of ours must still refuse is
checked here: any transfer coding but a single ``chunked``, targets that are not a path
(absolute or asterisk form), HTTP/0.9 and 2.0, and heads or bodies past their limits. Each
refusal closes the connection: once framing is in doubt, no later byte can be trusted to start
a request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

MAX_HEADERS = 100
MAX_FIELD_BYTES = 8190  # a header's name or value, and the target
MAX_HEAD_BYTES = 64 * 1024  # request line and headers together


class Refusal(Exception):
    """A request answered ``status`` without running, and the connection closed after it."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.head: Request | None = None  # the refused request, once its head is read

    @property
    def path(self) -> str | None:
        return None if self.head is None else self.head.path


@dataclass
class Request:
    """One whole request. Header names are lower case; a repeated header's values are joined
    with commas, as RFC 9110 reads them."""

    method: str
    path: str
    headers: dict[str, str]
    keep_alive: bool
    body: bytes = b""
    reserved: int = 0  # bytes of the body counted against the front door's bound while it lives
    http10: bool = False  # HTTP/1.0: keep-alive only when asked for, and said so in the answer

    @property
    def content_length(self) -> int | None:
        text = self.headers.get("content-length")
        return None if text is None else int(text)  # llhttp accepted only digits, and one value

    @property
    def chunked(self) -> bool:
        return "transfer-encoding" in self.headers

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


Admit = Callable[[Request], int]  # a request's head in, the bytes its body may hold out
Grow = Callable[[Request, int], None]  # a chunked body's bytes as they come, counted or refused


@dataclass
class _Partial:
    """The request being read."""

    url: bytearray = field(default_factory=bytearray)
    headers: dict[str, str] = field(default_factory=dict)
    count: int = 0
    head_size: int = 0  # bytes of the target and headers
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    request: Request | None = None


class RequestReader:
    """Reads the requests of one connection, pipelined ones too. ``admit`` is asked about each
    request once its head is read, before its body: it may raise :class:`Refusal` (not allowed,
    too large, no length, over the bytes held at once) or return the bytes to reserve for the
    body; ``grow`` is told of a chunked body's bytes as they come, and may refuse them too.

    A request that asks to upgrade (``Upgrade: h2c``, as ``curl --http2`` sends) is served in
    HTTP/1.1 with the body its Content-Length gives; nothing after it is read, and the
    connection closes after its answer."""

    def __init__(self, max_body: int, admit: Admit, grow: Grow) -> None:
        self.max_body = max_body
        self.admit = admit
        self.grow = grow
        self.ready: deque[Request] = deque()
        self.refusal: Refusal | None = None  # set once: nothing is read after it
        self.upgraded = False  # a request asked to leave HTTP/1.1: it is served, then the connection closes
        self.continue_wanted = False  # a head read asks for "100 Continue" before its body
        self.head_bytes = 0
        self._upgrading: Request | None = None  # an upgrade request whose body is still arriving
        self._partial = _Partial()
        self._parser = httptools.HttpRequestParser(self)

    def feed(self, data: bytes | memoryview) -> None:
        """Parse ``data`` (kept by nothing once this returns: the caller reuses its buffer);
        whole requests go to ``ready``, a refusal to ``refusal``."""
        if self._upgrading is not None:
            self._upgrade_body(data)
            return
        if self.refusal is not None or self.upgraded:
            return
        if self._partial.request is None:  # still in a head: bound what it may take
            self.head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade(data[exc.args[0]:])
        except httptools.HttpParserCallbackError as exc:
            context = exc.__context__
            self.refusal = context if isinstance(context, Refusal) else Refusal(400, f"a malformed request: {context}")
        except httptools.HttpParserError as exc:
            self.refusal = _framing_refusal(exc)
        if self.refusal is not None and self.refusal.head is None:
            self.refusal.head = self._partial.request
        if self.refusal is None and self._partial.request is None and self.head_bytes > MAX_HEAD_BYTES:
            self.refusal = Refusal(400, f"the request's head is over {MAX_HEAD_BYTES} bytes")

    def _upgrade(self, rest: bytes | memoryview) -> None:
        """llhttp stops at an upgrade request's head, its body unread: read it from ``rest``."""
        self.upgraded = True
        request = self.ready.pop()  # llhttp completed it without its body
        if request.chunked:
            self.refusal = Refusal(400, "an Upgrade request with a chunked body is not served")
            self.refusal.head = request
            return
        self._upgrading = request
        self._upgrade_body(rest)

    def _upgrade_body(self, data: bytes | memoryview) -> None:
        request = self._upgrading
        assert request is not None
        wanted = (request.content_length or 0) - len(request.body)
        request.body += data[:wanted]
        if len(request.body) == (request.content_length or 0):
            self._upgrading = None
            self.ready.append(request)

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self._partial = _Partial()

    def on_url(self, url: bytes) -> None:
        self._partial.url += url
        self._partial.head_size += len(url)
        if len(self._partial.url) > MAX_FIELD_BYTES:
            raise Refusal(400, f"the target is over {MAX_FIELD_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        partial = self._partial
        if partial.request is not None:  # a chunked body's trailer: never read as a header
            return
        partial.head_size += len(name) + len(value)
        if partial.head_size > MAX_HEAD_BYTES:
            raise Refusal(400, f"the request's head is over {MAX_HEAD_BYTES} bytes")
        partial.count += 1
        if partial.count > MAX_HEADERS:
            raise Refusal(400, f"more than {MAX_HEADERS} headers")
        if len(name) > MAX_FIELD_BYTES or len(value) > MAX_FIELD_BYTES:
            raise Refusal(400, f"a header over {MAX_FIELD_BYTES} bytes")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        partial.headers[key] = f"{partial.headers[key]}, {text}" if key in partial.headers else text

    def on_headers_complete(self) -> None:
        parser, partial = self._parser, self._partial
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise Refusal(505, f"HTTP/{version} is not served here: speak HTTP/1.1")
        target = partial.url.decode("latin-1")
        if not target.startswith("/"):
            raise Refusal(400, f"the target {target[:100]!r} is not a path (absolute and asterisk forms are not served)")
        coding = partial.headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise Refusal(501, f"Transfer-Encoding {coding[:100]!r} is not served: send chunked, or Content-Length")
        request = Request(parser.get_method().decode("ascii"), target.partition("?")[0], partial.headers,
                          parser.should_keep_alive(), http10=version == "1.0")
        try:
            if request.content_length is not None and request.content_length > self.max_body:
                raise _too_large(request.content_length, self.max_body)
            request.reserved = self.admit(request)
        except Refusal as exc:
            exc.head = request
            raise
        partial.request = request
        self.continue_wanted = request.has_body and request.headers.get("expect", "").lower() == "100-continue"

    def on_body(self, data: bytes) -> None:
        partial = self._partial
        partial.size += len(data)
        if partial.size > self.max_body:
            raise _too_large(partial.size, self.max_body)
        if partial.request is not None and partial.request.chunked:
            self.grow(partial.request, len(data))
        partial.body.append(data)

    def on_message_complete(self) -> None:
        partial = self._partial
        request = partial.request
        assert request is not None
        request.body = b"".join(partial.body)
        self.ready.append(request)
        self._partial = _Partial()
        self.head_bytes = 0
        self.continue_wanted = False  # the body came: no "100 Continue" is owed any more

    @property
    def partial(self) -> Request | None:
        """The request whose head is read and whose body is still arriving."""
        return self._partial.request

    @property
    def in_body(self) -> bool:
        """Whether a request's head is read and its body is still arriving."""
        return self._partial.request is not None


def _too_large(size: int, limit: int) -> Refusal:
    return Refusal(413, f"the request body is {size} bytes, over the {limit}-byte limit (--max-message-size)")


def _framing_refusal(exc: Exception) -> Refusal:
    text = str(exc)
    if "PRI" in text:  # the HTTP/2 preface
        return Refusal(505, "HTTP/2 is not served here: speak HTTP/1.1")
    return Refusal(400, f"a malformed request: {text}")


def response(status: int, body: bytes, *, content_type: str = "application/json",
             headers: dict[str, str] | None = None, close: bool = False) -> bytes:
    """A whole HTTP/1.1 response, head and body joined (a refusal written once)."""
    return response_head(status, len(body), content_type=content_type, headers=headers, close=close) + body


def response_head(status: int, length: int, *, content_type: str = "application/json",
                  headers: dict[str, str] | None = None, close: bool = False,
                  keep_alive_said: bool = False) -> bytes:
    """The head of an HTTP/1.1 response whose body is ``length`` bytes (a HEAD request's too,
    whose body is not sent); ``keep_alive_said``: an HTTP/1.0 client that asked to keep the
    connection is told it is kept."""
    lines = [f"HTTP/1.1 {status} {_reason(status)}", f"Content-Type: {content_type}", f"Content-Length: {length}"]
    lines.extend(f"{name}: {value}" for name, value in (headers or {}).items() if name != "Connection")
    if close:
        lines.append("Connection: close")
    elif keep_alive_said:
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
