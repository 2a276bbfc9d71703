"""The load-aware router: clients on one ROUTER socket, workers on another.

A request goes only to a worker that has said it is free (the ZeroMQ guide's load-balancing
broker), so a slow request never holds up others that a free worker could take. Requests wait
in a bounded queue; past ``max_queue`` they are refused at once. A worker that takes a request
takes the compatible ones queued behind it too, as one batch (see batching.py); it answers
them in the order sent. A request in flight on a worker that dies is retried once on another
worker, alone (inference is idempotent); one that runs past ``request_timeout`` is answered
``request_timeout`` and its worker given up (see quarantine.py). A batch that dies or runs out
of time tells nothing about which of its requests is to blame: each is retried alone.

Local workers connect to a private ipc backend; worker hosts on other machines to an optional
TCP one. Which socket a worker registered on, never what it says, decides whether it is local.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from .. import models
from ..config.pool import HEARTBEAT_SECONDS, LIVENESS_BEATS
from ..protocol import messages as protocol
from ..protocol.transport import NOBLOCK, receive_batch, send_parts, transport_heartbeats
from ..security import CLIENTS, WORKER_HOSTS
from ..units import MS_PER_SECOND, MiB
from .batching import BatchPolicy, BatchShape
from .intake import Intake, Pending
from .quarantine import Quarantine
from .registry import WorkerKey, WorkerRecord, admit, send_to_peer
from .rollout import Rollout

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2
MESSAGE_OVERHEAD = MiB  # room on the backend for a reply's header beside its arrays
CLIENT_READ_AHEAD = 128  # requests libzmq reads from one client ahead of the router
HANDSHAKE_SECONDS = 5.0  # a peer that has not completed the ZeroMQ handshake by then is dropped


class RouterEvents(Protocol):
    """What the router's owner hears about workers."""

    def worker_ready(self, worker: WorkerRecord) -> None: ...

    def worker_lost(self, worker: WorkerRecord, why: str) -> None: ...

    def started_here(self, token: str | None) -> bool:
        """Whether this pool started (or is starting) the local worker that holds ``token``."""

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
        remote_backend: str | None = None,
        max_queue: int,
        max_message_size: int,
        max_queue_bytes: int | None = None,
        heartbeat: float = HEARTBEAT_SECONDS,
        liveness: int = LIVENESS_BEATS,
        signature: dict[str, Any] | None = None,
        secure: Callable[[zmq.Socket, str], None] | None = None,
        request_timeout: float | None = None,
        batching: BatchPolicy | None = None,
    ) -> None:
        self.signature = signature or {}
        self.batching = batching or BatchPolicy()
        declared = models.array_input(self.signature)
        if declared and declared["shape"][:1] == [None]:  # a batch axis: requests stack along it
            self.batching.rank = len(declared["shape"])
        self.batching.text = models.takes_text(self.signature)
        self.wake_at: float | None = None  # when a held request is due to be released
        self.request_timeout = request_timeout
        self.quarantine = Quarantine()
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.events = events
        self.rollout = Rollout()
        self._workers: dict[WorkerKey, WorkerRecord] = {}
        self._free: deque[WorkerKey] = deque()
        self._running_here: set[WorkerKey] = set()  # local workers with requests in flight
        self.queue_waits = Histogram(LATENCY_BUCKETS)  # seconds from a request's arrival to its dispatch
        self.run_times = Histogram(LATENCY_BUCKETS)  # seconds from a request's dispatch to its reply
        self.batch_rows = Histogram(BATCH_BUCKETS)  # rows per forward pass, since the start
        self.frontend = _bind(context, frontend, max_message_size, _in_domain(secure, CLIENTS),
                              read_ahead=CLIENT_READ_AHEAD)
        self.endpoint = self.frontend.getsockopt_string(zmq.LAST_ENDPOINT)
        self.intake = Intake(self.frontend, max_queue=max_queue, max_message_size=max_message_size,
                             max_queue_bytes=max_queue_bytes, dispatch=self._dispatch)
        self.queue = self.intake.queue
        self.backend = _bind(context, backend, beats=(heartbeat, liveness))
        self.backend_endpoint = self.backend.getsockopt_string(zmq.LAST_ENDPOINT)
        self.remote = None if remote_backend is None else _bind(  # worker hosts connect from outside
            context, remote_backend, max_message_size + MESSAGE_OVERHEAD,
            _in_domain(secure, WORKER_HOSTS), beats=(heartbeat, liveness))
        self._next_beat = time.monotonic() + heartbeat

    # The read-only view.

    @property
    def workers(self) -> list[WorkerRecord]:
        return list(self._workers.values())

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def in_flight(self) -> int:
        return sum(len(worker.inflight) for worker in self._workers.values())

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
        receive_batch(self.backend, lambda frames: self._from_worker(self.backend, True, frames))

    def on_remote_backend(self, remote: zmq.Socket) -> None:
        receive_batch(remote, lambda frames: self._from_worker(remote, False, frames))

    def _from_worker(self, link: zmq.Socket, local: bool, frames: list[zmq.Frame]) -> None:
        address, command = frames[0].bytes, frames[1].bytes
        worker = self._workers.get((local, address))
        if worker is not None:
            worker.last_seen = time.monotonic()
        if command == protocol.REPLY and worker is not None and len(frames) >= 4:
            self._reply(worker, frames[2].bytes, frames[3].bytes == b"ok", frames[4:])
        elif command == protocol.RELOADED and worker is not None and len(frames) >= 3:
            self._reloaded(worker, frames[2])
        elif command == protocol.READY:
            self._register(link, local, address, frames[2:])
        elif worker is None:  # a worker registered with a router before this one restarted
            send_to_peer(link, address, [protocol.WHO])
        elif command == protocol.BYE:
            self.stop_worker(worker.key)
        elif command != protocol.HEARTBEAT:
            log.warning("unexpected %r message from worker %r ignored", command[:16], address)

    def _reply(self, worker: WorkerRecord, client: bytes, ok: bool, frames: list[zmq.Frame]) -> None:
        inflight = worker.inflight
        if not inflight or inflight[0].client != client:  # already answered, e.g. shutting down
            log.debug("late reply from worker %d dropped", worker.pid)
            return
        inflight.pop(0)
        worker.served += 1
        worker.errors += not ok
        now = time.monotonic()
        self.run_times.observe(now - worker.busy_since)
        self.intake.outcomes["ok" if ok else _error_code(frames)] += 1
        self.rollout.answered(client, worker.generation)
        self.intake.send(client, frames)
        if not inflight:
            if worker.key in self._running_here:
                self._running_here.discard(worker.key)
                if worker.batchable:
                    self.batching.finished(now - worker.busy_since)
            self._worker_free(worker)

    def _register(self, link: zmq.Socket, local: bool, address: bytes, frames: list[zmq.Frame]) -> None:
        worker = admit(link, local, address, frames, self.signature)
        if worker is None:
            return
        if local and not self.events.started_here(worker.token):
            log.warning("refused local worker %d: it is not one this pool runs or is starting (its "
                        "token is unknown)", worker.pid)
            send_to_peer(link, address, [protocol.REFUSE, b"not a worker this pool runs or is starting"])
            return
        if worker.key in self._workers:
            self.lose(worker.key, "re-registered")
        self._workers[worker.key] = worker
        log.info("worker %d on %s ready (model %s, generation %d)", worker.pid, worker.host,
                 worker.model, worker.generation, extra={"worker": worker.pid, "generation": worker.generation})
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
        self._free.append(worker.key)
        self.rollout.settle(self._workers.values())
        self._drain()

    # Hot reload: one worker at a time switches generation, between two requests.

    def begin_rollout(self, generation: int, file_identity: list[int]) -> None:
        """Move every local worker to ``generation``: the file with this identity, validated."""
        self.rollout.begin(generation, file_identity)
        self.quarantine.clear()
        self._advance_rollout()

    def _advance_rollout(self) -> None:
        for key in list(self._free):
            worker = self._workers.get(key)
            if worker is not None and worker.state == "ready" and self.rollout.wants(worker):
                self._free.remove(key)
                self._send_reload(worker)
                return

    def _send_reload(self, worker: WorkerRecord) -> None:
        if self._send(worker, [protocol.RELOAD, self.rollout.order]):
            worker.state = "reloading"
            self.rollout.started(worker)

    def _reloaded(self, worker: WorkerRecord, answer: Any) -> None:
        if worker.key != self.rollout.switching:
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
        """Hand a request, with the compatible ones queued behind it, to the least recently used
        free worker that may answer its client; True when it is handled (sent, or refused as a
        known killer). Local workers may be held back for a batch to form (batching.py)."""
        if self.quarantine:
            refusal = self.quarantine.refusal(pending.client, pending.frames)
            if refusal is not None:
                self.intake.fail(pending, "worker_failed", refusal)
                return True
        floor = self.rollout.floor(pending.client)
        held = self._held(pending)
        for _ in range(len(self._free)):
            if not self._free:  # a failed send below lost workers
                break
            worker = self._workers.get(self._free.popleft())
            if worker is None or worker.state != "ready":
                continue
            if worker.generation < floor or (held and worker.local and worker.batching):
                self._free.append(worker.key)
                continue
            if self._send_batch(worker, pending):
                return True
        return False

    def _held(self, pending: Pending) -> bool:
        """Whether local batching workers wait for company before taking ``pending`` (and then
        when to look again): only a request that could share a pass, never past its deadline."""
        if not self.batching.on or pending.solo:
            return False
        until = self.batching.hold_until(pending.received, len(self.queue), len(self._running_here))
        if until is None or time.monotonic() >= until:
            return False
        shape = self._shape(pending)
        if shape is None or shape.rows >= self.batching.max_rows:
            return False
        pending.read_deadline()
        if pending.expires is not None and pending.expires <= until:
            return False
        self.wake_at = until if self.wake_at is None else min(self.wake_at, until)
        return True

    def _send_batch(self, worker: WorkerRecord, first: Pending) -> bool:
        batch, rows = self._gather(worker, first)
        if len(batch) == 1:
            sent = self._send(worker, [protocol.REQUEST, first.client, *first.frames])
        else:  # every request of a batch has as many frames as the first
            stride = str(1 + len(first.frames)).encode()
            sent = self._send(worker, [protocol.BATCH, stride, *(f for p in batch for f in (p.client, *p.frames))])
        if not sent:
            for pending in reversed(batch[1:]):
                self.queue.put(pending, first=True)
            return False
        worker.took(batch, rows, batchable=self._shape(first) is not None and rows <= self.batching.max_rows)
        self.batch_rows.observe(rows)
        for pending in batch:
            pending.attempts += 1
            self.queue_waits.observe(worker.busy_since - pending.received)
        if worker.local:
            self._running_here.add(worker.key)
        log.debug("worker %d: batch of %d requests, %d rows", worker.pid, len(batch), rows)
        return True

    def _gather(self, worker: WorkerRecord, first: Pending) -> tuple[list[Pending], int]:
        """``first`` and the requests queued next that fit with it, and their rows: same
        method, dtype and shape past the batch axis, at most ``max_rows`` rows together, for
        clients that may see the worker's generation. A request past its deadline is answered."""
        shape = self._shape(first)
        rows = 1 if shape is None else shape.rows
        batch = [first]
        policy = self.batching
        if shape is None or first.solo or not worker.batching or rows >= policy.max_rows:
            return batch, rows
        now = time.monotonic()
        while self.queue:
            candidate = self.queue.peek()
            if candidate.expired(now):
                self.intake.expire(self.queue.take())
                continue
            fits = self._shape(candidate)
            if candidate.solo or fits is None or fits.key != shape.key \
                    or rows + fits.rows > policy.max_rows \
                    or self.rollout.floor(candidate.client) > worker.generation:
                break
            self.queue.take()
            refusal = self.quarantine.refusal(candidate.client, candidate.frames) if self.quarantine else None
            if refusal is not None:
                self.intake.fail(candidate, "worker_failed", refusal)
                continue
            batch.append(candidate)
            rows += fits.rows
        return batch, rows

    def _shape(self, pending: Pending) -> BatchShape | None:
        """How ``pending`` batches (read once); None for a request that goes alone."""
        if not pending.shaped:
            pending.shaped = True
            if len(pending.frames) <= 2:
                pending.shape = self.batching.shape_of(pending.header(), len(pending.frames))
        return pending.shape

    def _send(self, worker: WorkerRecord, frames: list[Any]) -> bool:
        try:
            send_parts(worker.link, [worker.address, *frames], NOBLOCK)
            return True
        except zmq.ZMQError as exc:
            self.lose(worker.key, f"unreachable ({exc})")
            return False

    # Losing and stopping workers.

    def lose(self, key: WorkerKey, why: str, *, asked: bool = False) -> None:
        """Forget a worker; retry its requests once elsewhere, else answer ``worker_failed``.
        ``asked``: it left because it was told to (the supervisor logs that, not a loss)."""
        worker = self._workers.pop(key, None)
        if worker is None:
            return
        if key in self._free:
            self._free.remove(key)
        self.rollout.forget(key)
        inflight = self._take_inflight(worker)
        pending = inflight[0] if len(inflight) == 1 else None
        if not inflight:
            log.log(logging.DEBUG if asked else logging.INFO, "worker %d %s (%s)", worker.pid,
                    "left" if asked else "lost", why, extra={"worker": worker.pid})
        elif pending is None:
            log.warning("worker %d lost (%s) with a batch of %d requests in flight; retrying each "
                        "alone", worker.pid, why, len(inflight))
            clients = {p.client for p in inflight}
            if len(clients) == 1:  # whichever request it was, it was this client's
                self.quarantine.killed(inflight[0].client, inflight[0].frames, proven=False)
            self._retry_alone(inflight)
        elif pending.attempts < MAX_ATTEMPTS:
            log.warning("worker %d lost (%s) with a request in flight; retrying it", worker.pid, why)
            self.quarantine.killed(pending.client, pending.frames, proven=False)
            self._retry_alone(inflight)
        else:
            log.warning("worker %d lost (%s); its request already failed once", worker.pid, why)
            self.quarantine.killed(pending.client, pending.frames, proven=True)
            self.intake.fail(pending, "worker_failed",
                             f"worker {worker.pid} failed while running the request, twice")
        self.events.worker_lost(worker, why)
        self._advance_rollout()

    def _take_inflight(self, worker: WorkerRecord) -> list[Pending]:
        """What ``worker`` was running, now no longer its to answer."""
        inflight, worker.inflight = worker.inflight, []
        self._running_here.discard(worker.key)
        return inflight

    def _retry_alone(self, batch: list[Pending]) -> None:
        """Queue ``batch`` again before everything else, each request to go alone: a request in
        a batch that failed is no more to blame than its batch-mates until it fails alone."""
        for pending in reversed(batch):
            pending.solo = True
            self.intake.enqueue(pending, first=True)

    def worker_exited(self, token: str, why: str, *, asked: bool = False) -> None:
        """A local worker process exited (its supervisor, which gave it ``token``, reaped it);
        ``asked``: it had been told to stop."""
        for key, worker in list(self._workers.items()):
            if worker.local and worker.token == token:
                self.lose(key, why, asked=asked)
        self._drain()

    def stop_worker(self, key: WorkerKey) -> None:
        """Ask a worker to exit once its current request is done."""
        worker = self._workers[key]
        worker.state = "stopping"
        if key in self._free:
            self._free.remove(key)
        if not worker.inflight and self.rollout.switching != key:
            self._worker_free(worker)

    # Time-driven duties.

    def tick(self) -> None:
        self.intake.expire_due()
        now = time.monotonic()
        if self.wake_at is not None and now >= self.wake_at:
            self.wake_at = None
            self._drain()
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat
            self._beat(now)
            self._drain()

    def _beat(self, now: float) -> None:
        deadline = self.heartbeat * self.liveness
        for key, worker in list(self._workers.items()):
            # A busy worker runs the model instead of beating; libzmq's transport heartbeats
            # still close its connection if it dies or freezes, and then this send fails.
            if not worker.inflight and worker.state != "reloading" \
                    and now - worker.last_seen > deadline:
                self.lose(key, f"no heartbeat for {now - worker.last_seen:.1f}s")
            elif worker.inflight and self.request_timeout is not None \
                    and now - worker.busy_since > self.request_timeout:
                self._time_out(worker)
            else:
                self._send(worker, [protocol.HEARTBEAT])

    def _time_out(self, worker: WorkerRecord) -> None:
        """Answer a request that ran too long and give up its worker (a local one is killed);
        the requests of a batch that ran too long are retried alone."""
        inflight = self._take_inflight(worker)
        limit = f"--request-timeout {self.request_timeout:g}s"
        if len(inflight) > 1:
            self._retry_alone(inflight)
            self.lose(worker.key, f"its batch of {len(inflight)} requests ran past {limit}; "
                      "retrying each alone")
            return
        pending = inflight[0]
        self.quarantine.killed(pending.client, pending.frames, proven=True)
        self.intake.fail(pending, "request_timeout", f"the request ran past {limit} on worker "
                         f"{worker.pid}; that worker is being replaced")
        self.lose(worker.key, f"its request ran past {limit}")

    def fail_all(self, code: str, message: str) -> None:
        """Answer every queued and in-flight request with an error (end of a forced shutdown)."""
        self.intake.fail_queued(code, message)
        for worker in self._workers.values():
            for pending in self._take_inflight(worker):
                self.intake.fail(pending, code, message)


