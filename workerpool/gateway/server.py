"""The HTTP front door's sockets, on the supervisor's own poll loop: no thread, no asyncio.

The listening socket and every connection are sources of the loop beside the router's ZeroMQ
sockets. A connection's bytes go to its :class:`~.http11.RequestReader`; each whole request is
answered by :class:`~.routes.Routes`, at once or by handing it to the router's intake as a client
of its own (a lane: the intake's local key and the connection's number), whose reply the intake
passes back here. Requests on one connection are answered one at a time, in order, so pipelined
requests get their answers in the order sent, and no answer carries another's bytes.

Limits, each with its answer:

- At most ``max_connections`` connections; one more is answered 503 as it arrives (plain HTTP;
  over TLS it is closed), then read from and dropped until it closes or for ``REFUSED_LINGER``
  seconds, so that its client reads the answer instead of a reset. At most ``max_refused``
  linger at once; past that a refused connection is closed once answered.
- A request's head must arrive within the client timeout (``--http-timeout``) of its first
  byte, or of the connection's last answer (an idle keep-alive connection is closed then); a
  body may not pause longer than that (408); a reply the client does not read for that long
  closes its connection.
- The bytes of request bodies held at once are bounded (503 past it), and a connection that
  does not read its replies, or pipelines more than ``MAX_PIPELINED`` requests ahead, is not
  read from until it catches up: its buffers stay bounded and other clients are served.
- TLS (``--http-cert``) is the standard library's, driven without blocking.
"""

from __future__ import annotations

import functools
import itertools
import logging
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..logs import Throttle
from ..router.intake import Intake
from ..supervisor.loop import Loop
from .http11 import CONTINUE, Refusal, Request, RequestReader, response
from .routes import Forward, Reply, Routes, error_reply

log = logging.getLogger(__name__)

RECEIVE_BYTES = 256 * 1024
READ_PER_TURN = 1024 * 1024  # bytes read from one connection before the loop serves others
MAX_PIPELINED = 128  # requests read ahead of their answers before the connection is paused
OUTPUT_HIGH = 256 * 1024  # bytes of answers waiting for a client before it is no longer read
REFUSED_LINGER = 1.0
SWEEP_INTERVAL = 0.1
CLOSE_FLUSH = 1.0  # seconds at exit for the last answers to leave
WARN_INTERVAL = 10.0


@dataclass(frozen=True)
class FrontSettings:
    max_body: int  # bytes; a larger request body is answered 413 before it is read
    max_buffered: int  # bytes of request bodies held at once, over every connection
    max_connections: int
    max_refused: int  # connections past max_connections that may wait for their 503 to be read
    client_timeout: float  # --http-timeout
    tls: Any = None  # an ssl.SSLContext, or None for plain HTTP


