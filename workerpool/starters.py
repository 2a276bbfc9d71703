"""How worker processes come to be: forked from the warm template, or spawned fresh.

``--start fork`` (the default) keeps one template process (see ``template.py``) and asks it
for each worker; ``--start spawn`` starts each worker as a fresh interpreter, for models or
libraries that are not safe to fork. Either way the supervisor gets a :class:`Child` with a
pidfd it reaps itself, and a start that fails is reported, never lost.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, Protocol

from . import linux, template
from .loop import Loop
from .process import (
    Backoff,
    Child,
    Process,
    collect_strays,
    describe_exit,
    python_env,
)
from .status import TemplateStatus
from .worker_spec import TOKEN_ENV, WorkerSpec

log = logging.getLogger("workerpool.supervisor")

TOKEN_BYTES = 16
MAX_REPLY_BYTES = 4096
TEMPLATE_READY_TIMEOUT = 120.0  # seconds a template may take to import everything (a big model library)
ORDER_TIMEOUT = 10.0  # seconds a ready template may take to fork one worker (it takes milliseconds)


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
        order = cls(spec, os.urandom(TOKEN_BYTES).hex())  # secrets.token_hex, without its OpenSSL
        if ready_pipe:
            order.ready_r, order.ready_w = os.pipe()
            os.set_blocking(order.ready_r, False)
        return order

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
        return Child(process.pid, process.pidfd, process.popen, generation=self.spec.generation,
                     token=self.token, ready_pipe=self.ready_r)


Started = Callable[[StartOrder, Process], None]
Failed = Callable[[StartOrder, str], None]


class Starter(Protocol):
    """Starts workers for the supervisor, which it tells through ``started`` and ``failed``."""

    @property
    def pending(self) -> int:
        """Orders neither started nor failed yet."""

    @property
    def template(self) -> Process | None:
        """The template process, when there is one (for ``status`` and the memory totals)."""

    def open(self, loop: Loop, cleanup: ExitStack) -> None: ...

    def start(self, order: StartOrder) -> None:
        """Start a worker; OSError when it cannot even be asked for."""

    def collect_strays(self) -> None:
        """Reap children the supervisor does not know of (a child exited)."""

    def close(self) -> None:
        """No more workers will be asked for: the pool is stopping."""

    def status(self, memory: Mapping[int, Any]) -> TemplateStatus | None:
        """The template's part of ``status``, with its figures from ``memory`` (by pid)."""


