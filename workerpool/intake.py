"""The client side of the router: the client socket, and requests waiting for a free worker.

Requests are checked only as far as routing needs (framing, total size, the server still
accepting); the worker validates the rest. Waiting requests sit in a bounded queue and carry
their deadlines.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import zmq

from . import protocol
from .transport import NOBLOCK, receive_batch, send_parts
from .units import MS_PER_SECOND

log = logging.getLogger("workerpool.router")

EXPIRY_SCAN_INTERVAL = 0.01  # seconds between scans of the queue for passed deadlines


@dataclass(eq=False)
class Pending:
    """A request the router holds: queued, or in flight on one worker."""

    client: bytes
    frames: list[Any]  # the header frame, then the array frames
    received: float
    expires: float | None = None
    attempts: int = 0

    def read_deadline(self) -> None:
        """Set ``expires`` from the header: done only when the request has to wait, off the
        fast path; a malformed header is the worker's to answer in full."""
        if self.expires is not None:
            return
        try:
            budget = protocol.deadline_of(protocol.decode_header(self.frames[0]))
        except protocol.ProtocolError:
            return
        if budget is not None:
            self.expires = self.received + budget

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


class RequestQueue:
    """First in, first out; a retried request goes back to the front."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[Pending] = deque()
        self._next_scan = 0.0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, pending: Pending, *, first: bool = False) -> None:
        if first:
            self._items.appendleft(pending)
        else:
            self._items.append(pending)

    def take(self) -> Pending:
        return self._items.popleft()

    def take_expired(self, now: float) -> list[Pending]:
        """Remove and return the requests whose deadline passed (scanned at most every 10 ms)."""
        if not self._items or now < self._next_scan:
            return []
        self._next_scan = now + EXPIRY_SCAN_INTERVAL
        if not any(p.expired(now) for p in self._items):
            return []
        expired = [p for p in self._items if p.expired(now)]
        self._items = deque(p for p in self._items if not p.expired(now))
        return expired

    def take_all(self) -> Iterator[Pending]:
        while self._items:
            yield self._items.popleft()


class Intake:
    """Owns the client socket: takes requests in, hands each to ``dispatch`` or queues it,
    and sends replies and errors back without ever blocking on a client."""

    def __init__(self, sock: zmq.Socket, *, max_queue: int, max_message_size: int,
                 dispatch: Callable[[Pending], bool]) -> None:
        self.socket = sock
        self.max_message_size = max_message_size
        self.dispatch = dispatch
        self.queue = RequestQueue(max_queue)
        self.accepting = True

    def on_readable(self) -> None:
        receive_batch(self.socket, self._accept)

    def _accept(self, frames: list[zmq.Frame]) -> None:
        client = frames[0].bytes
        if len(frames) < 3 or frames[1].bytes != b"":
            request_id = protocol.request_id_of(frames[1]) if len(frames) > 1 else None
            self.reply_error(client, request_id, "bad_request",
                             "a request is an empty delimiter frame, a JSON header frame, then array frames")
            return
        if not self.accepting:
            self.refuse(client, frames[2], "shutting_down", "the server is shutting down")
            return
        size = sum(len(frame) for frame in frames)
        if size > self.max_message_size:  # libzmq's own limit is per frame
            self.refuse(client, frames[2], "bad_request",
                        f"the request is {size} bytes, over --max-message-size {self.max_message_size}")
            return
        pending = Pending(client, frames[2:], time.monotonic())
        if self.dispatch(pending):
            return
        if len(self.queue) >= self.queue.limit:
            self.refuse(client, frames[2], "overloaded",
                        f"{len(self.queue)} requests already queued (--max-queue {self.queue.limit})")
            return
        self.enqueue(pending)

    def enqueue(self, pending: Pending, *, first: bool = False) -> None:
        pending.read_deadline()
        if pending.expired(time.monotonic()):
            self.expire(pending)
        else:
            self.queue.put(pending, first=first)

    def refuse(self, client: bytes, header: Any, code: str, message: str) -> None:
        self.reply_error(client, protocol.request_id_of(header), code, message)

    def fail(self, pending: Pending, code: str, message: str) -> None:
        self.refuse(pending.client, pending.frames[0], code, message)

    def reply_error(self, client: bytes, request_id: Any, code: str, message: str) -> None:
        self.send(client, protocol.encode_error(request_id, code, message))

    def send(self, client: bytes, frames: list[Any]) -> None:
        try:
            send_parts(self.socket, [client, b"", *frames], NOBLOCK)
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client went away; EAGAIN: it does not read
            log.debug("reply to a vanished or stalled client dropped: %s", exc)

    def expire(self, pending: Pending) -> None:
        waited = time.monotonic() - pending.received
        self.fail(pending, "deadline_exceeded",
                  f"the deadline passed after {waited * MS_PER_SECOND:.0f} ms in the queue")

    def expire_due(self) -> None:
        for pending in self.queue.take_expired(time.monotonic()):
            self.expire(pending)

    def fail_queued(self, code: str, message: str) -> None:
        for pending in self.queue.take_all():
            self.fail(pending, code, message)
