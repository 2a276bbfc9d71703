"""The supervisor (arbiter): starts and replaces worker processes, runs the router, obeys signals.

One thread, one poll loop: client and worker sockets, the control socket, a self-pipe for
signals and a pidfd per worker, so every event (a request, a dead worker, SIGTERM) is handled
in order without locks. Workers are fresh interpreters (``python -m workerpool.worker``) that map
the weights themselves; nothing is forked after the model is loaded.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from . import control, metrics, models, reload, runtime, security
from .router import Router, WorkerState
from .units import format_size
from .worker import EXIT_FILE_CHANGED, EXIT_REFUSED

log = logging.getLogger("workerpool.supervisor")

BACKOFF_START = 0.5
BACKOFF_CAP = 30.0
STOP_TIMEOUT = 5.0
DUTY_INTERVAL = 0.01  # seconds between checks of timers: deadlines, heartbeats, the weight file


class StartupError(Exception):
    """The server cannot start (bad model file, endpoint in use); nothing was started."""


@dataclass
class ServeConfig:
    path: str
    workers: int
    model: str | None = None
    bind: str = "tcp://127.0.0.1:5555"
    control: str | None = None
    load: str = "mmap"
    max_queue: int = 1024
    graceful_timeout: float = 30.0
    max_message_size: int | None = None
    heartbeat: float = 1.0
    liveness: int = 5
    log_level: str = "info"
    watch_interval: float | None = 0.5
    reload_timeout: float = 120.0
    backend: str | None = None
    server_keys: security.ServerKeys | None = None


@dataclass
class Child:
    """A worker process the supervisor started."""

    popen: subprocess.Popen
    pidfd: int
    started: float = field(default_factory=time.time)
    ready: bool = False
    stopping: bool = False
    generation: int = 1

    @property
    def pid(self) -> int:
        return self.popen.pid


class Supervisor:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.target = config.workers
        self.children: dict[int, Child] = {}
        self.spawn_at: list[float] = []
        self.failures = 0
        self.refusals = 0
        self.switch_failure: str | None = None  # why a worker could not switch to the current generation
        self.announced = False
        self.reload_waiters: list[tuple[bytes, int, float]] = []
        self.status_waiters: list[tuple[bytes, Future]] = []
        self.memory_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory")
        self.next_watch = 0.0
        self.next_duties = 0.0
        self.stopping = False
        self.stop_deadline = 0.0
        self.kill_deadline: float | None = None

    # Start-up.

    def _claim_control(self, endpoint: str) -> None:
        path = runtime.ipc_path(endpoint)
        if path is None or not os.path.exists(path):
            return
        try:
            control.call(endpoint, "status", timeout=2.0, memory=False)
        except control.ControlError:
            os.unlink(path)  # left behind by a server that died
            return
        raise StartupError(
            f"another workerpool server answers on control endpoint {endpoint}; stop it or pass --control"
        )

    def run(self) -> int:
        try:  # the file and the model, checked once before anything starts
            self.watcher = reload.Watcher(self.config.path, self.config.model)
        except reload.WeightsRefused as exc:
            raise StartupError(str(exc)) from exc
        self.context = zmq.Context()
        self.poller = zmq.Poller()
        self.readers: dict[Any, Callable[[], None]] = {}
        try:
            self._open()
            return self._serve()
        finally:
            for child in list(self.children.values()):
                child.popen.kill()
                child.popen.wait()
                os.close(child.pidfd)
            self.children.clear()
            self.memory_reader.shutdown(wait=True, cancel_futures=True)
            self._close()
            self.context.destroy(linger=0)

    def _read(self, source: Any, handler: Callable[[], None]) -> None:
        """Call ``handler`` whenever ``source`` (a socket or a file descriptor) is readable."""
        self.readers[source] = handler
        self.poller.register(source, zmq.POLLIN)

    def _forget(self, source: Any) -> None:
        del self.readers[source]
        self.poller.unregister(source)

    def _open(self) -> None:
        """Bind the router's sockets and the control socket."""
        config = self.config
        try:
            self.private_dir = tempfile.mkdtemp(prefix="pool-", dir=runtime.runtime_dir())
            self.control_endpoint = config.control or runtime.default_control_endpoint()
        except OSError as exc:
            raise StartupError(f"cannot create the runtime directory: {exc}") from exc
        _check_local(self.control_endpoint)
        self._claim_control(self.control_endpoint)
        secure = None
        if config.server_keys is not None:
            try:
                self.authenticator = config.server_keys.start(self.context)
            except security.KeysError as exc:
                raise StartupError(str(exc)) from exc
            secure = config.server_keys.apply
        for endpoint in (config.bind, config.backend):
            if endpoint and secure is None and not runtime.is_local(endpoint):
                log.warning("%s is open to the network without CURVE keys: anyone who can reach it "
                            "can use it (see --curve-server-key)", endpoint)
        backend = config.backend or f"ipc://{os.path.join(self.private_dir, 'backend.sock')}"
        max_message_size = config.max_message_size or default_max_message_size(self.watcher.current.signature)
        try:
            self.router = Router(
                self.context,
                frontend=config.bind,
                backend=backend,
                max_queue=config.max_queue,
                max_message_size=max_message_size,
                heartbeat=config.heartbeat,
                liveness=config.liveness,
                on_ready=self._on_ready,
                on_lost=self._on_lost,
                on_reload_failed=self._on_reload_failed,
                signature=self.watcher.current.signature,
                secure=secure,
            )
        except zmq.ZMQError as exc:
            raise StartupError(f"cannot bind {config.bind} and {backend}: {exc}") from exc
        self.backend_endpoint = self.router.backend_endpoint
        self.control = self.context.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        old_umask = os.umask(0o177)  # the control socket is for this user only
        try:
            self.control.bind(self.control_endpoint)
        except zmq.ZMQError as exc:
            raise StartupError(f"cannot bind control endpoint {self.control_endpoint}: {exc}") from exc
        finally:
            os.umask(old_umask)
        self.control_bound = True
        self._read(self.router.frontend, self.router.on_frontend)
        self._read(self.router.backend, self.router.on_backend)
        self._read(self.control, self._on_control)

    def _close(self) -> None:
        if getattr(self, "authenticator", None) is not None:
            self.authenticator.stop()
        path = runtime.ipc_path(getattr(self, "control_endpoint", ""))
        if path and os.path.exists(path) and getattr(self, "control_bound", False):
            os.unlink(path)
        shutil.rmtree(getattr(self, "private_dir", ""), ignore_errors=True)

    # The loop.

    def _serve(self) -> int:
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_r, False)
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)
        for signum in handled:
            signal.signal(signum, lambda *_: None)
        self._read(wakeup_r, lambda: self._on_signals(os.read(wakeup_r, 256)))
        log.info("starting %d workers for %s (model %s, %s)", self.target, self.config.path,
                 self.watcher.current.model, self.config.load)
        for _ in range(self.target):
            self._spawn()
        self._announce_if_ready()
        try:
            while not self._finished():
                timeout = DUTY_INTERVAL * 2000 if self._busy() else self.config.heartbeat * 250
                for source, _ in self.poller.poll(timeout):
                    handler = self.readers.get(source)
                    if handler is not None:
                        handler()
                now = time.monotonic()
                if now >= self.next_duties:  # time-driven work, at most every DUTY_INTERVAL
                    self.next_duties = now + DUTY_INTERVAL
                    self._spawn_due()
                    self._tick()
                    self._watch()
                    if self.stopping:
                        self._shutdown_step()
        finally:
            signal.set_wakeup_fd(-1)
            for signum in handled:
                signal.signal(signum, signal.SIG_DFL)
            os.close(wakeup_r)
            os.close(wakeup_w)
        log.info("stopped")
        return 0

    def _busy(self) -> bool:
        return bool(self.router.queue or self.status_waiters or self.stopping)

    def _tick(self) -> None:
        self.router.tick()
        self._answer_reload_waiters()
        self._answer_status_waiters()

    def _finished(self) -> bool:
        return self.stopping and not self.children and self.kill_deadline is not None

    # Workers.

    def _spawn(self, extra: Sequence[str] = (), pass_fds: Sequence[int] = ()) -> Child:
        config = self.config
        command = [
            sys.executable, "-m", "workerpool.worker", config.path,
            "--backend", self.backend_endpoint,
            "--load", config.load,
            "--generation", str(self.watcher.current.generation),
            "--expect", json.dumps(self.watcher.current.identity.as_list()),
            "--heartbeat", str(config.heartbeat),
            "--liveness", str(config.liveness),
            "--log-level", config.log_level,
            "--model", config.model or self.watcher.current.model,
            *extra,
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, close_fds=True,
                                 pass_fds=pass_fds)
        child = Child(popen, os.pidfd_open(popen.pid), generation=self.watcher.current.generation)
        self.children[popen.pid] = child
        self._read(child.pidfd, lambda: self._reap(child))
        log.debug("started worker %d", popen.pid)
        return child

    def _spawn_due(self) -> None:
        now = time.monotonic()
        due = [t for t in self.spawn_at if t <= now]
        if due and not self.stopping and self.watcher.problem is None:
            self.spawn_at = [t for t in self.spawn_at if t > now]
            for _ in due:
                self._spawn()

    def _reap(self, child: Child) -> None:
        code = child.popen.wait()
        self._forget(child.pidfd)
        os.close(child.pidfd)
        del self.children[child.pid]
        why = _describe_exit(code)
        self._worker_exited(child, why)
        if child.stopping or self.stopping:
            log.info("worker %d stopped (%s)", child.pid, why)
            return
        if code == -signal.SIGBUS:
            log.error("worker %d was killed by SIGBUS: %s was truncated or rewritten in place while "
                      "mapped; publish new weights by rename (workerpool publish NEW.bpk %s)",
                      child.pid, self.config.path, self.config.path)
        self._check_weights("worker exit")
        if sum(not c.stopping for c in self.children.values()) + len(self.spawn_at) >= self.target:
            return
        if self.watcher.problem is not None:
            log.warning("worker %d %s; waiting for a valid %s before starting a replacement",
                        child.pid, why, self.config.path)
            self.spawn_at.append(time.monotonic())
            return
        if code == EXIT_FILE_CHANGED:
            log.info("worker %d found %s replaced while it started; starting another",
                     child.pid, self.config.path)
            self._spawn()
            return
        if code == EXIT_REFUSED:  # the same file would be refused again: back off until it changes
            self.refusals += 1
            delay = min(BACKOFF_START * 2 ** (self.refusals - 1), BACKOFF_CAP)
            log.error("worker %d was refused by the router: its model does not fit; trying again in "
                      "%.1fs (%d refusals in a row)", child.pid, delay, self.refusals)
            self.spawn_at.append(time.monotonic() + delay)
            return
        if child.ready:
            log.warning("worker %d %s; starting a replacement", child.pid, why)
            self._spawn()
            return
        self.failures += 1
        delay = min(BACKOFF_START * 2 ** (self.failures - 1), BACKOFF_CAP)
        log.error("worker %d %s before it was ready; restarting in %.1fs (%d failed starts in a row)",
                  child.pid, why, delay, self.failures)
        self.spawn_at.append(time.monotonic() + delay)

    def _worker_exited(self, child: Child, why: str) -> None:
        self.router.worker_exited(child.pid, why)

    def _on_ready(self, worker: WorkerState) -> None:
        child = self._local_child(worker)
        if child is not None:
            self._child_ready(child)

    def _local_child(self, worker: WorkerState) -> Child | None:
        """The process behind a registered worker, if it is ours (a worker host's pids may collide)."""
        return self.children.get(worker.pid) if worker.info.get("local", True) else None

    def _child_ready(self, child: Child) -> None:
        child.ready = True
        self.failures = 0
        self._announce_if_ready()

    def _on_lost(self, worker: WorkerState, why: str) -> None:
        child = self._local_child(worker)
        if child is not None and child.popen.poll() is None:
            log.warning("killing worker %d: %s", worker.pid, why)
            child.popen.kill()

    def _announce_if_ready(self) -> None:
        ready = sum(1 for child in self.children.values() if child.ready)
        if not self.announced and ready >= self.target:
            self.announced = True
            print(self._ready_line(), flush=True)

    def _ready_line(self) -> str:
        current = self.watcher.current
        return (f"workerpool: serving {self.config.path} ({format_size(current.identity.size)}, "
                f"model {current.model}) with {self.target} workers on {self.router.endpoint}")

    # Hot reload.

    def _watch(self) -> None:
        interval = self.config.watch_interval
        now = time.monotonic()
        if interval is not None and now >= self.next_watch and not self.stopping:
            self.next_watch = now + interval
            self._check_weights("watch")

    def _check_weights(self, trigger: str) -> str:
        """Look at the served path; start moving the pool to a new, valid generation."""
        outcome = self.watcher.check(trigger)
        if outcome == "new":
            self.refusals = 0
            self.switch_failure = None
            self._switch()
        return outcome

    def _switch(self) -> None:
        """Move the workers to the watcher's new generation, one at a time."""
        current = self.watcher.current
        self.router.begin_reload(current.generation, current.identity.as_list())

    def _answer_reload_waiters(self) -> None:
        """Answer ``workerpool reload`` once every worker serves its generation, or time is up."""
        if not self.reload_waiters:
            return
        now = time.monotonic()
        starting = any(not child.ready for child in self.children.values())
        done = not starting and self.router.reload_complete() and bool(self.router.workers)
        waiting = []
        for client, generation, deadline in self.reload_waiters:
            current = self.watcher.current.generation
            if done and current >= generation:
                self._control_reply(client, {"result": "reloaded", "generation": current})
            elif self.switch_failure is not None and current == generation:
                self._control_reply(client, {"error": self.switch_failure})
            elif now >= deadline:
                behind = [w.pid for w in self.router.workers.values() if w.generation < generation]
                self._control_reply(client, {
                    "error": f"not every worker reached generation {generation} within "
                    f"{self.config.reload_timeout:g}s (still behind: {behind or 'workers starting'})"
                })
            else:
                waiting.append((client, generation, deadline))
        self.reload_waiters = waiting

    def _on_reload_failed(self, worker: WorkerState, why: str) -> None:
        self.switch_failure = f"worker {worker.pid} could not switch to generation " \
            f"{self.watcher.current.generation}: {why}"

    def _add_worker(self) -> None:
        self.target += 1
        log.info("SIGTTIN: adding a worker (now %d)", self.target)
        self._spawn()

    def _remove_worker(self) -> None:
        if self.target <= 1:
            log.info("SIGTTOU ignored: keeping the last worker")
            return
        self.target -= 1
        log.info("SIGTTOU: removing a worker (now %d)", self.target)
        if self.spawn_at:
            self.spawn_at.pop()
            return
        candidates = [c for c in self.children.values() if not c.stopping]
        self._stop_child(min(candidates, key=lambda c: (c.ready, -c.started)))

    def _stop_child(self, child: Child) -> None:
        """SIGTERM: the worker says goodbye to the router and leaves once its request is done."""
        child.stopping = True
        child.popen.terminate()

    # Signals and shutdown.

    def _on_signals(self, signums: bytes) -> None:
        """The signal numbers Python's wakeup fd received, handled here in the loop, in order."""
        for signum in signums:
            self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            name = signal.Signals(signum).name
            if self.stopping:
                log.warning("%s again: stopping now", name)
                self.stop_deadline = 0.0
            else:
                self._begin_shutdown(name)
        elif signum == signal.SIGTTIN and not self.stopping:
            self._add_worker()
        elif signum == signal.SIGTTOU and not self.stopping:
            self._remove_worker()
        elif signum == signal.SIGHUP and not self.stopping:
            outcome = self._check_weights("SIGHUP")
            if outcome == "unchanged":
                log.info("SIGHUP: %s is unchanged; generation %d keeps serving",
                         self.config.path, self.watcher.current.generation)

    def _begin_shutdown(self, reason: str) -> None:
        self.stopping = True
        self._stop_accepting()
        self.spawn_at.clear()
        self.stop_deadline = time.monotonic() + self.config.graceful_timeout
        log.info("%s: finishing %d unfinished requests (up to %gs), then stopping",
                 reason, self._unfinished(), self.config.graceful_timeout)

    def _shutdown_step(self) -> None:
        now = time.monotonic()
        if self.kill_deadline is None:
            unfinished = self._unfinished()
            if unfinished and now < self.stop_deadline:
                return
            if unfinished:
                log.warning("graceful timeout: failing %d unfinished requests", unfinished)
                self.router.fail_all("shutting_down", "the server stopped before the request finished")
            for child in list(self.children.values()):
                self._stop_child(child)
            self.kill_deadline = now + self._leave_timeout()
        elif now >= self.kill_deadline:
            for child in self.children.values():
                log.warning("worker %d did not stop in %gs; killing it", child.pid, STOP_TIMEOUT)
                child.popen.kill()
            self.kill_deadline = float("inf")

    def _leave_timeout(self) -> float:
        """How long stopped workers get to exit before they are killed."""
        return STOP_TIMEOUT

    def _stop_accepting(self) -> None:
        self.router.accepting = False

    def _unfinished(self) -> int:
        return self.router.busy_count + len(self.router.queue)

    # Control socket.

    def _on_control(self) -> None:
        while True:
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                request = json.loads(frames[-1])
                command = request["command"]
            except (ValueError, KeyError, TypeError, IndexError, RecursionError):
                answer: dict[str, Any] = {"error": "malformed control request"}
            else:
                answer = self._control_command(frames[0], command, request)
            if answer is not None:
                self._control_reply(frames[0], answer)

    def _control_reply(self, client: bytes, answer: dict[str, Any]) -> None:
        try:
            self.control.send_multipart([client, b"", json.dumps(answer).encode()])
        except zmq.ZMQError as exc:
            log.debug("control reply dropped: %s", exc)

    def _control_command(self, client: bytes, command: Any, request: dict) -> dict[str, Any] | None:
        """Answer a control command now, or return None when the answer comes later."""
        if command == "status":
            if not request.get("memory", True):
                return self.status()
            # Reading every worker's smaps takes tens of milliseconds: do it beside the loop,
            # which keeps routing meanwhile, and answer when it is done.
            memory = self.memory_reader.submit(metrics.pool_memory, list(self.children), self.config.path)
            self.status_waiters.append((client, memory))
            return None
        if command == "reload":
            if self.stopping:
                return {"error": "the server is shutting down"}
            outcome = self._check_weights("reload")
            current = self.watcher.current.generation
            if outcome == "unchanged" and self.router.reload_complete():
                return {"result": "unchanged", "generation": current}
            if outcome == "refused":
                return {"error": self.watcher.problem}
            self.reload_waiters.append((client, current, time.monotonic() + self.config.reload_timeout))
            return None
        if command == "check":
            try:
                name, _, signature = reload.validate(str(request.get("path")), self.watcher.current.model)
            except reload.WeightsRefused as exc:
                return {"error": str(exc)}
            mismatch = models.signature_mismatch(self.watcher.current.signature, signature)
            if mismatch:
                return {"error": f"model {name} does not fit the served one: {mismatch}"}
            return {"result": "ok", "model": name}
        return {"error": f"unknown control command {command!r}"}

    def _answer_status_waiters(self) -> None:
        waiting = []
        for client, memory in self.status_waiters:
            if memory.done():
                self._control_reply(client, self.status(memory.result()))
            else:
                waiting.append((client, memory))
        self.status_waiters = waiting

    def status(self, memory: metrics.PoolMemory | None = None) -> dict[str, Any]:
        """The pool's state; per-worker ``memory`` and ``totals`` are None unless ``memory`` is given."""
        registered = {w.pid: w for w in self.router.workers.values() if w.info.get("local", True)}
        remote = [w for w in self.router.workers.values() if not w.info.get("local", True)]
        workers = []
        for child in self.children.values():
            worker = registered.pop(child.pid, None)
            if worker is not None:
                entry = worker.public()
                if child.stopping:
                    entry["state"] = "stopping"
            else:
                entry = {"pid": child.pid, "host": os.uname().nodename,
                         "generation": self.watcher.current.generation,
                         "served": 0, "errors": 0, "started": child.started,
                         "state": "stopping" if child.stopping else "starting"}
            entry["memory"] = memory.workers.get(child.pid) if memory else None
            workers.append(entry)
        for worker in [*registered.values(), *remote]:
            workers.append({**worker.public(), "memory": None})
        current = self.watcher.current
        return {
            "supervisor_pid": os.getpid(),
            "endpoint": self.router.endpoint,
            "model": {
                "name": current.model,
                "path": self.config.path,
                "size": current.identity.size,
                "inode": current.identity.inode,
                "generation": current.generation,
                "load": self.config.load,
                "watch_interval": self.config.watch_interval,
                "last_reload": self.watcher.last_reload,
            },
            "queue": {"depth": len(self.router.queue), "max": self.config.max_queue,
                      "in_flight": self.router.busy_count},
            "workers": sorted(workers, key=lambda w: w["pid"]),
            "totals": memory.totals if memory else None,
        }


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def default_max_message_size(signature: dict[str, Any]) -> int:
    """Room for a batch of 4096 inputs of the model's declared shape (at least 1 MiB); 64 MiB
    when the model declares none."""
    shape, dtype = signature.get("input_shape"), signature.get("input_dtype")
    if not shape or dtype is None or any(d is None for d in shape[1:]):
        return 64 * 1024 * 1024
    sample = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    return max(1024 * 1024, 4096 * sample + 64 * 1024)


def _check_local(endpoint: str) -> None:
    if not runtime.is_local(endpoint):
        raise StartupError(f"the control endpoint {endpoint} must be ipc:// or loopback: it is not "
                           "authenticated")
