"""What waits to be written to one HTTP connection: the buffers as the responses gave them.

A response's head and its body (the worker's bytes, as they came off the link) are queued
without being joined, and each write is one ``sendmsg`` of everything waiting (at most
``IOV_MAX`` buffers), so a response costs one call and no copy in this process. What the
socket did not take stays queued, cut where the write stopped. TLS has no ``sendmsg``: its
buffers are joined and written with ``send``.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from typing import Any

IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024


class Output:
    """Buffers waiting for one connection, in order; ``len`` is their bytes."""

    def __init__(self) -> None:
        self._buffers: deque[Any] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, *buffers: Any) -> None:
        for buffer in buffers:
            size = len(buffer) if isinstance(buffer, bytes) else memoryview(buffer).nbytes
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
            sent = sock.sendmsg(list(buffers) if len(buffers) <= IOV_MAX else [buffers[i] for i in range(IOV_MAX)])
        else:  # TLS: one record layer, no scatter-gather
            sent = sock.send(b"".join(buffers))
        self._drop(sent)
        return sent

    def _drop(self, sent: int) -> None:
        """Forget the first ``sent`` bytes."""
        self._size -= sent
        buffers = self._buffers
        while sent:
            first = buffers[0]
            size = len(first) if isinstance(first, bytes) else memoryview(first).nbytes
            if sent < size:
                buffers[0] = memoryview(first)[sent:]
                return
            buffers.popleft()
            sent -= size
