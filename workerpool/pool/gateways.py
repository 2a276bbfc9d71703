"""The gateway processes of ``serve --http``: the socket they share, and their lives.

The supervisor binds the HTTP socket itself, so a port in use fails the start at once and
connections wait in its backlog while a gateway starts or restarts. Each gateway is a fresh
interpreter (``python -m workerpool.gateway``, aiohttp on uvloop) holding one DEALER to the
router's private gateway endpoint; its routing id is a secret made here and known to the
router, which is what lets it speak for many HTTP connections (router/intake.py). A gateway
that dies is started again, after a back-off if it keeps dying; at shutdown, once the router
has answered what it took, each is told to stop and waited for.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from ..gateway.spec import GatewaySpec
from ..router.intake import GATEWAY_ID_BYTES, Intake
from ..supervisor.loop import Loop
from ..supervisor.process import Backoff, Process, describe_exit, python_env
from ..worker.spec import STOP_SIGNAL

log = logging.getLogger(__name__)

BACKLOG = 1024
STOP_PATIENCE = 10.0  # seconds a gateway told to stop may take before it is killed


@dataclass(eq=False)
class _Slot:
    process: Process | None = None
    routing_id: bytes = b""
    start_at: float | None = None


class Gateways:
    """``count`` gateway processes serving ``sock``, made from ``spec`` (whose socket,
    routing id and supervisor are filled in for each)."""

    def __init__(self, loop: Loop, intake: Intake, sock: socket.socket, spec: GatewaySpec, count: int) -> None:
        self.loop = loop
        self.intake = intake
        self.socket = sock
        self.spec = spec
        self.slots = [_Slot() for _ in range(count)]
        self.backoff = Backoff()
        self.stopping = False
        loop.every_tick(self._start_due, due=self._next_start)

    def start(self) -> None:
        for slot in self.slots:
            self._start(slot)

    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots if slot.process is not None]

    def _start(self, slot: _Slot) -> None:
        slot.start_at = None
        slot.routing_id = b"g" + os.urandom(GATEWAY_ID_BYTES - 1)  # not 0: libzmq's own ids start so
        spec = GatewaySpec(**{**vars(self.spec), "listen_fd": self.socket.fileno(),
                              "routing_id": slot.routing_id.hex(), "supervisor_pid": os.getpid()})
        try:
            process = Process.spawn([sys.executable, "-m", "workerpool.gateway"],
                                    python_env() | spec.environment(), pass_fds=[self.socket.fileno()])
        except OSError as exc:
            log.error("cannot start an HTTP gateway: %s", exc)
            slot.start_at = time.monotonic() + self.backoff.fail()
            return
        self.intake.gateways.add(slot.routing_id)
        slot.process = process
        self.loop.read(process.pidfd, lambda: self._exited(slot))

    def _exited(self, slot: _Slot) -> None:
        process = slot.process
        assert process is not None
        self.loop.forget(process.pidfd)
        code = process.reap()
        self.intake.gateways.discard(slot.routing_id)
        slot.process = None
        if self.stopping:
            return
        if time.monotonic() - process.started > 60:
            self.backoff.reset()
        delay = self.backoff.fail()
        log.warning("HTTP gateway %d %s; starting another in %.1fs", process.pid, describe_exit(code), delay)
        slot.start_at = time.monotonic() + delay

    def _next_start(self) -> float | None:
        return min((slot.start_at for slot in self.slots if slot.start_at is not None), default=None)

    def _start_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.start_at is not None and slot.start_at <= now and not self.stopping:
                self._start(slot)

    def stop(self, requests: zmq.Socket, answer: Callable[[], None]) -> None:
        """Tell every gateway to stop and wait for them (``STOP_PATIENCE`` at most, then kill),
        answering meanwhile what they still send on ``requests`` (the router no longer takes
        it, and says so); then close the HTTP socket."""
        self.stopping = True
        running = {slot.process.pidfd: slot.process for slot in self.slots if slot.process is not None}
        poller = zmq.Poller()
        poller.register(requests, zmq.POLLIN)
        for pidfd, process in running.items():
            process.send(STOP_SIGNAL)
            poller.register(pidfd, zmq.POLLIN)
        deadline = time.monotonic() + STOP_PATIENCE
        while running and time.monotonic() < deadline:
            for source, _ in poller.poll(100):
                if source is requests:
                    answer()
                elif source in running:
                    poller.unregister(source)
                    self._reap(running.pop(source))
        for process in running.values():
            log.warning("HTTP gateway %d did not stop within %gs; killing it", process.pid, STOP_PATIENCE)
            process.kill()
            self._reap(process)
        self.socket.close()

    def _reap(self, process: Process) -> None:
        self.loop.forget(process.pidfd)
        process.reap()


def bind(host: str, port: int) -> socket.socket:
    """The listening HTTP socket, inheritable by the gateways; OSError when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
