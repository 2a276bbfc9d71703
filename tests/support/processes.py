"""Calls in the background, frozen processes, peak memory and log times."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import numpy as np
import psutil

import workerpool


def proc_kib_field(path: str, name: str) -> int:
    """A ``Name:  N kB`` field of a ``/proc`` file (``status``, ``smaps_rollup``), in bytes."""
    with open(path) as f:
        for line in f:
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name} in {path}")


def vm_hwm(pid: int) -> int:
    """Peak resident set size of ``pid`` in bytes (Linux ``VmHWM``)."""
    return proc_kib_field(f"/proc/{pid}/status", "VmHWM")


def private_dirty(pid: int) -> int:
    """Bytes of the pages only ``pid`` has written (copy-on-write copies, its own heap)."""
    return proc_kib_field(f"/proc/{pid}/smaps_rollup", "Private_Dirty")


def log_time(line: str) -> float:
    stamp = " ".join(line.split()[:2])
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Background:
    """Run ``target`` in a thread; ``join`` returns its result or raises its exception."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self.thread.start()

    def _run(self, target: Callable[[], Any]) -> None:
        try:
            self.result = target()
        except BaseException as exc:  # noqa: BLE001 - re-raised in join()
            self.error = exc

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"background call still running after {timeout}s"
        if self.error is not None:
            raise self.error
        return self.result


def slow_request(endpoint: str, seconds: float, *, timeout: float = 20.0) -> Background:
    """A slow_model request that sleeps ``seconds`` on its worker; answers -2 * seconds."""

    def run() -> workerpool.Result:
        with workerpool.Client(endpoint, timeout=timeout, retries=0) as c:
            return c.request(np.full((1, 2), -seconds, np.float32))

    return Background(run)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[psutil.Process]:
    """SIGSTOP ``pid``; on the way out SIGCONT and SIGKILL it if it still exists."""
    proc = psutil.Process(pid)
    proc.suspend()
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.resume()
            proc.kill()
