"""The rolling reload: which worker switches generation next, and what clients may still see.

Workers switch one at a time, between two requests, so the pool keeps N-1 workers serving.
While a switch is under way, a client that was answered by the new generation is only served
by workers at least that new (its answers never go back a generation). This object only
decides; the router does the sending.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from ..protocol import messages as protocol
from .registry import WorkerKey, WorkerRecord

log = logging.getLogger(__name__)


class Rollout:
    """The state of moving local workers to the newest validated generation."""

    def __init__(self) -> None:
        self.target = 0
        self.order = b""  # the RELOAD message body: generation, expected file identity, where to open it
        self.switching: WorkerKey | None = None  # the worker switching now
        self.paused = False  # the newest file failed on a worker: wait for the next one
        self.active = False  # from begin() until every local worker is on the target
        self._floor: dict[bytes, int] = {}  # client -> newest generation that answered it

    def begin(self, generation: int, file_identity: list[int], source: str) -> None:
        """Move every local worker to ``generation``: the file with this identity, validated,
        which workers open at ``source``."""
        self.target = generation
        self.order = json.dumps({"generation": generation, "identity": file_identity,
                                 "source": source}).encode()
        self.paused = False
        self.active = True

    def wants(self, worker: WorkerRecord) -> bool:
        """Whether ``worker``, now free, should switch before it takes another request."""
        return (worker.generation < self.target
                and worker.local  # worker hosts watch their own copy of the file
                and self.switching is None
                and not self.paused)

    def started(self, worker: WorkerRecord) -> None:
        self.switching = worker.key

    def forget(self, key: WorkerKey) -> None:
        if self.switching == key:
            self.switching = None

    def finished(self, worker: WorkerRecord, answer: Any) -> str | None:
        """Apply a worker's RELOADED answer; the reason when the target generation failed."""
        self.switching = None
        try:
            outcome = protocol.decode_header(answer)
            ok, ordered, generation = outcome["ok"], outcome["ordered"], outcome["generation"]
            if type(ordered) is not int or type(generation) is not int:
                raise TypeError("generations must be integers")
        except (KeyError, TypeError, protocol.ProtocolError):
            ok, ordered, generation = False, self.target, worker.generation
            outcome = {"error": "malformed RELOADED"}
        if ok is True:
            worker.generation = generation
            return None
        log.warning("worker %d could not switch to generation %d: %s", worker.pid, ordered,
                    outcome.get("error"))
        if ordered != self.target:
            return None
        self.paused = True  # retrying the same file would fail the same way
        return str(outcome.get("error"))

    def complete(self, workers: Iterable[WorkerRecord]) -> bool:
        return all(w.generation >= self.target for w in workers if w.local)

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
