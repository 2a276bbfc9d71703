"""The load-aware router's core: a state machine with no socket. Events come in (a request
arrived, a worker's message came, a worker's process exited, time passed, an operator asked
for a reload, a model or a stop); what is to be sent goes to its outbox, which the shell
(``links.py``) sends, so no send ever re-enters the core mid-way. Its tests drive it with no
socket at all.

Its parts, each with one job: the intake admits a request or answers it at once
(``intake.py``); the scheduler owns every worker's state and decides what each is sent
(``scheduler.py``), handing out the requests the backlog holds (``backlog.py``: a queue per
model, ``queue.py``); replies are counted on their way out (``replies.py``). A request goes
only to a worker that has said it is free (the ZeroMQ guide's load-balancing broker), so a slow
request never holds up others that a free worker could take.

Local workers each talk over a link of their own (``local_links.py``); worker hosts on other
machines connect to an optional TCP backend (``sockets.py`` binds it). Which way a message
came, never what its worker says, decides whether it is local: the shell tells, with each
message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .. import models
from ..config.pool import HEARTBEAT_SECONDS, LIVENESS_BEATS
from ..control.status import WorkerState
from ..errors import ErrorCode
from ..logs import AccessLog
from ..protocol import messages as protocol
from . import recovery
from .backlog import Backlog
from .batching import BatchPolicy
from .intake import Intake
from .outbox import Outbox
from .quarantine import Quarantine
from .queue import QueueFull, RequestQueue
from .registry import WorkerKey, WorkerRecord, admit
from .replies import Replies
from .requests import Request
from .scheduler import Scheduler, SchedulerEvents
from .stats import RouterStats

log = logging.getLogger(__name__)

MAX_TOKENIZING_SECONDS = 3600.0  # more, for one message's texts, is a worker's lie


class RouterEvents(SchedulerEvents, Protocol):
    """What the router's owner hears about workers: what the scheduler tells, and more."""

    def worker_ready(self, worker: WorkerRecord) -> None: ...

    def started_here(self, token: str | None) -> bool:
        """Whether this pool started (or is starting) the local worker that holds ``token``."""

    def stopped(self, worker: WorkerRecord) -> bool:
        """Whether a local worker's process is stopped (SIGSTOP): frozen, not busy."""


