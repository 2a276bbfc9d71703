"""ZeroMQ socket settings and sends shared by the router, the workers and the clients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq

from .units import MS_PER_SECOND, KiB

# Below this, copying a part into a new message is cheaper than handing libzmq a buffer it must
# give back later (pyzmq's own copy threshold); above it, arrays go out without a copy.
ZERO_COPY_MIN = 64 * KiB
# Plain ints: pyzmq's constants are enum flags, and enum arithmetic costs microseconds per message.
BATCH = 64  # messages taken from one socket per poll: amortises the loop, keeps it fair
SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)


def send_parts(sock: zmq.Socket, parts: Sequence[Any], flags: int = 0) -> None:
    """Send a multipart message: received frames as they are, large buffers without a copy."""
    more = flags | SNDMORE
    last = len(parts) - 1
    for index, part in enumerate(parts):
        large = not isinstance(part, (bytes, zmq.Frame)) and memoryview(part).nbytes >= ZERO_COPY_MIN
        sock.send(part, more if index < last else flags, copy=not large)


def readable(sock: zmq.Socket) -> bool:
    """Whether a message is waiting, without a poll call."""
    # ZMQ_EVENTS is an int option; pyzmq types every option as int | bytes.
    return bool(cast(int, sock.get(zmq.EVENTS)) & POLLIN)


def receive_batch(sock: zmq.Socket, handler: Callable[[list[zmq.Frame]], None]) -> None:
    """Hand ``handler`` the messages waiting on a readable socket, at most ``BATCH`` of them."""
    for _ in range(BATCH):
        handler(sock.recv_multipart(copy=False))
        if not readable(sock):
            return


def transport_heartbeats(sock: zmq.Socket, interval: float, liveness: int) -> None:
    """ZMTP pings, answered by libzmq's own thread: a peer that stops (killed, frozen, cut off)
    loses its connection even while the process at the other end is busy running the model."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(interval * MS_PER_SECOND))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(interval * liveness * MS_PER_SECOND))
    sock.setsockopt(zmq.HEARTBEAT_TTL, int(interval * liveness * MS_PER_SECOND))
