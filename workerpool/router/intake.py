"""The client side of the router: the client socket, and requests waiting for a free worker.

Requests are checked only as far as routing needs (framing, the route frame, total size, the
server still accepting); the worker validates the rest. The router reads a request's route
frame (``protocol/route.py``: method, deadline, how it batches) and decodes its JSON header only
to answer it with an error. Waiting requests carry their deadlines.

The queue is bounded twice, by count (``--max-queue``) and by the bytes its requests hold
(``--max-queue-bytes``): the count alone let a client with large requests fill the
supervisor's memory. It is also fair between clients (ZeroMQ routing ids), so one client that
pipelines thousands of requests cannot starve the others:

- Each client waits in its own first-in-first-out line, and free workers serve the lines in
  turn, so a newcomer's request is served before the flooder's next one. Requests retried
  after their worker died go before every line: they have waited longest.
- While there is room anyone may queue, so a client alone can use the whole queue. When a
  limit is reached, a client that would still hold no more than its fair share of it (the
  limit divided among the clients holding requests, itself included) makes room: the newest
  requests of the client holding the most are answered ``overloaded``; otherwise its own
  request is. The newest go because the oldest have waited longest and are served next.
  Finding the biggest holder scans the clients, but only when a limit is reached.

The HTTP front door runs on this process's loop (``gateway/server.py``): it hands requests in
without a socket, each HTTP connection a client of its own (a key that begins with this process's secret
:attr:`Intake.local_key`, which no ZeroMQ peer can know), and its replies go back the same way.

Nothing here touches a socket: the router's shell (``links.py``) hands in what the client
socket received, and sends the replies put in the outbox, without blocking: libzmq holds up to
the socket's SNDHWM replies (1000 by default) for a client that does not read, then the shell
drops the rest, so a stalled client never delays anyone else.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode
from ..logs import Throttle
from ..protocol import messages as protocol
from ..protocol.route import Route, is_json, read_route
from ..units import MS_PER_SECOND, KiB
from .batching import BatchShape
from .outbox import Outbox

if TYPE_CHECKING:
    import zmq

    from .connections import ConnectionLimit

log = logging.getLogger(__name__)

WARN_INTERVAL = 10.0  # seconds between warnings about requests refused for their size
EXPIRY_SCAN_INTERVAL = 0.01  # seconds between scans of the queue for passed deadlines
# libzmq's ZMQ_IN_BATCH_SIZE: a received frame up to this size may point into a shared receive
# buffer of about 18 KiB, which it keeps alive for as long as it lives.
SHARED_FRAME_MAX = 8 * KiB
EVICTED = ("the queue is full and this client held the most of it: its newest request gave "
           "way to a client holding less than its share")
LOCAL_KEY_BYTES = 16
COUNT = "count"  # the limits a full queue can be at
BYTES = "bytes"


@dataclass(eq=False)
class Pending:
    """A request the router holds: queued, or in flight on one worker."""

    client: bytes
    frames: list[Any]  # the route frame, the header frame, then the array frames
    route: Route
    received: float
    expires: float | None = None
    attempts: int = 0
    size: int = 0  # bytes of the message, counted against the queue's byte limit
    solo: bool = False  # sent alone from now on: it was in flight on a worker that was lost
    shape: BatchShape | None = None  # how it batches, once ``shaped``
    shaped: bool = False

    @property
    def id(self) -> Any:
        """The request's id, for an error reply: the one time the router decodes its header."""
        return request_id_of(self.frames)

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


class QueueFull(Exception):
    """A request may not queue: ``limit`` (``COUNT`` or ``BYTES``) is reached and its client
    holds its fair share."""

    def __init__(self, limit: str) -> None:
        super().__init__(limit)
        self.limit = limit


class Line:
    """One client's queued requests, oldest first, and the bytes they hold."""

    __slots__ = ("nbytes", "requests")

    def __init__(self) -> None:
        self.requests: deque[Pending] = deque()
        self.nbytes = 0

    def held(self, limit: str) -> int:
        return len(self.requests) if limit == COUNT else self.nbytes