BATCH_BUCKETS = tuple(2**i for i in range(11))  # 1, 2, 4 ... 1024 rows
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """How many values fell at or under each of ``bounds`` (then above them all), and their
    sum: what a Prometheus histogram reports, counted without a lock in the loop."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> tuple[tuple[float, ...], list[int], float]:
        """Bounds, counts and sum as they are now, for another thread to read."""
        return self.bounds, list(self.counts), self.total


def _error_code(frames: list[Any]) -> str:
    """The code of a worker's error reply (``internal`` when it cannot be read)."""
    try:
        code = protocol.decode_header(frames[0]).get("error", {}).get("code")
    except (protocol.ProtocolError, AttributeError, IndexError):
        code = None
    return code if isinstance(code, str) and code.isidentifier() and len(code) <= 32 else "internal"


def _in_domain(secure: Callable[[zmq.Socket, str], None] | None,
               domain: str) -> Callable[[zmq.Socket], None] | None:
    return None if secure is None else lambda sock: secure(sock, domain)


def _bind(context: zmq.Context, endpoint: str, max_message_size: int | None = None,
          secure: Callable[[zmq.Socket], None] | None = None,
          beats: tuple[float, int] | None = None, read_ahead: int | None = None) -> zmq.Socket:
    """A bound ROUTER that fails a send to a gone peer instead of dropping it silently.

    Options are set before bind: libzmq copies them into each connection it accepts.
    ``read_ahead`` bounds the messages libzmq buffers per peer before the router reads them;
    replies to a peer that does not read are dropped past libzmq's own 1000-message buffer.
    """
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_SECONDS * MS_PER_SECOND))
    if read_ahead is not None:
        sock.setsockopt(zmq.RCVHWM, read_ahead)
    if max_message_size is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_size)
    if secure is not None:
        secure(sock)
    if beats is not None:
        transport_heartbeats(sock, *beats)
    sock.bind(endpoint)
    return sock

