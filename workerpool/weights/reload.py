"""Which weights the pool should serve: the served file's identity, validation of new versions.

A new version is published by renaming a complete file over the served path, which gives it a
new inode. The supervisor polls the path's identity; a change is validated (the file in full,
and the served model built on it with the same input and output) before any worker sees it.
Only then does it become the next generation.

The supervisor keeps each generation's file open, and workers open it through that descriptor
(``Weights.source``), never by the path: a worker started after a refused file was renamed over
the path still maps the weights the pool serves, so a refused publish costs no capacity.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from .. import burnpack, models
from ..config.pool import DEFAULT_LOAD
from ..models.loaded import LoadedModel

log = logging.getLogger(__name__)


HOLD_ATTEMPTS = 3  # validations at start when the path keeps being replaced meanwhile
QUIET_TRIGGERS = ("watch", "worker exit")  # a file already refused is not refused again for these


class WeightsRefused(Exception):
    """A weight file is malformed or does not fit the served model."""


@dataclass(frozen=True)
class Weights:
    """A validated weight file: what the workers of one generation map."""

    generation: int
    identity: burnpack.FileIdentity
    model: str
    signature: dict[str, Any]
    source: str  # where workers open it: the supervisor's descriptor of it, under /proc


def validate(path: str, model: str | None,
             cache_dir: str | None = None) -> tuple[str, burnpack.FileIdentity, dict[str, Any]]:
    """Read the file and build the model on it, as a worker will; return the model's name, the
    file's identity and the model's signature. Reads no tensor data beyond what building the
    model reads, and keeps nothing mapped; what the model prepares in ``cache_dir`` is there
    for the workers."""
    try:
        loaded = LoadedModel(path, model, DEFAULT_LOAD, threads=1, cache_dir=cache_dir)  # no thread pool
    except (burnpack.BurnpackError, models.ModelError) as exc:
        raise WeightsRefused(str(exc)) from exc
    return loaded.name, loaded.pack.identity, loaded.signature()


def validate_new(path: str, model: str | None,
                 cache_dir: str | None) -> tuple[str, burnpack.FileIdentity, dict[str, Any]]:
    """:func:`validate` for new weights, preparing nothing where it can: the router waits while
    the supervisor validates, and the first worker of the new generation prepares what its
    model needs (an ONNX model's prepacked copy) while the old generation serves. Only a model
    that cannot be built without it is built with ``cache_dir``."""
    try:
        return validate(path, model)
    except WeightsRefused:
        if cache_dir is None:
            raise
    return validate(path, model, cache_dir)


class Watcher:
    """Tracks the served file and decides when its content is a new, valid generation."""

    def __init__(self, path: str, model: str | None, cache_dir: str | None = None, generation: int = 1) -> None:
        """At the start, the model is built as the workers will build it: what it prepares in
        ``cache_dir`` is there before the first worker starts. Its weights are ``generation``."""
        self.path = path
        self.cache_dir = cache_dir
        # Descriptors of the current generation's file and, until no worker needs it, the one before.
        self._held: list[int] = []
        for _ in range(HOLD_ATTEMPTS):
            name, identity, signature = validate(path, model, cache_dir)
            source = self._hold(identity)
            if source is not None:
                break
        else:
            raise WeightsRefused(f"{path} was replaced while being validated, {HOLD_ATTEMPTS} times in a row")
        self.current = Weights(generation, identity, name, signature, source)
        self.seen: burnpack.FileIdentity | None = identity
        self.problem: str | None = None
        self.last_reload: dict[str, Any] | None = None
        self.outcomes = {"accepted": 0, "refused": 0}  # new weights taken or refused, so far

    def check(self, trigger: str) -> str:
        """Look at the path now: ``unchanged``, ``refused`` or ``new`` (then ``current`` moved on)."""
        try:
            identity = burnpack.FileIdentity.of(os.stat(self.path))
        except OSError as exc:
            self.seen = None  # whatever comes back is looked at afresh
            if self.problem is None:
                self.problem = f"cannot stat {self.path}: {exc.strerror}"
                log.warning("%s; generation %d keeps serving", self.problem, self.current.generation)
            return "unchanged" if trigger in QUIET_TRIGGERS else self._refuse(trigger, self.problem)
        if identity == self.seen:
            if self.problem is not None and trigger not in QUIET_TRIGGERS:
                return self._refuse(trigger, self.problem)
            return "unchanged"
        self.seen = identity
        if identity == self.current.identity:
            if self.problem is not None:
                log.info("%s is generation %d's file again: new weights no longer refused",
                         self.path, self.current.generation)
            self.problem = None
            return "unchanged"
        same_inode = (identity.device, identity.inode) == (self.current.identity.device,
                                                           self.current.identity.inode)
        if same_inode:
            log.warning("%s was modified in place (same inode, size %d -> %d): workers mapping it may "
                        "crash with SIGBUS; publish new weights by rename (workerpool publish NEW.bpk %s)",
                        self.path, self.current.identity.size, identity.size, self.path)
        try:
            name, validated, signature = validate_new(self.path, self.current.model, self.cache_dir)
        except WeightsRefused as exc:
            self.problem = str(exc)
            return self._refuse(trigger, self.problem)
        if validated != identity:  # replaced again while we read it: look again next time
            self.seen = validated
        mismatch = models.signature_mismatch(self.current.signature, signature)
        if mismatch:
            self.problem = f"{self.path}: model {name} does not fit generation {self.current.generation}: {mismatch}"
            return self._refuse(trigger, self.problem)
        source = self._hold(validated)
        if source is None:  # replaced again since it was validated: look afresh next time
            self.seen = None
            return "unchanged"
        self.problem = None
        self.current = Weights(self.current.generation + 1, validated, name, signature, source)
        self.outcomes["accepted"] += 1
        self.last_reload = {"time": time.time(), "trigger": trigger, "result": "ok",
                            "generation": self.current.generation, "reason": None}
        log.info("new weights in %s (inode %d, %d bytes): generation %d; switching workers one at a time",
                 self.path, validated.inode, validated.size, self.current.generation)
        return "new"

    @property
    def held(self) -> tuple[int, ...]:
        """The descriptors kept open for workers to open their generation's file by."""
        return tuple(self._held)

    @property
    def holds_previous(self) -> bool:
        """Whether the generation before's file is still held open."""
        return len(self._held) > 1

    def release_previous(self) -> None:
        """Close the generation before's file once no worker needs it: a replaced file would
        otherwise stay on disk, held open, until the next reload."""
        while len(self._held) > 1:
            os.close(self._held.pop(0))

    def release_all(self) -> None:
        """Close every file held: the model is no longer served (its workers hold their own)."""
        while self._held:
            os.close(self._held.pop())

    @property
    def degraded(self) -> str | None:
        """Why the path is not what the pool serves, while it is not: a restart would load the
        refused file (another model, or none)."""
        return None if self.problem is None else f"new weights refused: {self.problem}"

    def _hold(self, identity: burnpack.FileIdentity) -> str | None:
        """Open the path and keep it open if it is still the file validated as ``identity``; the
        path workers open it by, or None. The generation before stays open too, for workers
        started just before this one arrived."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        if burnpack.FileIdentity.of(os.fstat(fd)) != identity:
            os.close(fd)
            return None
        self._held.append(fd)
        while len(self._held) > 2:
            os.close(self._held.pop(0))
        return f"/proc/{os.getpid()}/fd/{fd}"

    def _refuse(self, trigger: str, reason: str) -> str:
        self.outcomes["refused"] += 1
        self.last_reload = {"time": time.time(), "trigger": trigger, "result": "refused",
                            "generation": self.current.generation, "reason": reason}
        log.error("refused new weights: %s; generation %d keeps serving", reason, self.current.generation)
        return "refused"
