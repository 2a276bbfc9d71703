"""How worker processes come to be: forked from the warm template, or spawned fresh.

``--start fork`` (the default) keeps one template process and asks it for each worker (see
``template_starter.py`` and ``template.py``); ``--start spawn`` starts each worker as a fresh
interpreter, for models or libraries that are not safe to fork. Either way the supervisor gets
a :class:`Child` with a pidfd it reaps itself, and a start that fails is reported, never lost.
"""

from __future__ import annotations

import os
import socket
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..control.status import TemplateStatus
from ..events.loop import Loop
from ..protocol import link
from ..worker.spec import TOKEN_ENV, WorkerSpec
from .process import Child, Process, python_env

TOKEN_BYTES = 16


@dataclass(eq=False)
class StartOrder:
    """One worker to start: its spec, its secret token and the one descriptor it inherits:
    a local worker's end of its link to the router, or a worker host's pipe it writes to once
    its model is built."""

    spec: WorkerSpec
    token: str
    ready_r: int | None = None
    passed: int | None = None  # what the worker inherits, until sent: its spec names it
    link: socket.socket | None = None  # the router's end, until the worker is adopted

    @classmethod
    def make(cls, spec: WorkerSpec, *, ready_pipe: bool) -> StartOrder:
        """The order for ``spec``; a spec with no backend endpoint talks over a link made here."""
        order = cls(spec, _new_token())
        if ready_pipe:
            order._new_pipe()
        if spec.backend is None:
            order._new_link()
        return order

    def renew(self) -> None:
        """A fresh token (and pipe, or link) to ask again with: a worker started for the old
        ones but never reported must not pass for this one, nor share its link."""
        self.token = _new_token()
        if self.ready_r is not None:
            self.abandon()
            self._new_pipe()
        elif self.link is not None:
            self.abandon()
            self._new_link()

    def _new_pipe(self) -> None:
        self.ready_r, self.passed = os.pipe()
        os.set_blocking(self.ready_r, False)
        self.spec = replace(self.spec, ready_fd=self.passed)

    def _new_link(self) -> None:
        self.link, theirs = link.pair()
        self.passed = theirs.detach()
        self.spec = replace(self.spec, link_fd=self.passed)

    def sent(self) -> None:
        """The worker (or the template) holds its own copy of what it inherits now."""
        if self.passed is not None:
            os.close(self.passed)
            self.passed = None

    def abandon(self) -> None:
        self.sent()
        if self.ready_r is not None:
            os.close(self.ready_r)
            self.ready_r = None
        if self.link is not None:
            self.link.close()
            self.link = None

    def child(self, process: Process) -> Child:
        """The started worker, which takes over the router's end of its link."""
        child = Child(process.pid, process.pidfd, process.popen, process.started,
                      generations={model.name: model.generation for model in self.spec.models},
                      token=self.token, ready_pipe=self.ready_r, link=self.link)
        self.link = None
        return child


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
        env = python_env()
        env[TOKEN_ENV] = order.token  # not in argv, which every user on the machine can read
        passed = order.passed
        try:
            process = Process.spawn([sys.executable, "-m", "workerpool.worker.child", "worker",
                                     *order.spec.to_argv()], env, pass_fds=() if passed is None else (passed,))
        finally:
            order.sent()
        self.started(order, process)

    def collect_strays(self) -> None:
        pass

    def close(self) -> None:
        pass

    def status(self, memory: Mapping[int, Any]) -> TemplateStatus | None:
        return None
