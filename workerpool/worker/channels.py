"""How a worker reaches its router: a local worker over the link it inherited, a worker host's
over ZeroMQ (TCP, CURVE when keys are given). The worker's loop sees one interface.

A busy worker runs the model instead of reading or beating. Over ZeroMQ, libzmq's I/O thread
keeps answering the router's transport heartbeats meanwhile, so a worker host's frozen worker
loses its connection; the supervisor sees a local worker's process itself (stopped, or gone).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, Protocol

import zmq

from .. import security
from ..protocol.link import Link, LinkClosed
from ..protocol.transport import NOBLOCK, send_parts, transport_heartbeats
from .spec import InvalidSpec, WorkerSpec


class RouterChannel(Protocol):
    """What a worker's loop needs of the way to its router."""

    source: Any  # what the loop's poller watches for the router's messages

    def send(self, frames: Sequence[Any]) -> bool:
        """Send a message; False when no router takes it now (it is dropped)."""

    def receive(self) -> list[Any] | None:
        """The message waiting (the source is readable); None when the router is gone for good."""

    def close(self) -> None: ...


class LinkChannel:
    """A local worker's link, inherited from its supervisor."""

    def __init__(self, fd: int) -> None:
        try:
            os.set_inheritable(fd, False)  # a process the model starts must not hold it open
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise InvalidSpec(f"--link-fd {fd}: {exc.strerror or exc}") from None
        if sock.type != socket.SOCK_SEQPACKET:
            sock.detach()
            raise InvalidSpec(f"--link-fd {fd} is not the end of a link")
        self._link = Link(sock)
        self.source = fd

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
        self._link.close()


class ZmqChannel:
    """A worker host's DEALER, connected to the router's backend."""

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
