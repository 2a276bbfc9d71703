"""What the router core asks to be sent, in the order it asked: the core never touches a
socket. Its shell (``links.py``) sends each message after the event that produced it; a send
that fails becomes an event of its own (the worker is lost), never a call back into the middle
of the core's work."""

from __future__ import annotations

from collections import deque
from typing import Any

from ..logs import Ran
from ..protocol import messages as protocol

WorkerKey = tuple[bool, bytes]  # (local, routing id): a remote peer can never pose as a local worker

CLIENT = 0  # to a client: a ZeroMQ routing id, or an HTTP connection's lane
WORKER = 1  # to a registered worker, by its key
PEER = 2  # to a worker that is not registered (WHO, REFUSE), by its would-be key
Send = tuple[int, Any, list[Any], Ran | None]  # what was measured of an answer to the HTTP door's lane


class Outbox:
    __slots__ = ("_sends",)

    def __init__(self) -> None:
        self._sends: deque[Send] = deque()

    def to_client(self, client: bytes, frames: list[Any], ran: Ran | None = None) -> None:
        self._sends.append((CLIENT, client, frames, ran))

    def to_worker(self, key: WorkerKey, frames: list[Any]) -> None:
        self._sends.append((WORKER, key, frames, None))

    def to_peer(self, key: WorkerKey, frames: list[Any]) -> None:
        self._sends.append((PEER, key, frames, None))

    def withdraw(self, key: WorkerKey) -> bool:
        """Drop what waits to go to ``key`` (a worker lost); whether any of it carried requests."""
        mine = [send for send in self._sends if send[0] != CLIENT and send[1] == key]
        for send in mine:
            self._sends.remove(send)
        return any(carries_requests(frames) for _, _, frames, _ in mine)

    def take(self) -> Send | None:
        """The oldest message not yet sent, or None."""
        return self._sends.popleft() if self._sends else None

    def __len__(self) -> int:
        return len(self._sends)


def carries_requests(frames: list[Any]) -> bool:
    """Whether a message to a worker hands it requests (a worker holds one such at a time)."""
    return frames[0] in (protocol.REQUEST, protocol.BATCH)
