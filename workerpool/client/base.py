"""What the blocking and the asyncio client share: everything but how they wait.

``Calls`` (``calls.py``) keeps the socket-free bookkeeping and the timeout and retry policy,
``Link`` (``link.py``) what the socket monitor says of the connection, and ``BaseClient`` owns
the DEALER socket and its monitor around them, so ``Client`` (``sync.py``) and ``AsyncClient``
(``aio.py``) only add a blocking poll or an asyncio reader task, and their public methods.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from typing import Any, Generic, TypeVar

import zmq

from .. import endpoints
from ..endpoints import DEFAULT_BIND
from ..errors import WorkerpoolError
from ..protocol.messages import Inputs
from ..protocol.transport import MONITOR_EVENT, readable, stated_message_limit
from ..security import ClientKeys
from ..units import MS_PER_SECOND
from .calls import Call, Calls, Outputs, Result
from .link import MONITORED, Link

__all__ = ["CONNECT_TIMEOUT", "DEFAULT_ENDPOINT", "BaseClient", "Call", "Outputs", "Result"]

DEFAULT_ENDPOINT = DEFAULT_BIND
CONNECT_TIMEOUT = 3.0  # seconds for a server to complete the handshake, first or after a drop
# ZMTP heartbeats notice a server whose host vanished without closing the connection.
HEARTBEAT_INTERVAL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 10_000
_monitor_ids = itertools.count(1)

_log = logging.getLogger(__name__)

SocketT = TypeVar("SocketT", bound=zmq.Socket)


class BaseClient(Generic[SocketT]):
    """The socket, its monitor and the calls on them; a subclass names its ``_socket_class``
    and ``_poller_class`` and waits.

    Waiting means: while a call is outstanding, poll ``self._poller`` (the socket and its
    monitor) for up to ``_poll_ms()`` and hand what is readable to ``_take``.
    """

    _socket_class: type[SocketT]
    _poller_class: type[zmq.Poller]
    _poller: zmq.Poller
    _monitor: SocketT

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        timeout: float = 30.0,
        retries: int = 2,
        context: zmq.Context | None = None,
        keys: ClientKeys | None = None,
    ) -> None:
        self.endpoint = endpoints.check(endpoint)
        self._keys = keys
        self._context = context or zmq.Context.instance()
        self._socket: SocketT | None = None
        self._calls = Calls(self.endpoint, timeout, retries, connect_timeout, self._connect())

    def _take_news(self) -> None:
        """Take in what the monitor said while no call waited (a drop while idle, say), once per
        public call before anything about the connection is decided: a server restarted
        meanwhile may have another --max-message-size."""
        self._open()
        self._take_events()

    def _start(self, payload: Inputs | None, method: str, deadline: float | None,
               model: str | None = None) -> Call:
        """Send a new call on the connection as last heard of (``_take_news`` first). A request
        that may be over the server's --max-message-size waits for the front end to learn that
        limit (``Calls.must_learn_limit``): over it, it fails without being sent."""
        return self._calls.start(payload, method, deadline, self._send, model)

    def _poll_ms(self) -> int | None:
        """How long to poll before the next call runs out of time; None once one has, and then
        it has failed, or (a reply overdue from a connected server: Lazy Pirate) the socket has
        just been replaced and every outstanding request resent."""
        now = time.monotonic()
        delay = self._calls.next_expiry() - now
        if delay > 0:
            return max(1, math.ceil(delay * MS_PER_SECOND))
        if self._calls.link.up:  # a server completed the handshake on the socket in use
            self._replace(dropped=False)
        else:
            self._calls.expire(now)
            if not self._calls.outstanding:  # their requests wait in the queue: discard them
                self._replace(dropped=False)
        return None

    def _take(self, ready: dict[Any, int]) -> None:
        """Read what the poll found: replies first, so that those which arrived before a drop
        settle their calls before the rest are resent."""
        if self._socket in ready:
            self._receive_one()
        if self._monitor in ready:
            self._take_events()

    def _receive_one(self) -> bool:
        try:
            frames = self._settled(self._open().recv_multipart(zmq.NOBLOCK, copy=False))
        except zmq.Again:
            return False
        if not self._calls.limit_heard:
            self._calls.hear_limit(stated_message_limit(frames[0]))
        self._calls.reply(frames)
        return True

    def _receive_all(self) -> None:
        while self._receive_one():
            pass

    def _take_events(self) -> None:
        while readable(self._monitor):  # a look costs less than the exception of an empty read
            event = self._settled(self._monitor.recv_multipart(zmq.NOBLOCK))
            kind, _ = MONITOR_EVENT.unpack(event[0][:MONITOR_EVENT.size])
            change = self._calls.link.event(kind)
            if change is True:
                self._calls.connected(time.monotonic())
            elif change is False:
                _log.debug("connection to %s lost; resending what was in flight", self.endpoint)
                self._replace(dropped=True, why=self._calls.link.why_dropped())
                return  # the old monitor's remaining events are of the old socket

    def _replace(self, *, dropped: bool, why: str = "") -> None:
        """A fresh socket for the old one, every outstanding request resent on it; replies the
        old one holds settle their calls first."""
        self._receive_all()
        self._close_socket()
        link = self._connect()
        self._calls.resend(time.monotonic(), self._send, link, dropped=dropped, why=why)

    @staticmethod
    def _settled(outcome: Any) -> Any:
        """The result of a non-blocking socket call, as a blocking socket returns it; the asyncio
        client reads its futures instead, so the blocking client never imports asyncio."""
        return outcome

    def _open(self) -> SocketT:
        if self._socket is None:
            raise WorkerpoolError("the client is closed")
        return self._socket

    def _shut(self) -> None:
        """Fail the calls still waiting and close the socket at once, dropping anything unsent."""
        self._calls.close()
        self._close_socket()

    def _close_socket(self) -> None:
        """Close the socket and its monitor. The monitor is stopped first: a socket closed while
        monitored leaves libzmq unable to deliver the next socket's events."""
        socket = self._open()
        socket.disable_monitor()
        self._monitor.close(linger=0)
        socket.close(linger=0)
        self._socket = None

    def _connect(self) -> Link:
        """A DEALER connected to the server's ROUTER (with CURVE when ``keys`` are given), its
        monitor, and a poller on both; the new connection's :class:`Link`.

        No ``IMMEDIATE``: a fresh socket (every retry makes one) has no finished connection yet,
        and with ``IMMEDIATE`` a non-blocking send would fail there; without it the message waits
        in the socket's queue until the connection is up, and replacing the socket (a retry, or
        calls that found no server) discards the queue (linger 0).
        """
        socket = self._context.socket(zmq.DEALER, socket_class=self._socket_class)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_INTERVAL_MS)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if self._keys is not None:
            self._keys.apply(socket)
        address = f"inproc://workerpool-client-monitor-{next(_monitor_ids)}"
        socket.monitor(address, MONITORED)
        self._monitor = self._context.socket(zmq.PAIR, socket_class=self._socket_class)
        # No bound: libzmq's I/O thread blocks on a full monitor, stalling the whole context.
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(address)
        socket.connect(self.endpoint)
        self._socket = socket
        self._poller = self._poller_class()
        self._poller.register(socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        return Link(self.endpoint, self._keys)

    def _send(self, frames: list) -> None:
        """Queue a request without ever blocking. If the queue is full the request is lost, which
        its timeout handles like any other lost request."""
        try:
            self._push(frames)
        except zmq.Again:
            _log.debug("send queue is full; the request will be resent when its reply is overdue")

    def _push(self, frames: list) -> None:
        """Send one message without blocking (zmq.Again when the queue is full)."""
        self._settled(self._open().send_multipart(frames, flags=zmq.NOBLOCK, copy=False))