class RequestQueue:
    """Per-client lines served in turn, retried requests first; bounded in count and bytes
    (``max_bytes`` None: unbounded in bytes)."""

    def __init__(self, limit: int, max_bytes: int | None = None) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._count = 0
        self._retried: deque[Pending] = deque()
        self._lines: dict[bytes, Line] = {}
        self._turns: deque[bytes] = deque()  # clients with a line, the next one to serve first
        self._next_scan = 0.0

    def __len__(self) -> int:
        return self._count

    def put(self, pending: Pending, *, first: bool = False) -> None:
        """Queue ``pending`` at the end of its client's line, or with ``first`` (a retry, or a
        request taken but not dispatched) before everything else. No limit is checked here."""
        if first:
            self._retried.appendleft(pending)
        else:
            line = self._lines.get(pending.client)
            if line is None:
                line = self._lines[pending.client] = Line()
                self._turns.append(pending.client)
            line.requests.append(pending)
            line.nbytes += pending.size
        self._count += 1
        self.nbytes += pending.size

    def peek(self) -> Pending:
        """The request :meth:`take` would return, left in place."""
        if self._retried:
            return self._retried[0]
        return self._lines[self._turns[0]].requests[0]

    def take(self) -> Pending:
        """The next request: a retried one, else the oldest of the client whose turn it is."""
        if self._retried:
            pending = self._retried.popleft()
        else:
            client = self._turns[0]
            line = self._lines[client]
            pending = line.requests.popleft()
            line.nbytes -= pending.size
            if line.requests:
                self._turns.rotate(-1)
            else:
                self._turns.popleft()
                del self._lines[client]
        self._count -= 1
        self.nbytes -= pending.size
        return pending

    @property
    def holders(self) -> int:
        """How many clients have requests in their lines."""
        return len(self._lines)

    def holds(self, client: bytes) -> bool:
        return client in self._lines

    def _passed(self, size: int) -> list[str]:
        passed = [COUNT] if self._count >= self.limit else []
        if self.max_bytes is not None and self.nbytes + size > self.max_bytes:
            passed.append(BYTES)
        return passed

    def check_room(self, pending: Pending) -> None:
        """Raise ``QueueFull`` when ``pending`` may not queue: a limit is reached and its client
        would hold more than its fair share of it."""
        for limit in self._passed(pending.size):
            if not self._within_share(pending, limit):
                raise QueueFull(limit)

    def make_room(self, pending: Pending) -> list[Pending]:
        """Remove and return the requests that give way for ``pending``, which ``check_room``
        let in: the newest of whichever client holds the most of a passed limit."""
        passed = self._passed(pending.size)
        evicted = []
        while passed:
            biggest = max(self._lines.values(), key=lambda line: line.held(passed[0]))
            evicted.append(self._evict_newest(biggest))
            passed = self._passed(pending.size)
        return evicted

    def _within_share(self, pending: Pending, limit: str) -> bool:
        """Whether ``pending``'s client, holding it too, keeps within an equal share of what
        ``limit`` leaves beside the retried requests. Then some other client holds more than
        its share, and evicting from the biggest holder always ends in room."""
        if limit == COUNT:
            capacity, size = self.limit - len(self._retried), 1
        else:
            retried = sum(p.size for p in self._retried)
            capacity, size = (self.max_bytes or 0) - retried, pending.size
        line = self._lines.get(pending.client)
        held = 0 if line is None else line.held(limit)
        holders = len(self._lines) + (line is None)
        return (held + size) * holders <= capacity

    def _evict_newest(self, line: Line) -> Pending:
        pending = line.requests.pop()
        line.nbytes -= pending.size
        if not line.requests:
            del self._lines[pending.client]
            self._turns.remove(pending.client)  # O(clients), as finding the biggest holder was
        self._count -= 1
        self.nbytes -= pending.size
        return pending

    def take_expired(self, now: float) -> list[Pending]:
        """Remove and return the requests whose deadline passed (scanned at most every 10 ms)."""
        if not self._count or now < self._next_scan:
            return []
        self._next_scan = now + EXPIRY_SCAN_INTERVAL
        expired = [p for p in self._everything() if p.expired(now)]
        if expired:
            self._retried = deque(p for p in self._retried if not p.expired(now))
            for line in self._lines.values():
                line.requests = deque(p for p in line.requests if not p.expired(now))
                line.nbytes = sum(p.size for p in line.requests)
            self._lines = {client: line for client, line in self._lines.items() if line.requests}
            self._turns = deque(client for client in self._turns if client in self._lines)
            self._count -= len(expired)
            self.nbytes -= sum(p.size for p in expired)
        return expired

    def take_all(self) -> Iterator[Pending]:
        while self._count:
            yield self.take()

    def _everything(self) -> Iterator[Pending]:
        yield from self._retried
        for line in self._lines.values():
            yield from line.requests


