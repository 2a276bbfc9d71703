"""Run a real ``workerpool serve`` for a test, and make sure nothing it started outlives the test."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from workerpool import control

TESTS = Path(__file__).resolve().parent
READY_PREFIX = "workerpool: serving "


class Server:
    """A ``workerpool serve`` subprocess on an ephemeral loopback port and a private ipc directory."""

    ready_prefix = READY_PREFIX

    def __init__(self, model: str | os.PathLike, *args: str, workers: int = 2) -> None:
        self.dir = tempfile.mkdtemp(prefix="wp-")  # short: ipc paths are limited to ~100 bytes
        self.control = f"ipc://{self.dir}/control"
        self.log_path = os.path.join(self.dir, "server.log")
        self.command = self.build_command(str(model), workers, args)
        self.proc: subprocess.Popen | None = None
        self.endpoint: str | None = None
        self.ready_line = ""
        self._known: dict[int, psutil.Process] = {}
        self._final_log: str | None = None

    def start(self, timeout: float = 60.0) -> Server:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, env=env
        )
        self.ready_line = self.read_line(timeout)
        if not self.ready_line.startswith(self.ready_prefix):
            raise RuntimeError(f"server did not become ready: {self.ready_line!r}\n{self.log()}")
        self.endpoint = self.ready_line.rsplit(" ", 1)[1].strip()
        self.track()
        return self

    def build_command(self, model: str, workers: int, args: Sequence[str]) -> list[str]:
        return [
            sys.executable, "-m", "workerpool", "serve", model,
            "--workers", str(workers),
            "--bind", "tcp://127.0.0.1:*",
            "--control", self.control,
            *args,
        ]

    def read_line(self, timeout: float) -> str:
        """One line of the server's stdout, or '' at EOF or timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        data = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    break
                data += chunk
        return data.decode()

    def log(self) -> str:
        """Everything the server logged so far (kept after stop())."""
        if self._final_log is not None:
            return self._final_log
        with open(self.log_path) as f:
            return f.read()

    def status(self, timeout: float = 10.0) -> dict:
        return control.call(self.control, "status", timeout=timeout)

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

    def wait_for(self, predicate, timeout: float = 30.0, interval: float = 0.05):
        """Poll the server's status until ``predicate(status)`` is truthy (no fixed sleeps)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = control.call(self.control, "status", timeout=2.0, memory=False)
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
        code = None
        if self.proc is not None:
            self.track()
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            code = self.proc.returncode
            self.proc.stdout.close()
            self._log.close()
        for child in self._known.values():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        if self._final_log is None and os.path.exists(self.log_path):
            self._final_log = self.log()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Host(Server):
    """A ``workerpool workers`` subprocess: N workers serving through a router's TCP backend."""

    ready_prefix = "workerpool: "

    def __init__(self, model: str | os.PathLike, connect: str, *args: str, workers: int = 1) -> None:
        self.connect = connect
        super().__init__(model, *args, workers=workers)

    def build_command(self, model: str, workers: int, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "workerpool", "workers", model, "--connect", self.connect,
                "--workers", str(workers), *args]
