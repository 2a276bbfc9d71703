"""The requests the router holds, waiting (the queue, ``queue.py``) or running, until each is
answered: taking them in, cutting the next batch of a model's work for a worker, and answering
them as their parts are answered, fail or run out of time. It changes no worker: the scheduler
(``scheduler.py``) asks it for work and tells it what workers answered, and what recovery
(``recovery.py``) decided for the parts of a worker that was lost.

Which waiting work shares a message to a worker (``batching.py``): the first, and the work
queued behind it that fits with it (same method, dtype and shape past the batch axis, as many
frames: a batch is sent with one stride), at most ``max_rows`` rows together, for clients that
may see the worker's generation. A request past its deadline is answered instead; one a
quarantine refuses is answered ``worker_failed``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container
from typing import Any

from ..errors import ErrorCode
from ..protocol import messages as protocol
from ..units import MS_PER_SECOND, KiB
from .batching import BatchPolicy
from .quarantine import Quarantine
from .queue import RequestQueue
from .recovery import AfterLoss
from .replies import Replies
from .requests import Part, Request

# libzmq's ZMQ_IN_BATCH_SIZE: a received frame up to this size may point into a shared receive
# buffer of about 18 KiB, which it keeps alive for as long as it lives: a request that waits
# holds a copy of its small frames instead.
SHARED_FRAME_MAX = 8 * KiB
log = logging.getLogger(__name__)

EVICTED = ("the queue is full and this client held the most of it: its newest request gave "
           "way to a client holding less than its share")

Fits = Callable[[Request], bool]  # whether a worker may run (a part of) this request


class Backlog:
    """Requests taken in and not answered yet: ``queue`` holds those waiting."""

    def __init__(self, replies: Replies, queue: RequestQueue, quarantine: Quarantine, local_key: bytes) -> None:
        self.replies = replies
        self.queue = queue
        self.quarantine = quarantine
        self.local_key = local_key  # the HTTP front door's clients begin with it
        self.held = 0

    def add(self, request: Request) -> None:
        """Hold ``request`` at the end of its line, if there is room. Raises ``QueueFull`` when
        it may not wait."""
        self.queue.check_room(request)
        if request.expired(time.monotonic()):  # before evicting: it would take no room
            self.held += 1
            self.expire(request)
            return
        for victim in self.queue.make_room(request):
            self.fail(victim, ErrorCode.OVERLOADED, EVICTED)
        self.held += 1
        request.frames = [bytes(f) if len(f) <= SHARED_FRAME_MAX else f for f in request.frames]
        self.queue.put(request)

    def start(self, request: Request) -> bool:
        """Hold ``request``, which a free worker takes at once, unless the quarantine refuses it
        (then it is answered): whether it may run."""
        self.held += 1
        return not self._refused(request)

    def head(self, model: str, fits: Fits) -> Part | Request | None:
        """The next work of ``model`` a worker may take, answering on the way what waited past
        its deadline or is refused; None when there is none, or the next may not go to it."""
        now = time.monotonic()
        while self.queue.has_work(model):
            item = self.queue.peek(model)
            request = item.request if isinstance(item, Part) else item
            if isinstance(item, Part) and item.stale:
                self.queue.take(model, 0)  # what was left of an answered request
            elif request.expired(now):
                self._drop(model, item)
                self.expire(request)
            elif not request.taken and self._refused(request):
                self._drop(model, item)
            else:
                return item if fits(request) else None
        return None

    def _drop(self, model: str, item: Part | Request) -> None:
        if isinstance(item, Part):
            self.queue.take(model, 0)
        else:
            self.queue.remove(item)

    def _refused(self, request: Request) -> bool:
        """Whether the quarantine refuses ``request`` (then it is answered so)."""
        refusal = self.quarantine.refusal(request.client, request.frames) if self.quarantine else None
        if refusal is not None:
            self.fail(request, ErrorCode.WORKER_FAILED, refusal)
        return refusal is not None

    def take_batch(self, model: str, policy: BatchPolicy, *, batching: bool, fits: Fits) -> tuple[list[Part], int]:
        """The head :meth:`head` gave and the work queued next that fits with it when the
        worker batches: the parts, and their rows."""
        part = self.queue.take(model, policy.max_rows)
        batch, rows = [part], part.rows
        shape, most = part.request.shape, policy.batch_rows
        if shape is None or part.solo or not batching or rows >= most:
            return batch, rows
        frames = len(part.request.frames)
        while rows < most:
            candidate = self.head(model, fits)
            if candidate is None or (isinstance(candidate, Part) and candidate.solo):
                return batch, rows
            request = _request_of(candidate)
            more = candidate.rows if isinstance(candidate, Part) else candidate.next_rows(most - rows)
            if request.shape is None or request.shape.key != shape.key or len(request.frames) != frames \
                    or rows + more > most:
                return batch, rows
            part = self.queue.take(model, most - rows)
            batch.append(part)
            rows += part.rows
        return batch, rows

    def settle(self, decision: AfterLoss, served: Container[str]) -> None:
        """Apply what recovery decided for a lost worker's parts: each to retry is queued again
        before everything else of its model (unless its request was answered or started again
        meanwhile; if its model is no longer ``served``, its request is answered so), each to
        fail answers its request, and a killer is quarantined (a suspect too, when an identical
        request crashed a worker before it)."""
        for part in reversed(decision.retry):
            if part.stale:
                continue
            request = part.request
            if decision.suspect and self.quarantine.suspected(request.client, request.frames, request.model):
                self.fail(request, ErrorCode.WORKER_FAILED, "an identical request crashed a worker before this one did")
            elif part.request.model in served:
                self.queue.put_back(part)
            else:
                self.fail(part.request, ErrorCode.MODEL_NOT_FOUND,
                          f"the model {part.request.model!r} is no longer served")
        for part, code, message in decision.fail:
            if decision.blame:
                self.quarantine.killed(part.request.client, part.request.frames, part.request.model)
            self.fail(part.request, code, message)

    def pinned_waiting(self, model: str, generation: int | None) -> bool:
        """Whether parts of a request pinned to ``generation`` of ``model`` still wait (not those
        left of a request answered or started again)."""
        if generation is None or not self.queue.has_work(model):
            return False
        return any(not (isinstance(item, Part) and item.stale) and _request_of(item).model == model
                   and _request_of(item).generation == generation for item in self.queue.everything())

    def restart_if_stranded(self, model: str, runnable: Fits) -> None:
        """Start again the request in parts at the head of ``model``'s work when no worker may
        run the generation it is pinned to any more (``runnable`` tells): all moved on while it
        waited, or its client has seen a newer one since. It runs again from its first row; what
        ran of it comes back stale."""
        if not self.queue.has_work(model):
            return
        request = _request_of(self.queue.peek(model))
        if request.generation is None or request.done or runnable(request):
            return
        log.info("no worker may run generation %d of %s for a request in parts any more: it starts "
                 "again on the newest", request.generation, model)
        self.queue.remove(request)
        request.restart()
        self.queue.put(request, first=True)

    def answer(self, part: Part, status: bytes, frames: list[Any]) -> None:
        """A worker's reply to ``part``: the request's answer once its last part has one."""
        request = part.request
        if status != b"ok":
            self._answered(request, frames, ErrorCode.read(status))
            return
        try:
            reply = request.answer(part, frames, joined=not request.client.startswith(self.local_key))
        except protocol.ProtocolError as exc:
            self.fail(request, ErrorCode.INTERNAL, f"the request ran in parts whose answers cannot be put "
                      f"together: {exc}")
            return
        if reply is not None:
            self._answered(request, reply, "ok")

    def _answered(self, request: Request, frames: list[Any], outcome: str) -> None:
        request.done = True
        self.held -= 1
        self.queue.remove(request)  # what was left of it waits no more
        self.replies.send(request.client, frames, request.model, outcome, api=request.api, request=request)

    def fail(self, request: Request, code: ErrorCode, message: str) -> None:
        """Answer ``request`` with an error (once: what is left of it is dropped)."""
        if not request.done:
            self._answered(request, protocol.encode_error(request.id, code, message), code)

    def expire(self, request: Request) -> None:
        waited = time.monotonic() - request.received
        self.fail(request, ErrorCode.DEADLINE_EXCEEDED,
                  f"the deadline passed after {waited * MS_PER_SECOND:.0f} ms in the queue")

    def expire_due(self) -> None:
        for item in self.queue.take_expired(time.monotonic()):
            self.expire(_request_of(item))

    def fail_queued(self, code: ErrorCode, message: str, model: str | None = None) -> None:
        """Answer what waits (of ``model``, or of every model) with an error."""
        taken = self.queue.take_all() if model is None else iter(self.queue.take_model(model))
        for item in taken:
            self.fail(_request_of(item), code, message)


def _request_of(item: Part | Request) -> Request:
    return item.request if isinstance(item, Part) else item
