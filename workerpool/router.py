"""The load-aware router: clients on one ROUTER socket, workers on another.

A request goes only to a worker that has said it is free (the ZeroMQ guide's load-balancing
broker), so a slow request never holds up others that a free worker could take. Requests wait
in a bounded queue; past ``max_queue`` they are refused at once. A request in flight on a worker
that dies is retried once on another worker (inference is idempotent).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from . import models, protocol
from .config import HEARTBEAT_SECONDS, LIVENESS_BEATS
from .intake import Intake, Pending
from .registry import WorkerRecord
from .rollout import Rollout
from .transport import NOBLOCK, receive_batch, send_parts, transport_heartbeats

log = logging.getLogger("workerpool.router")

MAX_ATTEMPTS = 2
MESSAGE_OVERHEAD = 1 << 20  # room on the backend for a reply's header beside its arrays


class RouterEvents(Protocol):
    """What the router's owner hears about workers."""

    def worker_ready(self, worker: WorkerRecord) -> None: ...

    def worker_lost(self, worker: WorkerRecord, why: str) -> None: ...

    def reload_failed(self, worker: WorkerRecord, why: str) -> None:
        """``worker`` could not switch to the newest generation: the file fails there too."""


class Router:
    """Routes client requests to free workers; knows nothing of processes.

    It tells its owner about workers through ``events``; others read it through
    ``queue_depth``, ``in_flight``, ``unfinished``, ``workers`` and ``reload_complete()``.
    """

    def __init__(
        self,
        context: zmq.Context,
        events: RouterEvents,
        *,
        frontend: str,
        backend: str,
        max_queue: int,
        max_message_size: int,
        heartbeat: float = HEARTBEAT_SECONDS,
        liveness: int = LIVENESS_BEATS,
        signature: dict[str, Any] | None = None,
        secure: Callable[[zmq.Socket], None] | None = None,
    ) -> None:
        self.signature = signature or {}
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.events = events
        self.rollout = Rollout()
        self._workers: dict[bytes, WorkerRecord] = {}
        self._free: deque[bytes] = deque()
        self.frontend = _router_socket(context, secure)
        self.frontend.setsockopt(zmq.MAXMSGSIZE, max_message_size)
        self.frontend.bind(frontend)
        self.endpoint = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        self.intake = Intake(self.frontend, max_queue=max_queue, max_message_size=max_message_size,
                             dispatch=self._dispatch)
        self.queue = self.intake.queue
        # Worker hosts connect from outside unless the backend is a private ipc socket.
        outside = not backend.startswith("ipc://")
        self.backend = _router_socket(context, secure if outside else None)
        transport_heartbeats(self.backend, heartbeat, liveness)
        if outside:
            self.backend.setsockopt(zmq.MAXMSGSIZE, max_message_size + MESSAGE_OVERHEAD)
        self.backend.bind(backend)
        self.backend_endpoint = self.backend.getsockopt_string(zmq.LAST_ENDPOINT)
        self._next_beat = time.monotonic() + heartbeat

    def on_frontend(self) -> None:
        self.intake.on_readable()

    # The read-only view.

    @property
    def workers(self) -> list[WorkerRecord]:
        return list(self._workers.values())

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def in_flight(self) -> int:
        return sum(1 for worker in self._workers.values() if worker.inflight is not None)

    @property
    def unfinished(self) -> int:
        return self.in_flight + len(self.queue)

    def reload_complete(self) -> bool:
        return self.rollout.complete(self._workers.values())

    def stop_accepting(self) -> None:
        """From now on new requests are answered ``shutting_down``; held ones still run."""
        self.intake.accepting = False

    # Worker side.

    def on_backend(self) -> None:
        receive_batch(self.backend, self._from_worker)

    def _from_worker(self, frames: list[zmq.Frame]) -> None:
        address, command = frames[0].bytes, frames[1].bytes
        worker = self._workers.get(address)
        if worker is not None:
            worker.last_seen = time.monotonic()
        if command == protocol.REPLY and worker is not None and len(frames) >= 4:
            self._reply(worker, frames[2].bytes, frames[3].bytes == b"ok", frames[4:])
        elif command == protocol.RELOADED and worker is not None and len(frames) >= 3:
            self._reloaded(worker, frames[2])
        elif command == protocol.READY:
            self._register(address, frames[2:])
        elif worker is None:  # a worker registered with a router before this one restarted
            self._send_raw(address, [protocol.WHO])
        elif command == protocol.BYE:
            self.stop_worker(address)
        elif command != protocol.HEARTBEAT:
            log.warning("unexpected %r message from worker %r ignored", command[:16], address)

    def _reply(self, worker: WorkerRecord, client: bytes, ok: bool, frames: list[zmq.Frame]) -> None:
        pending = worker.inflight
        if pending is None or pending.client != client:  # already answered, e.g. shutting down
            log.debug("late reply from worker %d dropped", worker.pid)
            return
        worker.served += 1
        worker.errors += not ok
        worker.inflight = None
        self.rollout.answered(client, worker.generation)
        self.intake.send(client, frames)
        self._worker_free(worker)

    def _register(self, address: bytes, frames: list[zmq.Frame]) -> None:
        try:
            info = protocol.decode_header(frames[0])
            worker = WorkerRecord.from_ready(address, info)
        except (IndexError, KeyError, TypeError, protocol.ProtocolError) as exc:
            log.warning("malformed READY from %r ignored: %s", address[:64], exc)
            return
        reason = models.signature_mismatch(self.signature, info)
        if reason:
            log.warning("refused worker %d on %s: its model does not fit: %s", worker.pid, worker.host, reason)
            self._send_raw(address, [protocol.REFUSE, reason.encode()])
            return
        if address in self._workers:
            self.lose(address, "re-registered")
        self._workers[address] = worker
        log.info("worker %d on %s ready (model %s, generation %d)",
                 worker.pid, worker.host, worker.model, worker.generation)
        self.events.worker_ready(worker)
        self._worker_free(worker)

    def _worker_free(self, worker: WorkerRecord) -> None:
        if worker.state == "stopping":
            self._send(worker, [protocol.STOP])
            return
        if self.rollout.wants(worker):
            self._send_reload(worker)
            return
        worker.state = "ready"
        self._free.append(worker.address)
        self.rollout.settle(self._workers.values())
        self._drain()

    # Hot reload: one worker at a time switches generation, between two requests.

    def begin_rollout(self, generation: int, file_identity: list[int]) -> None:
        """Move every local worker to ``generation``: the file with this identity, validated."""
        self.rollout.begin(generation, file_identity)
        self._advance_rollout()

    def _advance_rollout(self) -> None:
        for address in list(self._free):
            worker = self._workers.get(address)
            if worker is not None and worker.state == "ready" and self.rollout.wants(worker):
                self._free.remove(address)
                self._send_reload(worker)
                return

    def _send_reload(self, worker: WorkerRecord) -> None:
        if self._send(worker, [protocol.RELOAD, self.rollout.order]):
            worker.state = "reloading"
            self.rollout.started(worker)

    def _reloaded(self, worker: WorkerRecord, answer: Any) -> None:
        if worker.address != self.rollout.switching:
            log.warning("unexpected RELOADED from worker %d ignored", worker.pid)
            return
        failure = self.rollout.finished(worker, answer)
        if failure is not None:
            self.events.reload_failed(worker, failure)
        worker.state = "ready" if worker.state == "reloading" else worker.state
        self._worker_free(worker)
        self._advance_rollout()

    # Dispatch.

    def _drain(self) -> None:
        while self._free and self.queue:
            pending = self.queue.take()
            if pending.expired(time.monotonic()):
                self.intake.expire(pending)
            elif not self._dispatch(pending):
                self.queue.put(pending, first=True)
                break

    def _dispatch(self, pending: Pending) -> bool:
        """Hand a request to the least recently used free worker that may answer its client."""
        floor = self.rollout.floor(pending.client)
        for _ in range(len(self._free)):
            worker = self._workers.get(self._free.popleft())
            if worker is None or worker.state != "ready":
                continue
            if worker.generation < floor:
                self._free.append(worker.address)
                continue
            if self._send(worker, [protocol.REQUEST, pending.client, *pending.frames]):
                worker.state = "busy"
                worker.inflight = pending
                pending.attempts += 1
                return True
        return False

    def _send_raw(self, address: bytes, frames: list[bytes]) -> None:
        try:
            send_parts(self.backend, [address, *frames], NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("message to unregistered worker %r dropped: %s", address, exc)

    def _send(self, worker: WorkerRecord, frames: list[Any]) -> bool:
        try:
            send_parts(self.backend, [worker.address, *frames], NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            self.lose(worker.address, f"unreachable ({exc})")
            return False

    # Losing and stopping workers.

    def lose(self, address: bytes, why: str) -> None:
        """Forget a worker; retry its request once elsewhere, else answer ``worker_failed``."""
        worker = self._workers.pop(address, None)
        if worker is None:
            return
        if address in self._free:
            self._free.remove(address)
        self.rollout.forget(address)
        pending, worker.inflight = worker.inflight, None
        if pending is None:
            log.info("worker %d lost (%s)", worker.pid, why)
        elif pending.attempts < MAX_ATTEMPTS:
            log.warning("worker %d lost (%s) with a request in flight; retrying it", worker.pid, why)
            self.intake.enqueue(pending, first=True)
        else:
            log.warning("worker %d lost (%s); its request already failed once", worker.pid, why)
            self.intake.fail(pending, "worker_failed",
                             f"worker {worker.pid} failed while running the request, twice")
        self.events.worker_lost(worker, why)
        self._advance_rollout()

    def worker_exited(self, pid: int, why: str) -> None:
        """A local worker process exited (its supervisor reaped it)."""
        for address, worker in list(self._workers.items()):
            if worker.pid == pid and worker.local:
                self.lose(address, why)
        self._drain()

    def stop_worker(self, address: bytes) -> None:
        """Ask a worker to exit once its current request is done."""
        worker = self._workers[address]
        worker.state = "stopping"
        if address in self._free:
            self._free.remove(address)
        if worker.inflight is None and self.rollout.switching != address:
            self._worker_free(worker)

    # Time-driven duties.

    def tick(self) -> None:
        self.intake.expire_due()
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat
            self._beat(now)
            self._drain()

    def _beat(self, now: float) -> None:
        deadline = self.heartbeat * self.liveness
        for address, worker in list(self._workers.items()):
            # A busy worker runs the model instead of beating; libzmq's transport heartbeats
            # still close its connection if it dies or freezes, and then this send fails.
            if worker.inflight is None and worker.state != "reloading" \
                    and now - worker.last_seen > deadline:
                self.lose(address, f"no heartbeat for {now - worker.last_seen:.1f}s")
            else:
                self._send(worker, [protocol.HEARTBEAT])

    def fail_all(self, code: str, message: str) -> None:
        """Answer every queued and in-flight request with an error (end of a forced shutdown)."""
        self.intake.fail_queued(code, message)
        for worker in self._workers.values():
            if worker.inflight is not None:
                self.intake.fail(worker.inflight, code, message)
                worker.inflight = None


def _router_socket(context: zmq.Context, secure: Callable[[zmq.Socket], None] | None) -> zmq.Socket:
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    if secure is not None:
        secure(sock)
    return sock
