"""The supervisor's side of the warm template (``template.py``): start it, ask it for workers,
adopt what it forks, and restart it when it dies or hangs."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..control.status import TemplateStatus
from ..events.loop import Loop
from ..linux import controls, procfs
from ..worker import template
from .process import Backoff, Process, describe_exit, python_env
from .starters import Failed, Started, StartOrder

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 4096
TEMPLATE_READY_TIMEOUT = 120.0  # seconds a template may take to import everything (a big model library)
ORDER_TIMEOUT = 10.0  # seconds a ready template may take to fork one worker (it takes milliseconds)
TEMPLATE_STABLE = 30.0  # seconds of life after which a template's earlier deaths are forgiven
MAX_PID = 1 << 22  # the kernel's limit (pid_max): a reply naming more is nonsense


class TemplateStarter:
    """Workers forked from a warm template, restarted (with back-off) when it dies; workers
    already running are the supervisor's children and are not touched."""

    def __init__(self, started: Started, failed: Failed, *, models: Callable[[], list[str]], log_level: str,
                 workers: Callable[[], set[int]], private: Callable[[], Iterable[int]] = tuple) -> None:
        self.started, self.failed = started, failed
        self.models = models  # the served models' factories, for a restarted template to import
        self.log_level = log_level
        self.workers = workers  # the pids of the supervisor's workers
        self.private = private  # descriptors of the supervisor's that a forked template closes
        self.template: Process | None = None
        self.restarts = 0
        self._sock: socket.socket | None = None
        self._orders: dict[int, tuple[StartOrder, float]] = {}  # id -> the order, when it was sent
        self._waiting: list[StartOrder] = []  # until a template is up (or its socket has room)
        self._next_id = 1
        self._backoff = Backoff()
        self._restart_at: float | None = None
        self._launched = self._ready = 0.0  # monotonic times; ready 0: not yet
        self._killed = False  # killed as hung: its exit is on the way
        self._loop: Loop

    @property
    def pending(self) -> int:
        return len(self._orders) + len(self._waiting)

    def tokens(self) -> set[str]:
        return {order.token for order, _ in self._orders.values()} | {o.token for o in self._waiting}

    def pending_models(self) -> Counter[str]:
        orders = [order for order, _ in self._orders.values()] + self._waiting
        return Counter(model.name for order in orders for model in order.spec.models)

    def forget_models(self, kept: set[str]) -> None:
        """Tell the template to drop what it built of any other model. Best effort: a template
        that misses it (its socket full, or it is dying) drops them at its next order."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps({"keep": sorted(kept)}).encode())

    def open(self, loop: Loop) -> None:
        """Become a subreaper, then start the template. While this process runs no thread of
        its own yet, the template is forked from it: the supervisor, the template and every
        worker then share one interpreter's pages. Later (a restart) it is a fresh interpreter."""
        controls.become_subreaper()
        self._loop = loop
        loop.every_tick(self._duties)
        self._launch(fork=threading.active_count() == 1)

    def start(self, order: StartOrder) -> None:
        self._waiting.append(order)
        self._send_waiting()

    def collect_strays(self) -> None:
        """Reap the exited children nobody else will: an intermediate whose template died, a
        worker refused by the router, a model's orphaned subprocess. Not while orders are out:
        a worker reported but not adopted yet keeps its exit status for its adoption."""
        if not self._orders:
            self._strays()

    def status(self, memory: Mapping[int, Any]) -> TemplateStatus | None:
        pid = self.template.pid if self.template else None
        return {"pid": pid, "restarts": self.restarts, "memory": memory.get(pid) if pid else None}

    def close(self) -> None:
        """Stop the template (no worker needs it) and drop the open orders."""
        self._restart_at = None
        if self.template is not None:
            template = self._detach()
            template.kill()
            template.reap()
        for order in [*(order for order, _ in self._orders.values()), *self._waiting]:
            order.abandon()
        self._orders.clear()
        self._waiting.clear()

    # The template's life.

    def _launch(self, *, fork: bool) -> None:
        try:
            self.template, ours = self._start(fork=fork)
        except OSError as exc:
            self._template_failed("-", f"could not be started: {exc}")
            return
        ours.setblocking(False)
        self._sock = ours
        self._loop.read(ours.fileno(), self._on_replies)
        self._loop.read(self.template.pidfd, self._on_exit)
        self._launched, self._ready, self._killed = time.monotonic(), 0.0, False
        log.debug("template %d started (%s)", self.template.pid, "forked" if fork else "spawned")
        self._send_waiting()

    def _start(self, *, fork: bool) -> tuple[Process, socket.socket]:
        """The template and the supervisor's end of the socket pair to it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            return (self._fork(ours, theirs) if fork else self._spawn(theirs)), ours
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()

    def _fork(self, ours: socket.socket, theirs: socket.socket) -> Process:
        supervisor = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        gc.collect()
        gc.freeze()  # neither process traverses these objects again, so their pages stay shared
        pid = os.fork()
        if pid == 0:
            ours.close()
            for fd in self.private():
                os.close(fd)
            template.run(theirs, supervisor)
        return Process.adopt(pid)

    def _spawn(self, theirs: socket.socket) -> Process:
        argv = [sys.executable, "-m", "workerpool.worker.child", "template", "--fd", str(theirs.fileno()),
                "--parent", str(os.getpid()), "--log-level", self.log_level,
                *(argument for model in self.models() for argument in ("--model", model))]
        env = dict(python_env(), OPENBLAS_NUM_THREADS="1")  # no BLAS threads in the template
        return Process.spawn(argv, env, pass_fds=(theirs.fileno(),))

    def _detach(self) -> Process:
        """Stop listening to the template; the caller ends it or has seen it end."""
        assert self.template is not None and self._sock is not None
        template, self.template = self.template, None
        self._loop.forget(self._sock.fileno())
        self._loop.forget(template.pidfd)
        self._sock.close()
        self._sock = None
        return template

    def _on_exit(self) -> None:
        """The template died: its answers so far still count, its open orders are asked again
        of the next one, and it comes back after a back-off."""
        self._on_replies()
        template = self._detach()
        why = describe_exit(template.reap())
        orders = [order for order, _ in self._orders.values()]
        self._orders.clear()
        for order in orders:
            try:
                order.renew()
            except OSError as exc:  # no descriptors for its new pipe
                self.failed(order, f"cannot ask again for a worker: {exc}")
            else:
                self._waiting.append(order)
        self._strays()
        self._template_failed(str(template.pid), why)

    def _template_failed(self, pid: str, why: str) -> None:
        delay = self._backoff.fail()
        waiting = f"; {len(self._waiting)} workers wait for it" if self._waiting else ""
        log.error("worker template %s %s; starting another in %.1fs (running workers are not "
                  "affected%s)", pid, why, delay, waiting)
        self._restart_at = time.monotonic() + delay

    def _duties(self) -> None:
        """Restart a dead template when its back-off is over; kill one that hangs."""
        now = time.monotonic()
        if self._restart_at is not None and now >= self._restart_at:
            self._restart_at = None
            self.restarts += 1
            self._launch(fork=False)
        if self.template is None or self._killed:
            return
        self._send_waiting()
        oldest = min((sent for _, sent in self._orders.values()), default=now)
        if not self._ready and now - self._launched > TEMPLATE_READY_TIMEOUT:
            self._kill_hung(f"did not finish its imports in {TEMPLATE_READY_TIMEOUT:g}s")
        elif self._ready and now - max(oldest, self._ready) > ORDER_TIMEOUT:
            self._kill_hung(f"did not fork a worker in {ORDER_TIMEOUT:g}s")
        elif self._ready and now - self._ready > TEMPLATE_STABLE:
            self._backoff.reset()

    def _kill_hung(self, why: str) -> None:
        assert self.template is not None
        log.error("worker template %d %s; killing it", self.template.pid, why)
        self._killed = True
        self.template.kill()  # its exit is handled as any other

    def _strays(self) -> None:
        """Reap this process's exited children that are neither workers nor the template. (A
        worker a dying template forked but could not report is not one of ours: the router
        refuses it, as its token is unknown, and it exits.)"""
        ours = self.workers() | ({self.template.pid} if self.template else set())
        for pid in procfs.child_pids() - ours:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    # Orders and answers.

    def _send_waiting(self) -> None:
        while self._waiting and self._sock is not None:
            order = self._waiting[0]
            order_id = self._next_id
            message = json.dumps({"id": order_id, "spec": order.spec.to_data(), "token": order.token}).encode()
            if len(message) > template.MAX_ORDER_BYTES:  # the template would end at it
                self._waiting.pop(0)
                self.failed(order, f"its order is {len(message)} bytes, over the template's "
                                   f"{template.MAX_ORDER_BYTES}")
                continue
            fds = [] if order.passed is None else [order.passed]
            try:
                socket.send_fds(self._sock, [message], fds)
            except OSError:  # full, or the template is dying: later, or to the next one
                return
            self._waiting.pop(0)
            self._next_id += 1
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
            reply = self._checked(data)
            if reply is None:
                self._kill_hung(f"answered {data[:100]!r}")  # its open orders are asked again
                return
            self._on_reply(reply)
        if not self._orders:
            self._strays()

    def _checked(self, data: bytes) -> dict[str, Any] | None:
        """The template's reply if it is one it could send: ready, or an id with a pid that is
        no process of ours yet (and could be a pid at all), or with an error."""
        try:
            reply = json.loads(data)
        except ValueError:
            return None
        if not isinstance(reply, dict):
            return None
        if reply.get("ready") is True:
            return reply
        pid, ours = reply.get("pid"), self.workers() | {self.template.pid if self.template else 0}
        good_pid = type(pid) is int and 0 < pid <= MAX_PID and pid not in ours
        good_error = pid is None and isinstance(reply.get("error"), str)
        return reply if type(reply.get("id")) is int and (good_pid or good_error) else None

    def _on_reply(self, reply: dict[str, Any]) -> None:
        if reply.get("ready") is True:
            self._ready = time.monotonic()
            return
        order, _ = self._orders.pop(reply["id"], (None, 0.0))
        pid = reply.get("pid")
        if order is None:  # not asked for (or asked again since): not ours to run
            _kill_child(pid)
            return
        if pid is None:
            self.failed(order, reply["error"])
            return
        try:
            process = Process.adopt(pid)
        except OSError as exc:
            _kill_child(pid)
            self.failed(order, f"worker {pid} could not be adopted: {exc}")
            return
        self.started(order, process)


def _kill_child(pid: int | None) -> None:
    """Kill ``pid`` if it is a child of this process, not reaped yet (so not a reused pid)."""
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # ours, or it raises
        os.kill(pid, signal.SIGKILL)
