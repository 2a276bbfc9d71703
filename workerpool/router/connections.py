"""Caps on client connections: the connections served, and the descriptors they hold.

ZeroMQ accepts every TCP connection on its own thread and has no limit of its own. Two are
kept here:

- ``--max-connections`` counts the connections that have sent a request, from their first
  until they close. A request on any further connection is answered ``overloaded`` at once,
  and that connection stays open: it is served as soon as a served one closes, and its client
  learns why it waits instead of reconnecting in a loop. Idle connections and peers that never
  complete the ZeroMQ handshake take no place (libzmq drops the latter after a few seconds,
  see sockets.py).
- The descriptor ceiling counts every accepted connection. Past it a new connection is shut
  down as it arrives, never one already open, so idle connections cannot take every
  descriptor. While more connections are open than are served, those that have sent no
  request ``IDLE_SECONDS`` after they were accepted are shut down too: peers that never finish
  a handshake libzmq takes for an old protocol's, or sit idle, make room (a ZeroMQ client
  reconnects by itself when it has something to send). Shutting down works on libzmq's own descriptor without closing it or needing a
  new one (there may be none left), and only after checking it is still a connection to this
  socket; libzmq then sees the peer go and cleans up after itself as usual.

A socket monitor reports each connection's descriptor as it is accepted and as it goes, and
each message carries the descriptor it came in on: that is how a request is tied to its
connection. A routing id is known once its first request arrives, so the check costs one
dictionary look-up per request.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import zmq

from ..logs import Throttle
from ..protocol.transport import MONITOR_EVENT

log = logging.getLogger(__name__)

WARN_INTERVAL = 10.0  # seconds between warnings about refused connections
IDLE_SECONDS = 10.0  # a connection that has sent nothing by then may be closed to make room
SWEEP_INTERVAL = 1.0
SOURCE_FD = int(zmq.SRCFD)


class ConnectionLimit:
    """Counts a bound socket's connections: serves ``limit`` of them, closes those past
    ``ceiling`` as they arrive."""

    def __init__(self, sock: zmq.Socket, limit: int, ceiling: int) -> None:
        self.limit = limit
        self.ceiling = ceiling
        self.open: dict[int, float] = {}  # descriptor -> when accepted, of the connections not yet gone
        self.serving: dict[bytes, int] = {}  # routing id -> descriptor, of the connections served
        self._client_on: dict[int, bytes] = {}
        self._asked: set[int] = set()  # descriptors of connections that have sent a request
        self.closed = 0  # connections shut down past the ceiling
        self.turned_away = 0  # requests answered overloaded for want of a place
        self._warnings = Throttle(WARN_INTERVAL)
        self._next_sweep = 0.0
        self.monitor = sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        self._sock = sock
        self._local = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def on_event(self) -> None:
        while self.monitor.poll(0):
            kind, fd = MONITOR_EVENT.unpack(self.monitor.recv_multipart()[0][:MONITOR_EVENT.size])
            if kind == zmq.EVENT_ACCEPTED:
                self.open[fd] = time.monotonic()
                if len(self.open) > self.ceiling:
                    self._close(fd)
            else:
                self._gone(fd)

    def admit(self, client: bytes, first_frame: Any) -> str | None:
        """Give a place to the connection of a request from ``client`` not served yet (the hot
        path checks ``serving`` first); why it cannot have one, or None.

        The monitor's news is taken first, so that a connection that has gone (a request read
        after its client closed) takes no place, and a place its descriptor held is free."""
        self.on_event()
        fd = first_frame.get(SOURCE_FD)
        if fd not in self.open:  # gone already, or not a connection (inproc): nothing to count
            return None
        self._asked.add(fd)
        stale = self._client_on.pop(fd, None)  # a client gone before its descriptor's reuse
        if stale is not None:
            self.serving.pop(stale, None)
        if len(self.serving) >= self.limit:
            self.turned_away += 1
            if self._warnings.due("turned away"):
                log.warning("%d client connections served, at --max-connections %d: answering "
                            "requests on others overloaded (%d so far)", len(self.serving),
                            self.limit, self.turned_away)
            return (f"{len(self.serving)} client connections are served, at the server's "
                    f"--max-connections {self.limit}: this one is served when one of them closes")
        self._client_on[fd] = client
        self.serving[client] = fd
        return None

    def sweep(self) -> None:
        """Shut down connections that have sent nothing in ``IDLE_SECONDS``, while more are
        open than may be served (called often; looks once a second)."""
        now = time.monotonic()
        if now < self._next_sweep or len(self.open) <= self.limit:
            return
        self._next_sweep = now + SWEEP_INTERVAL
        idle = [fd for fd, since in self.open.items() if fd not in self._asked and now - since > IDLE_SECONDS]
        for fd in idle:
            del self.open[fd]
            _shut_down(fd, self._local)
        if idle and self._warnings.due("idle"):
            log.warning("%d client connections open, more than --max-connections %d: closed %d "
                        "that sent nothing in %gs", len(self.open) + len(idle), self.limit,
                        len(idle), IDLE_SECONDS)

    def _gone(self, fd: int) -> None:
        self.open.pop(fd, None)
        self._asked.discard(fd)
        client = self._client_on.pop(fd, None)
        if client is not None:
            self.serving.pop(client, None)

    def _close(self, fd: int) -> None:
        self.closed += 1
        del self.open[fd]
        _shut_down(fd, self._local)
        if self._warnings.due("closed"):
            log.warning("%d client connections open, the most the open file limit leaves room "
                        "for: closing new ones (%d so far)", len(self.open), self.closed)

    def close(self) -> None:
        self._sock.disable_monitor()
        self.monitor.close(linger=0)


def _shut_down(fd: int, endpoint: str) -> None:
    """Shut down the connection on ``fd`` if it is still one accepted on ``endpoint``."""
    try:
        conn = socket.socket(fileno=fd)
    except OSError:  # closed meanwhile
        return
    try:
        if _accepted_on(conn, endpoint):
            conn.shutdown(socket.SHUT_RDWR)
    except OSError as exc:
        log.debug("could not close an excess connection: %s", exc)
    finally:
        conn.detach()  # the descriptor stays libzmq's


def _accepted_on(conn: socket.socket, endpoint: str) -> bool:
    local = conn.getsockname()
    if conn.family == socket.AF_UNIX:
        return endpoint == f"ipc://{local}"
    return endpoint.rsplit(":", 1)[-1] == str(local[1])
