"""The rolling reload of one model: which worker switches to its newest generation next, and
what clients may still see.

Workers switch one at a time, between two requests, so the pool keeps N-1 workers serving the
model (and every worker serving the others). A model added while the pool runs rolls out the
same way, from no generation to its first. While a switch is under way, a client that was
answered by the new generation is only served by workers at least that new (its answers never
go back a generation). This object only decides; the scheduler does the sending.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .outbox import WorkerKey
from .registry import WorkerRecord

log = logging.getLogger(__name__)


class Switch(NamedTuple):
    """What a worker's RELOADED says: the generation of the model it serves now (None: as
    before), whether it stacks that model's requests, and why the target failed (None: it did
    not, or an older order did)."""

    generation: int | None
    batching: bool = False
    failure: str | None = None


class Rollout:
    """The state of moving local workers to ``model``'s newest validated generation; ``limit``:
    the workers that serve it (None: every one)."""

    def __init__(self, model: str, limit: int | None = None) -> None:
        self.model = model
        self.limit = limit
        self.target = 0
        self.order = b""  # the RELOAD message body: the model's spec at its new generation
        self.switching: WorkerKey | None = None  # the worker switching now
        self.paused = False  # the newest file failed on a worker: wait for the next one
        self.active = False  # from begin() until every local worker is on the target
        self._floor: dict[bytes, int] = {}  # client -> newest generation that answered it

    def begin(self, generation: int, order: bytes) -> None:
        """Move every local worker that serves the model (or should) to ``generation``, whose
        RELOAD message is ``order``."""
        self.target = generation
        self.order = order
        self.paused = False
        self.active = True

    def wants(self, worker: WorkerRecord, serving: int) -> bool:
        """Whether ``worker``, now free, should switch before it takes another request;
        ``serving``: the local workers that serve the model now."""
        if not (self.active and worker.local  # worker hosts watch their own copy of the file
                and self.switching is None and not self.paused):
            return False
        have = worker.models.get(self.model)
        if have is None:  # a model new to the pool, or one this worker was started without
            return self.limit is None or serving < self.limit
        return have < self.target

    def started(self, worker: WorkerRecord) -> None:
        self.switching = worker.key

    def forget(self, key: WorkerKey) -> None:
        if self.switching == key:
            self.switching = None

    def finished(self, pid: int, outcome: Mapping[str, Any]) -> Switch:
        """Read the RELOADED answer (decoded) of the worker ``pid`` that was switching."""
        self.switching = None
        ok, ordered, generation = outcome.get("ok"), outcome.get("ordered"), outcome.get("generation")
        if type(ordered) is not int or type(generation) is not int:
            ok, ordered = False, self.target
            outcome = {"error": "malformed RELOADED"}
        if ok is True and type(generation) is int:
            info = outcome.get("info")
            return Switch(generation, isinstance(info, dict) and info.get("batching") is True)
        log.warning("worker %d could not switch %s to generation %d: %s", pid, self.model,
                    ordered, outcome.get("error"))
        if ordered != self.target:
            return Switch(None)
        self.paused = True  # retrying the same file would fail the same way
        return Switch(None, failure=str(outcome.get("error")))

    def complete(self, workers: Iterable[WorkerRecord]) -> bool:
        """Whether every local worker that should serve the model serves the target."""
        local = [w for w in workers if w.local]
        serving = [w for w in local if self.model in w.models]
        wanted = len(local) if self.limit is None else min(self.limit, len(local))
        return len(serving) >= wanted and all(w.models[self.model] >= self.target for w in serving)

    def settle(self, workers: Iterable[WorkerRecord]) -> None:
        """Once every local worker is on the target, clients may be served by any worker."""
        if self.active and self.complete(workers):
            self.active = False
            self._floor.clear()

    def answered(self, client: bytes, generation: int) -> None:
        if self.active:
            self._floor[client] = max(generation, self._floor.get(client, 0))

    def floor(self, client: bytes) -> int:
        """The oldest generation that may still answer ``client``."""
        return self._floor.get(client, 0) if self.active else 0
