"""Recovery: what becomes of the requests of a worker that is lost or runs out of time.

A request in flight on a worker that dies is retried once on another worker, alone (inference
is idempotent); one that fails twice is answered ``worker_failed``. One that runs past
``request_timeout`` is answered ``request_timeout`` and its worker given up. A batch that dies
or runs out of time tells nothing about which of its requests is to blame: each is retried
alone. What killed workers is remembered by the quarantine (quarantine.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..control.status import WorkerState
from ..errors import ErrorCode
from .dispatch import Dispatcher
from .intake import Intake, Pending
from .quarantine import Quarantine
from .registry import WorkerKey, WorkerRecord
from .rollout import Rollout

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2


@dataclass(eq=False)
class Recovery:
    """Forgets lost workers and retries, refuses or answers what they were running."""

    workers: dict[WorkerKey, WorkerRecord]  # the router's registry: a lost worker leaves it here
    intake: Intake
    dispatcher: Dispatcher
    rollout: Rollout
    quarantine: Quarantine
    lost: Callable[[WorkerRecord, str], None]
    request_timeout: float | None = None

    def lose(self, key: WorkerKey, why: str, *, asked: bool = False, killed: bool = False,
             unsent: bool = False) -> None:
        """Forget a worker; retry its requests once elsewhere, else answer ``worker_failed``.
        ``asked``: it left because it was told to (the supervisor logs that, not a loss);
        ``killed``: by SIGKILL, which blames no request; ``unsent``: the message that failed to
        reach it handed it its requests. Those, like requests still waiting in the outbox to be
        sent to it, never ran there: they go to another worker as they were, counting no
        attempt."""
        worker = self.workers.pop(key, None)
        if worker is None:
            return
        asked = asked or worker.state == WorkerState.STOPPING  # gone between its BYE and our STOP
        self.dispatcher.withdraw(key)
        self.rollout.forget(key)
        unsent = self.intake.outbox.withdraw(key) or unsent
        inflight = self.take_inflight(worker)
        if inflight and unsent:
            log.warning("worker %d lost (%s) before it got %d requests; they go to another worker",
                        worker.pid, why, len(inflight), extra={"worker": worker.pid})
            for pending in reversed(inflight):
                pending.attempts -= 1
                self.intake.enqueue(pending, first=True)
        elif inflight:
            self._recover(worker, why, inflight, killed)
        else:
            log.log(logging.DEBUG if asked else logging.INFO, "worker %d %s (%s)", worker.pid,
                    "left" if asked else "lost", why, extra={"worker": worker.pid})
        self.lost(worker, why)
        self.dispatcher.reload_next()

    def _recover(self, worker: WorkerRecord, why: str, inflight: list[Pending], killed: bool) -> None:
        """Retry alone, or fail, what the lost ``worker`` was running. Only a request that
        kills again when it runs alone is blamed, and never by a SIGKILL: deaths come from
        outside too, and a kill sweep takes a retry's worker as well as the first."""
        pending = inflight[0]
        if worker.sent > 1:  # a batch, some of it answered maybe: each request left goes alone
            log.warning("worker %d lost (%s) with a batch of %d requests in flight; retrying each "
                        "alone", worker.pid, why, len(inflight))
            self._retry_alone(inflight)
        elif pending.attempts < MAX_ATTEMPTS:
            log.warning("worker %d lost (%s) with a request in flight; retrying it", worker.pid, why)
            self._retry_alone(inflight)
        else:
            log.warning("worker %d lost (%s); its request already failed once", worker.pid, why)
            if not killed:
                self.quarantine.killed(pending.client, pending.frames)
            self.intake.fail(pending, ErrorCode.WORKER_FAILED,
                              f"worker {worker.pid} failed while running the request, twice")

    def take_inflight(self, worker: WorkerRecord) -> list[Pending]:
        """What ``worker`` was running, now no longer its to answer."""
        inflight, worker.inflight = worker.inflight, []
        self.dispatcher.stopped_running(worker.key)
        return inflight

    def _retry_alone(self, batch: list[Pending]) -> None:
        """Queue ``batch`` again before everything else, each request to go alone: a request in
        a batch that failed is no more to blame than its batch-mates until it fails alone."""
        for pending in reversed(batch):
            pending.solo = True
            self.intake.enqueue(pending, first=True)

    def worker_exited(self, token: str, why: str, *, asked: bool = False, killed: bool = False) -> None:
        """A local worker process exited (its supervisor, which gave it ``token``, reaped it);
        ``asked``: it had been told to stop; ``killed``: by SIGKILL, which blames no request."""
        for key, worker in list(self.workers.items()):
            if worker.local and worker.token == token:
                self.lose(key, why, asked=asked, killed=killed)
        self.dispatcher.drain()

    def overdue(self, worker: WorkerRecord, now: float) -> bool:
        """Whether what ``worker`` runs has run past ``request_timeout``."""
        return bool(worker.inflight) and self.request_timeout is not None \
            and now - worker.busy_since > self.request_timeout

    def time_out(self, worker: WorkerRecord) -> None:
        """Answer a request that ran too long and give up its worker (a local one is killed);
        the requests of a batch that ran too long are retried alone."""
        inflight = self.take_inflight(worker)
        limit = f"--request-timeout {self.request_timeout:g}s"
        if worker.sent > 1:  # none of a batch's requests is to blame for the time the others took
            self._retry_alone(inflight)
            self.lose(worker.key, f"its batch of {worker.sent} requests ran past {limit}; retrying the "
                      f"{len(inflight)} unanswered each alone")
            return
        pending = inflight[0]
        self.quarantine.killed(pending.client, pending.frames)
        self.intake.fail(pending, ErrorCode.REQUEST_TIMEOUT, f"the request ran past {limit} on worker "
                          f"{worker.pid}; that worker is being replaced")
        self.lose(worker.key, f"its request ran past {limit}")

    def fail_all(self, code: ErrorCode, message: str) -> None:
        """Answer every queued and in-flight request with an error (end of a forced shutdown)."""
        self.intake.fail_queued(code, message)
        for worker in self.workers.values():
            for pending in self.take_inflight(worker):
                self.intake.fail(pending, code, message)
