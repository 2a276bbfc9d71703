"""The load-aware router's core: a state machine with no socket. Events come in (a request
arrived, a worker's message came, a worker's process exited, time passed, an operator asked
for a reload or a stop); what is to be sent goes to its outbox, which the shell (``links.py``)
sends, so no send ever re-enters the core mid-way. Its tests drive it with no socket at all.

A request goes only to a worker that has said it is free (the ZeroMQ guide's load-balancing
broker), so a slow request never holds up others that a free worker could take. Requests wait
in a bounded queue; past ``max_queue`` they are refused at once (intake.py). A worker that
takes a request takes the compatible ones queued behind it too, as one batch (dispatch.py,
batching.py); it answers them in the order sent. What a lost or overdue worker was running is
retried or answered by recovery.py.

Local workers connect to a private ipc backend; worker hosts on other machines to an optional
TCP one (sockets.py binds them). Which socket a worker registered on, never what it says,
decides whether it is local: the shell tells, with each message.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from .. import models
from ..config.pool import HEARTBEAT_SECONDS, LIVENESS_BEATS
from ..errors import ErrorCode
from ..protocol import messages as protocol
from .batching import BatchPolicy
from .dispatch import Dispatcher
from .intake import Intake
from .outbox import Outbox
from .quarantine import Quarantine
from .recovery import Recovery
from .registry import WorkerKey, WorkerRecord, WorkerState, admit
from .rollout import Rollout
from .stats import RouterStats

log = logging.getLogger(__name__)


class RouterEvents(Protocol):
    """What the router's owner hears about workers."""

    def worker_ready(self, worker: WorkerRecord) -> None: ...

    def worker_lost(self, worker: WorkerRecord, why: str) -> None: ...

    def started_here(self, token: str | None) -> bool:
        """Whether this pool started (or is starting) the local worker that holds ``token``."""

    def reload_failed(self, worker: WorkerRecord, why: str) -> None:
        """``worker`` could not switch to the newest generation: the file fails there too."""


