"""``serve``'s control commands: ``status``, ``reload`` and ``check``, the status document, and
``modules``, for debugging: the modules the supervisor has imported.

Two answers wait: a ``reload`` until every worker serves its generation (or time is up), and a
``status`` with memory figures until a thread beside the loop has read them; ``answer_waiting``
sends them from the loop's tick.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .. import models
from ..control.server import Handler
from ..control.status import Status
from ..ops import metrics
from ..ops.worker_rows import worker_rows
from ..weights import reload

if TYPE_CHECKING:
    from .serving import ServingRole

log = logging.getLogger(__name__)


class ControlCommands:
    """What the control socket of one ``serve`` answers, read from its role, pool and router."""

    def __init__(self, role: ServingRole) -> None:
        self.role = role
        self.reload_waiters: list[tuple[bytes, int, float]] = []
        self.status_waiters: list[tuple[bytes, Future[metrics.PoolMemory]]] = []
        self._memory_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory")

    def handlers(self) -> dict[str, Handler]:
        return {"status": self._status, "reload": self._reload, "check": self._check,
                "modules": self._modules}

    def close(self) -> None:
        self._memory_reader.shutdown(wait=True, cancel_futures=True)

    def answer_waiting(self) -> None:
        self._answer_reloads()
        self._answer_statuses()

    def _reply(self, client: bytes, answer: dict[str, Any]) -> None:
        self.role.control_server.reply(client, answer)

    def _status(self, client: bytes, request: dict[str, Any]) -> dict[str, Any] | None:
        if not request.get("memory", True):
            return dict(self.status())
        # Reading every worker's smaps takes tens of milliseconds: do it beside the loop,
        # which keeps routing meanwhile, and answer when it is done.
        pool = self.role.pool
        try:
            memory = self._memory_reader.submit(metrics.pool_memory, list(pool.children),
                                                self.role.config.path, [os.getpid(), *pool.helper_pids()])
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
        pool = self.role.pool
        if pool.stopping:
            return {"error": "the server is shutting down"}
        outcome = pool.check_weights("reload")
        watcher = pool.watcher
        if outcome == "unchanged" and self.role.router.reload_complete():
            return {"result": "unchanged", "generation": watcher.current.generation}
        if outcome == "refused":
            return {"error": watcher.problem}
        self.reload_waiters.append((client, watcher.current.generation,
                                    time.monotonic() + self.role.config.reload_timeout))
        return None

    def _check(self, client: bytes, request: dict[str, Any]) -> dict[str, Any]:
        """Whether a file could be published over the served one. Only files in the served
        file's directory are looked at, so the answer tells nothing about other paths."""
        current = self.role.pool.watcher.current
        path = request.get("path")
        if not isinstance(path, str) or not path or "\0" in path:
            return {"error": "check needs a path"}
        served_dir = os.path.dirname(os.path.realpath(self.role.config.path))
        if os.path.dirname(os.path.realpath(path)) != served_dir:
            return {"error": f"check only looks at files in {served_dir}, the served file's directory"}
        try:
            name, _, signature = reload.validate_new(path, current.model, self.role.config.cache_dir)
        except reload.WeightsRefused as exc:
            return {"error": str(exc)}
        mismatch = models.signature_mismatch(current.signature, signature)
        if mismatch:
            return {"error": f"model {name} does not fit the served one: {mismatch}"}
        return {"result": "ok", "model": name}

    def _answer_reloads(self) -> None:
        """Answer ``workerpool reload`` once every worker serves its generation, or time is up."""
        if not self.reload_waiters:
            return
        now = time.monotonic()
        pool, router, failure = self.role.pool, self.role.router, self.role.switch_failure
        starting = any(not child.ready for child in pool.children.values())
        done = not starting and router.reload_complete() and bool(router.workers)
        current = pool.watcher.current.generation
        waiting = []
        for client, generation, deadline in self.reload_waiters:
            if done and current >= generation:
                self._reply(client, {"result": "reloaded", "generation": current})
            elif failure is not None and current == generation:
                self._reply(client, {"error": failure})
            elif now >= deadline:
                behind = [w.pid for w in router.workers if w.generation < generation]
                self._reply(client, {
                    "error": f"not every worker reached generation {generation} within "
                    f"{self.role.config.reload_timeout:g}s (still behind: {behind or 'workers starting'})"
                })
            else:
                waiting.append((client, generation, deadline))
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
        pool, router, config = self.role.pool, self.role.router, self.role.config
        connections = self.role.connections
        current = pool.watcher.current
        helpers: dict[int, Any] = memory.helpers if memory else {}
        return {
            "supervisor_pid": os.getpid(),
            "draining": pool.stopping,
            "degraded": pool.watcher.degraded,
            "supervisor_memory": helpers.get(os.getpid()),
            "template": pool.starter.status(helpers),
            "endpoint": self.role.links.endpoint,
            "http": self.role.http_url,
            "threads_per_worker": pool.threads_per_worker,
            "model": {
                "name": current.model,
                "path": config.path,
                "size": current.identity.size,
                "inode": current.identity.inode,
                "generation": current.generation,
                "load": config.load,
                "watch_interval": config.watch_interval,
                "last_reload": pool.watcher.last_reload,
            },
            "queue": {"depth": router.queue_depth, "max": config.max_queue,
                      "in_flight": router.in_flight},
            "connections": {"served": len(connections.serving), "open": len(connections.open),
                            "max": connections.limit},
            "workers": worker_rows(pool.children.values(), router.workers,
                                   memory.workers if memory else None),
            "totals": memory.totals if memory else None,
        }
