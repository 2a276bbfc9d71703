"""Which worker may take which request: rules the scheduler asks before it hands out work.
They read the workers and a model's rollout and batching, and change nothing.

- A worker serves the model, at a generation the request may see: during a rollout, no older
  than its client has already seen; the generation a request in parts is pinned to; the newest,
  for a request in parts that starts while a rollout is under way and a worker serves it.
- A local worker that batches is held back for company (``batching.py``): only for a request
  that could share a pass, never past its deadline.
- A free worker switches a model first when that model's rollout wants it, unless parts of a
  request pinned to its generation of the model still wait (they need it as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from ..control.status import WorkerState
from .batching import BatchPolicy
from .registry import WorkerRecord
from .requests import Request
from .rollout import Rollout


def may_run(worker: WorkerRecord, rollout: Rollout, request: Request, workers: Iterable[WorkerRecord]) -> bool:
    """Whether ``worker`` serves a generation of ``rollout``'s model that ``request`` may see."""
    model = rollout.model
    have = worker.models.get(model)
    if have is None or have < rollout.floor(request.client):
        return False
    if request.generation is not None:
        return have == request.generation
    return not (request.split and rollout.active and have < rollout.target
                and generation_left(workers, model, rollout.target))


def pinned_runnable(workers: Iterable[WorkerRecord], rollout: Rollout, request: Request) -> bool:
    """Whether a worker may still run the generation ``request`` (in parts) is pinned to: one
    that is not stopping serves it, and its client has seen no newer one since."""
    assert request.generation is not None
    return request.generation >= rollout.floor(request.client) \
        and generation_left(workers, rollout.model, request.generation)


def generation_left(workers: Iterable[WorkerRecord], model: str, generation: int) -> bool:
    """Whether a worker that is not stopping serves ``generation`` of ``model``."""
    return any(w.models.get(model) == generation and w.state != WorkerState.STOPPING for w in workers)


def serving(workers: Iterable[WorkerRecord], model: str) -> int:
    """The local workers that serve ``model`` and are not stopping."""
    return sum(1 for w in workers if w.local and model in w.models and w.state != WorkerState.STOPPING)


def hold_until(policy: BatchPolicy, request: Request, queued: int, running: int, now: float) -> float | None:
    """Until when local batching workers wait for company before taking ``request``, with
    ``queued`` requests of its model waiting and ``running`` local workers busy; None: no wait."""
    if not policy.on or request.split:
        return None
    until = policy.hold_until(request.received, queued, running)
    if until is None or now >= until or request.shape is None or request.shape.rows >= policy.max_rows:
        return None
    if request.expires is not None and request.expires <= until:
        return None
    return until


def rollout_wanting(worker: WorkerRecord, rollouts: Iterable[Rollout], workers: Collection[WorkerRecord],
                    pinned_waiting: Callable[[str, int | None], bool]) -> Rollout | None:
    """The rollout that wants ``worker``, now free, to switch its model, if one does;
    ``pinned_waiting(model, generation)``: whether parts pinned to that generation wait."""
    for rollout in rollouts:
        if rollout.active and rollout.wants(worker, serving(workers, rollout.model)) \
                and not pinned_waiting(rollout.model, worker.models.get(rollout.model)):
            return rollout
    return None
