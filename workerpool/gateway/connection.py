"""One HTTP connection of the front door: its reader, the request being answered, and what
waits to be written (``server.py`` accepts connections and holds what they share).

Requests on one connection are answered one at a time, in order, so pipelined requests get
their answers in the order sent and no answer carries another's bytes; at most
``ANSWERS_PER_TURN`` of them before the loop serves the others. A connection that does not
read its answers, or pipelines more than ``MAX_PIPELINED`` requests ahead, is not read from
until it catches up. TLS is the standard library's, driven without blocking.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..events.loop import Loop
from ..logs import AccessLog, Ran, RequestIds
from ..router.core import Router
from .http11 import CONTINUE, Request, RequestReader, response_head
from .output import Output
from .routes import Forward, Reply, Routes, error_reply, errors_of, outcome_of

log = logging.getLogger(__name__)

RECEIVE_BYTES = 64 * 1024
READ_PER_TURN = 1024 * 1024  # bytes read from one connection before the loop serves others
MAX_PIPELINED = 128  # requests read ahead of their answers before the connection is paused
ANSWERS_PER_TURN = 32  # answered on one connection before the loop serves others
OUTPUT_HIGH = 256 * 1024  # bytes of answers waiting for a client before it is no longer read


def _closing_on_failure(handle: Callable[..., None]) -> Callable[..., None]:
    """An entry point of a connection: a failure of ours is logged and closes that connection
    alone, never the loop every other client and worker depends on."""
    @functools.wraps(handle)
    def guarded(connection: Connection, *args: Any) -> None:
        try:
            handle(connection, *args)
        except OSError as exc:  # the connection's own failure (reset, broken pipe): it goes
            log.debug("an HTTP connection failed: %s; closing it", exc)
            connection.close()
        except Exception:
            log.exception("an HTTP connection failed; closing it")
            connection.close()
    return guarded


@dataclass(frozen=True)
class FrontSettings:
    """What the front door is started with (``serve``'s options)."""

    max_body: int  # bytes; a larger request body is answered 413 before it is read
    max_buffered: int  # bytes of request bodies held at once, over every connection
    max_connections: int
    max_refused: int  # connections past max_connections that may wait for their 503 to be read
    client_timeout: float  # --http-timeout
    tls: Any = None  # an ssl.SSLContext, or None for plain HTTP


class Front(Protocol):
    """What a connection needs of the server that accepted it (``server.HttpServer``): its
    loop and settings, the routes and the router a request goes to, the connections and body
    bytes it holds (``reserve``, ``grow``), and whether it drains."""

    loop: Loop
    settings: FrontSettings
    routes: Routes
    router: Router
    connections: dict[bytes, Connection]
    buffered: int
    would_block: tuple[type[Exception], ...]
    receive_buffer: memoryview  # every connection reads here first: what it reads is parsed at once
    request_ids: RequestIds  # for requests that bring no X-Request-Id
    access: AccessLog

    @property
    def draining(self) -> bool: ...

    def linger(self, sock: socket.socket) -> None: ...

    def reserve(self, request: Request) -> int: ...

    def grow(self, request: Request, size: int) -> None: ...


class Connection:
    """One client connection: its reader, the request being answered and what waits to be written."""

    def __init__(self, server: Front, sock: socket.socket, key: bytes) -> None:
        self.server = server
        self.key = key
        self.reader = RequestReader(server.settings.max_body, server.reserve, server.grow)
        self.output = Output()
        self.current: Request | None = None  # being answered
        self.forwarded: Forward | None = None  # its inference, at the router
        self.request_id = ""  # the current request's (its X-Request-Id, else made)
        self.closing = False  # close once the output is written
        self.ended = False  # the client sent all it will send
        self.closed = False
        self.reading = True
        self.handshaking = server.settings.tls is not None
        self.deadline: float | None = time.monotonic() + server.settings.client_timeout
        self._progressing = False
        self.socket = sock
        if self.handshaking:
            self.socket = server.settings.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        server.loop.read(self.socket, self.on_readable)
        if self.handshaking:
            self._handshake()

    # Reading

    @_closing_on_failure
    def on_readable(self) -> None:
        if self.handshaking:
            self._handshake()
            return
        read = 0
        while read < READ_PER_TURN or self._tls_pending():
            data = self._receive()
            if data is None:
                break
            if not data:
                self.ended = True
                break
            read += len(data)
            in_body = self.reader.in_body
            self.reader.feed(data)
            if (in_body or self.reader.in_body) and self.current is None:  # a body that moves may wait again
                self.deadline = time.monotonic() + self.server.settings.client_timeout
            if self.reader.refusal is not None or self.reader.upgraded or len(self.reader.ready) >= MAX_PIPELINED:
                break
        self._progress()

    def _tls_pending(self) -> bool:
        """Whether TLS holds decrypted bytes the poll cannot see."""
        pending = getattr(self.socket, "pending", None)
        return pending is not None and pending() > 0

    def _receive(self) -> memoryview | bytes | None:
        """Bytes the client sent, empty when it is done sending, None when none are waiting."""
        buffer = self.server.receive_buffer
        try:
            return buffer[:self.socket.recv_into(buffer)]  # read before the next connection's bytes replace them
        except self.server.would_block:
            return None
        except OSError:  # reset, or a TLS record that does not decrypt
            self.closing = True
            self.output.clear()
            return b""

    def _handshake(self) -> None:
        import ssl

        try:
            self.socket.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self.server.loop.write(self.socket, None)
            return
        except ssl.SSLWantWriteError:
            self.server.loop.write(self.socket, self.on_writable)
            return
        except OSError as exc:  # ssl.SSLError too: not TLS, or a certificate it refuses
            log.debug("an HTTPS connection failed its handshake: %s", exc)
            self.close()
            return
        self.handshaking = False
        self.server.loop.write(self.socket, None)

    # Answering

    def _progress(self) -> None:
        """Answer what is ready, in order, one at a time; then write, and read on or pause."""
        if self._progressing or self.closed:
            return
        self._progressing = True
        try:
            reader, answered = self.reader, 0
            while self.current is None and not self.closing:
                if answered == ANSWERS_PER_TURN or len(self.output) > OUTPUT_HIGH:
                    break  # the rest once this is written: the loop serves the others meanwhile
                answered += 1
                if reader.ready:
                    self._answer(reader.ready.popleft())
                elif reader.refusal is not None:
                    refusal = reader.refusal
                    head = refusal.head
                    self.request_id = self._id_for(head)
                    self._respond(error_reply(refusal.status, refusal.message, errors_of(refusal.path or ""),
                                              refusal.headers, self.request_id),
                                  close=True, head=head)
                elif self.ended or reader.upgraded:
                    self.closing = True
                else:
                    break
        finally:
            self._progressing = False
        self.flush()
        if not self.closed:
            self._read_or_pause()

    def _answer(self, request: Request) -> None:
        self.current = request
        self.deadline = None
        self.request_id = self._id_for(request)
        decision = self.server.routes.answer(request, self.request_id)
        if isinstance(decision, Reply):
            if decision.refused is not None:
                self.server.router.intake.refused_at_door(*decision.refused)
            self._respond(decision)
            return
        self.forwarded = decision
        self.server.router.admit_local(self.key, decision.frames, sum(len(frame) for frame in decision.frames),
                                       decision.route)

    @_closing_on_failure
    def replied(self, frames: list[Any], ran: Ran | None) -> None:
        """The router's answer to the inference this connection forwarded, and what it
        measured of it."""
        forwarded = self.forwarded
        if forwarded is None:
            return
        self.forwarded = None
        self._respond(self.server.routes.answer_forwarded(forwarded, frames), ran=ran, model=forwarded.model)
        self._progress()

    def _respond(self, reply: Reply, *, close: bool = False, ran: Ran | None = None, model: str = "",
                 head: Request | None = None) -> None:
        """Queue ``reply`` to the current request (None: one refused unread, of which ``head``
        may have been read), with its request id, and write its access line (``ran``: what the
        router measured of an inference)."""
        request, self.current = self.current, None
        close = close or reply.close or request is None or not request.keep_alive or self.reader.upgraded \
            or self.server.draining
        if request is not None:
            self._release(request)
        response = response_head(reply.status, len(reply.body), content_type=reply.content_type,
                                 headers={**reply.headers, "X-Request-Id": self.request_id},
                                 close=close, keep_alive_said=request is not None and request.http10)
        body = b"" if request is not None and request.method == "HEAD" else reply.body
        self.output.add(response, body)
        self.closing = self.closing or close
        self.deadline = time.monotonic() + self.server.settings.client_timeout  # for the next head
        access = self.server.access
        if access.wanted(reply.status >= 400):
            ran = ran or Ran(outcome_of(reply))
            if not model and reply.refused is not None:
                model = reply.refused[0]
            shown = request or head
            access.write("http", _shown(shown), model=model, status=reply.status, ran=ran,
                         size_in=len(request.body) if request is not None else 0, size_out=len(body),
                         request_id=self.request_id)

    def _id_for(self, request: Request | None) -> str:
        """The id of ``request`` (None: one refused before its head was read): its
        X-Request-Id when that is a fit id, else one made."""
        return self.server.request_ids.chosen(request.headers.get("x-request-id") if request else None)

    def _release(self, request: Request) -> None:
        self.server.buffered -= request.reserved
        request.reserved = 0

    # Writing

    def flush(self) -> None:
        """Write what waits; the loop calls back when the client can take more."""
        if self.closed:
            return
        if self.reader.continue_wanted and self.current is None and not self.reader.ready:
            self.reader.continue_wanted = False  # owed once every earlier request is answered
            self.output.add(CONTINUE)
        while self.output:
            try:
                self.output.write(self.socket)
            except self.server.would_block:
                break
            except OSError:
                self.close()
                return
            self.deadline = None if self.forwarded else time.monotonic() + self.server.settings.client_timeout
        if self.output or (self.reader.ready and self.current is None and not self.closing):
            self.server.loop.write(self.socket, self.on_writable)  # more to write, or to answer next turn
            return
        self.server.loop.write(self.socket, None)
        if self.closing and self.current is None:
            self.close(linger=True)

    @_closing_on_failure
    def on_writable(self) -> None:
        if self.handshaking:
            self._handshake()
        else:
            self.flush()
            self._progress()  # answers left for this turn, and reading again

    def _read_or_pause(self) -> None:
        wanted = not (self.closing or self.ended or len(self.output) > OUTPUT_HIGH
                      or len(self.reader.ready) >= MAX_PIPELINED)
        if wanted != self.reading:
            self.reading = wanted
            if wanted:
                self.server.loop.read(self.socket, self.on_readable)
            else:
                self.server.loop.pause(self.socket)

    def timed_out(self) -> None:
        if self.reader.in_body and self.current is None and not self.output:
            timeout = self.server.settings.client_timeout
            head = self.reader.partial
            self.request_id = self._id_for(head)
            self._respond(error_reply(408, f"the request body stopped arriving for {timeout:g}s (--http-timeout)",
                                      errors_of(head.path if head else ""), request_id=self.request_id),
                          close=True, head=head)
            self.flush()
        if not self.closed:
            self.close()

    def close(self, *, linger: bool = False) -> None:
        """Close now, or with ``linger`` once the client has read the last answer (see
        :meth:`HttpServer.linger`)."""
        if self.closed:
            return
        self.closed = True
        for request in [*self.reader.ready, *([self.current] if self.current else [])]:
            self._release(request)
        partial = self.reader.partial
        if partial is not None:
            self._release(partial)
        self.server.loop.forget(self.socket)
        self.server.connections.pop(self.key, None)
        if linger:
            self.server.linger(self.socket)
            return
        _discard_input(self.socket)
        self.socket.close()


def _shown(request: Request | None) -> str:
    """A request's method and path as an access line shows them: at most 200 characters, any
    that is not visible ASCII as ``?`` (a log line carries no byte a client chose to break it)."""
    if request is None:
        return "-"
    text = f"{request.method} {request.path[:200]}"
    return text if text.isascii() and text.isprintable() else "".join(
        c if c.isascii() and c.isprintable() else "?" for c in text)


def _discard_input(sock: socket.socket) -> None:
    """Read and drop what the client sent that was not read (a little at most): closing a
    socket with unread input resets the connection, and the client could lose its answer."""
    for _ in range(4):
        try:
            if not socket.socket.recv(sock, RECEIVE_BYTES):  # past TLS: the bytes as they arrived
                return
        except OSError:
            return


