"""The supervisor (arbiter): keeps N worker processes alive, obeys signals, watches the weights.

One thread runs one :class:`~workerpool.events.loop.Loop`; signals reach it through
:class:`~workerpool.supervisor.signals.Signals`. What differs between ``serve`` and ``workers``
is the :class:`~workerpool.supervisor.role.Role` the supervisor is composed with (the local
router with its control socket, or the uplink to a remote router); the supervisor itself is
never subclassed.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import signal
import time
from contextlib import ExitStack

from ..config.pool import POLLS_PER_HEARTBEAT, PoolConfig, StartupError
from ..errors import ErrorCode
from ..events.loop import Loop
from ..units import format_size
from ..weights.reload import WeightsRefused
from ..weights.served import ServedModels
from ..worker.spec import EXIT_FILE_CHANGED, EXIT_RECYCLED, EXIT_REFUSED, WorkerSpec
from .headcount import Correction, correct
from .model_changes import ModelChanges
from .process import Backoff, Child, Process, describe_exit
from .ready_line import worker_count
from .role import OpenRole, Role
from .signals import Signals
from .starters import SpawnStarter, Starter, StartOrder
from .systemd import Notifier
from .template_starter import TemplateStarter

log = logging.getLogger(__name__)

KILLS_NAMED = 10  # pids a warning about workers killed at a stop names; the rest are counted


class Supervisor:
    """Keeps the worker count (``manage_workers``: replacing the dead, with back-off after
    failed starts; TTIN/TTOU move its target), reloads a model whose file changed (or on HUP,
    which reads model folders again too), adds and removes models, and shuts down gracefully on
    TERM/INT."""

    def __init__(self, config: PoolConfig, open_role: OpenRole) -> None:
        self.config = config
        self.open_role = open_role
        self.role: Role  # made in run(), over the models it loads
        self.target = config.workers  # what TTIN/TTOU move; the role may ask for more (surge)
        self.children: dict[int, Child] = {}
        self.spawn_at: list[float] = []  # monotonic times of restarts waiting out a back-off
        self.start_failures = Backoff()
        self.refusals = Backoff()
        self.announced = False
        self.notifier = Notifier()
        self.replacements = 0  # workers that were serving and died, replaced
        self.stopping = False
        self.stop_deadline = 0.0
        self.kill_deadline: float | None = None
        self.stopped_from: tuple[float, int] | None = None  # when the workers were told to stop, and how many
        self.loop = Loop(idle_timeout=config.heartbeat / POLLS_PER_HEARTBEAT)
        self.signals = Signals(self)
        self.threads_per_worker = config.cpu_budget()  # fixed at start: TTIN/TTOU leave it
        self.models: ServedModels
        self.changes: ModelChanges
        self._next_watch = 0.0
        self.starter: Starter = (
            TemplateStarter(self._started, self._start_failed, log_level=config.log_level,
                            models=lambda: [served.current.model for served in self.models],
                            workers=lambda: set(self.children), private=lambda: self.models.held)
            if config.start == "fork" else SpawnStarter(self._started))

    def run(self) -> int:
        raise_fd_limit()
        try:  # the files and the models, checked once before anything starts
            # A copy of the weights per worker (--load copy) prepares nothing to share.
            self.models = ServedModels(self.config.models, self.config.cache_dir if self.config.load == "mmap" else None)
        except WeightsRefused as exc:
            raise StartupError(str(exc)) from exc
        _check_memory_limit(self.config, max(served.current.identity.size for served in self.models))
        if (crowded := self.config.crowding()) is not None:
            log.warning("%s", crowded)
        self.loop.every_tick(self._duties, urgent=lambda: self.stopping,  # before the role's duties
                             due=lambda: min(self.spawn_at, default=None))
        with ExitStack() as cleanup:
            self.signals.defer()
            self.starter.open(self.loop)  # first: a template is forked before any thread
            cleanup.callback(self.starter.close)  # in case the role cannot open; else _kill_all
            self.role = self.open_role(self, cleanup)
            self.changes = ModelChanges(self.models, self.config, self.role, self.notifier, self.starter,
                                        self.refusals, self._tell_status)
            gc.collect()
            gc.freeze()  # what starting made lives on: collections in the loop never traverse it again
            cleanup.callback(self._kill_all)  # runs before the role's own clean-up
            cleanup.enter_context(self.signals.take())
            log.info("starting %s for %s (%s, %s, %d BLAS thread%s each)",
                     worker_count(self.target), self.models.described(), self.config.load,
                     "forked from a template" if self.config.start == "fork" else "spawned",
                     self.threads_per_worker, "" if self.threads_per_worker == 1 else "s")
            self.manage_workers()
            self.announce_if_ready()
            while not self._finished():
                self.loop.turn()
        log.info("stopped%s", "" if self.stopped_from is None else
                 f": {worker_count(self.stopped_from[1])} in {time.monotonic() - self.stopped_from[0]:.1f}s")
        return 0

    def _duties(self) -> None:
        self.notifier.ping()
        self.manage_workers()
        self._watch()
        if self.changes.reloading and not self.stopping and self.role.reload_done():
            self.changes.reloading = False
            self.notifier.ready(self._summary())
        elif self.models.holds_previous and not (self.changes.reloading or self.starter.pending) \
                and all(c.ready for c in self.children.values()):  # none serves or starts on it
            self.models.release_previous()
        if self.stopping:
            self._shutdown_step()
        else:
            self._kill_overdue()

    def _kill_overdue(self) -> None:
        """A worker outstaying its stop (its model ignores the signal) keeps the pool one over."""
        deadline = time.monotonic() - self.role.stop_patience
        for child in self.children.values():
            if child.stopping and child.told_to_stop < deadline:
                log.warning("worker %d did not leave within %gs of being told to; killing it",
                            child.pid, self.role.stop_patience)
                child.told_to_stop = float("inf")  # once: its exit is on the way
                child.kill()

    def _finished(self) -> bool:
        return self.stopping and not self.children and self.kill_deadline is not None

    def _kill_all(self) -> None:
        self.starter.close()  # first, or it could start a worker after the others are gone
        for child in list(self.children.values()):
            child.kill()
            child.reap()
            child.close_ready_pipe()
        self.children.clear()

    # Workers.

    def manage_workers(self) -> int:
        """Close the gap between the workers wanted and those running, starting or scheduled
        (``headcount.py``), on every tick and after an event that opens one; how many it started."""
        if self.stopping:
            return 0
        correction = self._correction()
        if correction.cancel:
            self.spawn_at = sorted(self.spawn_at)[:-correction.cancel]
        for child in correction.stop:
            self.stop_child(child)
        for _ in range(correction.start):
            self.spawn()
        return correction.start

    def _correction(self) -> Correction:
        now = time.monotonic()
        self.spawn_at = [t for t in self.spawn_at if t > now]  # those due count as missing
        running = [c for c in self.children.values() if not c.stopping]
        return correct(self.target + self.role.surge, running, self.starter.pending,
                       len(self.spawn_at), self.models.generations())

    def spawn(self) -> None:
        """Start a worker; when the system refuses (no descriptors, no processes left), try
        again after a back-off instead of failing the pool."""
        mapping = self.starter.pending_models()
        mapping.update(name for c in self.children.values() if not c.stopping for name in c.generations)
        spec = WorkerSpec(
            models=self.models.wanted(mapping),
            backend=self.role.backend,
            load=self.config.load,
            heartbeat=self.config.heartbeat,
            liveness=self.config.liveness,
            log_level=self.config.log_level,
            max_memory=self.config.max_worker_memory,
            parent=os.getpid(),
            threads=self.threads_per_worker,
            cache_dir=self.config.cache_dir,
        )
        order = StartOrder.make(self.role.prepare(spec), ready_pipe=self.role.ready_pipe)
        try:
            self.starter.start(order)
        except OSError as exc:
            self._start_failed(order, str(exc))

    def _started(self, order: StartOrder, process: Process) -> None:
        child = order.child(process)
        self.children[child.pid] = child
        self.loop.read(child.pidfd, lambda: self._reap(child))
        log.debug("started worker %d", child.pid)
        self.role.child_started(child)

    def _start_failed(self, order: StartOrder, why: str) -> None:
        order.abandon()
        if self.stopping:
            return
        delay = self.start_failures.fail()
        log.error("cannot start a worker: %s; trying again in %.1fs", why, delay)
        self.spawn_at.append(time.monotonic() + delay)

    def helper_pids(self) -> list[int]:
        """The pool's processes that are neither the supervisor nor a worker: the template."""
        return [] if self.starter.template is None else [self.starter.template.pid]

    def _reap(self, child: Child) -> None:
        self.loop.forget(child.pidfd)
        code = child.reap()
        del self.children[child.pid]
        why = describe_exit(code)
        if child.stopping or self.stopping:
            log.log(logging.DEBUG if self.stopping else logging.INFO, "worker %d stopped (%s)", child.pid, why)
            self.role.child_exited(child, why)
            return
        if code == -signal.SIGBUS:
            log.error("worker %d was killed by SIGBUS: a weight file it mapped (%s) was truncated or "
                      "rewritten in place; publish new weights by rename (workerpool publish NEW.bpk "
                      "MODEL.bpk)", child.pid, ", ".join(served.entry.path for served in self.models))
        # Before the role hears of it: a host's rollout may close the gap, hiding the log and back-off.
        if self._correction().start:  # not when the pool was over its count
            self._replace(child, code, why)
        self.role.child_exited(child, why)
        self.changes.check("worker exit")
        self.manage_workers()

    def _replace(self, child: Child, code: int, why: str) -> None:
        """Say why a worker that died is replaced; a failed start waits out a back-off first
        (``manage_workers`` starts the others at once)."""
        if code == EXIT_FILE_CHANGED:
            log.info("worker %d found a weight file replaced while it started; starting another", child.pid)
        elif code == EXIT_RECYCLED:
            log.info("worker %d recycled (its private memory passed --max-worker-memory); starting "
                     "a replacement", child.pid)
        elif code == EXIT_REFUSED:  # the same file would be refused again: back off until it changes
            delay = self.refusals.fail()
            log.error("worker %d was refused by the router: its model does not fit; trying again in "
                      "%.1fs (%d refusals in a row)", child.pid, delay, self.refusals.failures)
            self.spawn_at.append(time.monotonic() + delay)
        elif child.ready:
            log.warning("worker %d %s; starting a replacement", child.pid, why)
            self.replacements += 1
        else:
            delay = self.start_failures.fail()
            log.error("worker %d %s before it was ready; restarting in %.1fs (%d failed starts in a "
                      "row)", child.pid, why, delay, self.start_failures.failures)
            self.spawn_at.append(time.monotonic() + delay)

    def child_ready(self, child: Child) -> None:
        """A worker built its model and can serve: the start succeeded."""
        child.ready = True
        self.start_failures.reset()
        self.announce_if_ready()

    def announce_if_ready(self) -> None:
        ready = sum(1 for child in self.children.values() if child.ready and not child.stopping)
        if not self.announced and ready >= self.target:
            self.announced = True
            paths, kinds = self.models.named()
            print(self.role.ready_line(paths, format_size(self.models.size), kinds, self.target), flush=True)
            self.notifier.ready(self._summary())

    def _summary(self) -> str:
        """One line for the service manager's status."""
        ready = sum(1 for child in self.children.values() if child.ready and not child.stopping)
        return self.models.summary(worker_count(ready))

    def stop_child(self, child: Child) -> None:
        child.terminate()

    # Weights.

    def _watch(self) -> None:
        interval = self.config.watch_interval
        now = time.monotonic()
        if interval is not None and now >= self._next_watch and not self.stopping:
            self._next_watch = now + interval
            self.changes.check("watch")

    def _tell_status(self) -> None:
        if self.announced:
            self.notifier.status(self._summary())

    # Shutdown.

    def begin_shutdown(self, reason: str) -> None:
        """Stop accepting requests and starting workers; drain, then stop the workers."""
        self.stopping = True
        self.notifier.stopping(f"{reason}: draining")
        requests = self.role.requests
        if requests is not None:
            requests.stop_accepting()
        self.spawn_at.clear()
        self.starter.close()
        self.stop_deadline = time.monotonic() + self.config.graceful_timeout
        log.info("%s: finishing %d unfinished requests (up to %gs), then stopping",
                 reason, self._unfinished(), self.config.graceful_timeout)

    def _unfinished(self) -> int:
        return 0 if self.role.requests is None else self.role.requests.unfinished

    def _shutdown_step(self) -> None:
        now = time.monotonic()
        if self.kill_deadline is None:
            unfinished = self._unfinished()
            if unfinished and now < self.stop_deadline:
                return
            if unfinished and self.role.requests is not None:
                log.warning("graceful timeout: failing %d unfinished requests", unfinished)
                self.role.requests.fail_all(ErrorCode.SHUTTING_DOWN,
                                            "the server stopped before the request finished")
            self.stopped_from = (now, len(self.children))
            for child in list(self.children.values()):
                self.stop_child(child)
            self.kill_deadline = now + self.role.leave_timeout
        elif now >= self.kill_deadline:
            log.warning("%s did not stop in %gs; killing: %s", worker_count(len(self.children)),
                        self.role.leave_timeout, _some(sorted(self.children)))
            for child in self.children.values():
                child.kill()
            self.kill_deadline = float("inf")


def _check_memory_limit(config: PoolConfig, size: int) -> None:
    """A limit below a private copy of the weights would recycle a worker after every request."""
    limit = config.max_worker_memory
    if limit is not None and config.load == "copy" and limit <= size:
        raise StartupError(f"--max-worker-memory {format_size(limit)} is below the private copy of "
                           f"the weights each worker holds with --load copy ({format_size(size)})")


def _some(pids: list[int]) -> str:
    """The first ``KILLS_NAMED`` of ``pids``, and an ellipsis for the rest."""
    return " ".join(map(str, pids[:KILLS_NAMED])) + (" ..." if len(pids) > KILLS_NAMED else "")


def raise_fd_limit() -> None:
    """Let the pool use every descriptor the hard limit allows: each client connection, worker
    and pidfd costs some, and running out must not be what stops it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.debug("raised the open file limit from %d to %d", soft, hard)
