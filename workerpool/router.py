"""The load-aware router: clients on one ROUTER socket, workers on another.

A request goes only to a worker that has said it is free (the ZeroMQ guide's load-balancing
broker), so a slow request never holds up others that a free worker could take. Requests wait
in a bounded queue; past ``max_queue`` they are refused at once. A request in flight on a worker
that dies is retried once on another worker (inference is idempotent).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from . import models, protocol
from .transport import NOBLOCK, readable, send_parts, transport_heartbeats

log = logging.getLogger("workerpool.router")

MAX_ATTEMPTS = 2
BATCH = 64  # messages taken from one socket per poll: amortises the loop, keeps it fair


@dataclass
class Pending:
    """A request the router holds: queued, or in flight on one worker."""

    client: bytes
    frames: list[Any]
    received: float
    expires: float | None = None
    attempts: int = 0


@dataclass
class WorkerState:
    identity: bytes
    pid: int
    host: str
    generation: int
    model: str
    started: float
    last_seen: float
    state: str = "ready"
    served: int = 0
    errors: int = 0
    inflight: Pending | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "host": self.host,
            "state": self.state,
            "generation": self.generation,
            "served": self.served,
            "errors": self.errors,
            "started": self.started,
        }


class Router:
    """Routes client requests to free workers; knows nothing of processes."""

    def __init__(
        self,
        context: zmq.Context,
        *,
        frontend: str,
        backend: str,
        max_queue: int,
        max_message_size: int,
        heartbeat: float = 1.0,
        liveness: int = 5,
        on_ready: Callable[[WorkerState], None] = lambda worker: None,
        on_lost: Callable[[WorkerState, str], None] = lambda worker, why: None,
        on_reload_failed: Callable[[WorkerState, str], None] = lambda worker, why: None,
        signature: dict[str, Any] | None = None,
        secure: Callable[[zmq.Socket], None] | None = None,
    ) -> None:
        self.max_queue = max_queue
        self.max_message_size = max_message_size
        self.signature = signature or {}
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.on_ready = on_ready
        self.on_lost = on_lost
        self.on_reload_failed = on_reload_failed
        self.target_generation = 0
        self.reload_order = b""
        self.reloading: bytes | None = None
        self.reload_paused = False
        self.switching = False  # between begin_reload and every worker on the new generation
        self.generation_floor: dict[bytes, int] = {}  # client -> newest generation that answered it
        self.accepting = True
        self.workers: dict[bytes, WorkerState] = {}
        self.free: deque[bytes] = deque()
        self.queue: deque[Pending] = deque()
        self.frontend = context.socket(zmq.ROUTER)
        self.frontend.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.frontend.setsockopt(zmq.MAXMSGSIZE, max_message_size)
        self.frontend.setsockopt(zmq.LINGER, 0)
        if secure is not None:
            secure(self.frontend)
        self.frontend.bind(frontend)
        self.endpoint = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        self.backend = context.socket(zmq.ROUTER)
        self.backend.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.backend.setsockopt(zmq.LINGER, 0)
        transport_heartbeats(self.backend, heartbeat, liveness)
        if not backend.startswith("ipc://"):  # worker hosts connect from outside
            self.backend.setsockopt(zmq.MAXMSGSIZE, max_message_size + (1 << 20))
            if secure is not None:
                secure(self.backend)
        self.backend.bind(backend)
        self.backend_endpoint = self.backend.getsockopt_string(zmq.LAST_ENDPOINT)
        self._next_beat = time.monotonic() + heartbeat
        self._next_expiry_scan = 0.0

    @property
    def busy_count(self) -> int:
        return sum(1 for worker in self.workers.values() if worker.inflight is not None)

    # Client side.

    def on_frontend(self) -> None:
        """Take the requests waiting on the client socket (a bounded batch per poll)."""
        for _ in range(BATCH):
            self._accept(self.frontend.recv_multipart(copy=False))
            if not readable(self.frontend):
                return

    def _accept(self, frames: list[zmq.Frame]) -> None:
        client = frames[0].bytes
        if len(frames) < 3 or frames[1].bytes != b"":
            request_id = protocol.request_id_of(frames[1]) if len(frames) > 1 else None
            self.reply_error(client, request_id, "bad_request",
                             "a request is an empty delimiter frame, a JSON header frame, then array frames")
            return
        if not self.accepting:
            self._refuse(client, frames[2], "shutting_down", "the server is shutting down")
            return
        size = sum(len(frame) for frame in frames)
        if size > self.max_message_size:  # libzmq's own limit is per frame
            self._refuse(client, frames[2], "bad_request",
                         f"the request is {size} bytes, over --max-message-size {self.max_message_size}")
            return
        pending = Pending(client, frames[2:], time.monotonic())
        if self._dispatch(pending):
            return
        if len(self.queue) >= self.max_queue:
            self._refuse(client, frames[2], "overloaded",
                         f"{len(self.queue)} requests already queued (--max-queue {self.max_queue})")
            return
        self._enqueue(pending)

    def _enqueue(self, pending: Pending, *, first: bool = False) -> None:
        """Queue a request, with its deadline: read from the header only now, off the fast path."""
        if pending.expires is None:
            try:
                budget = protocol.deadline_of(protocol.decode_header(pending.frames[0]))
            except protocol.ProtocolError:
                budget = None  # the worker answers the malformed header in full
            if budget is not None:
                pending.expires = pending.received + budget
        if pending.expires is not None and time.monotonic() >= pending.expires:
            self._expire(pending)
        elif first:
            self.queue.appendleft(pending)
        else:
            self.queue.append(pending)

    def _refuse(self, client: bytes, header: Any, code: str, message: str) -> None:
        self.reply_error(client, protocol.request_id_of(header), code, message)

    def reply_error(self, client: bytes, request_id: Any, code: str, message: str) -> None:
        self._to_client(client, protocol.encode_error(request_id, code, message))

    def _to_client(self, client: bytes, frames: list[Any]) -> None:
        try:
            send_parts(self.frontend, [client, b"", *frames], NOBLOCK)
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client went away; EAGAIN: it does not read
            log.debug("reply to a vanished or stalled client dropped: %s", exc)

    # Worker side.

    def on_backend(self) -> None:
        """Take the messages waiting from workers (a bounded batch per poll)."""
        for _ in range(BATCH):
            self._from_worker(self.backend.recv_multipart(copy=False))
            if not readable(self.backend):
                return

    def _from_worker(self, frames: list[zmq.Frame]) -> None:
        identity, command = frames[0].bytes, frames[1].bytes
        worker = self.workers.get(identity)
        if worker is not None:
            worker.last_seen = time.monotonic()
        if command == protocol.REPLY and worker is not None and len(frames) >= 4:
            pending, client = worker.inflight, frames[2].bytes
            if pending is None or pending.client != client:  # already answered, e.g. shutting down
                log.debug("late reply from worker %d dropped", worker.pid)
                return
            ok = frames[3].bytes == b"ok"
            worker.served += 1
            worker.errors += not ok
            worker.inflight = None
            if self.switching:
                self.generation_floor[client] = max(worker.generation, self.generation_floor.get(client, 0))
            self._to_client(client, frames[4:])
            self._worker_free(worker)
        elif command == protocol.RELOADED and worker is not None and len(frames) >= 3:
            self._reloaded(worker, frames[2])
        elif command == protocol.READY:
            self._register(identity, frames[2:])
        elif worker is None:  # a worker registered with a router before this one restarted
            self._send_raw(identity, [protocol.WHO])
        elif command == protocol.BYE:
            self.stop_worker(identity)
        elif command == protocol.HEARTBEAT:
            pass
        else:
            log.warning("unexpected %r message from worker %r ignored", command[:16], identity)

    def _register(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        try:  # a worker host on TCP is outside: read its READY as warily as a request
            info = protocol.decode_header(frames[0])
            pid, generation = info["pid"], info["generation"]
            if type(pid) is not int or type(generation) is not int:
                raise TypeError("pid and generation must be integers")
            worker = WorkerState(
                identity=identity,
                pid=pid,
                host=str(info["host"]),
                generation=generation,
                model=str(info["model"]),
                started=time.time(),
                last_seen=time.monotonic(),
                info=info,
            )
        except (IndexError, KeyError, TypeError, protocol.ProtocolError) as exc:
            log.warning("malformed READY from %r ignored: %s", identity[:64], exc)
            return
        reason = models.signature_mismatch(self.signature, info)
        if reason:
            log.warning("refused worker %d on %s: its model does not fit: %s", worker.pid, worker.host, reason)
            self._send_raw(identity, [protocol.REFUSE, reason.encode()])
            return
        if identity in self.workers:
            self.lose(identity, "re-registered")
        self.workers[identity] = worker
        log.info("worker %d on %s ready (model %s, generation %d)",
                 worker.pid, worker.host, worker.model, worker.generation)
        self.on_ready(worker)
        self._worker_free(worker)

    def _worker_free(self, worker: WorkerState) -> None:
        if worker.state == "stopping":
            self._send(worker, [protocol.STOP])
            return
        if self._may_reload(worker):
            self._send_reload(worker)
            return
        worker.state = "ready"
        self.free.append(worker.identity)
        if self.switching and self.reload_complete():
            self.switching = False
            self.generation_floor.clear()
        self._drain()

    # Hot reload: one worker at a time switches generation, between two requests.

    def begin_reload(self, generation: int, identity: list[int]) -> None:
        """Move every worker to ``generation``: the file with this identity, already validated."""
        self.target_generation = generation
        self.reload_order = json.dumps({"generation": generation, "identity": identity}).encode()
        self.reload_paused = False
        self.switching = True
        self._advance_reload()

    def _may_reload(self, worker: WorkerState) -> bool:
        return (
            worker.generation < self.target_generation
            and worker.info.get("local", True)  # worker hosts watch their own copy of the file
            and self.reloading is None
            and not self.reload_paused
        )

    def _advance_reload(self) -> None:
        for identity in list(self.free):
            worker = self.workers.get(identity)
            if worker is not None and worker.state == "ready" and self._may_reload(worker):
                self.free.remove(identity)
                self._send_reload(worker)
                return

    def _send_reload(self, worker: WorkerState) -> None:
        if self._send(worker, [protocol.RELOAD, self.reload_order]):
            worker.state = "reloading"
            self.reloading = worker.identity

    def _reloaded(self, worker: WorkerState, answer: Any) -> None:
        if worker.identity != self.reloading:
            log.warning("unexpected RELOADED from worker %d ignored", worker.pid)
            return
        self.reloading = None
        try:
            outcome = protocol.decode_header(answer)
            ok, ordered, generation = outcome["ok"], outcome["ordered"], outcome["generation"]
            if type(ordered) is not int or type(generation) is not int:
                raise TypeError("generations must be integers")
        except (KeyError, TypeError, protocol.ProtocolError):
            ok, ordered, generation = False, self.target_generation, worker.generation
            outcome = {"error": "malformed RELOADED"}
        if ok is True:
            worker.generation = generation
            worker.info["generation"] = generation
        else:
            log.warning("worker %d could not switch to generation %d: %s", worker.pid, ordered,
                        outcome.get("error"))
            if ordered == self.target_generation:
                # Retrying the same file would fail the same way: wait for the next begin_reload.
                self.reload_paused = True
                self.on_reload_failed(worker, str(outcome.get("error")))
        worker.state = "ready" if worker.state == "reloading" else worker.state
        self._worker_free(worker)
        self._advance_reload()

    def reload_complete(self) -> bool:
        return all(w.generation >= self.target_generation
                   for w in self.workers.values() if w.info.get("local", True))

    def _drain(self) -> None:
        while self.free and self.queue:
            pending = self.queue.popleft()
            if pending.expires is not None and time.monotonic() >= pending.expires:
                self._expire(pending)
            elif not self._dispatch(pending):
                self.queue.appendleft(pending)
                break

    def _dispatch(self, pending: Pending) -> bool:
        """Hand a request to the least recently used free worker, if there is one.

        While workers switch generation, a client that was answered by the new one is served
        only by workers at least that new: its replies never go back a generation.
        """
        floor = self.generation_floor.get(pending.client, 0) if self.switching else 0
        for _ in range(len(self.free)):
            worker = self.workers.get(self.free.popleft())
            if worker is None or worker.state != "ready":
                continue
            if worker.generation < floor:
                self.free.append(worker.identity)
                continue
            if self._send(worker, [protocol.REQUEST, pending.client, *pending.frames]):
                worker.state = "busy"
                worker.inflight = pending
                pending.attempts += 1
                return True
        return False

    def _send_raw(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            send_parts(self.backend, [identity, *frames], NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("message to unregistered worker %r dropped: %s", identity, exc)

    def _send(self, worker: WorkerState, frames: list[Any]) -> bool:
        try:
            send_parts(self.backend, [worker.identity, *frames], NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            self.lose(worker.identity, f"unreachable ({exc})")
            return False

    def _expire(self, pending: Pending) -> None:
        waited = time.monotonic() - pending.received
        self._refuse(pending.client, pending.frames[0], "deadline_exceeded",
                     f"the deadline passed after {waited * 1000:.0f} ms in the queue")

    def lose(self, identity: bytes, why: str) -> None:
        """Forget a worker; retry its request once elsewhere, else answer ``worker_failed``."""
        worker = self.workers.pop(identity, None)
        if worker is None:
            return
        try:
            self.free.remove(identity)
        except ValueError:
            pass
        if self.reloading == identity:
            self.reloading = None
        pending, worker.inflight = worker.inflight, None
        if pending is not None:
            if pending.attempts < MAX_ATTEMPTS:
                log.warning("worker %d lost (%s) with a request in flight; retrying it", worker.pid, why)
                self._enqueue(pending, first=True)
            else:
                log.warning("worker %d lost (%s); its request already failed once", worker.pid, why)
                self._refuse(pending.client, pending.frames[0], "worker_failed",
                             f"worker {worker.pid} failed while running the request, twice")
        else:
            log.info("worker %d lost (%s)", worker.pid, why)
        self.on_lost(worker, why)
        self._advance_reload()

    def worker_exited(self, pid: int, why: str) -> None:
        for identity, worker in list(self.workers.items()):
            if worker.pid == pid and worker.info.get("local", True):
                self.lose(identity, why)
        self._drain()

    def stop_worker(self, identity: bytes) -> None:
        """Ask a worker to exit once its current request is done."""
        worker = self.workers[identity]
        worker.state = "stopping"
        if identity in self.free:
            self.free.remove(identity)
        if worker.inflight is None and self.reloading != identity:
            self._worker_free(worker)

    # Time-driven duties.

    def tick(self) -> None:
        now = time.monotonic()
        if self.queue and now >= self._next_expiry_scan:
            self._next_expiry_scan = now + 0.01
            if any(p.expires is not None and now >= p.expires for p in self.queue):
                keep: deque[Pending] = deque()
                for pending in self.queue:
                    if pending.expires is not None and now >= pending.expires:
                        self._expire(pending)
                    else:
                        keep.append(pending)
                self.queue = keep
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat
            deadline = self.heartbeat * self.liveness
            for identity, worker in list(self.workers.items()):
                # A busy worker runs the model instead of beating; libzmq's transport heartbeats
                # still close its connection if it dies or freezes, and then this send fails.
                if worker.inflight is None and worker.state != "reloading" \
                        and now - worker.last_seen > deadline:
                    self.lose(identity, f"no heartbeat for {now - worker.last_seen:.1f}s")
                else:
                    self._send(worker, [protocol.HEARTBEAT])
            self._drain()

    def fail_all(self, code: str, message: str) -> None:
        """Answer every queued and in-flight request with an error (end of a forced shutdown)."""
        while self.queue:
            pending = self.queue.popleft()
            self._refuse(pending.client, pending.frames[0], code, message)
        for worker in self.workers.values():
            if worker.inflight is not None:
                self._refuse(worker.inflight.client, worker.inflight.frames[0], code, message)
                worker.inflight = None