class Router:
    """Routes client requests to free workers; knows nothing of processes or sockets.

    It tells its owner about workers through ``events``; others read it through
    ``queue_depth``, ``in_flight``, ``unfinished``, ``workers`` and ``reload_complete()``.
    What it sends waits in ``outbox``.
    """

    def __init__(
        self,
        events: RouterEvents,
        *,
        max_queue: int,
        max_message_size: int,
        max_queue_bytes: int | None = None,
        heartbeat: float = HEARTBEAT_SECONDS,
        liveness: int = LIVENESS_BEATS,
        signature: dict[str, Any] | None = None,
        request_timeout: float | None = None,
        batching: BatchPolicy | None = None,
    ) -> None:
        self.signature = signature or {}
        self.batching = _batching_for(self.signature, batching or BatchPolicy())
        self.quarantine = Quarantine()
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.events = events
        self.rollout = Rollout()
        self.stats = RouterStats()
        self._workers: dict[WorkerKey, WorkerRecord] = {}
        self.outbox = Outbox()
        self.intake = Intake(self.outbox, max_queue=max_queue, max_message_size=max_message_size,
                             max_queue_bytes=max_queue_bytes,
                             dispatch=lambda pending: self.dispatcher.dispatch(pending))
        self.queue = self.intake.queue
        self.dispatcher = Dispatcher(self._workers, self.intake, batching=self.batching,
                                     rollout=self.rollout, quarantine=self.quarantine, stats=self.stats)
        self.recovery = Recovery(self._workers, self.intake, self.dispatcher, rollout=self.rollout,
                                 quarantine=self.quarantine, lost=events.worker_lost,
                                 request_timeout=request_timeout)
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

    def count_held(self) -> None:
        """Tell the occupancy how many requests the pool holds now (after each turn of the loop)."""
        self.stats.occupancy.count(time.monotonic(), self.unfinished)

    @property
    def wake_at(self) -> float | None:
        """When a held request is due to be released (None: none is held)."""
        return self.dispatcher.wake_at

    def reload_complete(self) -> bool:
        return self.rollout.complete(self._workers.values())

    def stop_accepting(self) -> None:
        """From now on new requests are answered ``shutting_down``; held ones still run."""
        self.intake.accepting = False

    # Worker side.

    def from_worker(self, local: bool, frames: list[Any]) -> None:
        """A message from a worker: its routing id, then what it sent; ``local``: it came on the
        private backend."""
        address, command = frames[0].bytes, frames[1].bytes
        worker = self._workers.get((local, address))
        if worker is not None:
            worker.last_seen = time.monotonic()
        if command == protocol.REPLY and worker is not None and len(frames) >= 4:
            self._reply(worker, frames[2].bytes, frames[3].bytes, frames[4:])
        elif command == protocol.RELOADED and worker is not None and len(frames) >= 3:
            self._reloaded(worker, frames[2])
        elif command == protocol.READY:
            self._register((local, address), frames[2:])
        elif worker is None:  # a worker registered with a router before this one restarted
            self.outbox.to_peer((local, address), [protocol.WHO])
        elif command == protocol.BYE:
            self.stop_worker(worker.key)
        elif command != protocol.HEARTBEAT:
            log.warning("unexpected %r message from worker %r ignored", command[:16], address)

    def _reply(self, worker: WorkerRecord, client: bytes, status: bytes, frames: list[Any]) -> None:
        inflight = worker.inflight
        if not inflight or inflight[0].client != client:  # already answered, e.g. shutting down
            log.debug("late reply from worker %d dropped", worker.pid)
            return
        inflight.pop(0)
        ok = status == b"ok"
        worker.served += 1
        worker.errors += not ok
        worker.failed_last = not ok
        now = time.monotonic()
        self.stats.run_times.observe(now - worker.busy_since)
        self.intake.outcomes["ok" if ok else ErrorCode.read(status)] += 1
        self.rollout.answered(client, worker.generation)
        self.intake.send(client, frames)
        if not inflight:
            self.dispatcher.finished(worker, now)

    def _register(self, key: WorkerKey, frames: list[Any]) -> None:
        worker = admit(self.outbox, key, frames, self.signature)
        if worker is None:
            return
        if worker.local and not self.events.started_here(worker.token):
            log.warning("refused local worker %d: it is not one this pool runs or is starting (its "
                        "token is unknown)", worker.pid)
            self.outbox.to_peer(key, [protocol.REFUSE, b"not a worker this pool runs or is starting"])
            return
        if worker.key in self._workers:
            self.lose(worker.key, "re-registered")
        self._workers[worker.key] = worker
        log.info("worker %d on %s ready (model %s, generation %d)", worker.pid, worker.host,
                 worker.model, worker.generation, extra={"worker": worker.pid, "generation": worker.generation})
        self.events.worker_ready(worker)
        self.dispatcher.worker_free(worker)

    # Hot reload: one worker at a time switches generation, between two requests.

    def begin_rollout(self, generation: int, file_identity: list[int], source: str) -> None:
        """Move every local worker to ``generation``: the file with this identity, validated,
        which workers open at ``source``."""
        self.rollout.begin(generation, file_identity, source)
        self.quarantine.clear()
        self.dispatcher.reload_next()

    def _reloaded(self, worker: WorkerRecord, answer: Any) -> None:
        if worker.key != self.rollout.switching:
            log.warning("unexpected RELOADED from worker %d ignored", worker.pid)
            return
        failure = self.rollout.finished(worker, answer)
        if failure is not None:
            self.events.reload_failed(worker, failure)
        if worker.state == WorkerState.RELOADING:
            worker.state = WorkerState.READY
        self.dispatcher.worker_free(worker)
        self.dispatcher.reload_next()

    # Losing and stopping workers.

    def lose(self, key: WorkerKey, why: str, *, asked: bool = False, unsent: bool = False) -> None:
        """Forget a worker; retry its requests once elsewhere, else answer ``worker_failed``.
        ``asked``: it left because it was told to (the supervisor logs that, not a loss);
        ``unsent``: the message that failed to reach it handed it the requests it holds."""
        self.recovery.lose(key, why, asked=asked, unsent=unsent)
        self.dispatcher.drain()  # what it ran goes to the free workers now, not at the next tick

    def worker_exited(self, token: str, why: str, *, asked: bool = False, killed: bool = False) -> None:
        """A local worker process exited (its supervisor, which gave it ``token``, reaped it);
        ``asked``: it had been told to stop; ``killed``: by SIGKILL, which blames no request."""
        self.recovery.worker_exited(token, why, asked=asked, killed=killed)

    def stop_worker(self, key: WorkerKey) -> None:
        """Ask a worker to exit once its current request is done."""
        worker = self._workers[key]
        worker.state = WorkerState.STOPPING
        self.dispatcher.withdraw(key)
        if not worker.inflight and self.rollout.switching != key:
            self.dispatcher.worker_free(worker)

    def fail_all(self, code: ErrorCode, message: str) -> None:
        """Answer every queued and in-flight request with an error (end of a forced shutdown)."""
        self.recovery.fail_all(code, message)

    # Time-driven duties.

    def tick(self) -> None:
        self.intake.expire_due()
        now = time.monotonic()
        self.dispatcher.wake(now)
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat
            self._beat(now)
            self.dispatcher.drain()

    def _beat(self, now: float) -> None:
        deadline = self.heartbeat * self.liveness
        for key, worker in list(self._workers.items()):
            # A busy worker runs the model instead of beating; libzmq's transport heartbeats
            # still close its connection if it dies or freezes, and then this send fails.
            if not worker.inflight and worker.state != WorkerState.RELOADING \
                    and now - worker.last_seen > deadline:
                self.lose(key, f"no heartbeat for {now - worker.last_seen:.1f}s")
            elif self.recovery.overdue(worker, now):
                self.recovery.time_out(worker)
            else:
                self.outbox.to_worker(key, [protocol.HEARTBEAT])


def _batching_for(signature: dict[str, Any], policy: BatchPolicy) -> BatchPolicy:
    """``policy`` told how the model's requests stack: along a declared batch axis, or as texts."""
    declared = models.array_input(signature)
    if declared and declared["shape"][:1] == [None]:  # a batch axis: requests stack along it
        policy.rank = len(declared["shape"])
    policy.text = models.takes_text(signature)
    return policy

