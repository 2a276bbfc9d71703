"""The ``workers`` role: local workers that serve through a remote router.

Composed with a :class:`~workerpool.supervisor.core.Supervisor`, it gives ``workerpool workers``
the same supervision as ``serve`` (fresh processes, replacement, back-off, signals, watching
the weight file) without a router: the workers connect to the router host's backend endpoint
over TCP and register there. Each worker tells this host through a pipe when its model is
built. New weights roll through the host one worker at a time: the host asks for one worker
over its count (``surge``), which starts on the new file, and once it is ready an old one says
goodbye to the router and leaves, so the host never serves with fewer than N workers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import zmq

from .. import runtime, security
from ..config.pool import HostConfig, StartupError
from ..supervisor.process import Child
from ..supervisor.ready_line import workers_line
from ..supervisor.role import Pool
from ..worker.spec import WorkerSpec

log = logging.getLogger(__name__)

READY_MESSAGE_MAX = 16


class HostRole:
    """The uplink to a remote router, for ``workerpool workers``."""

    requests = None  # requests wait in the remote router, not here

    def __init__(self, config: HostConfig, pool: Pool) -> None:
        """Check the CURVE keys (StartupError), or warn that the link to the router has none."""
        self.config = config
        self.pool = pool
        self.leave_timeout = config.graceful_timeout  # workers finish their request, then leave
        if config.keys is not None:
            _check_keys(config.keys)
        elif not runtime.is_local(config.connect):
            log.warning("connecting to %s without CURVE keys: the traffic is neither authenticated nor "
                        "encrypted (see --curve-key)", config.connect)

    @property
    def backend(self) -> str:
        return self.config.connect

    ready_pipe = True  # no router here to hear that a worker is ready

    @property
    def stop_patience(self) -> float:
        return self.leave_timeout  # the remote router's request timeout is not known here

    def prepare(self, spec: WorkerSpec) -> WorkerSpec:
        keys = self.config.keys
        return replace(spec, remote=True,
                       curve_key=keys.secret_file if keys else None,
                       curve_server_key=keys.server_public_file if keys else None)

    def child_started(self, child: Child) -> None:
        assert child.ready_pipe is not None
        self.pool.loop.read(child.ready_pipe, lambda: self._on_loaded(child))

    def _on_loaded(self, child: Child) -> None:
        assert child.ready_pipe is not None
        try:
            loaded = os.read(child.ready_pipe, READY_MESSAGE_MAX)  # b"": it died before loading
        except BlockingIOError:
            return
        self.pool.loop.forget(child.ready_pipe)
        child.close_ready_pipe()
        # A worker that wrote and died within one poll is reaped, not counted as ready.
        if loaded and child.pid in self.pool.children and child.alive():
            self.pool.child_ready(child)
            self.roll_out()

    def child_exited(self, child: Child, why: str) -> None:
        self.roll_out()

    def model_removed(self, model: str) -> None:
        self.roll_out()

    def _older(self) -> list[Child]:
        """Running workers of a generation before the newest, or of a model no longer served."""
        generations = self.pool.models.generations()
        return [c for c in self.pool.children.values() if not c.stopping and c.behind(generations)]

    @property
    def surge(self) -> int:
        """One worker over the count while older generations remain and none is leaving."""
        children = self.pool.children.values()
        return 1 if self._older() and not any(c.stopping for c in children) else 0

    def roll_out(self, model: str | None = None) -> None:
        """Replace one worker of an older generation: once the one over the count is ready, the
        oldest of them leaves; the supervisor's count then starts the next."""
        pool = self.pool
        active = [c for c in pool.children.values() if not c.stopping]
        old = self._older()
        if pool.stopping or not old:
            return
        if pool.starter.pending or any(not c.ready for c in active):
            return  # a new worker is still loading
        if len(active) > pool.target:
            pool.stop_child(min(old, key=lambda c: c.started))
        elif pool.manage_workers():  # none while a failed start backs off
            log.info("started a worker on %s to replace one on %s", _generations(pool.models.generations()),
                     _generations(old[0].generations))

    def reload_done(self) -> bool:
        generations = self.pool.models.generations()
        return all(not c.behind(generations) and c.ready for c in self.pool.children.values()
                   if not c.stopping)

    def ready_line(self, path: str, size: str, model: str, workers: int) -> str:
        return workers_line(path, size, model, workers, self.config.connect)


def _generations(generations: dict[str, int]) -> str:
    return ", ".join(f"generation {generation} of {name}" for name, generation in generations.items())


def _check_keys(keys: security.ClientKeys) -> None:
    """Read the key files now, so that a bad one stops the host before any worker starts."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        keys.apply(context.socket(zmq.DEALER))
    except security.KeysError as exc:
        raise StartupError(str(exc)) from exc
    finally:
        context.destroy(linger=0)
