"""``serve``'s control commands: ``status``, ``reload``, ``check`` and ``models`` (list, add or
remove a served model), the status document, and ``modules``, for debugging: the modules the
supervisor has imported.

Answers that wait: a ``reload`` (and a model added) until every worker serves its generation
(or time is up), and a ``status`` with memory figures until a thread beside the loop has read
them; ``answer_waiting`` sends them from the loop's tick.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .. import models
from ..config.models import ModelsError, list_models
from ..control.server import Handler
from ..control.status import ModelStatus, Status, model_unready
from ..ops import metrics
from ..ops.worker_rows import worker_rows
from ..weights import reload
from .serving_parts import ServingParts

if TYPE_CHECKING:
    from ..weights.served import ServedModel

log = logging.getLogger(__name__)


class ControlCommands:
    """What the control socket of one ``serve`` answers, read from its parts: pool, router, sockets."""

    def __init__(self, parts: ServingParts) -> None:
        self.parts = parts
        self.reload_waiters: list[tuple[bytes, dict[str, int], float]] = []
        self.status_waiters: list[tuple[bytes, Future[metrics.PoolMemory]]] = []
        self._memory_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory")

    def handlers(self) -> dict[str, Handler]:
        return {"status": self._status, "reload": self._reload, "check": self._check,
                "models": self._models, "modules": self._modules}

    def close(self) -> None:
        self._memory_reader.shutdown(wait=True, cancel_futures=True)

    def answer_waiting(self) -> None:
        self._answer_reloads()
        self._answer_statuses()

    def _reply(self, client: bytes, answer: dict[str, Any]) -> None:
        self.parts.control_server.reply(client, answer)

    def _status(self, client: bytes, request: dict[str, Any]) -> dict[str, Any] | None:
        if not request.get("memory", True):
            return dict(self.status())
        # Reading every worker's smaps takes tens of milliseconds: do it beside the loop,
        # which keeps routing meanwhile, and answer when it is done.
        pool = self.parts.pool
        try:
            memory = self._memory_reader.submit(metrics.pool_memory, list(pool.children),
                                                [served.entry.path for served in pool.models],
                                                [os.getpid(), *pool.helper_pids()])
        except RuntimeError as exc:  # no thread to read them with (a process limit): answer without
            log.warning("status without memory figures: %s", exc)
            return dict(self.status())
        self.status_waiters.append((client, memory))
        return None

    def _modules(self, client: bytes, request: dict[str, Any]) -> dict[str, Any]:
        """Every module this process has imported: what it serves with, and what the template it
        forks shares with the workers. For debugging and for the tests that keep it lean, which
        must see what a running supervisor loaded, not only what its modules import."""
        return {"modules": sorted(sys.modules)}

    def _reload(self, client: bytes, request: dict[str, Any]) -> dict[str, Any] | None:
        pool = self.parts.pool
        if pool.stopping:
            return {"error": "the server is shutting down"}
        pool.changes.read_folders()
        outcomes = pool.changes.check("reload")
        refused = [pool.models[name].watcher.problem for name, outcome in outcomes.items() if outcome == "refused"]
        if refused:
            return {"error": "; ".join(str(problem) for problem in refused)}
        if all(outcome == "unchanged" for outcome in outcomes.values()) and self.parts.router.reload_complete():
            return {"result": "unchanged", **_generations(pool.models.generations())}
        self._wait_for_generations(client, pool.models.generations())
        return None

    def _wait_for_generations(self, client: bytes, generations: dict[str, int]) -> None:
        self.reload_waiters.append((client, generations, time.monotonic() + self.parts.config.reload_timeout))

    def _check(self, client: bytes, request: dict[str, Any]) -> dict[str, Any]:
        """Whether a file could be published over a served one (``model``: which, unless one
        model is served). Only files in the served file's directory are looked at, so the
        answer tells nothing about other paths."""
        path = request.get("path")
        if not isinstance(path, str) or not path or "\0" in path:
            return {"error": "check needs a path"}
        served = self._named(request.get("model"))
        if isinstance(served, str):
            return {"error": served}
        served_dir = os.path.dirname(os.path.realpath(served.entry.path))
        if os.path.dirname(os.path.realpath(path)) != served_dir:
            return {"error": f"check only looks at files in {served_dir}, the served file's directory"}
        current = served.current
        try:
            name, _, signature = reload.validate_new(path, current.model, self.parts.config.cache_dir)
        except reload.WeightsRefused as exc:
            return {"error": str(exc)}
        mismatch = models.signature_mismatch(current.signature, signature)
        if mismatch:
            return {"error": f"model {name} does not fit the served one: {mismatch}"}
        return {"result": "ok", "model": name}

    def _named(self, model: Any) -> ServedModel | str:
        """The served model ``model`` names (the only one when None), or why there is none."""
        served = self.parts.pool.models
        if model is None and len(served) == 1:
            return next(iter(served))
        if isinstance(model, str) and model in served:
            return served[model]
        return f"no model named {model!r} is served (served: {', '.join(served.names)})"

    def _models(self, client: bytes, request: dict[str, Any]) -> dict[str, Any] | None:
        """List the served models, add one (``add``: NAME=FILE or FILE, answered once every
        worker serves it) or remove one (``remove``: its name)."""
        pool = self.parts.pool
        if pool.stopping:
            return {"error": "the server is shutting down"}
        add, remove = request.get("add"), request.get("remove")
        try:
            if isinstance(add, str) and add:
                found = list_models([add], lambda path: path)
                if found.folders or len(found.named) != 1:
                    return {"error": "add one weight file at a time: NAME=FILE or FILE"}
                name, path, _ = found.named[0]
                served = pool.changes.add(self.parts.config.entry(name, os.path.abspath(path)))
                self._wait_for_generations(client, {name: served.current.generation})
                return None
            if isinstance(remove, str) and remove:
                if remove not in pool.models:
                    return {"error": f"no model named {remove!r} is served (served: {', '.join(pool.models.names)})"}
                pool.changes.remove(remove)
        except (ModelsError, reload.WeightsRefused) as exc:
            return {"error": str(exc)}
        return {"result": "ok", "models": self.status()["models"]}

    def _answer_reloads(self) -> None:
        """Answer ``workerpool reload`` (or a model added) once every worker serves the
        generations it waits for, or time is up."""
        if not self.reload_waiters:
            return
        now = time.monotonic()
        pool, router, failures = self.parts.pool, self.parts.router, self.parts.switch_failures
        starting = any(not child.ready for child in pool.children.values())
        current = pool.models.generations()
        waiting = []
        for client, wanted, deadline in self.reload_waiters:
            gone = [name for name in wanted if name not in current]
            done = not starting and bool(router.workers) and all(router.reload_complete(name) for name in wanted)
            failed = [failures[name] for name, generation in wanted.items()
                      if name in failures and current.get(name) == generation]
            if gone:
                self._reply(client, {"error": f"{', '.join(gone)} is no longer served"})
            elif failed:
                self._reply(client, {"error": "; ".join(failed)})
            elif done and all(current[name] >= generation for name, generation in wanted.items()):
                self._reply(client, {"result": "reloaded", **_generations(current)})
            elif now >= deadline:
                behind = sorted({w.pid for w in router.workers for name, generation in wanted.items()
                                 if 0 < w.models.get(name, 0) < generation})
                self._reply(client, {
                    "error": f"not every worker reached {_listed(wanted)} within "
                    f"{self.parts.config.reload_timeout:g}s (still behind: {behind or 'workers starting'})"
                })
            else:
                waiting.append((client, wanted, deadline))
        self.reload_waiters = waiting

    def _answer_statuses(self) -> None:
        waiting = []
        for client, memory in self.status_waiters:
            if memory.done():
                self._reply(client, dict(self.status(memory.result())))
            else:
                waiting.append((client, memory))
        self.status_waiters = waiting

    def status(self, memory: metrics.PoolMemory | None = None) -> Status:
        """The pool's state; per-worker ``memory`` and ``totals`` are None unless ``memory`` is given."""
        pool, router, config = self.parts.pool, self.parts.router, self.parts.config
        connections = self.parts.connections
        helpers: dict[int, Any] = memory.helpers if memory else {}
        workers = worker_rows(pool.children.values(), router.workers, memory.workers if memory else None)
        served = {served.name: self._model_status(served, workers) for served in pool.models}
        degraded = pool.models.degraded
        return {
            "supervisor_pid": os.getpid(),
            "draining": pool.stopping,
            "degraded": "; ".join(f"{name}: {why}" if len(served) > 1 else why
                                  for name, why in degraded.items()) or None,
            "supervisor_memory": helpers.get(os.getpid()),
            "template": pool.starter.status(helpers),
            "endpoint": self.parts.links.endpoint,
            "http": self.parts.http_url,
            "threads_per_worker": pool.threads_per_worker,
            "model": next(iter(served.values())) if len(served) == 1 else None,
            "models": served,
            "queue": {"depth": router.queue_depth, "max": config.max_queue,
                      "in_flight": router.in_flight},
            "connections": {"served": len(connections.serving), "open": len(connections.open),
                            "max": connections.limit},
            "workers": workers,
            "totals": memory.totals if memory else None,
        }

    def _model_status(self, served: ServedModel, workers: list[Any]) -> ModelStatus:
        current, config, router = served.current, self.parts.config, self.parts.router
        record = router.scheduler.models.get(served.name)
        return {
            "name": current.model,
            "path": served.entry.path,
            "size": current.identity.size,
            "inode": current.identity.inode,
            "generation": current.generation,
            "load": config.load,
            "watch_interval": config.watch_interval,
            "last_reload": served.watcher.last_reload,
            "degraded": served.watcher.degraded,
            "max_batch": served.entry.max_batch,
            "workers": sum(1 for row in workers if served.name in row["models"]),
            "queue": router.queue.depth(served.name),
            "in_flight": sum(1 for w in router.workers for part in w.inflight if part.request.model == served.name),
            "switch_failure": self.parts.switch_failures.get(served.name),
            "reloading": bool(record and record.rollout.active),
        }

    def unready(self, model: str) -> str | None:
        """Why ``model`` is not ready, or None (for the HTTP front door's per-model routes)."""
        return model_unready(self.status(), model)


def _generations(generations: dict[str, int]) -> dict[str, Any]:
    """A reload's answer: the generation of the one model, or of each of several."""
    if len(generations) == 1:
        return {"generation": next(iter(generations.values()))}
    return {"generations": generations}


def _listed(generations: dict[str, int]) -> str:
    return ", ".join(f"generation {generation} of {name}" for name, generation in generations.items())
