"""The client side of the router: admitting what the client socket (or the HTTP front door)
hands in as a request, or answering it at once.

Requests are checked only as far as routing needs: framing, the connection cap, total size,
the server still accepting, the route frame (``protocol/route.py``: method, deadline, model, how
it batches and splits) and the model it names; the worker validates the rest. The router
decodes a request's JSON header only to answer it with an error. A request that names no model
goes to the only model served; with several served, it is refused with their names.

The HTTP front door runs on this process's loop (``gateway/server.py``): it hands requests in
without a socket, each HTTP connection a client of its own (a key that begins with this
process's secret :attr:`Intake.local_key`, which no ZeroMQ peer can know), and its replies go
back the same way.

Nothing here touches a socket: the router's shell (``links.py``) hands in what the client
socket received, and sends the answers put in the outbox, without blocking: libzmq holds up to
the socket's SNDHWM replies (1000 by default) for a client that does not read, then the shell
drops the rest, so a stalled client never delays anyone else.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode
from ..logs import Throttle
from ..protocol import messages as protocol
from ..protocol.route import read_route
from .batching import BatchPolicy
from .queue import COUNT, QueueFull, RequestQueue
from .replies import UNKNOWN_MODEL, Replies
from .requests import ZMQ, Request

if TYPE_CHECKING:
    import zmq

    from .connections import ConnectionLimit

log = logging.getLogger(__name__)

WARN_INTERVAL = 10.0  # seconds between warnings about requests refused for their size
LOCAL_KEY_BYTES = 16


class Intake:
    """Admits requests for the models ``policies`` batches (by name), or answers them through
    ``replies``."""

    def __init__(self, replies: Replies, policies: Mapping[str, BatchPolicy], *,
                 max_message_size: int, connections: Callable[[], ConnectionLimit | None] = lambda: None) -> None:
        self.replies = replies
        self.policies = policies
        self.local_key = os.urandom(LOCAL_KEY_BYTES)
        self.connections = connections  # the cap on client connections, once the serve role has one
        self.max_message_size = max_message_size
        self.accepting = True
        self.read = 0  # requests taken in, answered or not yet
        self.too_large = 0  # requests refused for their size
        self._warnings = Throttle(WARN_INTERVAL)

    def receive(self, frames: list[zmq.Frame]) -> Request | None:
        """A message from the client socket (the client's routing id, then what it sent): the
        request to hold, or None when it was answered."""
        self.read += 1
        client = frames[0].bytes
        if len(frames) < 3 or frames[1].bytes != b"":
            self.replies.error(client, frames[2:] if len(frames) > 2 and frames[1].bytes == b"" else frames[1:],
                               ErrorCode.BAD_REQUEST,
                               "a request is an empty delimiter frame, a route frame, a JSON header "
                               "frame, then array frames")
            return None
        connections = self.connections()
        if connections is not None and client not in connections.serving:
            why = connections.admit(client, frames[0])
            if why is not None:
                self.refuse(client, frames[2:], ErrorCode.OVERLOADED, why)
                return None
        return self.admit(client, frames[2:], sum(len(frame) for frame in frames))

    def overlong(self, frames: list[zmq.Frame], count: int) -> None:
        """A message of more frames than any request has: answered, though never held whole."""
        self.read += 1
        self.replies.error(frames[0].bytes, frames[2:] if frames[1].bytes == b"" else [], ErrorCode.BAD_REQUEST,
                           f"a message of {count - 1} frames: a request is at most {protocol.MAX_ARRAYS + 3} "
                           f"(a delimiter, a route frame, a header and {protocol.MAX_ARRAYS} arrays)")

    def receive_local(self, lane: bytes, frames: list[Any], size: int, api: str) -> Request | None:
        """A request from the HTTP front door, in this process: ``lane`` (one HTTP connection,
        which begins with :attr:`local_key`) is a client of its own; ``api`` names its route."""
        self.read += 1
        return self.admit(lane, frames, size, api)

    def refused_at_door(self, model: str, outcome: str, api: str) -> None:
        """An inference the HTTP front door answered itself by the route ``api`` (a body it could
        not read, a model it does not serve): read and answered, like every request counted here."""
        self.read += 1
        self.replies.count(model, outcome, api)

    def admit(self, client: bytes, frames: list[Any], size: int, api: str = ZMQ) -> Request | None:
        """The request of ``size`` bytes (route frame, header frame, then array frames) from
        ``client`` to hold, or None when it was answered; ``api``: the door and route it came by."""
        if not self.accepting:
            self.refuse(client, frames, ErrorCode.SHUTTING_DOWN, "the server is shutting down", api=api)
            return None
        if size > self.max_message_size:  # libzmq's own limit is per frame
            self.too_large += 1
            if self._warnings.due("too large"):
                log.warning("refused a request of %d bytes, over --max-message-size %d (%d so far)",
                            size, self.max_message_size, self.too_large)
            self.refuse(client, frames, ErrorCode.BAD_REQUEST,
                        f"the request is {size} bytes, over --max-message-size {self.max_message_size}", api=api)
            return None
        try:
            route = read_route(frames[0])
            if len(frames) < 2:
                raise protocol.ProtocolError("a route frame with no header frame after it")
        except protocol.ProtocolError as exc:
            self.refuse(client, frames, ErrorCode.BAD_REQUEST, str(exc), api=api)
            return None
        model = self._model(client, frames, route.model, api)
        if model is None:
            return None
        policy = self.policies[model]
        shape = policy.shape_of(route, len(frames))
        split = policy.split(shape)
        if split:  # the router cuts its data frame by what the route frame says: the two must agree
            expected, held = route.data_bytes(), len(frames[2])
            if expected != held:
                self.refuse(client, frames, ErrorCode.BAD_REQUEST, f"the route frame describes {expected} "
                            f"bytes of data where the request holds {held}", model, api)
                return None
            split = held > 0  # rows of no bytes are never cut: a header alone would make that many parts
        request = Request(client, frames, route, model, time.monotonic(), size, shape,
                          shape.rows if shape else 1, split=split, api=api)
        if route.deadline is not None:
            request.expires = request.received + route.deadline
        return request

    def _model(self, client: bytes, frames: list[Any], named: bytes, api: str) -> str | None:
        """The served model a request names, or the only one when it names none; None (then it
        is answered) when it names one not served, or none of several."""
        if named:
            model = named.decode("ascii")
            if model in self.policies:
                return model
            why = f"no model named {model!r} is served here"
        elif len(self.policies) == 1:
            return next(iter(self.policies))
        else:
            why = "this server serves several models: the request must name one"
        self.refuse(client, frames, ErrorCode.MODEL_NOT_FOUND,
                    f"{why} (served: {', '.join(sorted(self.policies))})", api=api)
        return None

    def refusal(self, request: Request, queue: RequestQueue, full: QueueFull) -> str:
        """Why ``request`` may not wait: a limit of ``queue`` is reached (``full`` says which)."""
        limit = full.limit
        if limit == COUNT:
            why = f"{len(queue)} requests already queued (--max-queue {queue.limit})"
        else:
            why = (f"queued requests hold {queue.nbytes} bytes; this one's {request.size} more "
                   f"would pass --max-queue-bytes {queue.max_bytes}")
        if full.started:
            why += "; the requests holding it have started running and cannot give way"
        elif queue.holders > int(queue.holds(request.client)):  # others hold requests too
            why += "; this client already holds its fair share"
        return why

    def refuse(self, client: bytes, frames: list[Any], code: ErrorCode, message: str,
               model: str = UNKNOWN_MODEL, api: str = ZMQ) -> None:
        """Answer a request not taken in: ``frames`` are what it sent past the delimiter."""
        self.replies.error(client, frames, code, message, model, api=api)
