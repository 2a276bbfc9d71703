"""The models a pool serves, each with the watcher of its weight file (``reload.py``).

Each model has its own generation: new weights for one model make a new generation of that
model alone, and weights refused for one leave the others as they are. Models may be added and
removed while the pool serves (a control command, or a folder of models read again).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from ..config.models import ModelEntry, ModelsError, models_in, stem
from ..worker.spec import ModelSpec
from .reload import Watcher, Weights, WeightsRefused

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ServedModel:
    """One model: what it was asked to be served with, and its weights' watcher."""

    entry: ModelEntry
    watcher: Watcher

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def current(self) -> Weights:
        return self.watcher.current

    def spec(self) -> ModelSpec:
        """What a worker is told of this model: its file, and the newest generation of it."""
        current, entry = self.current, self.entry
        return ModelSpec(name=self.name, path=entry.path, factory=entry.factory, generation=current.generation,
                         expect=current.identity.as_list(), source=current.source, max_batch=entry.max_batch,
                         truncate=entry.truncate)


class ServedModels:
    """Every model served, by name, in the order they were given."""

    def __init__(self, entries: list[ModelEntry], cache_dir: str | None) -> None:
        """Validate every model as the workers will build it; ``WeightsRefused`` names the
        model that cannot be served."""
        self.cache_dir = cache_dir
        self._models: dict[str, ServedModel] = {}
        self._last: dict[str, int] = {}  # the last generation of each model removed
        for entry in entries:
            self.add(entry)

    def add(self, entry: ModelEntry) -> ServedModel:
        """Serve one more model, validated first; ``WeightsRefused`` says why it cannot be. A
        name served before goes on from the generation it was at, so that no generation names
        two different files (a worker may still hold the removed one)."""
        if entry.name in self._models:
            raise WeightsRefused(f"a model named {entry.name!r} is served already")
        try:
            watcher = Watcher(entry.path, entry.factory, self.cache_dir, self._last.get(entry.name, 0) + 1)
        except WeightsRefused as exc:
            raise WeightsRefused(f"model {entry.name}: {exc}") from exc
        served = self._models[entry.name] = ServedModel(entry, watcher)
        return served

    def remove(self, name: str) -> ServedModel:
        """Stop serving ``name``: its files are let go of at once (workers hold their own)."""
        served = self._models.pop(name)
        served.watcher.release_all()
        self._last[name] = served.current.generation
        return served

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(list(self._models.values()))

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __getitem__(self, name: str) -> ServedModel:
        return self._models[name]

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def wanted(self, mapping: Counter[str]) -> list[ModelSpec]:
        """The models a new worker maps: every model, but one that asks for fewer workers
        (``--workers NAME=N``) once ``mapping`` (workers running or starting, by model) has
        that many of them; the first model at least."""
        wanted = [served.spec() for served in self._models.values()
                  if served.entry.workers is None or mapping[served.name] < served.entry.workers]
        return wanted or [next(iter(self._models.values())).spec()]

    def folder_changes(self, folders: list[str]) -> tuple[list[tuple[str, str, str]], list[str]]:
        """What ``folders`` hold now that is not served (name, path, folder), and the models
        served from them whose file is gone. A folder that cannot be read changes nothing."""
        found, gone = [], []
        for folder in folders:
            try:
                present = {stem(path): path for path in models_in(folder)}
            except ModelsError as exc:
                log.warning("%s; its models are left as they are", exc)
                continue
            gone += [name for name, served in self._models.items()
                     if served.entry.folder == folder and name not in present]
            found += [(name, path, folder) for name, path in present.items() if name not in self._models]
            for name, path in present.items():
                served = self._models.get(name)
                if served is not None and served.entry.folder != folder:
                    log.warning("not serving %s: a model named %s is served from %s", path, name, served.entry.path)
        return found, gone

    def named(self) -> tuple[str, str]:
        """What the ready line names: the one file served, or ``NAME=PATH`` of each; and the
        models' kinds (``mlp``, ``bert``...)."""
        served = list(self._models.values())
        paths = served[0].entry.path if len(served) == 1 else \
            ", ".join(f"{model.name}={model.entry.path}" for model in served)
        return paths, ", ".join(model.current.model for model in served)

    def summary(self, workers: str) -> str:
        """One line for the service manager's status, served by ``workers``."""
        served = list(self._models.values())
        generations = f"{served[0].current.model} generation {served[0].current.generation}" if len(served) == 1 \
            else ", ".join(f"{model.name} ({model.current.model}) generation {model.current.generation}"
                           for model in served)
        degraded = "; ".join(why if len(served) == 1 else f"{name}: {why}" for name, why in self.degraded.items())
        summary = f"serving {generations} with {workers}"
        return summary if not degraded else f"{summary}; degraded: {degraded}"

    def described(self) -> str:
        """Every model, for a log line: name, file and kind."""
        return ", ".join(f"{served.name} ({served.entry.path}, model {served.current.model})"
                         for served in self._models.values())

    def generations(self) -> dict[str, int]:
        return {name: served.current.generation for name, served in self._models.items()}

    @property
    def size(self) -> int:
        """The bytes of every model's current file."""
        return sum(served.current.identity.size for served in self._models.values())

    @property
    def held(self) -> tuple[int, ...]:
        """The descriptors kept open for workers to open their files by."""
        return tuple(fd for served in self._models.values() for fd in served.watcher.held)

    @property
    def holds_previous(self) -> bool:
        return any(served.watcher.holds_previous for served in self._models.values())

    def release_previous(self) -> None:
        for served in self._models.values():
            served.watcher.release_previous()

    @property
    def degraded(self) -> dict[str, str]:
        """Why a model's path is not what the pool serves of it, by model."""
        return {name: served.watcher.degraded for name, served in self._models.items()
                if served.watcher.degraded is not None}

    def outcomes(self) -> dict[str, dict[str, int]]:
        """New weights taken or refused so far, by model."""
        return {name: dict(served.watcher.outcomes) for name, served in self._models.items()}
