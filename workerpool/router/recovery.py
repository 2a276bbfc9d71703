"""Recovery: what becomes of the parts a lost worker, or one that ran out of time, was running.
Rules only: the scheduler asks, and applies the answer.

A part in flight on a worker that dies is retried once on another worker, alone (inference is
idempotent); one that fails twice answers its request ``worker_failed``. The request is a killer
(quarantine.py) only on evidence that it killed the second worker: a local worker's process
that died of itself while running it alone (reaping tells: a crash, an abort, an exit). Losses
with another visible cause blame no request: a SIGKILL (an operator's kill, the OOM killer, a
kill sweep that takes a retry's worker as well as the first), a SIGBUS (a weight file cut short
under the workers that map it), a worker given up by the router (silent, stopped, malformed),
and a worker host's worker whose link closed, which is all the router sees of its host going
away (its workers go at once, a retry's included). A batch that dies tells nothing about which
of its parts is to blame: each is retried alone. Parts a worker never received (the message to
it could not be sent) go to another worker as they were.

A crash is evidence whichever request of identical ones it comes from: a part that crashed its
worker alone is a suspect, and an identical request (the same one retried, or sent again: one
whose deadline passes before its retry runs is sent again) that crashes a worker while
suspected is a killer.

A part that runs past ``--request-timeout`` alone answers its request ``request_timeout`` and
the request is a killer; the parts of a batch that ran out of time are retried alone (none of
them is to blame for the time the others took). Either way the worker is given up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..errors import ErrorCode
from .registry import WorkerRecord
from .requests import Part

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2


@dataclass
class AfterLoss:
    """What to do with a lost worker's parts: retry these (in order, before other work), fail
    those (with the code and message), and whether the failed ones are killers."""

    retry: list[Part] = field(default_factory=list)
    fail: list[tuple[Part, ErrorCode, str]] = field(default_factory=list)
    blame: bool = False
    suspect: bool = False  # the one part to retry crashed its worker alone: a first piece of evidence


def after_loss(worker: WorkerRecord, parts: list[Part], why: str, *, crashed: bool, unsent: bool,
               asked: bool) -> AfterLoss:
    """The fate of ``parts``, which ``worker`` was running when it was lost (``why``);
    ``crashed``: its process died of itself, the one evidence that what it ran killed it."""
    if not parts:
        log.log(logging.DEBUG if asked else logging.INFO, "worker %d %s (%s)", worker.pid,
                "left" if asked else "lost", why, extra={"worker": worker.pid})
        return AfterLoss()
    if unsent:
        log.warning("worker %d lost (%s) before it got %d requests; they go to another worker",
                    worker.pid, why, len(parts), extra={"worker": worker.pid})
        for part in parts:
            part.attempts -= 1
        return AfterLoss(retry=parts)
    if worker.sent > 1:  # a batch, some of it answered maybe: each part left goes alone
        log.warning("worker %d lost (%s) with a batch of %d requests in flight; retrying each alone",
                    worker.pid, why, len(parts))
        for part in parts:
            part.solo = True
        return AfterLoss(retry=parts)
    part = parts[0]
    if part.attempts < MAX_ATTEMPTS:
        log.warning("worker %d lost (%s) with a request in flight; retrying it", worker.pid, why)
        part.solo = True
        return AfterLoss(retry=[part], suspect=crashed)
    log.warning("worker %d lost (%s); its request already failed once", worker.pid, why)
    message = f"worker {worker.pid} failed while running the request, twice"
    return AfterLoss(fail=[(part, ErrorCode.WORKER_FAILED, message)], blame=crashed)


def overdue(worker: WorkerRecord, now: float, request_timeout: float | None) -> bool:
    """Whether what ``worker`` runs has run past ``request_timeout``."""
    return bool(worker.inflight) and request_timeout is not None and now - worker.busy_since > request_timeout


def after_timeout(worker: WorkerRecord, parts: list[Part], limit: str) -> tuple[AfterLoss, str]:
    """The fate of ``parts``, which ``worker`` ran past ``limit``, and why the worker is lost."""
    if worker.sent > 1:  # none of a batch's parts is to blame for the time the others took
        for part in parts:
            part.solo = True
        return AfterLoss(retry=parts), (f"its batch of {worker.sent} requests ran past {limit}; retrying the "
                                        f"{len(parts)} unanswered each alone")
    message = f"the request ran past {limit} on worker {worker.pid}; that worker is being replaced"
    return AfterLoss(fail=[(parts[0], ErrorCode.REQUEST_TIMEOUT, message)], blame=True), f"its request ran past {limit}"