class Intake:
    """Takes requests in, hands each to ``dispatch`` or queues it, and puts replies and errors
    in the outbox."""

    def __init__(self, outbox: Outbox, *, max_queue: int, max_message_size: int,
                 max_queue_bytes: int | None, dispatch: Callable[[Pending], bool]) -> None:
        self.outbox = outbox
        self.local_key = os.urandom(LOCAL_KEY_BYTES)
        self.connections: ConnectionLimit | None = None  # set by the serve role
        self.max_message_size = max_message_size
        self.dispatch = dispatch
        self.queue = RequestQueue(max_queue, max_queue_bytes)
        self.accepting = True
        self.outcomes: Counter[str] = Counter()  # replies sent, by "ok" or error code
        self.read = 0  # requests taken in, answered or not yet
        self.too_large = 0  # requests refused for their size
        self._warnings = Throttle(WARN_INTERVAL)

    def receive(self, frames: list[zmq.Frame]) -> None:
        """A message from the client socket: the client's routing id, then what it sent."""
        self.read += 1
        client = frames[0].bytes
        if len(frames) < 3 or frames[1].bytes != b"":
            self.reply_error(client, request_id_of(frames[1:]), ErrorCode.BAD_REQUEST,
                             "a request is an empty delimiter frame, a route frame, a JSON header frame, "
                             "then array frames")
            return
        connections = self.connections
        if connections is not None and client not in connections.serving:
            why = connections.admit(client, frames[0])
            if why is not None:
                self.refuse(client, frames[2:], ErrorCode.OVERLOADED, why)
                return
        self.admit(client, frames[2:], sum(len(frame) for frame in frames))

    def overlong(self, frames: list[zmq.Frame], count: int) -> None:
        """A message of more frames than any request has: answered, though never held whole."""
        self.read += 1
        request_id = request_id_of(frames[2:]) if frames[1].bytes == b"" else None
        self.reply_error(frames[0].bytes, request_id, ErrorCode.BAD_REQUEST,
                         f"a message of {count - 1} frames: a request is at most {protocol.MAX_ARRAYS + 3} "
                         f"(a delimiter, a route frame, a header and {protocol.MAX_ARRAYS} arrays)")

    def admit_local(self, lane: bytes, frames: list[Any], size: int) -> None:
        """Take a request from the HTTP front door, in this process: ``lane`` (one HTTP
        connection, which begins with :attr:`local_key`) is a client of its own."""
        self.read += 1
        self.admit(lane, frames, size)

    def admit(self, client: bytes, frames: list[Any], size: int) -> None:
        """Take a request (route frame, header frame, then array frames) of ``size`` bytes
        from ``client``."""
        if not self.accepting:
            self.refuse(client, frames, ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            return
        if size > self.max_message_size:  # libzmq's own limit is per frame
            self.too_large += 1
            if self._warnings.due("too large"):
                log.warning("refused a request of %d bytes, over --max-message-size %d (%d so far)",
                            size, self.max_message_size, self.too_large)
            self.refuse(client, frames, ErrorCode.BAD_REQUEST,
                        f"the request is {size} bytes, over --max-message-size {self.max_message_size}")
            return
        try:
            route = read_route(frames[0])
            if len(frames) < 2:
                raise protocol.ProtocolError("a route frame with no header frame after it")
        except protocol.ProtocolError as exc:
            self.refuse(client, frames, ErrorCode.BAD_REQUEST, str(exc))
            return
        pending = Pending(client, frames, route, time.monotonic(), size=size)
        if route.deadline is not None:
            pending.expires = pending.received + route.deadline
        if not self.dispatch(pending):
            self._wait(pending)

    def _wait(self, pending: Pending) -> None:
        """Queue a request no worker could take, if its client may have room (module docstring)."""
        try:
            self.queue.check_room(pending)
        except QueueFull as full:
            self.fail(pending, ErrorCode.OVERLOADED, self._refusal(pending, full.limit))
            return
        if self._expired(pending):  # before evicting: a request past its deadline takes no room
            return
        for victim in self.queue.make_room(pending):
            self.fail(victim, ErrorCode.OVERLOADED, EVICTED)
        pending.frames = [bytes(f) if len(f) <= SHARED_FRAME_MAX else f for f in pending.frames]
        self.queue.put(pending)

    def _refusal(self, pending: Pending, limit: str) -> str:
        queue = self.queue
        if limit == COUNT:
            why = f"{len(queue)} requests already queued (--max-queue {queue.limit})"
        else:
            why = (f"queued requests hold {queue.nbytes} bytes; this one's {pending.size} more "
                   f"would pass --max-queue-bytes {queue.max_bytes}")
        if queue.holders > int(queue.holds(pending.client)):  # others hold requests too
            why += "; this client already holds its fair share"
        return why

    def enqueue(self, pending: Pending, *, first: bool = False) -> None:
        """Queue ``pending`` without a limit (a retry), or answer it if its deadline passed."""
        if not self._expired(pending):
            self.queue.put(pending, first=first)

    def _expired(self, pending: Pending) -> bool:
        """Whether ``pending``'s deadline has passed; then answer it and say so."""
        if not pending.expired(time.monotonic()):
            return False
        self.expire(pending)
        return True

    def refuse(self, client: bytes, frames: list[Any], code: ErrorCode, message: str) -> None:
        """Answer a request not taken in: ``frames`` are what it sent past the delimiter."""
        self.reply_error(client, request_id_of(frames), code, message)

    def fail(self, pending: Pending, code: ErrorCode, message: str) -> None:
        self.reply_error(pending.client, pending.id, code, message)

    def reply_error(self, client: bytes, request_id: Any, code: ErrorCode, message: str) -> None:
        self.outcomes[code] += 1
        self.send(client, protocol.encode_error(request_id, code, message))

    def send(self, client: bytes, frames: list[Any]) -> None:
        self.outbox.to_client(client, frames)

    def expire(self, pending: Pending) -> None:
        waited = time.monotonic() - pending.received
        self.fail(pending, ErrorCode.DEADLINE_EXCEEDED,
                  f"the deadline passed after {waited * MS_PER_SECOND:.0f} ms in the queue")

    def expire_due(self) -> None:
        for pending in self.queue.take_expired(time.monotonic()):
            self.expire(pending)

    def fail_queued(self, code: ErrorCode, message: str) -> None:
        for pending in self.queue.take_all():
            self.fail(pending, code, message)


def request_id_of(frames: list[Any]) -> Any:
    """The id of a request (route frame, header, arrays), best effort: None when its header
    cannot be read. A protocol version 1 request has its header where the route frame is."""
    if not frames:
        return None
    if is_json(bytes(memoryview(frames[0])[:3])):
        return protocol.request_id_of(frames[0])
    return protocol.request_id_of(frames[1]) if len(frames) > 1 else None
