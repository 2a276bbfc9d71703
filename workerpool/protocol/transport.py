"""ZeroMQ socket settings and sends shared by the router, the workers and the clients."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq

from ..units import MS_PER_SECOND, KiB
from .messages import MAX_ARRAYS
from .records import Frame as LinkFrame
from .terms import LIMIT_PROPERTY

# Below this, copying a part into a new message is cheaper than handing libzmq a buffer it must
# give back later (pyzmq's own copy threshold); above it, arrays go out without a copy.
ZERO_COPY_MIN = 64 * KiB
# Plain ints: pyzmq's constants are enum flags, and enum arithmetic costs microseconds per message.
log = logging.getLogger(__name__)

# A monitor event's first frame (zmq_socket_monitor(3)): the event (uint16) and its value
# (uint32, the descriptor for these events), native byte order. Parsed here rather than with
# zmq.utils.monitor, which imports asyncio and, through it, OpenSSL: some MiB in the supervisor.
MONITOR_EVENT = struct.Struct("=HI")

BATCH = 64  # messages taken from one socket per poll: amortises the loop, keeps it fair
# Routing id, then a worker's command, client id, status and header, or a client's delimiter,
# route frame and header; then at most 64 arrays.
MAX_FRAMES = 5 + MAX_ARRAYS
SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)


def send_parts(sock: zmq.Socket, parts: Sequence[Any], flags: int = 0) -> None:
    """Send a multipart message: received frames as they are, large buffers without a copy."""
    more = flags | SNDMORE
    last = len(parts) - 1
    for index, part in enumerate(parts):
        if type(part) is LinkFrame:  # a frame read from a local link: its bytes where they lie
            part = part.buffer
        large = not isinstance(part, (bytes, zmq.Frame)) and memoryview(part).nbytes >= ZERO_COPY_MIN
        sock.send(part, more if index < last else flags, copy=not large)


def readable(sock: zmq.Socket) -> bool:
    """Whether a message is waiting, without a poll call."""
    # ZMQ_EVENTS is an int option; pyzmq types every option as int | bytes.
    return bool(cast(int, sock.get(zmq.EVENTS)) & POLLIN)


def receive_batch(sock: zmq.Socket, handler: Callable[[list[zmq.Frame]], None],
                  overlong: Callable[[list[zmq.Frame], int], None] | None = None) -> None:
    """Hand ``handler`` the messages waiting on a readable socket, at most ``BATCH`` of them.

    A message of more than ``MAX_FRAMES`` frames is no message of the protocol: it is read
    and dropped frame by frame, never held whole (libzmq's size limits count bytes per frame,
    so a few megabytes of empty frames would otherwise cost a Python object each). Its first
    ``MAX_FRAMES`` frames and its frame count go to ``overlong``, which can answer its sender.
    """
    for _ in range(BATCH):
        frames = _receive_capped(sock, overlong)
        if frames is not None:
            handler(frames)
        if not readable(sock):
            return


def _receive_capped(sock: zmq.Socket,
                    overlong: Callable[[list[zmq.Frame], int], None] | None) -> list[zmq.Frame] | None:
    frames = [sock.recv(copy=False)]
    while frames[-1].more:
        if len(frames) == MAX_FRAMES:
            count = len(frames) + _discard_rest(sock)
            log.warning("refused a message of %d frames, the routing id included (at most %d are read)",
                        count, MAX_FRAMES)
            if overlong is not None:
                overlong(frames, count)
            return None
        frames.append(sock.recv(copy=False))
    return frames


def _discard_rest(sock: zmq.Socket) -> int:
    count = 0
    while sock.getsockopt(zmq.RCVMORE):
        sock.recv(copy=True)
        count += 1
    return count


def state_message_limit(sock: zmq.Socket, limit: int) -> None:
    """Tell every peer of ``sock`` (set before bind) the largest message it takes, in the
    handshake's metadata: a client learns it from any reply and refuses larger requests itself,
    where libzmq would drop them and close the connection without a word."""
    sock.setsockopt(zmq.METADATA, f"{LIMIT_PROPERTY}:{limit}".encode("ascii"))


def stated_message_limit(frame: zmq.Frame) -> int | None:
    """The limit the peer that sent ``frame`` states (``state_message_limit``); None when it
    states none (an older server), or nothing a limit can be."""
    try:
        text = frame.get(LIMIT_PROPERTY)
    except zmq.ZMQError:
        return None
    return int(text) if isinstance(text, str) and text.isdigit() and int(text) > 0 else None


def transport_heartbeats(sock: zmq.Socket, interval: float, liveness: int) -> None:
    """ZMTP pings, answered by libzmq's own thread: a peer that stops (killed, frozen, cut off)
    loses its connection even while the process at the other end is busy running the model."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(interval * MS_PER_SECOND))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(interval * liveness * MS_PER_SECOND))
    sock.setsockopt(zmq.HEARTBEAT_TTL, int(interval * liveness * MS_PER_SECOND))
