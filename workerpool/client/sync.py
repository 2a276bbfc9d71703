"""The blocking client: one DEALER socket, Lazy Pirate retries, pipelined ``infer_many``.

All but the waiting lives in ``base.py``, shared with the asyncio client; here a call
is waited for by polling the socket in the caller's thread.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Self

import zmq

from ..errors import RemoteError
from ..protocol import messages as protocol
from ..protocol.messages import Inputs
from ..protocol.transport import NOBLOCK, send_parts
from .base import DEFAULT_ENDPOINT, BaseClient
from .calls import Call, Outputs, Result

__all__ = ["DEFAULT_ENDPOINT", "Client", "Outputs", "Result"]


class Client(BaseClient[zmq.Socket]):
    """Blocking client for a workerpool server.

    Not thread-safe: it owns one ZeroMQ socket, and ZeroMQ sockets must not be used from two
    threads at once. Use one client per thread. Within a thread, calls may interleave freely
    (``info()`` inside an ``infer_many`` loop works): replies are routed to requests by id.

    ``endpoint`` is ``tcp://HOST:PORT`` or ``ipc://PATH``; anything else is a ``ValueError``
    at once. A request waits up to ``connect_timeout`` seconds for a server to complete the
    ZeroMQ handshake, else raises ``Unreachable``. When the connection drops under requests in
    flight (a server that exits or is killed), they are resent at once and reach a server that
    is there again within ``connect_timeout`` (a restart); otherwise, or at once with no retry
    left, they raise ``ConnectionLost``. A connected server's
    reply is awaited up to ``timeout`` seconds; when it is overdue the socket is replaced and
    every outstanding request resent (inference is idempotent). Each resend counts against
    ``retries``: a request sent ``retries + 1`` times without a reply raises ``Timeout``.

    ``keys`` (:class:`workerpool.security.ClientKeys`) speaks CURVE to a server started with
    ``--curve-server-key``: without allowed keys such a server does not answer at all.
    """

    _socket_class = zmq.Socket
    _poller_class = zmq.Poller

    def request(self, x: Inputs, *, deadline: float | None = None, model: str | None = None) -> Result:
        """Run the model on ``x`` (an array, a dict of named arrays, or a list of texts).

        ``deadline`` (seconds) asks the server to answer ``DeadlineExceeded`` rather than start
        the request late. ``model`` names the model, for a server that serves several (one
        with no name goes to the only model; with several served, it raises ``ModelNotFound``
        naming them). Inputs of a dtype the protocol cannot carry raise ``BadRequest`` before
        anything is sent.
        """
        return self._wait(self._start_infer(x, deadline, model)).result()

    def infer(self, x: Inputs, *, deadline: float | None = None, model: str | None = None) -> Outputs:
        """Like ``request``, returning only the outputs."""
        return self.request(x, deadline=deadline, model=model).outputs

    def info(self, *, model: str | None = None) -> dict[str, Any]:
        """The server's description of itself and of ``model`` (its only model when None)."""
        self._take_news()
        return self._wait(self._start(None, protocol.METHOD_INFO, None, model)).info()

    def infer_many(
        self, inputs: Iterable[Inputs], *, window: int = 8, deadline: float | None = None,
        model: str | None = None,
    ) -> Iterator[Outputs]:
        """Outputs for ``inputs`` in order, with up to ``window`` requests in flight at once.

        ``inputs`` is read lazily, never more than ``window`` items ahead of the output being
        waited for. A failed item raises when its turn comes. Arrays must not be modified while
        their request is in flight (they are sent without a copy, and resent on retry).
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, not {window!r}")
        return self._pipeline(iter(inputs), window, deadline, model)

    def close(self) -> None:
        """Close the socket at once, dropping anything unsent. Safe to call twice."""
        if self._socket is not None:
            self._shut()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _pipeline(
        self, inputs: Iterator[Inputs], window: int, deadline: float | None, model: str | None
    ) -> Iterator[Outputs]:
        calls: deque[Call] = deque()
        try:
            for x in inputs:
                calls.append(self._start_infer(x, deadline, model))
                if len(calls) == window:
                    yield self._wait(calls.popleft()).result().outputs
            while calls:
                yield self._wait(calls.popleft()).result().outputs
        finally:
            for call in calls:
                self._calls.forget(call)

    def _start_infer(self, x: Inputs, deadline: float | None, model: str | None) -> Call:
        self._take_news()
        if self._calls.must_learn_limit(x):
            with contextlib.suppress(RemoteError):  # any reply states the server's limit
                self.info(model=model)
        return self._start(x, protocol.METHOD_INFER, deadline, model)

    def _push(self, frames: list) -> None:
        # Frame by frame with plain int flags: send_multipart combines pyzmq's enum flags for
        # every frame, which costs more than the send.
        send_parts(self._open(), frames, NOBLOCK)

    def _wait(self, call: Call) -> Call:
        try:
            while not call.done:
                poll_ms = self._poll_ms()
                if poll_ms is not None:
                    self._open()
                    self._take(dict(self._poller.poll(poll_ms)))
        finally:
            self._calls.forget(call)
        return call
