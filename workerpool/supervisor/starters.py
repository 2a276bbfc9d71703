"""How worker processes come to be: forked from the warm template, or spawned fresh.

``--start fork`` (the default) keeps one template process and asks it for each worker (see
``template_starter.py`` and ``template.py``); ``--start spawn`` starts each worker as a fresh
interpreter, for models or libraries that are not safe to fork. Either way the supervisor gets
a :class:`Child` with a pidfd it reaps itself, and a start that fails is reported, never lost.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..control.status import TemplateStatus
from ..events.loop import Loop
from ..worker.spec import TOKEN_ENV, WorkerSpec
from .process import Child, Process, python_env

TOKEN_BYTES = 16


@dataclass(eq=False)
class StartOrder:
    """One worker to start: its spec, its secret token and, for a worker host, the pipe it
    writes to once its model is built."""

    spec: WorkerSpec
    token: str
    ready_r: int | None = None
    ready_w: int | None = None

    @classmethod
    def make(cls, spec: WorkerSpec, *, ready_pipe: bool) -> StartOrder:
        order = cls(spec, _new_token())
        if ready_pipe:
            order._new_pipe()
        return order

    def renew(self) -> None:
        """A fresh token (and pipe) to ask again with: a worker started for the old ones but
        never reported must not pass for this one."""
        self.token = _new_token()
        if self.ready_r is not None:
            self.abandon()
            self._new_pipe()

    def _new_pipe(self) -> None:
        self.ready_r, self.ready_w = os.pipe()
        os.set_blocking(self.ready_r, False)

    def sent(self) -> None:
        """The worker (or the template) holds its own copy of the write end now."""
        if self.ready_w is not None:
            os.close(self.ready_w)
            self.ready_w = None

    def abandon(self) -> None:
        self.sent()
        if self.ready_r is not None:
            os.close(self.ready_r)
            self.ready_r = None

    def child(self, process: Process) -> Child:
        return Child(process.pid, process.pidfd, process.popen, process.started,
                     generations={model.name: model.generation for model in self.spec.models},
                     token=self.token, ready_pipe=self.ready_r)


def _new_token() -> str:
    return os.urandom(TOKEN_BYTES).hex()  # secrets.token_hex, without the OpenSSL it loads


Started = Callable[[StartOrder, Process], None]
Failed = Callable[[StartOrder, str], None]


class Starter(Protocol):
    """Starts workers for the supervisor, which it tells through ``started`` and ``failed``."""

    @property
    def pending(self) -> int:
        """Orders neither started nor failed yet."""

    def tokens(self) -> set[str]:
        """The tokens of those orders: a worker may register before it is reported."""

    def pending_models(self) -> Counter[str]:
        """How many of those orders map each model."""

    def forget_models(self, kept: set[str]) -> None:
        """Only the models ``kept`` are served from now on: let go of any other."""

    @property
    def template(self) -> Process | None:
        """The template process, when there is one (for ``status`` and the memory totals)."""

    def open(self, loop: Loop) -> None: ...

    def start(self, order: StartOrder) -> None:
        """Start a worker; OSError when it cannot even be asked for."""

    def collect_strays(self) -> None:
        """Reap exited children the supervisor does not know of (a child exited)."""

    def close(self) -> None:
        """No more workers will be asked for: the pool is stopping (or failed to start)."""

    def status(self, memory: Mapping[int, Any]) -> TemplateStatus | None:
        """The template's part of ``status``, with its figures from ``memory`` (by pid)."""


class SpawnStarter:
    """Each worker a fresh interpreter: ``python -m workerpool.worker.child worker``."""

    pending = 0
    template = None

    def __init__(self, started: Started) -> None:
        self.started = started

    def open(self, loop: Loop) -> None:
        pass

    def tokens(self) -> set[str]:
        return set()

    def pending_models(self) -> Counter[str]:
        return Counter()

    def forget_models(self, kept: set[str]) -> None:
        pass

    def start(self, order: StartOrder) -> None:
        spec = order.spec if order.ready_w is None else replace(order.spec, ready_fd=order.ready_w)
        env = python_env()
        env[TOKEN_ENV] = order.token  # not in argv, which every user on the machine can read
        try:
            process = Process.spawn([sys.executable, "-m", "workerpool.worker.child", "worker", *spec.to_argv()], env,
                                    pass_fds=() if order.ready_w is None else (order.ready_w,))
        finally:
            order.sent()
        self.started(order, process)

    def collect_strays(self) -> None:
        pass

    def close(self) -> None:
        pass

    def status(self, memory: Mapping[int, Any]) -> TemplateStatus | None:
        return None
