"""Requests from a thread of the supervisor's own process: the HTTP front door's.

A thread calls :meth:`LocalClients.submit` with a lane (one HTTP connection) and the request's
frames; the router's loop takes them between two events, woken through a pipe, and admits
each as the intake admits a ZeroMQ client's request (same limits, same fair share per lane,
same quarantine). Replies go to the function given to :meth:`listen`, called in the loop's
thread.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import Any

from ..linux import drain_pipe
from .intake import Intake


class LocalClients:
    def __init__(self, intake: Intake) -> None:
        self.intake = intake
        self._inbox: deque[tuple[bytes, list[Any], int]] = deque()
        self._woken = False
        self.wakeup, self._wake = os.pipe()
        os.set_blocking(self.wakeup, False)
        os.set_blocking(self._wake, False)

    def listen(self, on_reply: Callable[[list[Any]], None]) -> None:
        self.intake.deliver_local = on_reply

    def submit(self, lane: bytes, frames: list[Any], size: int) -> None:
        """Any thread: hand a request over; the loop admits it at its next turn (woken only
        when no wake-up is on its way already)."""
        self._inbox.append((self.intake.local_key + lane, frames, size))
        if not self._woken:
            self._woken = True
            try:
                os.write(self._wake, b"!")
            except BlockingIOError:  # the loop has wake-ups enough to read already
                pass

    def take(self) -> None:
        """The loop's thread: admit what was handed over."""
        drain_pipe(self.wakeup)
        # After the pipe is read, before the inbox is: a request handed over from now on either
        # is in the inbox below or writes a wake-up that stays in the pipe.
        self._woken = False
        while self._inbox:
            client, frames, size = self._inbox.popleft()
            self.intake.read += 1
            self.intake.admit(client, frames, size)

    def close(self) -> None:
        os.close(self.wakeup)
        os.close(self._wake)
