"""The socket-free bookkeeping of a client's calls: request ids, outstanding requests, turning
replies into results or typed errors, and the timeout and retry policy.

Two clocks bound a call. While no server has completed a handshake, ``connect_timeout``: past
it the call fails with ``Unreachable`` (never connected) or ``ConnectionLost`` (the connection
it was sent on dropped). Once one has, ``timeout`` per attempt (Lazy Pirate), then ``Timeout``.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import errors
from ..protocol import messages as protocol
from ..protocol.messages import Inputs, Message, ProtocolError
from ..units import MS_PER_SECOND, format_size
from .link import Link

_log = logging.getLogger(__name__)

Outputs = np.ndarray | dict[str, np.ndarray] | None
EVERY_CALL = object()  # the id of a reply that answers all calls: the server speaks another version


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
    model: str | None = None  # the served model it is for; None: the server's only one
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
            raise errors.InternalError(
                "malformed reply: 'info' is not an object", worker_pid=header.get("worker_pid")
            )
        return info


@dataclass(eq=False)
class Calls:
    """The outstanding calls of one client, independent of its socket and of how it waits.

    ``start`` sends a new call, ``reply`` takes every message received, ``connected`` and
    ``resend`` follow the connection (``link``, that of the socket in use), and ``expire`` runs
    once ``next_expiry`` has passed.
    """

    endpoint: str
    timeout: float
    retries: int
    connect_timeout: float
    link: Link
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), init=False)
    _outstanding: dict[int, Call] = field(default_factory=dict, init=False)
    # The server on this connection answered shutting_down: nothing more is sent on it, where
    # it would race the server's exit (a request sent as it closes is read by no one).
    draining: bool = field(default=False, init=False)
    # The largest request the server on this connection takes, as its replies state it; None
    # before any reply (``limit_heard`` then False), or when it states none (an older server).
    limit: int | None = field(default=None, init=False)
    limit_heard: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {self.timeout!r}")
        if not self.connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, not {self.connect_timeout!r}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, not {self.retries!r}")

    @property
    def outstanding(self) -> bool:
        return bool(self._outstanding)

    def next_expiry(self) -> float:
        """When the next call runs out of time: for a reply while connected, else for a server."""
        return min((call.expires if self.link.up else call.connect_by
                    for call in self._outstanding.values()), default=math.inf)

    def start(
        self,
        payload: Inputs | None,
        method: str,
        deadline: float | None,
        send: Callable[[list], None],
        model: str | None = None,
    ) -> Call:
        """A new call, sent at once, or already failed if its input cannot be encoded. Sent
        before any server is connected, it waits in the socket's queue until one is."""
        if deadline is not None and not deadline >= 0:
            raise ValueError(f"deadline must be >= 0 seconds, not {deadline!r}")
        call = Call(payload, method, deadline, model)
        self._attempt(call, time.monotonic(), send)
        return call

    def must_learn_limit(self, payload: Inputs | None) -> bool:
        """Whether ``payload`` may be over a limit not heard yet: the front end then asks the
        server for ``info`` first, whose reply states it (``hear_limit``)."""
        return not self.limit_heard and protocol.payload_bytes(payload) > protocol.MIN_MESSAGE_SIZE

    def hear_limit(self, limit: int | None) -> None:
        """Take the limit a reply from the server on this connection states."""
        self.limit, self.limit_heard = limit, True

    def reply(self, frames: list) -> Call | None:
        """Settle the call a received message answers; anything not outstanding is dropped,
        and a ``shutting_down`` answer with a retry left is held (None for both)."""
        request_id, outcome = _decode(frames)
        if request_id is EVERY_CALL:
            assert isinstance(outcome, BaseException)
            self.abandon(outcome)
            return None
        call = self._outstanding.get(request_id) if type(request_id) is int else None
        if call is None:
            _log.debug("discarding reply to request %r: not outstanding", request_id)
            return None
        if isinstance(outcome, errors.ShuttingDown):
            self.draining = True
        if isinstance(outcome, errors.ShuttingDown) and call.attempts <= self.retries:
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
        # A new connection: whoever is there has said nothing yet.
        self.draining, self.limit, self.limit_heard = False, None, False
        calls = list(self._outstanding.values())
        self._outstanding.clear()
        for call in calls:
            call.lost = call.lost or dropped
            out_of_retries = call.attempts > self.retries
            if dropped and out_of_retries:
                self._lost(call, f"after {_attempts(call.attempts)}{why}")
            elif out_of_retries and call.expires <= now:
                self._finish(call, errors.Timeout(
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
                self._lost(call, f"and no server took it back in {self.connect_timeout:g} s")
            else:
                self._finish(call, errors.Unreachable(unreachable))

    def forget(self, call: Call) -> None:
        """Stop waiting for a call (its caller gave up): a reply to it will be discarded."""
        if call.id is not None and self._outstanding.get(call.id) is call:
            del self._outstanding[call.id]

    def abandon(self, error: BaseException) -> None:
        """Fail every outstanding call with ``error`` (the client closed, or its reader died)."""
        for call in list(self._outstanding.values()):
            self._finish(call, error)

    def close(self) -> None:
        self.abandon(errors.WorkerpoolError("the client was closed before the reply arrived"))

    def _attempt(self, call: Call, now: float, send: Callable[[list], None]) -> None:
        call.attempts += 1
        deadline_ms = None
        if call.deadline is not None:
            if call.deadline_at is None:
                call.deadline_at = now + call.deadline
            elif call.deadline_at <= now:
                self._finish(
                    call,
                    errors.DeadlineExceeded("the deadline passed before the request could be retried"),
                )
                return
            deadline_ms = (call.deadline_at - now) * MS_PER_SECOND
        call.id = next(self._ids)
        try:
            frames = protocol.encode_request(
                call.id, call.payload, method=call.method, deadline_ms=deadline_ms, model=call.model
            )
        except ProtocolError as exc:
            self._finish(call, errors.BadRequest(str(exc)))
            return
        size = protocol.request_bytes(frames)
        if self.limit is not None and size > self.limit:
            self._finish(call, errors.RequestTooLarge(
                f"the request is {format_size(size)} ({size} bytes), over the --max-message-size "
                f"of the server at {self.endpoint}, {format_size(self.limit)} ({self.limit} bytes): it "
                "was not sent; send fewer rows per request, or raise the server's limit"))
            return
        if self.draining and call.attempts > self.retries:
            self._finish(call, errors.ShuttingDown(
                f"the server at {self.endpoint} said it is shutting down: the request was not sent"))
            return
        call.expires = now + self.timeout
        call.connect_by = math.inf if self.link.up else now + self.connect_timeout
        self._outstanding[call.id] = call
        if not self.draining:  # else held, to be sent to whatever server is there once this one is gone
            send(frames)

    def _lost(self, call: Call, how: str) -> None:
        self._finish(call, errors.ConnectionLost(
            f"the connection to {self.endpoint} was lost while the request was in flight, {how}"))

    def _finish(self, call: Call, outcome: Message | BaseException) -> None:
        self.forget(call)
        call.outcome = outcome
        if call.on_done is not None:
            call.on_done()


def _attempts(count: int) -> str:
    return f"{count} attempt{'s' if count > 1 else ''}"


def _decode(frames: list) -> tuple[Any, Message | errors.RemoteError]:
    """The request id a message answers and its outcome: a reply, or the error it carries.

    A reply that breaks the protocol becomes ``InternalError`` (a server fault, not the
    caller's) when its id can still be read; otherwise it is attributed to nobody, dropped, and
    its request is retried when its timeout expires. A reply of another protocol version
    answers every call (:data:`EVERY_CALL`): that server can read none of them.
    """
    try:
        if not frames or len(frames[0]):
            raise ProtocolError("reply does not start with an empty delimiter frame")
        message = protocol.decode_reply(frames[1:])
    except ProtocolError as exc:
        try:  # a reply of another version need not be laid out as this version's are
            header = protocol.decode_header(frames[1])
        except (ProtocolError, IndexError):
            return None, errors.InternalError(f"malformed reply: {exc}")
        if header.get("v") != protocol.VERSION:
            return EVERY_CALL, _other_version(header)
        return header.get("id"), errors.InternalError(f"malformed reply: {exc}")
    if message.header.get("v") != protocol.VERSION:
        return EVERY_CALL, _other_version(message.header)
    if message.header["status"] == "ok":
        return message.id, message
    return message.id, errors.error_of_reply(message.header)


def _other_version(header: dict[str, Any]) -> errors.BadRequest:
    return errors.BadRequest(
        f"the server speaks wire protocol version {header.get('v')!r} and this client version "
        f"{protocol.VERSION} (docs/protocol.md): run the same workerpool release on both sides")
