"""A cap on client connections, enforced as libzmq accepts them.

ZeroMQ accepts every TCP connection on its own thread and has no limit of its own, so idle
connections could take every file descriptor. A socket monitor reports each connection's
descriptor as it is accepted and as it goes; past the cap the new connection is shut down at
once, never one already serving a client. Shutting down works on
libzmq's own descriptor without closing it or needing a new one (there may be none left), and
only after checking it is still a connection to this socket; libzmq then sees the peer go and
cleans up after itself as usual.
Peers that never complete the ZeroMQ handshake are dropped by libzmq after a few seconds
(see sockets.py), which frees their places.
"""

from __future__ import annotations

import logging
import socket
import time

import zmq

from ..protocol.transport import MONITOR_EVENT

log = logging.getLogger(__name__)

WARN_INTERVAL = 10.0  # seconds between warnings about refused connections


class ConnectionLimit:
    """Counts a bound socket's connections and closes those past ``limit``."""

    def __init__(self, sock: zmq.Socket, limit: int) -> None:
        self.limit = limit
        self.open: set[int] = set()
        self.refused = 0
        self._last_warning = 0.0
        self.monitor = sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        self._sock = sock
        self._local = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def on_event(self) -> None:
        while self.monitor.poll(0):
            kind, fd = MONITOR_EVENT.unpack(self.monitor.recv_multipart()[0][:MONITOR_EVENT.size])
            if kind == zmq.EVENT_ACCEPTED:
                self.open.add(fd)
                if len(self.open) > self.limit:
                    self._refuse(fd)
            else:
                self.open.discard(fd)

    def _refuse(self, fd: int) -> None:
        self.refused += 1
        self.open.discard(fd)
        _shut_down(fd, self._local)
        now = time.monotonic()
        if now - self._last_warning >= WARN_INTERVAL:
            self._last_warning = now
            log.warning("%d client connections open, over --max-connections %d: closing new ones "
                        "(%d so far)", len(self.open), self.limit, self.refused)

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