class SpawnStarter:
    """Each worker a fresh interpreter: ``python -m workerpool.worker``."""

    pending = 0
    template = None

    def __init__(self, started: Started) -> None:
        self.started = started

    def open(self, loop: Loop, cleanup: ExitStack) -> None:
        pass

    def start(self, order: StartOrder) -> None:
        spec = order.spec if order.ready_w is None else replace(order.spec, ready_fd=order.ready_w)
        env = python_env()
        env[TOKEN_ENV] = order.token  # not in argv, which every user on the machine can read
        try:
            process = Process.spawn([sys.executable, "-m", "workerpool.worker", *spec.to_argv()], env,
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


class TemplateStarter:
    """Workers forked from a warm template, restarted (with back-off) when it dies; workers
    already running are the supervisor's children and are not touched."""

    def __init__(self, started: Started, failed: Failed, *, model: str | None, log_level: str,
                 known: Callable[[], set[int]]) -> None:
        self.started, self.failed = started, failed
        self.model, self.log_level = model, log_level
        self.known = known  # the supervisor's workers
        self.template: Process | None = None
        self.restarts = 0
        self._sock: socket.socket | None = None
        self._orders: dict[int, tuple[StartOrder, float]] = {}  # id -> the order, when it was sent
        self._waiting: list[StartOrder] = []  # until a template is up
        self._next_id = 1
        self._backoff = Backoff()
        self._restart_at: float | None = None
        self._launched = self._ready = 0.0  # monotonic times; ready 0: not yet
        self._loop: Loop

    @property
    def pending(self) -> int:
        return len(self._orders) + len(self._waiting)

    def open(self, loop: Loop, cleanup: ExitStack) -> None:
        """Become a subreaper, then start the template. While this process has no thread yet,
        the template is forked from it: the supervisor, the template and every worker then
        share one interpreter's pages. Later (a restart) it is a fresh interpreter."""
        linux.become_subreaper()
        self._loop = loop
        cleanup.callback(self.close)
        loop.every_tick(self._duties)
        self._launch(fork=threading.active_count() == 1)

    def start(self, order: StartOrder) -> None:
        if self._sock is None:
            self._waiting.append(order)
        else:
            self._send(order)

    def collect_strays(self) -> None:
        collect_strays(self._known(), kill=False)

    def status(self, memory: Mapping[int, Any]) -> TemplateStatus | None:
        pid = self.template.pid if self.template else None
        return {"pid": pid, "restarts": self.restarts, "memory": memory.get(pid) if pid else None}

    def _known(self) -> set[int]:
        return self.known() | ({self.template.pid} if self.template else set())

    # The template's life.

    def _launch(self, *, fork: bool) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.template = self._fork(ours, theirs) if fork else self._spawn(theirs)
        except OSError as exc:
            ours.close()
            self._template_failed(f"could not be started: {exc}")
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._loop.read(ours.fileno(), self._on_replies)
        self._loop.read(self.template.pidfd, self._on_exit)
        self._launched, self._ready = time.monotonic(), 0.0
        log.debug("template %d started (%s)", self.template.pid, "forked" if fork else "spawned")
        waiting, self._waiting = self._waiting, []
        for order in waiting:
            self._send(order)

    def _fork(self, ours: socket.socket, theirs: socket.socket) -> Process:
        sys.stdout.flush()
        sys.stderr.flush()
        gc.collect()
        gc.freeze()  # neither process traverses these objects again, so their pages stay shared
        pid = os.fork()
        if pid == 0:
            ours.close()
            template.run(theirs, os.getppid())
        return Process.adopt(pid)

    def _spawn(self, theirs: socket.socket) -> Process:
        argv = [sys.executable, "-m", "workerpool.template", "--fd", str(theirs.fileno()),
                "--parent", str(os.getpid()), "--log-level", self.log_level]
        if self.model is not None:
            argv += ["--model", self.model]
        return Process.spawn(argv, python_env(), pass_fds=(theirs.fileno(),))

    def _on_exit(self) -> None:
        """The template died: its answers so far still count, its open orders fail, a worker it
        forked but could not report is stopped, and it comes back after a back-off."""
        assert self.template is not None and self._sock is not None
        self._on_replies()
        self._loop.forget(self._sock.fileno())
        self._loop.forget(self.template.pidfd)
        self._sock.close()
        self._sock = None
        why = describe_exit(self.template.reap())
        orders, self._orders = list(self._orders.values()), {}
        for order, _ in orders:
            self.failed(order, f"the template {why} before starting it")
        collect_strays(self._known(), kill=True)
        self._template_failed(why)

    def _template_failed(self, why: str) -> None:
        delay = self._backoff.fail()
        pid = self.template.pid if self.template else "-"
        self.template = None
        log.error("worker template %s %s; starting another in %.1fs (running workers are not "
                  "affected)", pid, why, delay)
        self._restart_at = time.monotonic() + delay

    def _duties(self) -> None:
        """Restart a dead template when its back-off is over; kill one that hangs."""
        now = time.monotonic()
        if self._restart_at is not None and now >= self._restart_at:
            self._restart_at = None
            self.restarts += 1
            self._launch(fork=False)
        elif self.template is not None:
            waiting, self._waiting = self._waiting, []  # the socket was full: try again
            for order in waiting:
                self._send(order)
            oldest = min((sent for _, sent in self._orders.values()), default=now)
            if not self._ready and now - self._launched > TEMPLATE_READY_TIMEOUT:
                self._kill_hung(f"did not finish its imports in {TEMPLATE_READY_TIMEOUT:g}s")
            elif self._ready and now - max(oldest, self._ready) > ORDER_TIMEOUT:
                self._kill_hung(f"did not fork a worker in {ORDER_TIMEOUT:g}s")

    def _kill_hung(self, why: str) -> None:
        assert self.template is not None
        log.error("worker template %d %s; killing it", self.template.pid, why)
        self.template.kill()  # its exit is handled as any other

    def close(self) -> None:
        """Stop the template (no worker needs it) and drop the open orders; a worker it forked
        but has not reported yet is stopped."""
        self._restart_at = None
        if self._sock is not None:
            self._loop.forget(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self.template is not None:
            self._loop.forget(self.template.pidfd)
            self.template.kill()
            self.template.reap()
            self.template = None
            collect_strays(self.known(), kill=True)
        for order in [*(order for order, _ in self._orders.values()), *self._waiting]:
            order.abandon()
        self._orders.clear()
        self._waiting.clear()

    # Orders and answers.

    def _send(self, order: StartOrder) -> None:
        assert self._sock is not None
        order_id, self._next_id = self._next_id, self._next_id + 1
        message = json.dumps({"id": order_id, "argv": order.spec.to_argv(), "token": order.token})
        fds = [] if order.ready_w is None else [order.ready_w]
        try:
            socket.send_fds(self._sock, [message.encode()], fds)
        except OSError:  # full, or the template is dying: try again later, or with the next one
            self._waiting.append(order)
            return
        order.sent()
        self._orders[order_id] = (order, time.monotonic())

    def _on_replies(self) -> None:
        while self._sock is not None:
            try:
                data = self._sock.recv(MAX_REPLY_BYTES)
            except (BlockingIOError, ConnectionError):
                return
            if not data:
                return
            reply = json.loads(data)
            if "ready" in reply:
                self._ready = time.monotonic()
                continue
            order, _ = self._orders.pop(reply["id"], (None, 0.0))
            if order is None:
                continue
            if "pid" not in reply:
                self.failed(order, str(reply.get("error")))
                continue
            try:
                process = Process.adopt(int(reply["pid"]))
            except OSError as exc:  # it died at once and was reaped as a stray
                self.failed(order, f"worker {reply['pid']} is gone before it could be adopted: {exc}")
                continue
            self._backoff.reset()
            self.started(order, process)
