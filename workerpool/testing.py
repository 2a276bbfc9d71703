"""Run ``workerpool serve`` or ``workerpool workers`` as a child process: for your tests and
benchmarks, as for ours. Nothing in the pool imports this module.

The line a pool prints on stdout once every worker is ready (``ready_line.py``) is its only
readiness signal: no sleeps, no polling of ports.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Self

from .supervisor.ready_line import Ready, parse_ready_line

LOOPBACK = "tcp://127.0.0.1:*"  # an ephemeral port: parallel runs never collide


def serve_args(
    model: str | os.PathLike | Sequence[str | os.PathLike], workers: int, *args: str, bind: str = LOOPBACK
) -> list[str]:
    """``serve MODEL... --workers N --bind ...``: ``model`` is one model (a file, ``NAME=FILE``
    or a folder) or a list of them; ``args`` come last, so they may override ``bind``."""
    models = [model] if isinstance(model, str | os.PathLike) else list(model)
    return ["serve", *(os.fspath(one) for one in models), "--workers", str(workers), "--bind", bind, *args]


def workers_args(model: str | os.PathLike, connect: str, workers: int, *args: str) -> list[str]:
    """``workers MODEL --connect ENDPOINT --workers N``, then ``args``."""
    return ["workers", os.fspath(model), "--connect", connect, "--workers", str(workers), *args]


class NotReady(RuntimeError):
    """The pool exited, or said something else, before its ready line; or it was too slow."""


def _control_of(args: Sequence[str]) -> str | None:
    """The ``--control`` endpoint ``args`` name (the last one wins, as for argparse)."""
    found = None
    for index, arg in enumerate(args):
        if arg == "--control" and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith("--control="):
            found = arg.partition("=")[2]
    return found


class ServerProcess:
    """``python -m workerpool ARGS`` in a session of its own, so that stopping it reaps
    whatever it started too. Stderr goes to ``log_path`` when given, else to ours; ``timeout``
    is how long start() waits for the ready line unless told otherwise.

    A ``serve`` told no ``--control`` (in ``args`` or ``WORKERPOOL_CONTROL``) gets one in a
    private directory, removed at stop(): otherwise it would take the default socket, which a
    server already running holds. ``control`` is the endpoint either way (None for other
    commands told none)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        timeout: float = 60.0,
    ) -> None:
        args = list(args)
        self.control = _control_of(args) or (os.environ if env is None else env).get("WORKERPOOL_CONTROL")
        self._private_dir: str | None = None
        if args[:1] == ["serve"] and self.control is None:
            self._private_dir = tempfile.mkdtemp(prefix="wp-")  # short: ipc paths are limited
            self.control = f"ipc://{self._private_dir}/control.sock"
            args += ["--control", self.control]
        self.command = [sys.executable, "-m", "workerpool", *args]
        self.env = env
        self.log_path = log_path
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_line = ""
        self.ready: Ready | None = None

    def start(self, timeout: float | None = None) -> Self:
        """Start the process and wait up to ``timeout`` seconds for its ready line.

        Raises NotReady otherwise and leaves the process as it is, for the caller to read its
        exit code; stop() reaps it (entering a ``with`` block does so itself)."""
        path = self.log_path
        with open(path, "wb") if path is not None else contextlib.nullcontext() as log:
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                env=self.env, start_new_session=True,
            )
        self.ready_line = self.read_line(self.timeout if timeout is None else timeout)
        self.ready = parse_ready_line(self.ready_line)
        if self.ready is None:
            name = " ".join(self.command[2:4])
            raise NotReady(f"{name} did not become ready: {self.ready_line!r}\n{self.log()}")
        return self

    @property
    def endpoint(self) -> str:
        """The endpoint its ready line names; there is none before start() succeeds."""
        if self.ready is None:
            raise RuntimeError("no ready line yet")
        return self.ready.endpoint

    def read_line(self, timeout: float) -> str:
        """One line of the process's stdout, or what came of it by EOF or ``timeout``.

        Reads a byte at a time: nothing past the line is taken from the pipe."""
        assert self.proc is not None and self.proc.stdout is not None
        data = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    break
                byte = os.read(self.proc.stdout.fileno(), 1)
                if not byte:
                    break
                data += byte
        return data.decode(errors="replace")

    def log(self) -> str:
        """What the process wrote to stderr so far ('' when it was not sent to a file)."""
        if self.log_path is None or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and up to ``timeout`` seconds to finish, then SIGKILL; then SIGKILL what is
        left of its session. Returns the exit code (None if never started); safe to repeat."""
        code = self._reap(timeout)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None
        return code

    def _reap(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