class Router:
    """Routes client requests to free workers; knows nothing of processes or sockets.

    Models are served once added (:meth:`add_model`). It tells its owner about workers through
    ``events``; others read it through ``queue_depth``, ``in_flight``, ``unfinished``,
    ``workers`` and ``reload_complete()``. What it sends waits in ``outbox``; ``access`` writes
    the ZeroMQ door's access lines (none without it). ``clock`` is what the scheduler measures
    the workers' time with (a test sets it).
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
        request_timeout: float | None = None,
        running_cap: int | None = None,
        access: AccessLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.events = events
        self.running_cap = running_cap  # local workers that can run at once (batching.py)
        self.outbox = Outbox()
        self.replies = Replies(self.outbox, access)
        self.stats = RouterStats()
        self.queue = RequestQueue(max_queue, max_queue_bytes)
        self.policies: dict[str, BatchPolicy] = {}  # by model: how its requests batch
        self.intake = Intake(self.replies, self.policies, max_message_size=max_message_size)
        self.backlog = Backlog(self.replies, self.queue, Quarantine(), self.intake.local_key)
        self.scheduler = Scheduler(self.backlog, self.stats, events=events, request_timeout=request_timeout,
                                   clock=clock)
        self._next_beat = time.monotonic() + heartbeat

    # Models.

    def add_model(self, name: str, signature: dict[str, Any], *, max_rows: int, wait: float = 0.0,
                  budget: float = 0.0, limit: int | None = None) -> None:
        """Serve ``name``, whose model has ``signature`` (what ``info`` lists); ``max_rows``,
        ``wait`` and ``budget`` are its --max-batch, --batch-wait and --pass-budget; ``limit``:
        the workers serving it."""
        policy = BatchPolicy(max_rows=max_rows, wait=wait, budget=budget, running_cap=self.running_cap)
        self.scheduler.add_model(name, dict(signature), _batching_for(signature, policy), limit)
        self.policies[name] = policy

    def remove_model(self, name: str) -> None:
        del self.policies[name]
        self.scheduler.remove_model(name)

    def begin_rollout(self, model: str, generation: int, order: bytes) -> None:
        """Move every local worker of ``model`` to ``generation``, whose RELOAD message is ``order``."""
        self.scheduler.begin_rollout(model, generation, order)

    # The read-only view.

    @property
    def workers(self) -> list[WorkerRecord]:
        return list(self.scheduler.workers.values())

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def in_flight(self) -> int:
        return sum(len(worker.inflight) for worker in self.scheduler.workers.values())

    @property
    def unfinished(self) -> int:
        """Requests taken in and not answered yet, waiting or running."""
        return self.backlog.held

    def count_held(self) -> None:
        """Tell the occupancy how many requests the pool holds now (after each turn of the loop)."""
        self.stats.occupancy.count(time.monotonic(), self.unfinished)

    @property
    def wake_at(self) -> float | None:
        """When a held request is due to be released (None: none is held)."""
        return self.scheduler.wake_at

    def reload_complete(self, model: str | None = None) -> bool:
        """Whether every local worker serves the newest generation of ``model`` (of every model)."""
        served = self.scheduler.models
        chosen = served.values() if model is None else [served[model]] if model in served else []
        return all(record.rollout.complete(self.scheduler.workers.values()) for record in chosen)

    def stop_accepting(self) -> None:
        """From now on new requests are answered ``shutting_down``; held ones still run."""
        self.intake.accepting = False

    # Client side.

    def receive(self, frames: list[Any]) -> None:
        """A message from the client socket: the client's routing id, then what it sent."""
        request = self.intake.receive(frames)
        if request is not None:
            self._take(request)

    def admit_local(self, lane: bytes, frames: list[Any], size: int, api: str) -> None:
        """A request from the HTTP front door by the route ``api`` (see :meth:`Intake.receive_local`)."""
        request = self.intake.receive_local(lane, frames, size, api)
        if request is not None:
            self._take(request)

    def _take(self, request: Request) -> None:
        try:
            self.scheduler.add(request)
        except QueueFull as full:
            self.intake.refuse(request.client, request.frames, ErrorCode.OVERLOADED,
                               self.intake.refusal(request, self.queue, full), request.model, request.api)

    # Worker side.

    def from_worker(self, local: bool, address: bytes, frames: list[Any]) -> None:
        """What a worker sent; ``local``: it came on a local link (``address`` is the link's),
        else on the worker hosts' backend (``address`` is the routing id)."""
        command = frames[0].bytes
        worker = self.scheduler.workers.get((local, address))
        if worker is not None:
            worker.last_seen = time.monotonic()
        if command == protocol.REPLY and worker is not None and len(frames) >= 3:
            self.scheduler.replied(worker, frames[1].bytes, frames[2].bytes, frames[3:])
        elif command == protocol.RELOADED and worker is not None and len(frames) >= 2:
            self.scheduler.reloaded(worker, frames[1])
        elif command == protocol.READY:
            self._register((local, address), frames[1:])
        elif worker is None:  # a worker registered with a router before this one restarted
            self.outbox.to_peer((local, address), [protocol.WHO])
        elif command == protocol.BYE:
            self.stop_worker(worker.key)
        elif command == protocol.USAGE:
            self._count_usage(worker, frames)
        elif command != protocol.HEARTBEAT:
            log.warning("unexpected %r message from worker %r ignored", command[:16], address)

    def _register(self, key: WorkerKey, frames: list[Any]) -> None:
        signatures = {name: model.signature for name, model in self.scheduler.models.items()}
        worker = admit(self.outbox, key, frames, signatures)
        if worker is None:
            return
        if worker.local and not self.events.started_here(worker.token):
            log.warning("refused local worker %d: it is not one this pool runs or is starting (its "
                        "token is unknown)", worker.pid)
            self.outbox.to_peer(key, [protocol.REFUSE, b"not a worker this pool runs or is starting"])
            return
        if worker.key in self.scheduler.workers:
            self.lose(worker.key, "re-registered")
        log.info("worker %d on %s ready (%s)", worker.pid, worker.host,
                 ", ".join(f"{name} generation {generation}" for name, generation in worker.models.items()),
                 extra={"worker": worker.pid, "generation": worker.generation})
        self.events.worker_ready(worker)
        self.scheduler.register(worker)

    def _count_usage(self, worker: WorkerRecord, frames: list[Any]) -> None:
        """What a worker says its tokenizer did, counted for a model it serves when the model's
        limit allows it (a worker host is outside: its word is bounded, never taken as is)."""
        usage = protocol.read_usage(frames)
        model = self.scheduler.models.get(usage[0]) if usage is not None else None
        if usage is None or model is None or model.name not in worker.models:
            log.debug("malformed or misplaced USAGE from worker %d ignored", worker.pid)
            return
        _, texts, tokens, seconds = usage
        limit = model.signature.get("max_input_tokens")
        if (type(limit) is int and tokens > texts * limit) or not 0 <= seconds <= MAX_TOKENIZING_SECONDS:
            log.debug("USAGE from worker %d past the model's bounds ignored", worker.pid)
            return
        self.stats.of(model.name).tokenized(texts, tokens, seconds)

    def lose(self, key: WorkerKey, why: str, *, asked: bool = False, unsent: bool = False) -> None:
        """Forget a worker; retry its requests once elsewhere, else answer ``worker_failed``.
        ``asked``: it left because it was told to (the supervisor logs that, not a loss);
        ``unsent``: the message that failed to reach it handed it the requests it holds."""
        self.scheduler.lose(key, why, asked=asked, unsent=unsent)

    def worker_exited(self, token: str, why: str, *, asked: bool = False, outside: bool = False) -> None:
        """A local worker process exited (its supervisor, which gave it ``token``, reaped it);
        ``asked``: it had been told to stop; ``outside``: of a cause that blames no request
        (SIGKILL: an operator, the OOM killer; SIGBUS: its weight file was cut short). Any other
        death of a local worker is a crash: the one loss that can blame a request."""
        for key, worker in list(self.scheduler.workers.items()):
            if worker.local and worker.token == token:
                self.scheduler.lose(key, why, asked=asked, crashed=not outside)

    def stop_worker(self, key: WorkerKey) -> None:
        """Ask a worker to exit once its current request is done."""
        self.scheduler.stop_worker(key)

    def fail_all(self, code: ErrorCode, message: str) -> None:
        """Answer every queued and in-flight request with an error (end of a forced shutdown)."""
        self.scheduler.fail_all(code, message)

    # Time-driven duties.

    def tick(self) -> None:
        now = time.monotonic()
        self.scheduler.tick(now)
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat
            self._beat(now)
            self.scheduler.dispatch()

    def _beat(self, now: float) -> None:
        deadline = self.heartbeat * self.liveness
        scheduler = self.scheduler
        for key, worker in list(scheduler.workers.items()):
            # A busy worker runs the model instead of beating, for as long as the model takes
            # (one holding the GIL included). A local one is lost if its process is stopped; a
            # worker host's, once libzmq's transport heartbeats close its connection (it died
            # or froze) and this send fails. A dead local one is reaped (pidfd).
            silent = now - worker.last_seen
            if silent > deadline and worker.state != WorkerState.RELOADING and not worker.inflight:
                self.lose(key, f"no heartbeat for {silent:.1f}s")
            elif silent > deadline and worker.local and worker.inflight and self.events.stopped(worker):
                self.lose(key, f"no heartbeat for {silent:.1f}s, its process stopped")
            elif recovery.overdue(worker, now, scheduler.request_timeout):
                if worker.local and self.events.stopped(worker):  # stopped from outside: no request's fault
                    self.lose(key, "past --request-timeout, its process stopped")
                else:
                    scheduler.time_out(worker)
            else:
                self.outbox.to_worker(key, [protocol.HEARTBEAT])


def _batching_for(signature: dict[str, Any], policy: BatchPolicy) -> BatchPolicy:
    """``policy`` told how the model's requests stack: along a declared batch axis, or as
    texts; and whether a request's rows or texts may run apart (the model batches them)."""
    declared = models.array_input(signature)
    if declared and declared["shape"][:1] == [None]:  # a batch axis: requests stack along it
        policy.rank = len(declared["shape"])
    policy.text = models.takes_text(signature)
    policy.splits = signature.get("batching") is True
    return policy
