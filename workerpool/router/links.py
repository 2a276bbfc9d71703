"""The router's shell: the sockets around its core. It hands the core what the client socket,
the local workers' links and the worker hosts' backend receive, and sends what the core put in
its outbox, never blocking: a reply to a client that is gone or does not read is dropped; a
message to a worker that cannot be reached loses that worker, an event the core handles like
any other, after the one that produced the message. Replies to the HTTP front door's lanes go
to ``deliver_local``, in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq

from ..logs import Ran
from ..protocol.transport import NOBLOCK, receive_batch, send_parts
from .core import Router
from .intake import LOCAL_KEY_BYTES
from .local_links import LocalLinks
from .outbox import CLIENT, WORKER, carries_requests
from .sockets import RouterSockets

log = logging.getLogger(__name__)


class RouterLinks:
    def __init__(self, sockets: RouterSockets, router: Router, local: LocalLinks) -> None:
        self.router = router
        self.frontend, self.remote = sockets.frontend, sockets.remote
        self.local = local
        self.endpoint = sockets.endpoint
        self.deliver_local: Callable[[bytes, list[Any], Ran | None], None] | None = None  # the HTTP door's

    def on_frontend(self) -> None:
        receive_batch(self.frontend, self.router.receive, self.router.intake.overlong)

    def on_remote_backend(self) -> None:
        assert self.remote is not None
        receive_batch(self.remote, lambda frames: self.router.from_worker(False, frames[0].bytes, frames[1:]))

    def flush(self) -> None:
        """Send everything in the outbox, what sending adds to it too."""
        outbox, local_key = self.router.outbox, self.router.intake.local_key
        while (send := outbox.take()) is not None:
            kind, key, frames, ran = send
            if kind == CLIENT:
                if key[:LOCAL_KEY_BYTES] == local_key:
                    if self.deliver_local is not None:
                        self.deliver_local(key, frames, ran)
                    continue
                try:
                    send_parts(self.frontend, [key, b"", *frames], NOBLOCK)
                except zmq.ZMQError as exc:  # EHOSTUNREACH: the client went away; EAGAIN: it does not read
                    log.debug("reply to a vanished or stalled client dropped: %s", exc)
                continue
            local, address = key
            try:
                if local:
                    self.local.send(address, frames)
                elif self.remote is not None:  # else no remote backend: no remote worker either
                    send_parts(self.remote, [address, *frames], NOBLOCK)
            except (zmq.ZMQError, OSError) as exc:
                why = exc.strerror or str(exc)
                if kind == WORKER:
                    self.router.lose(key, f"unreachable ({why})", unsent=carries_requests(frames))
                else:  # a peer not registered: it is gone, or will say READY again
                    log.debug("message to unregistered worker %r dropped: %s", address, why)
