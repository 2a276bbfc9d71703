"""What the blocking and the asyncio client share: everything but how they wait.

``Calls`` keeps the socket-free bookkeeping (request ids, outstanding requests, turning replies
into results or typed errors, the timeout and retry policy), ``Link`` what the socket monitor
says of the connection, and ``BaseClient`` owns the DEALER socket and its monitor around them,
so ``Client`` (``client.py``) and ``AsyncClient`` (``aio.py``) only add a blocking poll or an
asyncio reader task, and their public methods.

Two clocks bound a call. While no server has completed a handshake, ``connect_timeout``: past
it the call fails with ``Unreachable`` (never connected) or ``ConnectionLost`` (the connection
it was sent on dropped). Once one has, ``timeout`` per attempt (Lazy Pirate), then ``Timeout``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import zmq

from .. import endpoints
from ..endpoints import DEFAULT_BIND
from ..errors import (
    ERRORS_BY_CODE,
    BadRequest,
    ConnectionLost,
    DeadlineExceeded,
    InternalError,
    RemoteError,
    ShuttingDown,
    Timeout,
    Unreachable,
    WorkerpoolError,
)
from ..protocol import messages as protocol
from ..protocol.messages import Inputs, Message, ProtocolError
from ..protocol.transport import MONITOR_EVENT
from ..security import ClientKeys
from ..units import MS_PER_SECOND
from . import reach

DEFAULT_ENDPOINT = DEFAULT_BIND
CONNECT_TIMEOUT = 3.0  # seconds for a server to complete the handshake, first or after a drop
# ZMTP heartbeats notice a server whose host vanished without closing the connection.
HEARTBEAT_INTERVAL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 10_000
_MONITORED = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
              | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
EARLY_DROP_SECONDS = 1.0
GREETING_SECONDS = 0.5  # for the one look at the peer's greeting when a call finds no server
_monitor_ids = itertools.count(1)

# Under the name users already configure: both front ends log through the one client logger.
_log = logging.getLogger(__name__)

Outputs = np.ndarray | dict[str, np.ndarray] | None

SocketT = TypeVar("SocketT", bound=zmq.Socket)


@dataclass(frozen=True, eq=False)
class Result:
    """One reply's outputs, with the worker and model generation that produced them.

    ``generation`` changes when the server hot-reloads its model. ``outputs`` is one array for a
    single unnamed output, else a dict; the arrays are read-only views of the received frames.
    Equality is identity: arrays have no single truth value to compare by.
    """

    outputs: Outputs
    worker_pid: int | None
    generation: int | None


@dataclass(eq=False)
class Call:
    """One logical request. Every attempt is sent under a fresh id, so a late reply to an
    abandoned attempt can never be taken for the answer to a newer one.

    ``on_done`` lets a front end that does not poll (asyncio) hear when the outcome arrives.
    """

    payload: Inputs | None
    method: str
    deadline: float | None
    deadline_at: float | None = None
    attempts: int = 0
    id: int | None = None
    expires: float = math.inf
    connect_by: float = math.inf
    lost: bool = False
    outcome: Message | BaseException | None = None
    on_done: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def message(self) -> Message:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        assert self.outcome is not None, "call is still outstanding"
        return self.outcome

    def result(self) -> Result:
        message = self.message()
        header = message.header
        outputs = message.payload()
        if isinstance(outputs, list):
            raise ProtocolError("a reply carries arrays, not texts")
        return Result(outputs, header.get("worker_pid"), header.get("generation"))

    def info(self) -> dict[str, Any]:
        header = self.message().header
        info = header.get("info")
        if not isinstance(info, dict):
            raise InternalError(
                "malformed reply: 'info' is not an object", worker_pid=header.get("worker_pid")
            )
        return info


class Link:
    """What the socket monitor has said of the connection to the server.

    ``up`` from a completed ZeroMQ handshake until that connection drops. While it is down,
    ``seen`` keeps the furthest any connection attempt got, to say why no server was reached.
    Failed connection attempts are not monitored (libzmq retries every 0.1 s, and an idle
    client would pile up their events): where nothing was accepted, the peer's ZMTP greeting
    is read once, when the call fails, for the kernel's or the peer's own answer.
    """

    # From least to most telling: the attempt that got furthest is the one worth naming.
    _STAGES: dict[int, int] = {
        zmq.EVENT_CONNECTED: 1,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: 2,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: 2,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH: 3,
    }

    def __init__(self, endpoint: str, keys: ClientKeys | None) -> None:
        self.endpoint = endpoint
        self.keys = keys
        self.up = False
        self.seen = 0
        self.up_at = 0.0

    def event(self, kind: int) -> bool | None:
        """Take one monitor event: True when the connection came up, False when it dropped."""
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up, self.seen, self.up_at = True, 0, time.monotonic()
            return True
        if kind == zmq.EVENT_DISCONNECTED and self.up:
            self.up = False
            return False
        self.seen = max(self.seen, self._STAGES.get(kind, 0))
        return None

    def why_dropped(self) -> str:
        """What a drop says of the server: closing a connection it has just accepted is what a
        server at its connection cap does."""
        if time.monotonic() - self.up_at < EARLY_DROP_SECONDS:
            return (" (the server closed it right after accepting it: a server at its "
                    "--max-connections limit?)")
        return ""

    def why_unreachable(self, waited: float) -> str:
        """Why no server completed a handshake in ``waited`` seconds, as one sentence."""
        if self.seen == 3:
            return (f"{self.endpoint}: the server refused this client's key (its public key "
                    "belongs in the server's --curve-client-keys folder)")
        if self.seen == 1:
            return (f"something at {self.endpoint} accepted the connection but completed no "
                    f"ZeroMQ handshake in {waited:g} s: a stopped server, or not a workerpool "
                    "endpoint (wrong port?)")
        try:
            reach.check_greeting(self.endpoint, self.keys, GREETING_SECONDS)
        except Unreachable as exc:
            return f"{exc} (no ZeroMQ handshake in {waited:g} s)"
        if self.seen == 2:
            return (f"{self.endpoint}: the ZeroMQ handshake failed: is the server key this "
                    "server's public key?")
        return f"no workerpool server at {self.endpoint} completed a ZeroMQ handshake in {waited:g} s"


class Calls:
    """The outstanding calls of one client, independent of its socket and of how it waits.

    ``start`` sends a new call, ``reply`` takes every message received, ``connected`` and
    ``resend`` follow the connection (``link``, that of the socket in use), and ``expire`` runs
    once ``next_expiry`` has passed.
    """

    def __init__(self, endpoint: str, timeout: float, retries: int, connect_timeout: float,
                 link: Link) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, not {connect_timeout!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries!r}")
        self.endpoint = endpoint
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = retries
        self.link = link
        self._ids = itertools.count(1)
        self._outstanding: dict[int, Call] = {}

    @property
    def outstanding(self) -> bool:
        return bool(self._outstanding)

    @property
    def linked(self) -> bool:
        """Whether a server has completed the handshake on the socket in use."""
        return self.link.up

    def next_expiry(self) -> float:
        """When the next call runs out of time: for a reply while connected, else for a server."""
        return min((call.expires if self.linked else call.connect_by
                    for call in self._outstanding.values()), default=math.inf)

    def start(
        self,
        payload: Inputs | None,
        method: str,
        deadline: float | None,
        send: Callable[[list], None],
    ) -> Call:
        """A new call, sent at once, or already failed if its input cannot be encoded. Sent
        before any server is connected, it waits in the socket's queue until one is."""
        if deadline is not None and not deadline >= 0:
            raise ValueError(f"deadline must be >= 0 seconds, not {deadline!r}")
        call = Call(payload, method, deadline)
        self._attempt(call, time.monotonic(), send)
        return call

    def reply(self, frames: list) -> Call | None:
        """Settle the call a received message answers; anything not outstanding is dropped,
        and a ``shutting_down`` answer with a retry left is held (None for both)."""
        request_id, outcome = _decode(frames)
        call = self._outstanding.get(request_id) if type(request_id) is int else None
        if call is None:
            _log.debug("discarding reply to request %r: not outstanding", request_id)
            return None
        if isinstance(outcome, ShuttingDown) and call.attempts <= self.retries:
            # A server that stops is often restarted: the call stays outstanding, to be resent
            # when the connection drops, to whatever server is there then.
            _log.debug("request %d: the server is shutting down; held for its successor", request_id)
            call.expires = time.monotonic() + self.timeout
            return None
        self._finish(call, outcome)
        return call

    def connected(self, now: float) -> None:
        """A server completed the handshake: what was queued has gone to it, and its reply is
        awaited from now."""
        for call in self._outstanding.values():
            call.connect_by, call.expires, call.lost = math.inf, now + self.timeout, False

    def resend(self, now: float, send: Callable[[list], None], link: Link, *, dropped: bool,
               why: str = "") -> None:
        """After the front end replaced its socket (``link`` is the new one's), which took every
        outstanding request with it.

        ``dropped``: the connection went down under them; a request with no retry left fails
        with ``ConnectionLost``, ``why`` added to its message. Otherwise (Lazy Pirate) a reply
        was overdue, and a request whose own reply was overdue with no retry left fails with
        ``Timeout``. The rest are resent.
        """
        self.link = link
        calls = list(self._outstanding.values())
        self._outstanding.clear()
        for call in calls:
            call.lost = call.lost or dropped
            out_of_retries = call.attempts > self.retries
            if dropped and out_of_retries:
                self._finish(call, ConnectionLost(
                    f"the connection to {self.endpoint} was lost while the request was in "
                    f"flight, after {_attempts(call.attempts)}{why}"))
            elif out_of_retries and call.expires <= now:
                self._finish(call, Timeout(
                    f"no reply from {self.endpoint} in {_attempts(call.attempts)} of "
                    f"{self.timeout:g} s"))
            else:
                self._attempt(call, now, send)

    def expire(self, now: float) -> None:
        """Fail each call that waited ``connect_timeout`` for a server in vain."""
        expired = [c for c in self._outstanding.values() if c.connect_by <= now]
        if not expired:
            return
        unreachable = None if all(c.lost for c in expired) else \
            self.link.why_unreachable(self.connect_timeout)
        for call in expired:
            if call.lost:
                self._finish(call, ConnectionLost(
                    f"the connection to {self.endpoint} was lost while the request was in "
                    f"flight, and no server took it back in {self.connect_timeout:g} s"))
            else:
                self._finish(call, Unreachable(unreachable))

    def forget(self, call: Call) -> None:
        """Stop waiting for a call (its caller gave up): a reply to it will be discarded."""
        if call.id is not None and self._outstanding.get(call.id) is call:
            del self._outstanding[call.id]

    def abandon(self, error: BaseException) -> None:
        """Fail every outstanding call with ``error`` (the client closed, or its reader died)."""
        for call in list(self._outstanding.values()):
            self._finish(call, error)

    def close(self) -> None:
        self.abandon(WorkerpoolError("the client was closed before the reply arrived"))

    def _attempt(self, call: Call, now: float, send: Callable[[list], None]) -> None:
        call.attempts += 1
        deadline_ms = None
        if call.deadline is not None:
            if call.deadline_at is None:
                call.deadline_at = now + call.deadline
            elif call.deadline_at <= now:
                self._finish(
                    call,
                    DeadlineExceeded("the deadline passed before the request could be retried"),
                )
                return
            deadline_ms = (call.deadline_at - now) * MS_PER_SECOND
        call.id = next(self._ids)
        try:
            frames = protocol.encode_request(
                call.id, call.payload, method=call.method, deadline_ms=deadline_ms
            )
        except ProtocolError as exc:
            self._finish(call, BadRequest(str(exc)))
            return
        call.expires = now + self.timeout
        call.connect_by = math.inf if self.linked else now + self.connect_timeout
        self._outstanding[call.id] = call
        send(frames)

    def _finish(self, call: Call, outcome: Message | BaseException) -> None:
        self.forget(call)
        call.outcome = outcome
        if call.on_done is not None:
            call.on_done()


