"""Processes as the supervisor sees them: start one, signal it, reap it, back off.

A :class:`Process` holds a pidfd (readable once the process exits, so the supervisor's poll
loop learns of a death as an ordinary event). Signals go through the pidfd, so a pid reused by
another process is never signalled. A process is either spawned (a fresh interpreter, with its
``Popen``) or adopted: forked from the warm template and reparented to the supervisor, which
reaps it with ``waitid`` on the pidfd.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..worker.spec import CONTROL_SIGNALS, STOP_SIGNAL


@dataclass(eq=False)
class Process:
    """A process this supervisor started (or adopted); its pid is known from starting it, never
    from anything the process says."""

    pid: int
    pidfd: int
    popen: subprocess.Popen[bytes] | None = None  # None: adopted, reaped through the pidfd
    started: float = field(default_factory=time.time)
    returncode: int | None = None  # once reaped, as reap() returned it

    @classmethod
    def spawn(cls, argv: Sequence[str], env: dict[str, str], pass_fds: Sequence[int] = ()) -> Process:
        """Start ``argv`` with stdin closed and no descriptors but ``pass_fds`` inherited. It
        starts with the supervisor's control signals blocked (the mask survives exec), so that
        a Ctrl-C to the process group waits until it ignores them (``child.py``); here one
        arriving meanwhile is only delayed, never lost."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, CONTROL_SIGNALS)
        try:
            popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, env=env, close_fds=True,
                                     pass_fds=tuple(pass_fds))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError:
            popen.kill()
            popen.wait()
            raise
        return cls(popen.pid, pidfd, popen)

    @classmethod
    def adopt(cls, pid: int) -> Process:
        """Take charge of ``pid``, which must be this process's child (a forked worker,
        reparented here); OSError when it is not, or is already gone."""
        pidfd = os.pidfd_open(pid)
        try:  # ChildProcessError unless it is our child; None while it runs
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except OSError:
            os.close(pidfd)
            raise
        return cls(pid, pidfd)

    def send(self, signum: int) -> None:
        """Signal the process unless it has already been reaped."""
        if self.pidfd < 0:
            return
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send(signal.SIGKILL)

    def alive(self) -> bool:
        """Still running (not even a zombie waiting to be reaped)."""
        if self.pidfd < 0:
            return False
        return os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def reap(self) -> int:
        """Collect the exit status (waiting for it) and close the pidfd; returns the exit code,
        negative for a signal, as ``Popen.returncode`` has it."""
        if self.popen is not None:
            code = self.popen.wait()
        else:
            result = os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED)
            assert result is not None  # without WNOHANG, waitid waits
            code = result.si_status if result.si_code == os.CLD_EXITED else -result.si_status
        os.close(self.pidfd)
        self.pidfd = -1
        self.returncode = code
        return code


@dataclass(eq=False, kw_only=True)
class Child(Process):
    """A worker process, and what the supervisor knows of it."""

    generations: dict[str, int]  # of each model it serves: started on, then switched, loaded or dropped
    token: str  # secret, given to the worker in its environment; it proves itself with it
    ready_pipe: int | None = None  # read end: the worker writes once its model is built
    link: socket.socket | None = None  # the router's end of its link, until the router takes it
    address: bytes | None = None  # what the router knows its link by, once it took it
    ready: bool = False
    stopping: bool = False
    told_to_stop: float = 0.0  # monotonic time of terminate()

    def behind(self, newest: Mapping[str, int]) -> bool:
        """Whether it serves an older generation of a model than ``newest``'s, or a model no
        longer served."""
        return any(name not in newest or generation < newest[name] for name, generation in self.generations.items())

    def terminate(self) -> None:
        """The worker says goodbye to its router and leaves once its request is done."""
        self.stopping = True
        self.told_to_stop = time.monotonic()
        self.send(STOP_SIGNAL)

    def close_ready_pipe(self) -> None:
        if self.ready_pipe is not None:
            os.close(self.ready_pipe)
            self.ready_pipe = None


def python_env() -> dict[str, str]:
    """The environment for a fresh interpreter that must import this package as we do."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


class Backoff:
    """Exponential delays for repeated failures, reset by a success."""

    def __init__(self, start: float = 0.5, cap: float = 30.0) -> None:
        self.start = start
        self.cap = cap
        self.failures = 0

    def fail(self) -> float:
        """Count a failure; the delay before the next attempt."""
        self.failures += 1
        return min(self.start * 2 ** (self.failures - 1), self.cap)

    def reset(self) -> None:
        self.failures = 0


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
