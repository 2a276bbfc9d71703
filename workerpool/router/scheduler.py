"""The scheduler: the one owner of every worker's state, the free list and what each worker
runs, with a record of each served model (how its requests batch, its rollout). The requests it
hands out wait in the backlog (``backlog.py``, a queue per model). The router's core hands it
events (a worker registered, answered, switched, was lost; a request was admitted; time passed)
and it decides; what it sends goes to the outbox. Recovery (``recovery.py``), which worker may
take which request (``eligible.py``) and each model's rollout (``rollout.py``) are rules it asks:
they change no worker themselves.

What a worker that has nothing in flight is sent:

1. STOP when it is stopping; a RELOAD dropping a model no longer served; a RELOAD of a model
   whose rollout wants it (unless parts pinned to its generation of that model still wait).
2. Otherwise it joins the free list (the most recently freed last; one whose last answer
   failed first, so a broken worker does not draw every request) and takes work: of the models
   it serves that have work waiting, the one that has had the least of the workers' time
   (``fair_share.py``): a model flooded with requests cannot starve another. Within a model,
   retried parts go first, then the clients' lines in turn, each oldest first; the work queued
   behind the first that fits with it goes in the same message, at most ``--max-batch`` rows.
   Batches never mix models.

A request goes to the most recently freed worker that may take it: while fewer requests run
than there are workers, the same few serve them with their caches warm, and the idle ones stay
asleep (waking an idle CPU costs more than the request, on a virtual machine most of all).
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..control.status import WorkerState
from ..errors import ErrorCode
from ..protocol import messages as protocol
from . import eligible, recovery
from .backlog import Backlog
from .batching import BatchPolicy
from .fair_share import FairShare
from .outbox import WorkerKey
from .registry import WorkerRecord
from .requests import Part, Request, message_for
from .rollout import Rollout
from .stats import RouterStats

log = logging.getLogger(__name__)


class SchedulerEvents(Protocol):
    """What the scheduler's owner hears about workers."""

    def worker_lost(self, worker: WorkerRecord, why: str) -> None: ...

    def reload_failed(self, worker: WorkerRecord, model: str, why: str) -> None:
        """``worker`` could not switch ``model`` to its newest generation: the file fails there too."""

    def models_changed(self, worker: WorkerRecord) -> None:
        """``worker`` answered a RELOAD (it switched, loaded or dropped a model, or failed to):
        ``worker.models`` says what it serves now."""


@dataclass(eq=False)
class ModelRecord:
    """What the scheduler keeps of one served model: its signature, how its requests batch,
    and its rollout."""

    name: str
    signature: dict[str, Any]
    policy: BatchPolicy
    rollout: Rollout


