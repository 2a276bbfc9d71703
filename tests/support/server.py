"""Run a real ``workerpool serve`` for a test, and make sure nothing it started outlives the test."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from support.paths import MODELS
from workerpool.control import client as control
from workerpool.testing import ServerProcess, serve_args, workers_args

START = "fork"  # how servers start their workers; the start_method fixture sets it


class Server(ServerProcess):
    """A ``workerpool serve`` subprocess on an ephemeral loopback port and a private ipc directory.

    The tests directory is on the server's PYTHONPATH, for the test models (``slow_model`` ...).
    """

    def __init__(self, model: str | os.PathLike, *args: str, workers: int = 2) -> None:
        self.dir = tempfile.mkdtemp(prefix="wp-")  # short: ipc paths are limited to ~100 bytes
        self.control = f"ipc://{self.dir}/control"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(MODELS), os.environ.get("PYTHONPATH", "")]))
        super().__init__(self.arguments(model, workers, args), env=env,
                         log_path=os.path.join(self.dir, "server.log"))
        self._known: dict[int, psutil.Process] = {}
        self._final_log: str | None = None

    def arguments(self, model: str | os.PathLike, workers: int, args: tuple[str, ...]) -> list[str]:
        return serve_args(model, workers, "--control", self.control, "--start", START, *args)

    def start(self, timeout: float | None = None) -> Server:
        super().start(timeout)
        self.track()
        return self

    def log(self) -> str:
        """Everything the server logged so far (kept after stop())."""
        return super().log() if self._final_log is None else self._final_log

    def status(self, timeout: float = 10.0, *, memory: bool = True) -> dict:
        return control.call(self.control, "status", timeout=timeout, memory=memory)

    def worker_pids(self) -> list[int]:
        return [w["pid"] for w in self.status()["workers"]]

    def track(self) -> None:
        """Remember every descendant now alive, so that stop() can reap even orphans."""
        if self.proc is None:
            return
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self._known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def descendants(self) -> list[psutil.Process]:
        """Every process it started that still runs (the template, the workers)."""
        self.track()
        return [p for p in self._known.values() if p.is_running()]

    def wait_for(self, predicate: Callable[[dict], Any], timeout: float = 30.0,
                 interval: float = 0.05, *, memory: bool = False) -> dict:
        """Poll the server's status (with each process's memory when ``memory``) until
        ``predicate(status)`` is truthy (no fixed sleeps)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = control.call(self.control, "status", timeout=2.0, memory=memory)
            except control.ControlError:
                last = None
            if last is not None and predicate(last):
                self.track()
                return last
            time.sleep(interval)
        raise AssertionError(f"condition not met within {timeout}s; last status: {last}\n{self.log()}")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL; then kill any descendant still alive. Returns the exit code."""
        self.track()
        code = super().stop(timeout)
        for child in self._known.values():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        if self._final_log is None:
            self._final_log = self.log()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


class Host(Server):
    """A ``workerpool workers`` subprocess: N workers serving through a router's TCP backend.

    Its ``endpoint`` is the backend it connects to, as its ready line says."""

    def __init__(self, model: str | os.PathLike, connect: str, *args: str, workers: int = 1) -> None:
        self.connect = connect
        super().__init__(model, *args, workers=workers)

    def arguments(self, model: str | os.PathLike, workers: int, args: tuple[str, ...]) -> list[str]:
        return workers_args(model, self.connect, workers, "--start", START, *args)

    def worker_pids(self) -> list[int]:
        """A worker host has no status to ask: its workers are the children named wp-worker
        (the template, if any, is wp-template)."""
        assert self.proc is not None
        self.track()
        children = psutil.Process(self.proc.pid).children()
        return sorted(c.pid for c in children if c.name() == "wp-worker")


def refused_at_start(server: Any, message: str) -> None:
    """``server`` (not yet started) exits 2 before its ready line, logging ``message``; stopped
    whatever happens."""
    try:
        with pytest.raises(RuntimeError):
            server.start(timeout=30)
        assert server.proc.wait(30) == 2
        assert message in server.log()
    finally:
        server.stop()
