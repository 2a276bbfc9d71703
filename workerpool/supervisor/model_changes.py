"""Changes to what a pool serves while it runs, the supervisor's part: new weights for a model
(a file published over its path, SIGHUP, ``workerpool reload``), a model added (``workerpool
models add``, a folder of models read again) or removed. Each change is validated here, against
the files; the role then moves its workers (``Role.roll_out``, ``Role.model_removed``), and the
service manager hears of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Protocol

from ..config.models import ModelEntry
from ..config.pool import PoolConfig
from ..weights.reload import WeightsRefused
from ..weights.served import ServedModel, ServedModels
from .process import Backoff
from .starters import Starter
from .systemd import Notifier

log = logging.getLogger(__name__)


class Moves(Protocol):
    """What the pool's role does once a model changed: move its workers (``role.Role``)."""

    def roll_out(self, model: str) -> None: ...

    def model_removed(self, model: str) -> None: ...


class ModelChanges:
    """Checks the served files and applies what changed; ``reloading`` while the workers move
    to a new generation (the service manager was told RELOADING=1, not yet READY=1 again).
    ``refusals``: the back-off of workers a router refused, which new weights reset;
    ``status``: tells the service manager how the pool stands now."""

    def __init__(self, models: ServedModels, config: PoolConfig, role: Moves, notifier: Notifier,
                 starter: Starter, refusals: Backoff, status: Callable[[], None]) -> None:
        self.models = models
        self.config = config
        self.role = role
        self.notifier = notifier
        self.starter = starter
        self.refusals = refusals
        self.status = status
        self.reloading = False

    def check(self, trigger: str) -> dict[str, str]:
        """Look at every served path; start moving the pool to each new, valid generation. The
        outcome by model: unchanged, refused or new. A model found in a folder whose file is gone
        is removed, as reading the folder again would: its absence is no refused weights."""
        for served in self.models:
            if served.entry.folder and len(self.models) > 1 and not os.path.exists(served.entry.path):
                log.info("%s is gone from %s", served.entry.path, served.entry.folder)
                self.remove(served.name)
        degraded = self.models.degraded
        outcomes = {served.name: served.watcher.check(trigger) for served in self.models}
        if self.models.degraded != degraded and not self.reloading:
            self.status()
        for name, outcome in outcomes.items():
            if outcome == "new":
                self.refusals.reset()
                self.reloading = True
                self.notifier.reloading(f"moving {name} to generation {self.models[name].current.generation}")
                self.role.roll_out(name)
        return outcomes

    def add(self, entry: ModelEntry) -> ServedModel:
        """Serve one more model: validated here, then mapped by the workers one at a time, as
        new weights are. ``WeightsRefused`` says why it cannot be served."""
        served = self.models.add(entry)
        log.info("serving a new model %s (%s, model %s)", entry.name, entry.path, served.current.model)
        self.reloading = True
        self.role.roll_out(entry.name)
        return served

    def remove(self, name: str) -> None:
        """Stop serving ``name``: requests for it are refused from now on, and every process
        lets go of its file."""
        if len(self.models) == 1:
            raise WeightsRefused(f"{name} is the only model served: a pool serves one model at least")
        self.models.remove(name)
        self.starter.forget_models(set(self.models.names))
        self.role.model_removed(name)
        log.info("no longer serving the model %s", name)

    def read_folders(self) -> None:
        """Serve what each model folder holds now: a new weight file is added, one gone removed."""
        found, gone = self.models.folder_changes(self.config.folders)
        for name in gone:
            if len(self.models) > 1:
                self.remove(name)
        for name, path, folder in found:
            try:
                self.add(self.config.entry(name, path, folder))
            except WeightsRefused as exc:
                log.error("not serving %s found in %s: %s", path, folder, exc)
