"""The supervisor's signals: a handler only writes to a wakeup pipe, and the loop calls
``handle_<name>`` here. TERM/INT stop the pool (the second one at once), TTIN/TTOU scale it by
one worker (they move the target: the supervisor's ``manage_workers`` does the rest), HUP
looks at the weights, CHLD collects processes that are not workers.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable
from contextlib import ExitStack
from typing import Protocol

from ..worker.spec import STOP_SIGNAL
from .role import Pool


class SignalledPool(Pool, Protocol):
    """What the signals act on (``core.Supervisor`` is one): a role's view of the pool, and
    its shutdown."""

    stop_deadline: float

    def begin_shutdown(self, reason: str) -> None: ...


log = logging.getLogger(__name__)

# The signals the loop handles, SIGCHLD aside (ignored by default, so nothing to hold back).
DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU,
                    STOP_SIGNAL)


def _unless_stopping(handle: Callable[[Signals], None]) -> Callable[[Signals], None]:
    """``handle``, skipped once the pool is stopping: scaling or reloading then would only
    start what shutdown is about to stop."""

    @functools.wraps(handle)
    def guarded(signals: Signals) -> None:
        if not signals.pool.stopping:
            handle(signals)

    return guarded


class Signals:
    """The signals of one supervisor, held back until its loop runs, then handled by it."""

    def __init__(self, pool: SignalledPool) -> None:
        self.pool = pool

    def defer(self) -> None:
        """Until the loop takes signals, they are blocked: the kernel keeps them pending, and
        delivers them once it does. Ctrl-C raised at once could land in the template's fork, or
        in a finaliser, where Python prints the exception and drops it; SIGHUP, SIGTTIN and
        SIGTTOU would kill or stop the supervisor mid-start. The template forked meanwhile
        inherits them blocked, and ignores them before it unblocks them."""
        signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED_SIGNALS)

    def take(self) -> ExitStack:
        """Route the signals through the loop from now on; the stack undoes it."""
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_r, False)
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        handlers: dict[int, Callable[[], None]] = {
            signal.SIGTERM: self.handle_term,
            signal.SIGINT: self.handle_int,
            signal.SIGHUP: self.handle_hup,
            signal.SIGTTIN: self.handle_ttin,
            signal.SIGTTOU: self.handle_ttou,
            signal.SIGCHLD: self.handle_chld,
            STOP_SIGNAL: self.handle_usr1,
        }
        for signum in handlers:
            signal.signal(signum, lambda *_: None)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFERRED_SIGNALS)  # those pending reach the pipe now

        def on_signals() -> None:
            self._dispatch(handlers, os.read(wakeup_r, 256))

        self.pool.loop.read(wakeup_r, on_signals)
        restore = ExitStack()
        restore.callback(os.close, wakeup_w)
        restore.callback(os.close, wakeup_r)
        for signum in handlers:
            restore.callback(signal.signal, signum, signal.SIG_DFL)
        restore.callback(signal.set_wakeup_fd, -1)
        return restore

    def _dispatch(self, handlers: dict[int, Callable[[], None]], signums: bytes) -> None:
        for signum in signums:
            handler = handlers.get(signum)
            if handler is not None:
                handler()

    def handle_term(self) -> None:
        self._stop("SIGTERM")

    def handle_int(self) -> None:
        self._stop("SIGINT")

    @_unless_stopping
    def handle_ttin(self) -> None:
        pool = self.pool
        pool.target += 1
        log.info("SIGTTIN: adding a worker (now %d)", pool.target)
        pool.manage_workers()

    @_unless_stopping
    def handle_ttou(self) -> None:
        pool = self.pool
        if pool.target <= 1:
            log.info("SIGTTOU ignored: keeping the last worker")
            return
        pool.target -= 1
        log.info("SIGTTOU: removing a worker (now %d)", pool.target)
        pool.manage_workers()

    def handle_usr1(self) -> None:
        log.info("%s ignored: it is the signal that tells a worker, not the supervisor, to leave "
                 "(to remove a worker, send SIGTTOU)", STOP_SIGNAL.name)

    def handle_chld(self) -> None:
        """A child exited: workers are reaped through their pidfds; this reaps the others."""
        self.pool.starter.collect_strays()

    @_unless_stopping
    def handle_hup(self) -> None:
        pool = self.pool
        pool.changes.read_folders()
        for name, outcome in pool.changes.check("SIGHUP").items():
            if outcome == "unchanged":
                served = pool.models[name]
                log.info("SIGHUP: %s is unchanged; generation %d of %s keeps serving",
                         served.entry.path, served.current.generation, name)

    def _stop(self, name: str) -> None:
        """The first TERM/INT drains gracefully; a second one stops without waiting."""
        if self.pool.stopping:
            log.warning("%s again: stopping now", name)
            self.pool.stop_deadline = 0.0
        else:
            self.pool.begin_shutdown(name)
