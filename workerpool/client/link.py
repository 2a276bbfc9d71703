"""What the socket monitor says of a client's connection, and why no server was reached.

Kept apart from the socket: ``BaseClient`` (``base.py``) feeds it the monitor's events, and
the retry policy (``calls.py``) asks it whether a server is connected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import zmq

from ..errors import Unreachable
from ..protocol import reach
from ..security import ClientKeys

# The events a client's monitor asks for: those ``Link.event`` reads.
MONITORED = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
             | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
             | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
EARLY_DROP_SECONDS = 1.0
GREETING_SECONDS = 0.5  # for the one look at the peer's greeting when a call finds no server


@dataclass(eq=False)
class Link:
    """What the socket monitor has said of the connection to the server.

    ``up`` from a completed ZeroMQ handshake until that connection drops. While it is down,
    ``seen`` keeps the furthest any connection attempt got, to say why no server was reached.
    Failed connection attempts are not monitored (libzmq retries every 0.1 s, and an idle
    client would pile up their events): where nothing was accepted, the peer's ZMTP greeting
    is read once, when the call fails, for the kernel's or the peer's own answer.
    """

    # From least to most telling: the attempt that got furthest is the one worth naming.
    _STAGES: ClassVar[dict[int, int]] = {
        zmq.EVENT_CONNECTED: 1,
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: 2,
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: 2,
        zmq.EVENT_HANDSHAKE_FAILED_AUTH: 3,
    }

    endpoint: str
    keys: ClientKeys | None
    up: bool = False
    seen: int = 0
    up_at: float = 0.0

    def event(self, kind: int) -> bool | None:
        """Take one monitor event: True when the connection came up, False when it dropped."""
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.up, self.seen, self.up_at = True, 0, time.monotonic()
            return True
        if kind == zmq.EVENT_DISCONNECTED and self.up:
            self.up = False
            return False
        self.seen = max(self.seen, self._STAGES.get(kind, 0))
        return None

    def why_dropped(self) -> str:
        """What a drop says of the server: closing a connection it has just accepted is what a
        server with no room for more connections under its open file limit does, and what
        libzmq does with a message over the server's size limit."""
        if time.monotonic() - self.up_at < EARLY_DROP_SECONDS:
            return (" (the server closed it right after accepting it: a server out of room for "
                    "connections, or a request over its --max-message-size?)")
        return ""

    def why_unreachable(self, waited: float) -> str:
        """Why no server completed a handshake in ``waited`` seconds, as one sentence."""
        if self.seen == 3:
            return (f"{self.endpoint}: the server refused this client's key (its public key "
                    "belongs in the server's --curve-client-keys folder)")
        if self.seen == 1:
            return (f"something at {self.endpoint} accepted the connection but completed no "
                    f"ZeroMQ handshake in {waited:g} s: a stopped server, or not a workerpool "
                    "endpoint (wrong port?)")
        try:
            reach.check_greeting(self.endpoint, self.keys, GREETING_SECONDS)
        except Unreachable as exc:
            return f"{exc} (no ZeroMQ handshake in {waited:g} s)"
        if self.seen == 2:
            return (f"{self.endpoint}: the ZeroMQ handshake failed: is the server key this "
                    "server's public key?")
        return f"no workerpool server at {self.endpoint} completed a ZeroMQ handshake in {waited:g} s"
