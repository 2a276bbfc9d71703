"""The blocking client: one DEALER socket, Lazy Pirate retries, pipelined ``infer_many``.

``_Calls`` below holds everything that does not touch a socket (request ids, outstanding
requests, turning replies into results or typed errors, the timeout and retry policy) so that
``Client`` here and ``AsyncClient`` in ``aio.py`` only differ in how they wait.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import zmq

from . import protocol
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

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"

_log = logging.getLogger(__name__)

Outputs = np.ndarray | dict[str, np.ndarray] | None


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
class _Call:
    """One logical request. Every attempt is sent under a fresh id, so a late reply to an
    abandoned attempt can never be taken for the answer to a newer one."""

    payload: Inputs | None
    method: str
    deadline: float | None
    deadline_at: float | None = None
    attempts: int = 0
    id: int | None = None
    expires: float = math.inf
    outcome: Message | BaseException | None = None

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
        return Result(message.payload(), header.get("worker_pid"), header.get("generation"))

    def info(self) -> dict[str, Any]:
        header = self.message().header
        info = header.get("info")
        if not isinstance(info, dict):
            raise InternalError(
                "malformed reply: 'info' is not an object", worker_pid=header.get("worker_pid")
            )
        return info


class _Calls:
    """The socket-free core shared by ``Client`` and ``AsyncClient``.

    Front ends call ``start`` to send, ``reply`` with every message received, and ``retry``
    (after replacing their socket) once ``next_expiry`` has passed. ``on_done`` is told about
    every call that finishes, which the asyncio front end needs to wake its waiters.
    """

    def __init__(
        self,
        endpoint: str,
        timeout: float,
        retries: int,
        on_done: Callable[[_Call], None] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, not {retries!r}")
        self.endpoint = endpoint
        self.timeout = timeout
        self.retries = retries
        self._on_done = on_done
        self._ids = itertools.count(1)
        self._outstanding: dict[int, _Call] = {}

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
    ) -> _Call:
        """A new call, sent at once, or already failed if its input cannot be encoded."""
        if deadline is not None and not deadline >= 0:
            raise ValueError(f"deadline must be >= 0 seconds, not {deadline!r}")
        call = _Call(payload, method, deadline)
        self._attempt(call, time.monotonic(), send)
        return call

    def reply(self, frames: list) -> _Call | None:
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
                        f"no reply from {self.endpoint} in {call.attempts} attempts of {self.timeout} s"
                    ),
                )
            else:
                self._attempt(call, now, send)

    def forget(self, call: _Call) -> None:
        """Stop waiting for a call (its caller gave up): a reply to it will be discarded."""
        if self._outstanding.get(call.id) is call:  # type: ignore[arg-type]
            del self._outstanding[call.id]  # type: ignore[arg-type]

    def abandon(self, error: BaseException) -> None:
        """Fail every outstanding call with ``error`` (the client closed, or its reader died)."""
        for call in list(self._outstanding.values()):
            self._finish(call, error)

    def close(self) -> None:
        self.abandon(WorkerpoolError("the client was closed before the reply arrived"))

    def _attempt(self, call: _Call, now: float, send: Callable[[list], None]) -> None:
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
            deadline_ms = (call.deadline_at - now) * 1000
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

    def _finish(self, call: _Call, outcome: Message | BaseException) -> None:
        self._outstanding.pop(call.id, None)  # type: ignore[arg-type]
        call.outcome = outcome
        if self._on_done is not None:
            self._on_done(call)


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


def _open_socket(
    context: zmq.Context, endpoint: str, socket_class: type[zmq.Socket], keys: ClientKeys | None
) -> zmq.Socket:
    """A DEALER connected to the server's ROUTER (with CURVE when ``keys`` are given).

    No ``IMMEDIATE``: a fresh socket (every retry makes one) has no finished connection yet, and
    with ``IMMEDIATE`` a non-blocking send would fail there; without it the message waits in the
    socket's queue until the connection is up, and a retry discards the queue (linger 0).
    """
    socket = context.socket(zmq.DEALER, socket_class=socket_class)
    socket.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.apply(socket)
    socket.connect(endpoint)
    return socket


def _send(socket: zmq.Socket, frames: list) -> None:
    """Queue a request without ever blocking. If the queue is full the request is lost, which its
    timeout handles like any other lost request."""
    try:
        sent = socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        if asyncio.isfuture(sent):  # zmq.asyncio settles a non-blocking send at once
            sent.result()
    except zmq.Again:
        _log.debug("send queue is full; the request will be resent when its reply is overdue")


def _poll_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class Client:
    """Blocking client for a workerpool server.

    Not thread-safe: it owns one ZeroMQ socket, and ZeroMQ sockets must not be used from two
    threads at once. Use one client per thread. Within a thread, calls may interleave freely
    (``info()`` inside an ``infer_many`` loop works): replies are routed to requests by id.

    Each request waits up to ``timeout`` seconds for its reply. When a reply is overdue the
    socket is closed and replaced and every outstanding request is resent (inference is
    idempotent); a request sent ``retries + 1`` times without a reply raises ``Timeout``.

    ``keys`` (:class:`workerpool.security.ClientKeys`) speaks CURVE to a server started with
    ``--curve-server-key``: without allowed keys such a server does not answer at all.
    """

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
        self._calls = _Calls(endpoint, timeout, retries)
        self._socket: zmq.Socket | None = _open_socket(self._context, endpoint, zmq.Socket, keys)

    def request(self, x: Inputs, *, deadline: float | None = None) -> Result:
        """Run the model on ``x`` (an array, or a dict of named arrays).

        ``deadline`` (seconds) asks the server to answer ``DeadlineExceeded`` rather than start
        the request late. Inputs of a dtype the protocol cannot carry raise ``BadRequest``
        before anything is sent.
        """
        return self._wait(self._start(x, protocol.METHOD_INFER, deadline)).result()

    def infer(self, x: Inputs, *, deadline: float | None = None) -> Outputs:
        """Like ``request``, returning only the outputs."""
        return self.request(x, deadline=deadline).outputs

    def info(self) -> dict[str, Any]:
        """The server's description of itself and its model."""
        return self._wait(self._start(None, protocol.METHOD_INFO, None)).info()

    def infer_many(
        self, inputs: Iterable[Inputs], *, window: int = 8, deadline: float | None = None
    ) -> Iterator[Outputs]:
        """Outputs for ``inputs`` in order, with up to ``window`` requests in flight at once.

        ``inputs`` is read lazily, never more than ``window`` items ahead of the output being
        waited for. A failed item raises when its turn comes. Arrays must not be modified while
        their request is in flight (they are sent without a copy, and resent on retry).
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, not {window!r}")
        return self._pipeline(iter(inputs), window, deadline)

    def close(self) -> None:
        """Close the socket at once, dropping anything unsent. Safe to call twice."""
        if self._socket is not None:
            self._calls.close()
            self._socket.close(linger=0)
            self._socket = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _pipeline(
        self, inputs: Iterator[Inputs], window: int, deadline: float | None
    ) -> Iterator[Outputs]:
        calls: deque[_Call] = deque()
        try:
            for x in inputs:
                calls.append(self._start(x, protocol.METHOD_INFER, deadline))
                if len(calls) == window:
                    yield self._wait(calls.popleft()).result().outputs
            while calls:
                yield self._wait(calls.popleft()).result().outputs
        finally:
            for call in calls:
                self._calls.forget(call)

    def _start(self, payload: Inputs | None, method: str, deadline: float | None) -> _Call:
        self._open()
        return self._calls.start(payload, method, deadline, self._send)

    def _send(self, frames: list) -> None:
        _send(self._open(), frames)

    def _wait(self, call: _Call) -> _Call:
        try:
            while not call.done:
                socket = self._open()
                delay = self._calls.next_expiry() - time.monotonic()
                if delay <= 0:
                    self._reset()
                elif socket.poll(_poll_ms(delay), zmq.POLLIN):
                    self._calls.reply(socket.recv_multipart(copy=False))
        finally:
            self._calls.forget(call)
        return call

    def _reset(self) -> None:
        self._open().close(linger=0)
        self._socket = _open_socket(self._context, self.endpoint, zmq.Socket, self._keys)
        self._calls.retry(time.monotonic(), self._send)

    def _open(self) -> zmq.Socket:
        if self._socket is None:
            raise WorkerpoolError("the client is closed")
        return self._socket
