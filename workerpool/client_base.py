"""What the blocking and the asyncio client share: everything but how they wait.

``Calls`` keeps the socket-free bookkeeping (request ids, outstanding requests, turning replies
into results or typed errors, the timeout and retry policy) and ``BaseClient`` owns the DEALER
socket around it, so ``Client`` (``client.py``) and ``AsyncClient`` (``aio.py``) only add a
blocking poll or an asyncio reader task, and their public methods.
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

from . import protocol
from .config import DEFAULT_BIND
from .errors import (
    ERRORS_BY_CODE,
    BadRequest,
    DeadlineExceeded,
    InternalError,
    RemoteError,
    Timeout,
    WorkerpoolError,
)
from .protocol import Inputs, Message, ProtocolError
from .security import ClientKeys
from .units import MS_PER_SECOND

DEFAULT_ENDPOINT = DEFAULT_BIND

# Under the name users already configure: both front ends log through the one client logger.
_log = logging.getLogger("workerpool.client")

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


class Calls:
    """The outstanding calls of one client, independent of its socket and of how it waits.

    ``start`` sends a new call, ``reply`` takes every message received, and ``retry`` (after the
    socket was replaced) runs once ``next_expiry`` has passed.
    """

    def __init__(self, endpoint: str, timeout: float, retries: int) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries!r}")
        self.endpoint = endpoint
        self.timeout = timeout
        self.retries = retries
        self._ids = itertools.count(1)
        self._outstanding: dict[int, Call] = {}

    @property
    def outstanding(self) -> bool:
        return bool(self._outstanding)

    def next_expiry(self) -> float:
        return min((call.expires for call in self._outstanding.values()), default=math.inf)

    def start(
        self,
        payload: Inputs | None,
        method: str,
        deadline: float | None,
        send: Callable[[list], None],
    ) -> Call:
        """A new call, sent at once, or already failed if its input cannot be encoded."""
        if deadline is not None and not deadline >= 0:
            raise ValueError(f"deadline must be >= 0 seconds, not {deadline!r}")
        call = Call(payload, method, deadline)
        self._attempt(call, time.monotonic(), send)
        return call

    def reply(self, frames: list) -> Call | None:
        """Settle the call a received message answers; anything not outstanding is dropped."""
        request_id, outcome = _decode(frames)
        call = self._outstanding.pop(request_id, None) if type(request_id) is int else None
        if call is None:
            _log.debug("discarding reply to request %r: not outstanding", request_id)
            return None
        self._finish(call, outcome)
        return call

    def retry(self, now: float, send: Callable[[list], None]) -> None:
        """Lazy Pirate, after the front end replaced its socket because a reply was overdue.

        The old socket took every outstanding request with it, so all of them are resent; a
        request whose own reply was overdue and had no retries left fails with ``Timeout``.
        """
        calls = list(self._outstanding.values())
        self._outstanding.clear()
        for call in calls:
            if call.expires <= now and call.attempts > self.retries:
                self._finish(
                    call,
                    Timeout(
                        f"no reply from {self.endpoint} in {call.attempts} "
                        f"attempt{'s' if call.attempts > 1 else ''} of {self.timeout:g} s"
                    ),
                )
            else:
                self._attempt(call, now, send)

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
        self._outstanding[call.id] = call
        send(frames)

    def _finish(self, call: Call, outcome: Message | BaseException) -> None:
        self.forget(call)
        call.outcome = outcome
        if call.on_done is not None:
            call.on_done()


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
    """The socket and the calls on it; a subclass names its ``_socket_class`` and waits.

    Waiting means: while a call is outstanding, poll the socket for up to ``_poll_ms()`` and hand
    what arrives to ``self._calls.reply``.
    """

    _socket_class: type[SocketT]

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        context: zmq.Context | None = None,
        keys: ClientKeys | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._keys = keys
        self._context = context or zmq.Context.instance()
        self._calls = Calls(endpoint, timeout, retries)
        self._socket: SocketT | None = self._connect()

    def _start(self, payload: Inputs | None, method: str, deadline: float | None) -> Call:
        self._open()
        return self._calls.start(payload, method, deadline, self._send)

    def _poll_ms(self) -> int | None:
        """How long to poll before the next reply is overdue; None once one is, and then the
        socket has just been replaced and every outstanding request resent (Lazy Pirate)."""
        delay = self._calls.next_expiry() - time.monotonic()
        if delay <= 0:
            self._reset()
            return None
        return max(1, math.ceil(delay * MS_PER_SECOND))

    def _reset(self) -> None:
        self._open().close(linger=0)
        self._socket = self._connect()
        self._calls.retry(time.monotonic(), self._send)

    def _open(self) -> SocketT:
        if self._socket is None:
            raise WorkerpoolError("the client is closed")
        return self._socket

    def _shut(self) -> None:
        """Fail the calls still waiting and close the socket at once, dropping anything unsent."""
        self._calls.close()
        self._open().close(linger=0)
        self._socket = None

    def _connect(self) -> SocketT:
        """A DEALER connected to the server's ROUTER (with CURVE when ``keys`` are given).

        No ``IMMEDIATE``: a fresh socket (every retry makes one) has no finished connection yet,
        and with ``IMMEDIATE`` a non-blocking send would fail there; without it the message waits
        in the socket's queue until the connection is up, and a retry discards the queue
        (linger 0).
        """
        socket = self._context.socket(zmq.DEALER, socket_class=self._socket_class)
        socket.setsockopt(zmq.LINGER, 0)
        if self._keys is not None:
            self._keys.apply(socket)
        socket.connect(self.endpoint)
        return socket

    def _send(self, frames: list) -> None:
        """Queue a request without ever blocking. If the queue is full the request is lost, which
        its timeout handles like any other lost request."""
        try:
            sent = self._open().send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            if asyncio.isfuture(sent):  # zmq.asyncio settles a non-blocking send at once
                sent.result()
        except zmq.Again:
            _log.debug("send queue is full; the request will be resent when its reply is overdue")
