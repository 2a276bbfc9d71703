"""The HTTP front door's sockets, on the supervisor's own poll loop: no thread, no asyncio.

The listening socket and every connection (``connection.py``) are sources of the loop beside
the router's ZeroMQ sockets. A connection's bytes go to its :class:`~.http11.RequestReader`;
each whole request is answered by :class:`~.routes.Routes`, at once or by handing it to the
router as a client of its own (a lane: the router intake's local key and the connection's
number), whose reply the router's shell passes back here (:meth:`HttpServer.deliver`).

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

import itertools
import logging
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from ..codecs.http_call import KSERVE
from ..events.loop import Loop
from ..logs import AccessLog, Ran, RequestIds, Throttle
from ..router.core import Router
from .connection import RECEIVE_BYTES, Connection, FrontSettings
from .http11 import Refusal, Request, response
from .routes import Routes, error_reply

log = logging.getLogger(__name__)

REFUSED_LINGER = 1.0
SWEEP_INTERVAL = 0.1
CLOSE_FLUSH = 1.0  # seconds at exit for the last answers to leave
QUIET_AT_EXIT = 0.02  # seconds without a byte from any connection after which none is coming
WARN_INTERVAL = 10.0


class HttpServer:
    """Accepts connections on ``sock`` and serves them on ``loop``, inferences through ``router``."""

    def __init__(self, loop: Loop, sock: socket.socket, settings: FrontSettings, routes: Routes,
                 router: Router, access: AccessLog) -> None:
        self.loop = loop
        self.access = access
        self.request_ids = RequestIds()
        self.socket = sock
        self.settings = settings
        self.routes = routes
        self.router = router
        self.connections: dict[bytes, Connection] = {}
        self.refused: dict[socket.socket, float] = {}  # lingering refused connections, until when
        self.buffered = 0
        self.receive_buffer = memoryview(bytearray(RECEIVE_BYTES))
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
            key = self.router.intake.local_key + next(self._numbers).to_bytes(8, "big")
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
        answer = error_reply(503, message, KSERVE, {"Retry-After": "1"})
        try:
            sock.send(response(answer.status, answer.body, headers=answer.headers, close=True))
        except OSError:
            sock.close()
            return
        self.linger(sock)

    def linger(self, sock: socket.socket) -> None:
        """Close a plain connection whose last answer is written: its write side now, the rest
        once the client closes too or ``REFUSED_LINGER`` has passed, reading and dropping what
        it still sends. Closing with its request unread would reset the connection, and the
        client could lose that answer. At most ``max_refused`` linger at once."""
        if self.settings.tls is not None or len(self.refused) >= self.settings.max_refused:
            sock.close()
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
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

    def deliver(self, client: bytes, frames: list[Any], ran: Ran | None) -> None:
        """The router's reply for one of our lanes, and what it measured of it (dropped when
        its connection is gone)."""
        connection = self.connections.get(client)
        if connection is not None:
            connection.replied(frames, ran)

    def reserve(self, request: Request) -> int:
        """The bytes ``request``'s body counts against the bound on bodies held at once, once
        its head is allowed: its Content-Length (a chunked body's bytes count as they come)."""
        self.routes.admit(request)
        held = request.content_length or 0
        self._hold(held)
        return held

    def grow(self, request: Request, size: int) -> None:
        """A chunked body's next ``size`` bytes."""
        self._hold(size)
        request.reserved += size

    def _hold(self, size: int) -> None:
        if self.buffered + size > self.settings.max_buffered:
            raise Refusal(503, "the server holds as many request bodies as it may; retry later",
                          headers={"Retry-After": "1"})
        self.buffered += size

    @property
    def draining(self) -> bool:
        """The router takes no new requests: every answer closes its connection."""
        return not self.router.intake.accepting

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

    def close(self, flush_router: Callable[[], None]) -> None:
        """At exit, once the router has answered what it held: take in the connections still in
        the backlog, answer what every connection sent meanwhile (``shutting_down``, through the
        router, whose answers ``flush_router`` sends), until they have been quiet for
        ``QUIET_AT_EXIT`` or ``CLOSE_FLUSH`` has passed; then close everything. A request sent
        after that reaches no one, and its client sees the connection close."""
        self.router.stop_accepting()
        self._accept()
        self.loop.forget(self.socket)
        self.socket.close()
        give_up = time.monotonic() + CLOSE_FLUSH
        while time.monotonic() < give_up:
            connections = list(self.connections.values())
            readable = [c.socket for c in connections if c.reading]
            writable = [c.socket for c in connections if c.output]
            if not readable and not writable:
                break
            ready, can_write, _ = select.select(readable, writable, [], min(QUIET_AT_EXIT, give_up - time.monotonic()))
            if not ready and not can_write and not writable:
                break
            for connection in connections:
                if connection.socket in ready:
                    connection.on_readable()
            flush_router()
            for connection in connections:
                if connection.socket in can_write and not connection.closed:
                    connection.on_writable()
        for connection in list(self.connections.values()):
            connection.close()
        for sock in list(self.refused):
            self._drop_refused(sock, at_once=True)
