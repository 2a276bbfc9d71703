"""What the router tells the pool about its workers (``router.core.RouterEvents``): which
registered worker is which process, and what follows for that process.

A registered local worker is known by the token it was started with, never by the pid it
reports, so no peer can make the supervisor signal a process.
"""

from __future__ import annotations

import logging

from ..linux import procfs
from ..router.registry import WorkerRecord
from ..supervisor.process import Child
from ..supervisor.role import Pool

log = logging.getLogger(__name__)


class WorkerEvents:
    """The serve role's ear for the router: it needs only the pool, so the router can be made
    before the role."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.switch_failures: dict[str, str] = {}  # by model: why a worker could not switch to its newest weights

    def _local_child(self, worker: WorkerRecord) -> Child | None:
        """The process behind a registered worker."""
        return self._child_with(worker.token) if worker.local else None

    def _child_with(self, token: str | None) -> Child | None:
        if token is None:
            return None
        return next((c for c in self.pool.children.values() if c.token == token), None)

    def started_here(self, token: str | None) -> bool:
        return self._child_with(token) is not None or token in self.pool.starter.tokens()

    def stopped(self, worker: WorkerRecord) -> bool:
        child = self._local_child(worker)
        return child is not None and procfs.stopped(child.pid)

    def worker_ready(self, worker: WorkerRecord) -> None:
        child = self._local_child(worker)
        if child is not None:
            self.pool.child_ready(child)

    def worker_lost(self, worker: WorkerRecord, why: str) -> None:
        child = self._local_child(worker)
        # One told to stop is on its way out: the supervisor kills it if it overstays.
        if child is not None and child.alive() and not child.stopping:
            log.warning("killing worker %d: %s", worker.pid, why)
            child.kill()

    def models_changed(self, worker: WorkerRecord) -> None:
        """What a worker serves decides which models its replacement maps (``--workers
        NAME=N``) and whether it is behind."""
        child = self._local_child(worker)
        if child is not None:
            child.generations = dict(worker.models)

    def reload_failed(self, worker: WorkerRecord, model: str, why: str) -> None:
        generation = self.pool.models[model].current.generation if model in self.pool.models else 0
        self.switch_failures[model] = f"worker {worker.pid} could not switch {model} to generation {generation}: {why}"
