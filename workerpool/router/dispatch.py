"""Dispatch: the free workers, and what each is sent once it is free.

A worker that becomes free is sent STOP if it is stopping, RELOAD if the rolling reload wants
it next (rollout.py), or else joins the free list and takes the next queued request, with the
compatible ones queued behind it as one batch (batching.py). A request goes to the most
recently freed worker that may answer its client; local workers may be held back for a batch
to form. This is the only code that edits the free list. What it sends goes to the outbox: a
send that fails later is the loss of that worker (recovery.py), not something to handle here.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from ..errors import ErrorCode
from ..protocol import messages as protocol
from .batching import BatchPolicy, BatchShape
from .intake import Intake, Pending
from .quarantine import Quarantine
from .registry import WorkerKey, WorkerRecord, WorkerState
from .rollout import Rollout
from .stats import RouterStats

log = logging.getLogger(__name__)


class Dispatcher:
    """Keeps the free list and hands queued requests, batched, to free workers."""

    def __init__(self, workers: dict[WorkerKey, WorkerRecord], intake: Intake, *,
                 batching: BatchPolicy, rollout: Rollout, quarantine: Quarantine,
                 stats: RouterStats) -> None:
        self._outbox = intake.outbox
        self.batching = batching
        self.wake_at: float | None = None  # when a held request is due to be released
        self._workers = workers  # the router's registry, read here, never changed
        self._intake = intake
        self._queue = intake.queue
        self._rollout = rollout
        self._quarantine = quarantine
        self._stats = stats
        self._free: deque[WorkerKey] = deque()
        self._running_here: set[WorkerKey] = set()  # local workers with requests in flight

    # What a free worker is sent.

    def worker_free(self, worker: WorkerRecord) -> None:
        """``worker`` has nothing in flight: stop it, reload it, or give it requests."""
        if worker.state == WorkerState.STOPPING:
            self._outbox.to_worker(worker.key, [protocol.STOP])
            return
        if self._rollout.wants(worker):
            self._send_reload(worker)
            return
        worker.state = WorkerState.READY
        if worker.failed_last:  # else a worker that fails fast would be the one always freed last
            self._free.appendleft(worker.key)
        else:
            self._free.append(worker.key)
        self._rollout.settle(self._workers.values())
        self.drain()

    def finished(self, worker: WorkerRecord, now: float) -> None:
        """``worker`` answered the last request of what it was sent: it is free again, and a
        batch's run time teaches the batching policy how long a run takes."""
        if worker.key in self._running_here:
            self._running_here.discard(worker.key)
            if worker.batchable:
                self.batching.finished(now - worker.busy_since)
        self.worker_free(worker)

    def stopped_running(self, key: WorkerKey) -> None:
        """What ``key`` ran was taken from it (it was lost or ran out of time)."""
        self._running_here.discard(key)

    def withdraw(self, key: WorkerKey) -> None:
        """``key`` takes no more requests: it is lost, or told to stop."""
        if key in self._free:
            self._free.remove(key)

    def reload_next(self) -> None:
        """Start the rolling reload's next switch on a free worker, if one is wanted."""
        for key in list(self._free):
            worker = self._workers.get(key)
            if worker is not None and worker.state == WorkerState.READY and self._rollout.wants(worker):
                self._free.remove(key)
                self._send_reload(worker)
                return

    def _send_reload(self, worker: WorkerRecord) -> None:
        self._outbox.to_worker(worker.key, [protocol.RELOAD, self._rollout.order])
        worker.state = WorkerState.RELOADING
        self._rollout.started(worker)

    # Requests to free workers.

    def wake(self, now: float) -> None:
        """Release held requests once they are due."""
        if self.wake_at is not None and now >= self.wake_at:
            self.wake_at = None
            self.drain()

    def drain(self) -> None:
        """Hand queued requests to free workers while both last."""
        while self._free and self._queue:
            pending = self._queue.take()
            if pending.expired(time.monotonic()):
                self._intake.expire(pending)
            elif not self.dispatch(pending):  # no worker may take it now
                self._queue.put(pending, first=True)
                break

    def dispatch(self, pending: Pending) -> bool:
        """Hand a request, with the compatible ones queued behind it, to the most recently
        freed worker that may answer its client; True when it is handled (sent, or refused as a
        known killer), False when no worker may take it now. Local workers may be held back for
        a batch to form (batching.py).

        Most recently freed: while fewer requests run than there are workers, the same few
        serve them with their caches warm, and the idle ones stay asleep (waking an idle CPU
        costs more than the request, on a virtual machine most of all). Under load no worker
        waits, and the order makes no difference. A worker whose last answer was an error is
        freed to the back of the list, so a broken worker does not draw every request."""
        if self._quarantine:
            refusal = self._quarantine.refusal(pending.client, pending.frames)
            if refusal is not None:
                self._intake.fail(pending, ErrorCode.WORKER_FAILED, refusal)
                return True
        floor = self._rollout.floor(pending.client)
        held = self._held(pending)
        passed_over: list[WorkerKey] = []
        try:
            while self._free:
                worker = self._workers.get(self._free.pop())
                if worker is None or worker.state != WorkerState.READY:
                    continue
                if worker.generation < floor or (held and worker.local and worker.batching):
                    passed_over.append(worker.key)
                    continue
                self._send_batch(worker, pending)
                return True
            return False
        finally:
            self._free.extend(reversed(passed_over))  # back in their places, for the next request

    def _held(self, pending: Pending) -> bool:
        """Whether local batching workers wait for company before taking ``pending`` (and then
        when to look again): only a request that could share a pass, never past its deadline."""
        if not self.batching.on or pending.solo:
            return False
        until = self.batching.hold_until(pending.received, len(self._queue), len(self._running_here))
        if until is None or time.monotonic() >= until:
            return False
        shape = self._shape(pending)
        if shape is None or shape.rows >= self.batching.max_rows:
            return False
        if pending.expires is not None and pending.expires <= until:
            return False
        self.wake_at = until if self.wake_at is None else min(self.wake_at, until)
        return True

    def _send_batch(self, worker: WorkerRecord, first: Pending) -> None:
        batch, rows = self._gather(worker, first)
        if len(batch) == 1:
            self._outbox.to_worker(worker.key, [protocol.REQUEST, first.client, *first.frames])
        else:  # every request of a batch has as many frames as the first
            stride = str(1 + len(first.frames)).encode()
            self._outbox.to_worker(worker.key, [protocol.BATCH, stride,
                                                *(f for p in batch for f in (p.client, *p.frames))])
        worker.took(batch, rows, batchable=self._shape(first) is not None and rows <= self.batching.max_rows)
        self._stats.batch_rows.observe(rows)
        for pending in batch:
            pending.attempts += 1
            self._stats.queue_waits.observe(worker.busy_since - pending.received)
        if worker.local:
            self._running_here.add(worker.key)
        log.debug("worker %d: batch of %d requests, %d rows", worker.pid, len(batch), rows)

    def _gather(self, worker: WorkerRecord, first: Pending) -> tuple[list[Pending], int]:
        """``first`` and the requests queued next that fit with it, and their rows: same
        method, dtype and shape past the batch axis and as many frames (a batch is sent with one
        stride), at most ``max_rows`` rows together, for clients that may see the worker's
        generation. A request past its deadline is answered."""
        shape = self._shape(first)
        rows = 1 if shape is None else shape.rows
        batch = [first]
        policy = self.batching
        if shape is None or first.solo or not worker.batching or rows >= policy.max_rows:
            return batch, rows
        now = time.monotonic()
        while self._queue:
            candidate = self._queue.peek()
            if candidate.expired(now):
                self._intake.expire(self._queue.take())
                continue
            fits = self._shape(candidate)
            if candidate.solo or fits is None or fits.key != shape.key \
                    or len(candidate.frames) != len(first.frames) \
                    or rows + fits.rows > policy.max_rows \
                    or self._rollout.floor(candidate.client) > worker.generation:
                break
            self._queue.take()
            refusal = self._quarantine.refusal(candidate.client, candidate.frames) if self._quarantine else None
            if refusal is not None:
                self._intake.fail(candidate, ErrorCode.WORKER_FAILED, refusal)
                continue
            batch.append(candidate)
            rows += fits.rows
        return batch, rows

    def _shape(self, pending: Pending) -> BatchShape | None:
        """How ``pending`` batches (read once); None for a request that goes alone."""
        if not pending.shaped:
            pending.shaped = True
            pending.shape = self.batching.shape_of(pending.route, len(pending.frames))
        return pending.shape
