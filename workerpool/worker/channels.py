"""How a worker reaches its router: a local worker over the link it inherited, a worker host's
over ZeroMQ (TCP, CURVE when keys are given). The worker's loop sees one interface.

A busy worker runs the model instead of reading. Over ZeroMQ, libzmq's I/O thread keeps
answering the router's transport heartbeats meanwhile; over a link, a thread of the worker's
own beats every heartbeat interval, busy or not, so the router tells a busy worker from a
frozen or stopped one the same way as an idle one. (The thread needs the GIL for a moment
each beat: numpy, onnxruntime and tokenizers release it while they compute.)
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import zmq

from .. import security
from ..protocol import messages as protocol
from ..protocol.link import Link, LinkClosed
from ..protocol.transport import NOBLOCK, send_parts, transport_heartbeats
from .spec import InvalidSpec, WorkerSpec

log = logging.getLogger(__name__)


class RouterChannel(Protocol):
    """What a worker's loop needs of the way to its router."""

    source: Any  # what the loop's poller watches for the router's messages
    beats_itself: bool  # heartbeats go out without the loop

    def send(self, frames: Sequence[Any]) -> bool:
        """Send a message; False when no router takes it now (it is dropped)."""

    def receive(self) -> list[Any] | None:
        """The message waiting (the source is readable); None when the router is gone for good."""

    def close(self) -> None: ...


class LinkChannel:
    """A local worker's link, inherited from its supervisor."""

    beats_itself = True

    def __init__(self, fd: int, heartbeat: float) -> None:
        self._link = Link(socket.socket(fileno=fd))
        self.source = fd
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beats, args=(heartbeat,), name="heartbeat", daemon=True)
        self._beat.start()

    def _beats(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if not self.send([protocol.HEARTBEAT]):
                return

    def send(self, frames: Sequence[Any]) -> bool:
        try:
            return self._link.send(frames)
        except OSError:  # the router's end is closed: the supervisor is gone or let go of us
            return False

    def receive(self) -> list[Any] | None:
        try:
            return self._link.receive()
        except LinkClosed:
            return None

    def close(self) -> None:
        self._stop.set()
        self._beat.join(timeout=1.0)  # it may be stuck sending to a router that stopped reading
        self._link.close()


class ZmqChannel:
    """A worker host's DEALER, connected to the router's backend."""

    beats_itself = False

    def __init__(self, spec: WorkerSpec, identity: bytes) -> None:
        if spec.backend is None:
            raise InvalidSpec("a worker reaches its router through --backend or --link-fd: neither was given")
        self._context = zmq.Context()
        sock = self.source = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # nothing queues up for a router that is not there
        transport_heartbeats(sock, spec.heartbeat, spec.liveness)
        if spec.curve_key and spec.curve_server_key:
            security.ClientKeys(spec.curve_key, spec.curve_server_key).apply(sock)
        sock.connect(spec.backend)

    def send(self, frames: Sequence[Any]) -> bool:
        """Without blocking: with no router connected (gone, restarting) the message is dropped
        rather than this worker stuck; the router retries a request whose reply never came."""
        try:
            send_parts(self.source, frames, NOBLOCK)
            return True
        except zmq.Again:
            return False

    def receive(self) -> list[Any] | None:
        return self.source.recv_multipart(copy=False)

    def close(self) -> None:
        self.source.close(linger=1000)
        self._context.term()
