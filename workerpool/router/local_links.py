"""The router's ends of its local workers' links (``protocol/link.py``), on the pool's loop.

A link is attached when its worker's process is adopted and detached when that process is
reaped, so it lives exactly as long as the supervisor knows the process. Each gets an address
of its own, the routing id the router knows the worker by: which link a message came on, never
what the worker says, tells who sent it.

The end of a link is not, on its own, a worker's loss: the process that held it is exiting,
and the supervisor reaps it an instant later, knowing then how it ended (a SIGKILL blames no
request). The link is only no longer read; a message sent to it meanwhile fails, and the
worker is lost then, as with ZeroMQ's backend before.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..events.loop import Loop
from ..protocol.link import Link, LinkClosed
from ..protocol.records import RECORD_BYTES, Frame, LinkError
from ..protocol.transport import BATCH, MAX_FRAMES
from .outbox import WorkerKey

log = logging.getLogger(__name__)

LOCAL = True  # the first half of a local worker's key (registry.WorkerKey)


class Workers(Protocol):
    """What the links tell the router."""

    def from_worker(self, local: bool, address: bytes, frames: list[Any]) -> None: ...

    def lose(self, key: WorkerKey, why: str, *, asked: bool = False, unsent: bool = False) -> None: ...


class LocalLinks:
    """Every local worker's link, by address."""

    def __init__(self, loop: Loop, workers: Workers) -> None:
        self._loop = loop
        self._workers = workers
        self._links: dict[bytes, Link] = {}
        self._buffer = memoryview(bytearray(RECORD_BYTES))  # every link's records are read here first
        self._next = 0

    def attach(self, sock: socket.socket) -> bytes:
        """Read and write ``sock`` from now on; the address its worker is known by."""
        sock.setblocking(False)
        self._next += 1
        address = b"link-%d" % self._next
        link = Link(sock, self._buffer, max_frames=MAX_FRAMES - 1)  # no routing id on a link
        self._links[address] = link
        self._loop.read(link, lambda: self._on_readable(address, link))
        return address

    def detach(self, address: bytes) -> None:
        link = self._links.pop(address, None)
        if link is not None:
            self._loop.forget(link)
            link.close()

    def send(self, address: bytes, frames: Sequence[Any]) -> None:
        """Send a message to the worker at ``address``. Raises ``OSError`` when it cannot be
        reached (its end is closed, or it was never attached)."""
        link = self._links.get(address)
        if link is None:
            raise ConnectionResetError(f"no link {address.decode()}")
        if not link.send(frames):
            self._loop.write(link, lambda: self._drain(address, link))

    def _drain(self, address: bytes, link: Link) -> None:
        try:
            done = link.flush()
        except OSError as exc:
            done = True
            self._workers.lose((LOCAL, address), f"unreachable ({exc.strerror})")
        if done:
            self._loop.write(link, None)

    def _on_readable(self, address: bytes, link: Link) -> None:
        deliver: Callable[[bool, bytes, list[Frame]], None] = self._workers.from_worker
        for _ in range(BATCH):
            try:
                frames = link.receive()
            except LinkClosed:
                self._loop.pause(link)  # its process is exiting: reaping it says how
                return
            except LinkError as exc:
                self._loop.pause(link)
                log.error("a malformed message on a worker's link: %s", exc)
                self._workers.lose((LOCAL, address), f"malformed message on its link ({exc})")
                return
            if frames is None:
                return
            deliver(LOCAL, address, frames)

    def close(self) -> None:
        for address in list(self._links):
            self.detach(address)
