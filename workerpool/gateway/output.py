"""What waits to be written to one HTTP connection: the buffers as the responses gave them.

A response's head and its body are queued without being joined, and each write is one
``sendmsg`` of everything waiting (at most ``IOV_MAX`` buffers), so a response costs one call
and no copy here. What the socket did not take stays queued, cut where the write stopped.
TLS has no ``sendmsg``, and a TLS write that does not finish must be tried again with the same
bytes: it writes the first ``TLS_CHUNK`` bytes waiting, joined, so that a large response to a
slow reader costs its size once, not once per attempt.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections import deque
from typing import Any

from ..units import KiB

IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
TLS_CHUNK = 256 * KiB  # at most this much plaintext per TLS write (a few records)


class Output:
    """Buffers waiting for one connection, in order; ``len`` is their bytes."""

    def __init__(self) -> None:
        self._buffers: deque[Any] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, *buffers: Any) -> None:
        for buffer in buffers:
            size = _size(buffer)
            if size:
                self._buffers.append(buffer)
                self._size += size

    def clear(self) -> None:
        self._buffers.clear()
        self._size = 0

    def write(self, sock: socket.socket) -> int:
        """Write what the socket takes now, in one call; the bytes written. Raises what the
        socket raises (``BlockingIOError`` and its TLS cousins when it takes nothing)."""
        buffers = self._buffers
        if type(sock) is socket.socket:
            sent = sock.sendmsg(list(itertools.islice(buffers, IOV_MAX)))
        else:  # TLS: no scatter-gather, and a retry must offer the same bytes
            sent = sock.send(self._first(TLS_CHUNK))
        self._drop(sent)
        return sent

    def _first(self, limit: int) -> bytes:
        """The first ``limit`` bytes waiting (fewer if fewer wait), joined."""
        pieces, room = [], limit
        for buffer in self._buffers:
            piece = memoryview(buffer)[:room]
            pieces.append(piece)
            room -= piece.nbytes
            if not room:
                break
        return b"".join(pieces)

    def _drop(self, sent: int) -> None:
        """Forget the first ``sent`` bytes."""
        self._size -= sent
        buffers = self._buffers
        while sent:
            first = buffers[0]
            size = _size(first)
            if sent < size:
                buffers[0] = memoryview(first)[sent:]
                return
            buffers.popleft()
            sent -= size


def _size(buffer: Any) -> int:
    return len(buffer) if isinstance(buffer, bytes) else memoryview(buffer).nbytes
