"""The router's bound sockets: clients on one ROUTER, and worker hosts on an optional TCP one
(local workers have links of their own, ``local_links.py``). Bound by the serve role and
handed to the router, so the router itself can be built over any sockets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import zmq

from ..config.pool import HEARTBEAT_SECONDS, LIVENESS_BEATS
from ..protocol.transport import state_message_limit, transport_heartbeats
from ..security import CLIENTS, WORKER_HOSTS
from ..units import MS_PER_SECOND, MiB

MESSAGE_OVERHEAD = MiB  # room on the backend for a reply's header beside its arrays
CLIENT_READ_AHEAD = 128  # requests libzmq reads from one client ahead of the router
HANDSHAKE_SECONDS = 5.0  # a peer that has not completed the ZeroMQ handshake by then is dropped


@dataclass(frozen=True)
class RouterSockets:
    """The bound client and (optional) worker hosts' backend sockets."""

    frontend: zmq.Socket
    remote: zmq.Socket | None = None

    @property
    def endpoint(self) -> str:
        """Where clients connect, as bound (a port 0 or wildcard resolved)."""
        return self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)


def bind_sockets(context: zmq.Context, *, frontend: str, remote_backend: str | None = None,
                 max_message_size: int, heartbeat: float = HEARTBEAT_SECONDS,
                 liveness: int = LIVENESS_BEATS,
                 secure: Callable[[zmq.Socket, str], None] | None = None) -> RouterSockets:
    """Bind the router's sockets; ``secure`` applies CURVE to a socket for its domain.

    Raises ``zmq.ZMQError`` when an endpoint cannot be bound.
    """
    clients = _bind(context, frontend, max_message_size, _in_domain(secure, CLIENTS),
                    read_ahead=CLIENT_READ_AHEAD)
    remote = None if remote_backend is None else _bind(  # worker hosts connect from outside
        context, remote_backend, max_message_size + MESSAGE_OVERHEAD,
        _in_domain(secure, WORKER_HOSTS), beats=(heartbeat, liveness))
    return RouterSockets(clients, remote)


def _in_domain(secure: Callable[[zmq.Socket, str], None] | None,
               domain: str) -> Callable[[zmq.Socket], None] | None:
    return None if secure is None else lambda sock: secure(sock, domain)


def _bind(context: zmq.Context, endpoint: str, max_message_size: int | None = None,
          secure: Callable[[zmq.Socket], None] | None = None,
          beats: tuple[float, int] | None = None, read_ahead: int | None = None) -> zmq.Socket:
    """A bound ROUTER that fails a send to a gone peer instead of dropping it silently.

    Options are set before bind: libzmq copies them into each connection it accepts.
    ``read_ahead`` bounds the messages libzmq buffers per peer before the router reads them;
    replies to a peer that does not read are dropped past libzmq's own 1000-message buffer.
    """
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * MS_PER_SECOND))
    if read_ahead is not None:
        sock.setsockopt(zmq.RCVHWM, read_ahead)
    if max_message_size is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_size)
        state_message_limit(sock, max_message_size)
    if secure is not None:
        secure(sock)
    if beats is not None:
        transport_heartbeats(sock, *beats)
    sock.bind(endpoint)
    return sock