class Scheduler:
    """Every worker's state; see the module."""

    def __init__(self, backlog: Backlog, stats: RouterStats, *, events: SchedulerEvents,
                 request_timeout: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.backlog = backlog
        self.outbox = backlog.replies.outbox
        self.stats = stats
        self.events = events
        self.request_timeout = request_timeout
        self.workers: dict[WorkerKey, WorkerRecord] = {}
        self.models: dict[str, ModelRecord] = {}
        self.shares = FairShare()
        self.free: deque[WorkerKey] = deque()
        self.running_here: set[WorkerKey] = set()  # local workers with requests in flight
        self.dropping: dict[WorkerKey, str] = {}  # workers told to drop a model no longer served
        self.wake_at: float | None = None  # when a request held for a batch is due to be released
        self.clock = clock

    # Models.

    def add_model(self, name: str, signature: dict[str, Any], policy: BatchPolicy,
                  limit: int | None = None) -> None:
        """Serve ``name``. A worker that still holds a model of that name removed before (it was
        busy) holds other weights: it lets go of them first, and loads these if the rollout
        wants it to, as one that never had it does."""
        for worker in self.workers.values():
            if worker.models.pop(name, None) is not None and worker.local:
                worker.stale.add(name)
        self.models[name] = ModelRecord(name, signature, policy, Rollout(name, limit))
        self.shares.add(name)
        self.stats.of(name)

    def remove_model(self, name: str) -> None:
        """Stop serving ``name``: what waits for it is answered, what runs finishes, and each
        local worker is told to drop it once free (one switching it now, once it has)."""
        switching = self.models[name].rollout.switching
        if switching is not None:
            self.dropping[switching] = name
        del self.models[name]
        self.shares.remove(name)
        self.backlog.fail_queued(ErrorCode.MODEL_NOT_FOUND, f"the model {name!r} is no longer served", name)
        self._free_again(lambda worker: worker.local and name in worker.models)

    def begin_rollout(self, model: str, generation: int, order: bytes) -> None:
        """Move the local workers that serve ``model`` (or should) to ``generation``."""
        self.models[model].rollout.begin(generation, order)
        self.backlog.quarantine.clear(model)
        self.reload_next()

    # Workers.

    def register(self, worker: WorkerRecord) -> None:
        self.workers[worker.key] = worker
        self.worker_free(worker)

    def worker_free(self, worker: WorkerRecord) -> None:
        """``worker`` has nothing in flight: stop it, have it drop or switch a model, or give
        it work."""
        key = worker.key
        if worker.state == WorkerState.STOPPING:
            self.outbox.to_worker(key, [protocol.STOP])
            return
        unserved = [name for name in worker.models if name not in self.models] + sorted(worker.stale) \
            if worker.local else []
        if unserved:
            self.dropping[key] = unserved[0]
            worker.state = WorkerState.RELOADING
            self.outbox.to_worker(key, [protocol.RELOAD, protocol.encode_header({"remove": unserved[0]})])
            return
        rollout = self._rollout_wanting(worker)
        if rollout is not None:
            self.outbox.to_worker(key, [protocol.RELOAD, rollout.order])
            worker.state = WorkerState.RELOADING
            rollout.started(worker)
            return
        worker.state = WorkerState.READY
        (self.free.appendleft if worker.failed_last else self.free.append)(key)
        for model in self.models.values():
            model.rollout.settle(self.workers.values())
        self.dispatch()

    def _rollout_wanting(self, worker: WorkerRecord) -> Rollout | None:
        return eligible.rollout_wanting(worker, [model.rollout for model in self.models.values()],
                                        self.workers.values(), self.backlog.pinned_waiting)

    def reload_next(self) -> None:
        """Start the next switch of each rollout on a free worker, if one is wanted."""
        self._free_again(lambda worker: self._rollout_wanting(worker) is not None)

    def _free_again(self, wanted: Callable[[WorkerRecord], bool]) -> None:
        """Take the free workers ``wanted`` picks (asked as each comes) out of the free list and
        free them again: :meth:`worker_free` tells each what it is wanted for."""
        for key in list(self.free):
            worker = self.workers[key]
            if wanted(worker):
                self.free.remove(key)
                self.worker_free(worker)

    def reloaded(self, worker: WorkerRecord, answer: Any) -> None:
        """``worker``'s RELOADED: it switched (or failed to switch) a model, or dropped one."""
        try:
            outcome = protocol.decode_header(answer)
        except protocol.ProtocolError:
            outcome = {}
        dropped = self.dropping.pop(worker.key, None)
        switched = next((model for model in self.models.values() if model.rollout.switching == worker.key), None)
        if dropped is not None and outcome.get("removed") is True:
            worker.models.pop(dropped, None)
            worker.stale.discard(dropped)
        elif dropped is not None:  # it was switching the model when it was removed: it drops it next
            if outcome.get("ok") is True:
                worker.models[dropped] = 0
        elif switched is not None:
            switch = switched.rollout.finished(worker.pid, outcome)
            if switch.generation is not None:
                worker.models[switched.name] = switch.generation
                worker.batching[switched.name] = switch.batching
            if switch.failure is not None:
                self.events.reload_failed(worker, switched.name, switch.failure)
        else:
            log.warning("unexpected RELOADED from worker %d ignored", worker.pid)
            return
        self.events.models_changed(worker)
        self.worker_free(worker)
        self.reload_next()

    def stop_worker(self, key: WorkerKey) -> None:
        """Ask a worker to exit once what it runs is done."""
        worker = self.workers[key]
        worker.state = WorkerState.STOPPING
        if key in self.free:
            self.free.remove(key)
        switching = key in self.dropping or any(model.rollout.switching == key for model in self.models.values())
        if not worker.inflight and not switching:
            self.worker_free(worker)

    def lose(self, key: WorkerKey, why: str, *, asked: bool = False, crashed: bool = False,
             unsent: bool = False) -> None:
        """Forget a worker: its parts are retried or answered (``recovery.py``). ``asked``: it
        left because it was told to (the supervisor logs that, not a loss); ``crashed``: its
        process died of itself (not SIGKILLed), the one loss that blames a request; ``unsent``:
        the message that failed to reach it handed it what it holds. Those, like messages still
        waiting in the outbox to be sent to it, never ran there."""
        worker = self.workers.pop(key, None)
        if worker is None:
            return
        asked = asked or worker.state == WorkerState.STOPPING  # gone between its BYE and our STOP
        if key in self.free:
            self.free.remove(key)
        self.dropping.pop(key, None)
        for model in self.models.values():
            model.rollout.forget(key)
        unsent = self.outbox.withdraw(key) or unsent
        self.backlog.settle(recovery.after_loss(worker, self.take_inflight(worker), why, crashed=crashed,
                                                unsent=unsent, asked=asked), self.models)
        self.events.worker_lost(worker, why)
        self.reload_next()
        self.dispatch()

    def take_inflight(self, worker: WorkerRecord) -> list[Part]:
        """What ``worker`` was running, now no longer its to answer."""
        parts, worker.inflight = worker.inflight, []
        self.running_here.discard(worker.key)
        return parts

    def time_out(self, worker: WorkerRecord) -> None:
        """What ``worker`` runs ran past ``--request-timeout``: its parts are answered or
        retried (``recovery.py``), and the worker is given up (a local one is killed)."""
        decision, why = recovery.after_timeout(worker, self.take_inflight(worker),
                                               f"--request-timeout {self.request_timeout:g}s")
        self.backlog.settle(decision, self.models)
        self.lose(worker.key, why)

    # Requests.

    def add(self, request: Request) -> None:
        """Take in an admitted request: when none of its model's work waits, straight to the
        free worker freed last that may take it (never queued, so a deadline of 0 is met), else
        into the queue if there is room there. Raises ``QueueFull`` when there is none."""
        model, idle = self.models[request.model], not self.backlog.queue.has_work(request.model)
        if idle and len(self.models) > 1:
            busy = {worker.running for worker in self.workers.values() if worker.inflight}
            if model.name not in busy:
                self.shares.rejoin(model.name, busy.union(self.backlog.queue.waiting_models()))
        worker = None if request.split or not idle else next(
            (self.workers[key] for key in reversed(self.free) if self._may_start(self.workers[key], model, request)), None)
        if worker is None:
            self.backlog.add(request)
            self.dispatch()
        elif self.backlog.start(request):
            self._hand(worker, model, [request.take(model.policy.max_rows)], request.rows)

    def replied(self, worker: WorkerRecord, client: bytes, status: bytes, frames: list[Any]) -> None:
        """A worker's reply to the first part it holds."""
        inflight = worker.inflight
        if not inflight or inflight[0].request.client != client:  # already answered, e.g. shutting down
            log.debug("late reply from worker %d dropped", worker.pid)
            return
        part = inflight.pop(0)
        worker.answered(part.rows, ok=status == b"ok")
        now = self.clock()
        self.stats.of(worker.running).run_times.observe(now - worker.busy_since)
        if not part.stale:
            model = self.models.get(part.request.model)
            if model is not None:
                model.rollout.answered(client, worker.models.get(model.name, 0))
            self.backlog.answer(part, status, frames)
        if not inflight:
            self._finished(worker, now)

    def _finished(self, worker: WorkerRecord, now: float) -> None:
        """``worker`` answered the last part of what it was sent: it is free again, its model is
        counted the time it took and the rows it ran (never the rows requests claim), and a
        batch's run time teaches the batching policy how long a row takes."""
        self.shares.finished(worker.running, worker.charged, now - worker.busy_since)
        self.stats.of(worker.running).ran(ran := worker.finished())
        if worker.key in self.running_here:
            self.running_here.discard(worker.key)
            if worker.batchable and ran and (model := self.models.get(worker.running)) is not None:
                model.policy.finished(now - worker.busy_since, ran)
        self.worker_free(worker)

    def tick(self, now: float) -> None:
        """Time passed: answer what waited past its deadline, release requests held for a batch,
        start a switch a rollout waited for (the parts pinned to a worker's generation are gone)."""
        self.backlog.expire_due()
        if self.wake_at is not None and now >= self.wake_at:
            self.wake_at = None
            self.dispatch()
        if any(model.rollout.active for model in self.models.values()):
            self.reload_next()

    def fail_all(self, code: ErrorCode, message: str) -> None:
        """Answer every queued and running request with an error (end of a forced shutdown)."""
        self.backlog.fail_queued(code, message)
        for worker in self.workers.values():
            for part in self.take_inflight(worker):
                self.backlog.fail(part.request, code, message)

    # Dispatch.

    def dispatch(self) -> None:
        """Hand waiting work to free workers while both last."""
        while self.free and len(self.backlog.queue):
            if not any(self._give_work(self.workers[key]) for key in reversed(self.free)):
                return

    def _give_work(self, worker: WorkerRecord) -> bool:
        """Send ``worker`` the next work of the models it serves, the one that has had the least
        of the workers' time first; whether it got any."""
        waiting = self.shares.order(name for name in self.backlog.queue.waiting_models()
                                    if name in worker.models and name in self.models)
        for model in map(self.models.__getitem__, waiting):
            self.backlog.restart_if_stranded(model.name, functools.partial(
                eligible.pinned_runnable, self.workers.values(), model.rollout))
            if self.backlog.head(model.name, functools.partial(self._may_start, worker, model)):
                self._send(worker, model)
                return True
        return False

    def _may_start(self, worker: WorkerRecord, model: ModelRecord, request: Request) -> bool:
        """Whether ``worker`` may take ``request`` now: it serves a generation the request may
        see, and it is not held back for a batch to form (then when to look again is noted)."""
        if not eligible.may_run(worker, model.rollout, request, self.workers.values()):
            return False
        if not (worker.local and worker.batching.get(model.name)):
            return True
        until = eligible.hold_until(model.policy, request, self.backlog.queue.depth(model.name),
                                    len(self.running_here), self.clock())
        if until is None:
            return True
        self.wake_at = until if self.wake_at is None else min(self.wake_at, until)
        return False

    def _send(self, worker: WorkerRecord, model: ModelRecord) -> None:
        """Hand ``worker`` the head of ``model``'s work and what fits with it, as one message."""
        batch, rows = self.backlog.take_batch(
            model.name, model.policy, batching=worker.batching.get(model.name, False),
            fits=lambda request: eligible.may_run(worker, model.rollout, request, self.workers.values()))
        self._hand(worker, model, batch, rows)

    def _hand(self, worker: WorkerRecord, model: ModelRecord, batch: list[Part], rows: int) -> None:
        """Send ``worker`` the parts of ``batch`` (``rows`` rows) as one message."""
        generation = worker.models[model.name]
        for part in batch:
            if part.request.split and part.request.generation is None:
                part.request.generation = generation
            part.attempts += 1
        self.outbox.to_worker(worker.key, message_for(model.name, batch))
        shape = batch[0].request.shape
        worker.took(model.name, batch, batchable=shape is not None and rows <= model.policy.max_rows,
                    now=self.clock())
        worker.charged = self.shares.charge(model.name)
        self.stats.of(model.name).handed([worker.busy_since - part.request.received for part in batch])
        self.free.remove(worker.key)
        if worker.local:
            self.running_here.add(worker.key)
        log.debug("worker %d: %s, %d parts, %d rows", worker.pid, model.name, len(batch), rows)
