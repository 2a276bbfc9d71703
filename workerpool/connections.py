"""A cap on client connections, enforced as libzmq accepts them.

ZeroMQ accepts every TCP connection on its own thread and has no limit of its own, so idle
connections could take every file descriptor. A socket monitor reports each connection's
descriptor as it is accepted and as its handshake completes. Past the cap, the oldest
connection that has not completed its handshake (a peer that connected and said nothing) is
shut down; when every connection is a real client, the newest is. Shutting down happens on a
duplicate of the descriptor, so libzmq sees the peer go and cleans up after itself as usual.
Peers that never complete the handshake are also dropped after ``HANDSHAKE_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from .units import MS_PER_SECOND

log = logging.getLogger("workerpool.router")

WARN_INTERVAL = 10.0  # seconds between warnings about refused connections
HANDSHAKE_SECONDS = 5.0  # libzmq's default is 30 s of holding a descriptor for nothing


class ConnectionLimit:
    """Counts a bound socket's connections and closes those past ``limit``."""

    def __init__(self, sock: zmq.Socket, limit: int) -> None:
        self.limit = limit
        self.open: set[int] = set()
        self.silent: dict[int, None] = {}  # accepted, handshake not complete: oldest first
        self.refused = 0
        self._last_warning = 0.0
        sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * MS_PER_SECOND))
        self.monitor = sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        self._sock = sock

    def on_event(self) -> None:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            kind, fd = event["event"], event["value"]
            if kind == zmq.EVENT_ACCEPTED:
                self.open.add(fd)
                self.silent[fd] = None
                if len(self.open) > self.limit:
                    self._refuse(next(iter(self.silent)) if len(self.silent) > 1 else fd)
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.silent.pop(fd, None)
            else:
                self.open.discard(fd)
                self.silent.pop(fd, None)

    def _refuse(self, fd: int) -> None:
        self.refused += 1
        self.open.discard(fd)
        self.silent.pop(fd, None)
        try:
            with socket.socket(fileno=os.dup(fd)) as duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already gone, or out of descriptors for the duplicate
            log.debug("could not close an excess connection: %s", exc)
        now = time.monotonic()
        if now - self._last_warning >= WARN_INTERVAL:
            self._last_warning = now
            log.warning("%d client connections open, over --max-connections %d: closing new ones "
                        "(%d so far)", len(self.open), self.limit, self.refused)

    def close(self) -> None:
        self._sock.disable_monitor()
        self.monitor.close(linger=0)
