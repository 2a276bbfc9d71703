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
from collections.abc import Sequence
from typing import Any

from ..errors import ERRORS_BY_CODE, BadRequest, InternalError, RemoteError
from ..protocol import messages as protocol
from ..protocol.messages import Message
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

    async def call(self, lane: bytes, *, method: str, text: list[str] | None = None,
                   arrays: Sequence[Any] = (), descriptors: list[dict[str, Any]] | None = None,
                   deadline: float | None = None, patience: float) -> Message:
        """Send one request on ``lane`` and await its reply; raises the reply's ``RemoteError``,
        or ``NoReply`` after ``patience`` seconds (plus slack) without one."""
        request_id = next(self._ids)
        header: dict[str, Any] = {"v": protocol.VERSION, "id": request_id, "method": method,
                                  "arrays": descriptors or []}
        if text is not None:
            header["text"] = text
        if deadline is not None:
            header["deadline_ms"] = deadline * 1000.0
        encoded = protocol.encode_header(header)
        if len(encoded) > protocol.MAX_HEADER_BYTES:  # texts travel in it: the router could not read it
            raise BadRequest(f"the request's texts take {len(encoded)} bytes as JSON, over the "
                             f"{protocol.MAX_HEADER_BYTES} one request may carry: send fewer or shorter texts")
        frames = [encoded, *arrays]
        answer: asyncio.Future[Message] = self._loop.create_future()
        self._waiting[request_id] = answer
        try:
            self._clients.submit(lane, frames, len(encoded) + sum(memoryview(a).nbytes for a in arrays))
            async with asyncio.timeout(patience + REPLY_SLACK):
                reply = await answer
        except TimeoutError:
            raise NoReply(f"the router sent no reply within {patience + REPLY_SLACK:g}s") from None
        finally:
            self._waiting.pop(request_id, None)
        if reply.header.get("status") != "ok":
            raise _remote_error(reply.header)
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


def _remote_error(header: dict[str, Any]) -> RemoteError:
    error = header.get("error")
    if not isinstance(error, dict):
        return InternalError("the router's error reply has no error object")
    kind = ERRORS_BY_CODE.get(str(error.get("code")), InternalError)
    return kind(str(error.get("message", "")), worker_pid=header.get("worker_pid"))
