"""Worker processes as the supervisor sees them: start one, signal it, reap it, back off.

A :class:`Child` owns its ``Popen`` and a pidfd (readable once the process exits, so the
supervisor's poll loop learns of a death as an ordinary event), and, when asked for, the
non-blocking read end of a "model loaded" pipe.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace

from .worker_spec import TOKEN_ENV, WorkerSpec

TOKEN_BYTES = 16


@dataclass(eq=False)
class Child:
    """A worker process this supervisor started; its pid is known from spawning it, never
    from anything the worker says."""

    popen: subprocess.Popen[bytes]
    pidfd: int
    generation: int
    token: str  # secret, given to the worker in its environment; it proves itself with it
    ready_pipe: int | None = None  # read end: the worker writes once its model is built
    started: float = field(default_factory=time.time)
    ready: bool = False
    stopping: bool = False

    @classmethod
    def spawn(cls, spec: WorkerSpec, *, ready_pipe: bool = False) -> Child:
        """Start ``python -m workerpool.worker`` for ``spec`` (a fresh interpreter)."""
        ready_r = ready_w = None
        if ready_pipe:
            ready_r, ready_w = os.pipe()
            os.set_blocking(ready_r, False)
            spec = replace(spec, ready_fd=ready_w)
        token = secrets.token_hex(TOKEN_BYTES)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env[TOKEN_ENV] = token  # not in argv, which every user on the machine can read
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "workerpool.worker", *spec.to_argv()],
                stdin=subprocess.DEVNULL, env=env, close_fds=True,
                pass_fds=() if ready_w is None else (ready_w,),
            )
        except BaseException:
            if ready_r is not None:
                os.close(ready_r)
            raise
        finally:
            if ready_w is not None:
                os.close(ready_w)
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError:
            popen.kill()
            popen.wait()
            if ready_r is not None:
                os.close(ready_r)
            raise
        return cls(popen, pidfd, spec.generation, token, ready_r)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def terminate(self) -> None:
        """SIGTERM: the worker says goodbye to its router and leaves once its request is done."""
        self.stopping = True
        self.popen.terminate()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def close_ready_pipe(self) -> None:
        if self.ready_pipe is not None:
            os.close(self.ready_pipe)
            self.ready_pipe = None

    def reap(self) -> int:
        """Collect the exit status and close the pidfd; returns the exit code. The ready pipe
        stays open until its reader sees the end of it."""
        code = self.popen.wait()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        return code


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