def _attempts(count: int) -> str:
    return f"{count} attempt{'s' if count > 1 else ''}"


def _decode(frames: list) -> tuple[Any, Message | RemoteError]:
    """The request id a message answers and its outcome: a reply, or the error it carries.

    A reply that breaks the protocol becomes ``InternalError`` (a server fault, not the
    caller's) when its id can still be read; otherwise it is attributed to nobody, dropped, and
    its request is retried when its timeout expires.
    """
    try:
        if not frames or len(frames[0]):
            raise ProtocolError("reply does not start with an empty delimiter frame")
        message = protocol.decode_reply(frames[1:])
    except ProtocolError as exc:
        request_id = protocol.request_id_of(frames[1]) if len(frames) > 1 else None
        return request_id, InternalError(f"malformed reply: {exc}")
    if message.header["status"] == "ok":
        return message.id, message
    return message.id, _remote_error(message.header)


def _remote_error(header: dict[str, Any]) -> RemoteError:
    error = header.get("error")
    worker_pid = header.get("worker_pid")
    if not isinstance(error, dict):
        return InternalError(
            "malformed reply: error without an 'error' object", worker_pid=worker_pid
        )
    code = error.get("code")
    cls = ERRORS_BY_CODE.get(code, RemoteError) if isinstance(code, str) else RemoteError
    exc = cls(str(error.get("message", "")), worker_pid=worker_pid)
    if cls is RemoteError:
        exc.code = str(code)
    return exc


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

    def _start(self, payload: Inputs | None, method: str, deadline: float | None) -> Call:
        """Send a new call, once the monitor's news (a drop while idle, say) is taken in."""
        self._open()
        self._take_events()
        return self._calls.start(payload, method, deadline, self._send)

    def _poll_ms(self) -> int | None:
        """How long to poll before the next call runs out of time; None once one has, and then
        it has failed, or (a reply overdue from a connected server: Lazy Pirate) the socket has
        just been replaced and every outstanding request resent."""
        now = time.monotonic()
        delay = self._calls.next_expiry() - now
        if delay > 0:
            return max(1, math.ceil(delay * MS_PER_SECOND))
        if self._calls.linked:
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
            frames = _settled(self._open().recv_multipart(zmq.NOBLOCK, copy=False))
        except zmq.Again:
            return False
        self._calls.reply(frames)
        return True

    def _receive_all(self) -> None:
        while self._receive_one():
            pass

    def _take_events(self) -> None:
        while True:
            try:
                event = _settled(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
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
        socket.monitor(address, _MONITORED)
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
            _settled(self._open().send_multipart(frames, flags=zmq.NOBLOCK, copy=False))
        except zmq.Again:
            _log.debug("send queue is full; the request will be resent when its reply is overdue")


def _settled(outcome: Any) -> Any:
    """The result of a non-blocking socket call; zmq.asyncio settles one at once as a future."""
    return outcome.result() if asyncio.isfuture(outcome) else outcome
