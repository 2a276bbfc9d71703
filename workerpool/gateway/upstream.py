"""The gateway's link to its router: one DEALER on the pool's private gateway endpoint.

Every HTTP connection is a lane (a frame before the delimiter), which the router treats as a
client of its own: its own line in the queue, its own fair share, its own quarantine. Replies
come back on the same socket and are matched to their callers by request id, which the
gateway numbers itself.

The socket is a plain one on the event loop: its ``ZMQ_FD`` is watched, and whenever it, or a
send, may have changed what is waiting, replies are read until ``ZMQ_EVENTS`` says there are
none (the descriptor only signals edges). ``zmq.asyncio``'s own futures cost this process
several times the CPU per request. Sends never wait: the socket queues without a high-water
mark, since the request bodies this gateway holds are bounded already (``server.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any

import zmq

from ..errors import ERRORS_BY_CODE, InternalError, RemoteError
from ..protocol import messages as protocol
from ..protocol.messages import Message

log = logging.getLogger(__name__)

REPLY_SLACK = 5.0  # seconds past the router's own limits before a missing reply is an error


class NoReply(Exception):
    """The router sent nothing back in time (it is stuck or gone)."""


class RouterLink:
    """Requests to the router, awaited by any number of coroutines at once."""

    def __init__(self, endpoint: str, routing_id: bytes, *, max_message_size: int) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.ROUTING_ID, routing_id)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_size + protocol.MAX_HEADER_BYTES)
        self._socket.connect(endpoint)
        self._fd = int(self._socket.getsockopt(zmq.FD))
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Message]] = {}

    def start(self) -> None:
        asyncio.get_running_loop().add_reader(self._fd, self._read)

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
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            self._socket.send_multipart([lane, b"", protocol.encode_header(header), *arrays],
                                        zmq.NOBLOCK, copy=False)
            self._read()  # the send may have taken the edge that said replies wait
            async with asyncio.timeout(patience + REPLY_SLACK):
                reply = await answer
        except TimeoutError:
            raise NoReply(f"the router sent no reply within {patience + REPLY_SLACK:g}s") from None
        finally:
            self._waiting.pop(request_id, None)
        if reply.header.get("status") != "ok":
            raise _remote_error(reply.header)
        return reply

    def _read(self) -> None:
        socket = self._socket
        while int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            if len(frames) < 3 or frames[1].bytes != b"":
                log.warning("a reply from the router without a lane and delimiter was dropped")
                continue
            try:
                reply = protocol.decode_reply(frames[2:])
            except protocol.ProtocolError as exc:
                log.warning("a malformed reply from the router was dropped: %s", exc)
                continue
            answer = self._waiting.get(reply.id) if isinstance(reply.id, int) else None
            if answer is not None and not answer.done():
                answer.set_result(reply)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self._fd)
        self._socket.close(linger=0)
        self._context.term()


def _remote_error(header: dict[str, Any]) -> RemoteError:
    error = header.get("error")
    if not isinstance(error, dict):
        return InternalError("the router's error reply has no error object")
    kind = ERRORS_BY_CODE.get(str(error.get("code")), InternalError)
    return kind(str(error.get("message", "")), worker_pid=header.get("worker_pid"))
