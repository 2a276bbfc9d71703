"""A worker host (``workerpool workers``): local workers that serve through a remote router.

The same supervision as ``serve`` (fresh processes, replacement, back-off, signals, watching the
weight file), without a router: the workers connect to the router host's backend endpoint over
TCP and register there. Each worker tells this supervisor through a pipe when its model is
built. New weights roll through the host one worker at a time: a new worker starts on the new
file, and once it is ready an old one says goodbye to the router and leaves, so the host never
serves with fewer than N workers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import zmq

from . import runtime, security
from .supervisor import Child, ServeConfig, StartupError, Supervisor
from .units import format_size

log = logging.getLogger("workerpool.host")


class WorkerHost(Supervisor):
    def __init__(self, config: ServeConfig, connect: str, keys: security.ClientKeys | None) -> None:
        super().__init__(config)
        self.connect = connect
        self.keys = keys

    def _open(self) -> None:
        self.backend_endpoint = self.connect
        if self.keys is not None:
            try:
                probe = self.context.socket(zmq.DEALER)  # only to check the key files
                self.keys.apply(probe)
                probe.close(linger=0)
            except security.KeysError as exc:
                raise StartupError(str(exc)) from exc
        elif not runtime.is_local(self.connect):
            log.warning("connecting to %s without CURVE keys: the traffic is neither authenticated nor "
                        "encrypted (see --curve-key)", self.connect)

    def _close(self) -> None:
        pass

    def _spawn(self, extra: Sequence[str] = (), pass_fds: Sequence[int] = ()) -> Child:
        ready_r, ready_w = os.pipe()
        args = ["--remote", "--ready-fd", str(ready_w)]
        if self.keys is not None:
            args += ["--curve-key", self.keys.secret_file, "--curve-server-key", self.keys.server_public_file]
        try:
            child = super()._spawn([*args, *extra], pass_fds=(*pass_fds, ready_w))
        finally:
            os.close(ready_w)
        self._read(ready_r, lambda: self._on_ready_pipe(ready_r, child))
        return child

    def _on_ready_pipe(self, fd: int, child: Child) -> None:
        loaded = os.read(fd, 16)
        self._forget(fd)
        os.close(fd)
        if loaded and child.pid in self.children:
            self._child_ready(child)
            self._roll()

    def _worker_exited(self, child: Child, why: str) -> None:
        self._roll()

    def _switch(self) -> None:
        self._roll()

    def _roll(self) -> None:
        """Replace one worker of an older generation: start a new one, then stop an old one."""
        generation = self.watcher.current.generation
        active = [c for c in self.children.values() if not c.stopping]
        old = [c for c in active if c.generation < generation]
        if self.stopping or not old or self.watcher.problem is not None:
            return
        if any(not c.ready for c in active):
            return  # a new worker is still loading
        if len(active) > self.target:
            self._stop_child(min(old, key=lambda c: c.started))
        else:
            log.info("starting a worker on generation %d to replace one on generation %d",
                     generation, old[0].generation)
            self._spawn()

    def _busy(self) -> bool:
        return self.stopping

    def _tick(self) -> None:
        pass

    def _stop_accepting(self) -> None:
        pass

    def _unfinished(self) -> int:
        return 0

    def _leave_timeout(self) -> float:
        """Stopped workers finish their request and leave the router: --graceful-timeout."""
        return self.config.graceful_timeout

    def _ready_line(self) -> str:
        current = self.watcher.current
        workers = f"{self.target} worker" + ("s" if self.target != 1 else "")
        return (f"workerpool: {workers} for {self.config.path} ({format_size(current.identity.size)}, "
                f"model {current.model}) serving through {self.connect}")
