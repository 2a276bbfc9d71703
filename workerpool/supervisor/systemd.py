"""Telling systemd what the pool is doing (``sd_notify``), when it runs as a ``Type=notify`` unit.

The protocol is one datagram of ``KEY=VALUE`` lines to the Unix socket named by
``NOTIFY_SOCKET`` (a leading ``@`` names an abstract socket). The variables are taken out of
the environment so that workers, which inherit it, never speak for the service. With
``WATCHDOG_USEC`` set, ``WATCHDOG=1`` goes out every half of that interval from the
supervisor's loop, so a loop that stops turning gets the service restarted.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

from ..runtime import socket_address

log = logging.getLogger(__name__)


class Notifier:
    """Sends state changes to the service manager; does nothing outside one."""

    def __init__(self, environ: MutableMapping[str, str] = os.environ) -> None:
        address = environ.pop("NOTIFY_SOCKET", "")
        self.address = address and socket_address(address)
        watchdog, watched = environ.pop("WATCHDOG_USEC", ""), environ.pop("WATCHDOG_PID", "")
        self.watchdog: float | None = None
        if self.address and watchdog.isdigit() and int(watchdog) > 0 \
                and watched in ("", str(os.getpid())):
            self.watchdog = int(watchdog) / 2e6  # seconds between pings
        self._next_ping = 0.0
        self._failed = False

    def send(self, *fields: str) -> None:
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as exc:
            if not self._failed:  # once: the manager's socket is gone or refuses
                self._failed = True
                log.warning("cannot notify the service manager at %s: %s", self.address, exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"MAINPID={os.getpid()}", f"STATUS={status}")

    def reloading(self, status: str) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                  f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def ping(self) -> None:
        """``WATCHDOG=1`` when due (call it from the loop)."""
        if self.watchdog is None:
            return
        now = time.monotonic()
        if now >= self._next_ping:
            self._next_ping = now + self.watchdog
            self.send("WATCHDOG=1")
