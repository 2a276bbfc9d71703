"""The HTTP front door's link to the router in the same process (``router/local.py``).

Every HTTP connection is a lane, which the router treats as a client of its own: its own line
in the queue, its own fair share, its own quarantine. A request's frames are handed to the
router's loop; its reply comes back on the loop's thread and is passed to this event loop,
where it is decoded and matched to its caller by the request id this link numbered it with.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from typing import Any

from ..errors import BadRequest, error_of_reply
from ..protocol import messages as protocol
from ..protocol.messages import Inputs, Message
from ..router.local import LocalClients

log = logging.getLogger(__name__)

REPLY_SLACK = 5.0  # seconds past the router's own limits before a missing reply is an error


class NoReply(Exception):
    """The router sent nothing back in time (it is stuck or gone)."""


class RouterLink:
    """Requests to the router, awaited by any number of coroutines of one event loop."""

    def __init__(self, clients: LocalClients, loop: asyncio.AbstractEventLoop) -> None:
        self._clients = clients
        self._loop = loop
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._replies: deque[list[Any]] = deque()
        self._woken = False
        clients.listen(self.reply)

    def reply(self, frames: list[Any]) -> None:
        """The router's thread: a reply for one of our lanes; the event loop is woken only when
        no wake-up is on its way to take them all already."""
        self._replies.append(frames)
        if not self._woken:
            self._woken = True
            self._loop.call_soon_threadsafe(self._answer_all)

    async def call(self, lane: bytes, payload: Inputs | None, *, method: str, deadline: float | None,
                   patience: float) -> Message:
        """Send one request (arrays, texts or nothing) on ``lane`` and await its reply; raises
        the reply's ``RemoteError``, ``BadRequest`` for what the protocol cannot carry, or
        ``NoReply`` after ``patience`` seconds (plus slack) without one."""
        request_id = next(self._ids)
        try:
            _, *frames = protocol.encode_request(request_id, payload, method=method,
                                                 deadline_ms=None if deadline is None else deadline * 1000.0)
        except protocol.ProtocolError as exc:  # the texts were too many for the router's header
            raise BadRequest(f"this request cannot be passed to the workers: {exc}") from None
        answer: asyncio.Future[Message] = self._loop.create_future()
        self._waiting[request_id] = answer
        try:
            self._clients.submit(lane, frames, sum(memoryview(frame).nbytes for frame in frames))
            async with asyncio.timeout(patience + REPLY_SLACK):
                reply = await answer
        except TimeoutError:
            raise NoReply(f"the router sent no reply within {patience + REPLY_SLACK:g}s") from None
        finally:
            self._waiting.pop(request_id, None)
        if reply.header.get("status") != "ok":
            raise error_of_reply(reply.header)
        return reply

    def _answer_all(self) -> None:
        self._woken = False  # first: replies from now on wake this loop again
        while self._replies:
            frames = self._replies.popleft()
            try:
                reply = protocol.decode_reply(frames)
            except protocol.ProtocolError as exc:
                log.warning("a malformed reply from the router was dropped: %s", exc)
                continue
            answer = self._waiting.get(reply.id) if isinstance(reply.id, int) else None
            if answer is not None and not answer.done():
                answer.set_result(reply)
