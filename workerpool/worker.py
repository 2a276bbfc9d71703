"""A worker process: maps the weights itself, builds the model on the views, serves requests.

The router gives a worker one request at a time and runs it inline: no thread hand-off on the
hot path. While the model runs, libzmq's I/O thread keeps answering the router's transport
heartbeats, so a busy worker is never mistaken for a dead one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import zmq

from . import burnpack, models, protocol, security
from .config import POLLS_PER_HEARTBEAT
from .logs import setup_logging
from .models.loaded import LoadedModel
from .transport import NOBLOCK, send_parts, transport_heartbeats
from .units import MS_PER_SECOND
from .worker_spec import EXIT_FILE_CHANGED, EXIT_LOAD_FAILED, EXIT_REFUSED, WorkerSpec

log = logging.getLogger("workerpool.worker")


def handle_request(loaded: LoadedModel, frames: Sequence[Any]) -> tuple[bool, list[Any]]:
    """Run one request; every failure becomes an error reply, never an exception."""
    pid, generation = os.getpid(), loaded.generation
    try:
        message = protocol.decode_request(frames)
    except protocol.ProtocolError as exc:
        return False, protocol.encode_error(
            exc.request_id, "bad_request", str(exc), worker_pid=pid, generation=generation
        )
    request_id = message.id
    try:
        if message.header["method"] == protocol.METHOD_INFO:
            reply = protocol.encode_reply(
                request_id, worker_pid=pid, generation=generation, info=loaded.describe()
            )
            return True, reply
        outputs = loaded.model(message.payload())
        return True, protocol.encode_reply(request_id, outputs, worker_pid=pid, generation=generation)
    except models.ModelInputError as exc:
        return False, protocol.encode_error(
            request_id, "bad_request", str(exc), worker_pid=pid, generation=generation
        )
    except Exception as exc:  # a model bug must not take the worker down
        log.exception("request %r failed", request_id)
        return False, protocol.encode_error(
            request_id, "internal", f"{type(exc).__name__}: {exc}", worker_pid=pid, generation=generation
        )


class Worker:
    """One worker's life: load, connect, register, serve requests and reloads, leave."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.parent = os.getppid()
        self.identity = f"{socket.gethostname()}/{os.getpid()}".encode()
        self.stopping = False
        self.reregister = False
        self.router_missing = False

    def run(self) -> int:
        spec = self.spec
        self.loaded = LoadedModel(spec.path, spec.model, spec.load, spec.generation)
        if spec.expect and self.loaded.pack.identity.as_list() != spec.expect:
            log.warning("worker %d: %s changed while starting; the supervisor will validate the new file",
                        os.getpid(), spec.path)
            return EXIT_FILE_CHANGED
        log.debug("mapped %s and built model %s", spec.path, self.loaded.name)
        if spec.ready_fd is not None:  # tell a worker host's supervisor: loaded, now connecting
            os.write(spec.ready_fd, b"ready")
            os.close(spec.ready_fd)
        context = zmq.Context()
        router = context.socket(zmq.DEALER)
        router.setsockopt(zmq.IDENTITY, self.identity)
        router.setsockopt(zmq.IMMEDIATE, 1)  # nothing queues up for a router that is not there
        transport_heartbeats(router, spec.heartbeat, spec.liveness)
        if spec.curve_key and spec.curve_server_key:
            security.ClientKeys(spec.curve_key, spec.curve_server_key).apply(router)
        router.connect(spec.backend)
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            return self._loop(router, wakeup_r)
        finally:
            router.close(linger=1000)
            context.term()

    def _register(self, router: zmq.Socket) -> bool:
        """Say READY (with what this worker serves); False while no router is connected."""
        ready = {"pid": os.getpid(), "host": socket.gethostname(), "local": not self.spec.remote,
                 **self.loaded.describe()}
        return _send_now(router, [protocol.READY, json.dumps(ready).encode()])

    def _loop(self, router: zmq.Socket, wakeup: int) -> int:
        interval = self.spec.heartbeat
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(wakeup, zmq.POLLIN)
        patience = interval * self.spec.liveness
        router_seen = last_beat = time.monotonic()
        leave_by: float | None = None
        registered = self._register(router)
        while True:
            events = dict(poller.poll(int(interval * MS_PER_SECOND / POLLS_PER_HEARTBEAT)))
            now = time.monotonic()
            if events.get(router):
                router_seen = now
                if self._on_router(router, router.recv_multipart(copy=False)):
                    last_beat = time.monotonic()
            if self.reregister:
                self.reregister = False
                registered = False
            if not registered:
                registered = self._register(router)
            if events.get(wakeup):
                os.read(wakeup, 64)
                if leave_by is None:
                    # Say goodbye and wait for the router's STOP: a request it sent meanwhile is
                    # still answered, so leaving loses nothing. No router connected: just go.
                    log.info("worker %d: SIGTERM, leaving the pool", os.getpid())
                    leave_by = now + patience
                    if not _send_now(router, [protocol.BYE]):
                        return 0
            if self.stopping or (leave_by is not None and (now >= leave_by or not registered)):
                return 0
            if now - last_beat >= interval:
                _send_now(router, [protocol.HEARTBEAT])
                last_beat = now
            if os.getppid() != self.parent:
                log.warning("worker %d: supervisor is gone, exiting", os.getpid())
                return 1
            if now - router_seen > patience:
                if not self.spec.remote:
                    log.warning("worker %d: no heartbeat from the router for %.1fs, exiting",
                                os.getpid(), now - router_seen)
                    return 1
                if not self.router_missing:
                    log.warning("worker %d: no heartbeat from the router at %s for %.1fs; waiting for it",
                                os.getpid(), self.spec.backend, now - router_seen)
                self.router_missing = True
            elif self.router_missing:
                log.info("worker %d: the router at %s is back", os.getpid(), self.spec.backend)
                self.router_missing = False

    def _on_router(self, router: zmq.Socket, frames: list[zmq.Frame]) -> bool:
        """Handle one message from the router; True when a reply was sent."""
        command = frames[0].bytes
        if command == protocol.REQUEST and len(frames) >= 2:
            ok, reply = handle_request(self.loaded, frames[2:])
            _send_now(router, [protocol.REPLY, frames[1], b"ok" if ok else b"err", *reply])
            return True
        if command == protocol.RELOAD and len(frames) >= 2:
            outcome = self._reload(frames[1].bytes)
            _send_now(router, [protocol.RELOADED, json.dumps(outcome).encode()])
            return True
        if command == protocol.STOP:
            self.stopping = True
        elif command == protocol.WHO:  # a restarted router does not know us yet
            self.reregister = True
        elif command == protocol.REFUSE:
            reason = frames[1].bytes.decode(errors="replace") if len(frames) > 1 else "no reason given"
            log.error("worker %d: the router refuses this worker: %s", os.getpid(), reason)
            raise Refused(reason)
        return False

    def _reload(self, order: bytes) -> dict[str, Any]:
        """Map the file now at the path and build the model on it, between two requests.

        The old generation is dropped only once the new one is built, and with it the last
        reference to the old mapping, so the replaced file's pages can be freed.
        """
        wanted = json.loads(order)
        generation, expected = int(wanted["generation"]), list(wanted["identity"])
        refusal = {"ok": False, "ordered": generation, "generation": self.loaded.generation}
        try:
            loaded = LoadedModel(self.spec.path, self.spec.model, self.spec.load, generation)
        except (burnpack.BurnpackError, models.ModelError) as exc:
            return {**refusal, "error": str(exc)}
        if loaded.pack.identity.as_list() != expected:
            return {**refusal, "error": f"{self.spec.path} changed again before this worker mapped it"}
        self.loaded = loaded
        log.info("worker %d: serving generation %d", os.getpid(), generation)
        return {"ok": True, "ordered": generation, "generation": generation}


class Refused(Exception):
    """The router will not take this worker (its model does not fit the router's)."""


def _send_now(sock: zmq.Socket, frames: list[Any]) -> bool:
    """Send without blocking: with no router connected (gone, restarting) the message is dropped
    rather than this worker stuck; the router retries a request whose reply never came."""
    try:
        send_parts(sock, frames, NOBLOCK)
        return True
    except zmq.Again:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides how to stop
    spec = WorkerSpec.from_argv(sys.argv[1:] if argv is None else argv)
    setup_logging(spec.log_level)
    try:
        return Worker(spec).run()
    except (burnpack.BurnpackError, models.ModelError, security.KeysError) as exc:
        log.error("worker %d: cannot load the model: %s", os.getpid(), exc)
        return EXIT_LOAD_FAILED
    except Refused:
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