class HttpServer:
    """Accepts connections on ``sock`` and serves them on ``loop``, inferences through ``intake``."""

    def __init__(self, loop: Loop, sock: socket.socket, settings: FrontSettings, routes: Routes,
                 intake: Intake) -> None:
        self.loop = loop
        self.socket = sock
        self.settings = settings
        self.routes = routes
        self.intake = intake
        self.connections: dict[bytes, Connection] = {}
        self.refused: dict[socket.socket, float] = {}  # lingering refused connections, until when
        self.buffered = 0
        self.turned_away = 0
        self._numbers = itertools.count(1)
        self._next_sweep = 0.0
        self._warnings = Throttle(WARN_INTERVAL)
        self.would_block: tuple[type[Exception], ...] = (BlockingIOError, InterruptedError)
        if settings.tls is not None:  # ssl is loaded only for TLS
            import ssl

            self.would_block += (ssl.SSLWantReadError, ssl.SSLWantWriteError)
        sock.setblocking(False)
        loop.read(sock, self._accept)

    def _accept(self) -> None:
        for _ in range(64):  # then the loop serves the others before accepting more
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the backlog keeps the rest
                log.warning("cannot accept an HTTP connection: %s", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an answer is one write: send it now
            if len(self.connections) >= self.settings.max_connections:
                self._refuse(sock)
                continue
            key = self.intake.local_key + next(self._numbers).to_bytes(8, "big")
            self.connections[key] = Connection(self, sock, key)

    def _refuse(self, sock: socket.socket) -> None:
        self.turned_away += 1
        if self._warnings.due():
            log.warning("%d HTTP connections open, at --max-connections: answering new ones 503 "
                        "(%d so far)", len(self.connections), self.turned_away)
        if self.settings.tls is not None:
            sock.close()
            return
        message = (f"{len(self.connections)} HTTP connections are open, at the server's "
                   f"--max-connections {self.settings.max_connections}")
        answer = error_reply(503, message, False, {"Retry-After": "1"})
        try:
            sock.send(response(answer.status, answer.body, headers=answer.headers, close=True))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        if len(self.refused) >= self.settings.max_refused:
            sock.close()
            return
        self.refused[sock] = time.monotonic() + REFUSED_LINGER
        self.loop.read(sock, lambda: self._drop_refused(sock))

    def _drop_refused(self, sock: socket.socket, *, at_once: bool = False) -> None:
        try:
            if not at_once and sock.recv(RECEIVE_BYTES):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.loop.forget(sock)
        self.refused.pop(sock, None)
        sock.close()

    def deliver(self, client: bytes, frames: list[Any]) -> None:
        """The router's reply for one of our lanes (dropped when its connection is gone)."""
        connection = self.connections.get(client)
        if connection is not None:
            connection.replied(frames)

    def reserve(self, request: Request) -> int:
        """The bytes ``request``'s body counts against the bound on bodies held at once."""
        self.routes.admit(request)
        held = request.content_length if request.content_length is not None else self.settings.max_body
        if self.buffered + held > self.settings.max_buffered:
            raise Refusal(503, "the server holds as many request bodies as it may; retry later",
                          headers={"Retry-After": "1"})
        self.buffered += held
        return held

    def sweep(self) -> None:
        """Close what has waited too long (a duty of the loop)."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_INTERVAL
        for connection in [c for c in self.connections.values() if c.deadline is not None and now >= c.deadline]:
            connection.timed_out()
        for sock in [s for s, until in self.refused.items() if now >= until]:
            self._drop_refused(sock, at_once=True)

    def close(self) -> None:
        """Stop listening, give the answers written the last moment to leave, close everything."""
        self.loop.forget(self.socket)
        self.socket.close()
        give_up = time.monotonic() + CLOSE_FLUSH
        while time.monotonic() < give_up:
            waiting = [c for c in self.connections.values() if c.output]
            if not waiting:
                break
            _, writable, _ = select.select([], [c.socket for c in waiting], [], give_up - time.monotonic())
            for connection in waiting:
                if connection.socket in writable:
                    connection.flush()
        for connection in list(self.connections.values()):
            connection.close()
        for sock in list(self.refused):
            self._drop_refused(sock, at_once=True)


def _closing_on_failure(handle: Callable[..., None]) -> Callable[..., None]:
    """An entry point of a connection: a failure of ours is logged and closes that connection
    alone, never the loop every other client and worker depends on."""
    @functools.wraps(handle)
    def guarded(connection: Connection, *args: Any) -> None:
        try:
            handle(connection, *args)
        except OSError:
            raise
        except Exception:
            log.exception("an HTTP connection failed; closing it")
            connection.close()
    return guarded


class Connection:
    """One client connection: its reader, the request being answered and what waits to be written."""

    def __init__(self, server: HttpServer, sock: socket.socket, key: bytes) -> None:
        self.server = server
        self.key = key
        self.reader = RequestReader(server.settings.max_body, server.reserve)
        self.output = bytearray()
        self.current: Request | None = None  # being answered
        self.forwarded: Forward | None = None  # its inference, at the router
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
        server.loop.read(self.socket, self._on_readable)
        if self.handshaking:
            self._handshake()

    # Reading

    @_closing_on_failure
    def _on_readable(self) -> None:
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
            if in_body or self.reader.in_body:  # a body that moves may wait again
                self.deadline = time.monotonic() + self.server.settings.client_timeout
            if self.reader.refusal is not None or self.reader.upgraded:
                break
        self._progress()

    def _tls_pending(self) -> bool:
        """Whether TLS holds decrypted bytes the poll cannot see."""
        pending = getattr(self.socket, "pending", None)
        return pending is not None and pending() > 0

    def _receive(self) -> bytes | None:
        """Bytes the client sent, b"" when it is done sending, None when none are waiting."""
        try:
            return self.socket.recv(RECEIVE_BYTES)
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
            self.server.loop.write(self.socket, self._on_writable)
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
            reader = self.reader
            while self.current is None and not self.closing:
                if reader.ready:
                    self._answer(reader.ready.popleft())
                elif reader.refusal is not None:
                    refusal = reader.refusal
                    openai_route = (refusal.path or "").startswith("/v1/")
                    self._respond(error_reply(refusal.status, refusal.message, openai_route, refusal.headers),
                                  close=True)
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
        decision = self.server.routes.answer(request)
        if isinstance(decision, Reply):
            self._respond(decision)
            return
        self.forwarded = decision
        self.server.intake.admit_local(self.key, decision.frames, sum(len(f) for f in decision.frames),
                                       deadline=decision.deadline)

    @_closing_on_failure
    def replied(self, frames: list[Any]) -> None:
        """The router's answer to the inference this connection forwarded."""
        forwarded = self.forwarded
        if forwarded is None:
            return
        self.forwarded = None
        self._respond(self.server.routes.answer_forwarded(forwarded, frames))
        self._progress()

    def _respond(self, reply: Reply, *, close: bool = False) -> None:
        request, self.current = self.current, None
        close = close or reply.close or request is None or not request.keep_alive
        if request is not None:
            self._release(request)
        self.output += response(reply.status, reply.body, content_type=reply.content_type, headers=reply.headers,
                                close=close, head_only=request is not None and request.method == "HEAD")
        self.closing = self.closing or close
        self.deadline = time.monotonic() + self.server.settings.client_timeout  # for the next head

    def _release(self, request: Request) -> None:
        self.server.buffered -= request.reserved
        request.reserved = 0

    # Writing

    def flush(self) -> None:
        """Write what waits; the loop calls back when the client can take more."""
        if self.closed:
            return
        if self.reader.continue_wanted:  # the client waits for it before it sends the body
            self.reader.continue_wanted = False
            if self.current is None and not self.reader.ready:  # else it would come before an earlier answer
                self.output += CONTINUE
        while self.output:
            try:
                sent = self.socket.send(self.output)
            except self.server.would_block:
                break
            except OSError:
                self.close()
                return
            del self.output[:sent]
            self.deadline = None if self.forwarded else time.monotonic() + self.server.settings.client_timeout
        if self.output:
            self.server.loop.write(self.socket, self._on_writable)
            return
        self.server.loop.write(self.socket, None)
        if self.closing and self.current is None:
            self.close()

    @_closing_on_failure
    def _on_writable(self) -> None:
        if self.handshaking:
            self._handshake()
        else:
            self.flush()
            if not self.closed:
                self._read_or_pause()

    def _read_or_pause(self) -> None:
        wanted = not (self.closing or self.ended or len(self.output) > OUTPUT_HIGH
                      or len(self.reader.ready) >= MAX_PIPELINED)
        if wanted != self.reading:
            self.reading = wanted
            if wanted:
                self.server.loop.read(self.socket, self._on_readable)
            else:
                self.server.loop.pause(self.socket)

    def timed_out(self) -> None:
        if self.reader.in_body and self.current is None and not self.output:
            timeout = self.server.settings.client_timeout
            self._respond(error_reply(408, f"the request body stopped arriving for {timeout:g}s "
                                      "(--http-timeout)", False), close=True)
            self.flush()
        if not self.closed:
            self.close()

    def close(self) -> None:
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
        _discard_input(self.socket)
        self.socket.close()


def _discard_input(sock: socket.socket) -> None:
    """Read and drop what the client sent that was not read (a little at most): closing a
    socket with unread input resets the connection, and the client could lose its answer."""
    for _ in range(4):
        try:
            if not socket.socket.recv(sock, RECEIVE_BYTES):  # past TLS: the bytes as they arrived
                return
        except OSError:
            return


