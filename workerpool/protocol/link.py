"""One end of a local link: the socket pair between the router and one worker on its machine.

The supervisor makes a ``SOCK_SEQPACKET`` pair for each worker it starts; the worker inherits
one end (forked from the template, which receives it with the order, or spawned with it), the
router keeps the other. A message is one ``sendmsg`` and one ``recvmsg_into`` (``records.py``
says how it is laid out), where ZeroMQ took a hand-off through its I/O thread at each end. The
kernel keeps the records' order and boundaries, reports the peer's end closing as end of
file, and needs no handshake: the link is usable from the moment it exists.

The router's end does not block: what the socket has no room for waits here, in order, until
it is writable. A worker's end blocks. Each end is used by one thread.
"""

from __future__ import annotations

import select
import socket
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..units import MiB
from .records import RECORD_BYTES, Frame, LinkError, frames_of, read_table, records

SEND_BUFFER = 4 * MiB  # asked for; the kernel grants at most net.core.wmem_max (doubled)
WHOLE_AT_ONCE = 16 * MiB  # a longer message's buffer grows as its records come, never past what came


class LinkClosed(Exception):
    """The other end of the link is closed: its process is gone or let go of it."""


def pair() -> tuple[socket.socket, socket.socket]:
    """A new link: the router's end, then the worker's (neither inherited by other children)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Link:
    """One end of a link: sends messages, receives them whole.

    ``receive_buffer`` (at least ``RECORD_BYTES``) is where records are read first; a router
    shares one between all its links. ``max_frames`` bounds the frames of a message received.
    """

    def __init__(self, sock: socket.socket, receive_buffer: memoryview | None = None, *,
                 max_frames: int | None = None) -> None:
        self.sock = sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        # A record may be as long as the send buffer; at half of it, two are in flight at once.
        self.record_bytes = min(RECORD_BYTES, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2)
        self.max_frames = max_frames
        self._buffer = receive_buffer if receive_buffer is not None else memoryview(bytearray(RECORD_BYTES))
        self._out: deque[list[Any]] = deque()  # records the socket had no room for yet
        self._partial: tuple[list[int], bytearray, int] | None = None  # lengths, its buffer, bytes read

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, frames: Sequence[Any]) -> bool:
        """Send a message; False when part of it waits for the socket to have room (see
        :meth:`flush`). Raises ``OSError`` when the other end is gone."""
        self._out.extend(records(frames, self.record_bytes))
        return self.flush()

    def flush(self) -> bool:
        """Send what waits; True once nothing does."""
        out, sock = self._out, self.sock
        while out:
            try:
                sock.sendmsg(out[0])
            except BlockingIOError:
                return False
            out.popleft()
        return True

    def receive(self) -> list[Frame] | None:
        """The next whole message; None while none has arrived whole (a non-blocking end).
        Raises :class:`LinkClosed` at the end of the link, :class:`LinkError` for a record
        that is no message."""
        if self._partial is None:
            size = self._read(self._buffer)
            if size is None:
                return None
            record = self._buffer[:size]
            lengths, start = read_table(record, self.max_frames)
            total, carried = sum(lengths), size - start
            if carried == total:  # the whole message: copied out of the shared buffer
                return frames_of(memoryview(record[start:].tobytes()), lengths)
            if carried > total:
                raise LinkError(f"a record of {size} bytes, more than its table's {start + total}")
            whole = bytearray(min(total, WHOLE_AT_ONCE))
            whole[:carried] = record[start:]
            self._partial = (lengths, whole, carried)
        lengths, whole, filled = self._partial
        total = sum(lengths)
        while filled < total:  # the progress is kept after each read: one that fails loses nothing
            wanted = min(total, filled + RECORD_BYTES)  # room for the next record
            if len(whole) < wanted:  # doubling, never past the table's total
                whole.extend(bytes(min(max(len(whole), wanted - len(whole)), total - len(whole))))
            size = self._read(memoryview(whole)[filled:])
            if size is None:
                return None
            filled += size
            self._partial = (lengths, whole, filled)
        self._partial = None
        return frames_of(memoryview(whole), lengths)

    def _read(self, into: memoryview) -> int | None:
        try:
            size, _, flags, _ = self.sock.recvmsg_into([into])
        except BlockingIOError:
            return None
        except ConnectionResetError:
            raise LinkClosed from None
        if size == 0:  # the other end closed, or an empty record, which no message is
            if select.select([self.sock], [], [], 0)[0] and not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                raise LinkClosed
            raise LinkError("an empty record")
        if flags & socket.MSG_TRUNC:
            raise LinkError(f"a record longer than the {into.nbytes} bytes left to it (records past their "
                            "table, or a record longer than one may be)")
        return size

    def close(self) -> None:
        self.sock.close()
