"""A benchmark run: its scratch directory and demo model, what it sends each server, the load
average it is judged by, and where its raw figures go."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from workerpool import models


def demo_model(directory: str, size: int, rows: int = 1) -> tuple[str, models.GeneratedMlp, np.ndarray]:
    """A generated mlp of ``size`` bytes in ``directory``, and a ``rows``-row input for it."""
    path = os.path.join(directory, "model.bpk")
    generated = models.generate_mlp(path, size)
    x = np.random.default_rng(0).standard_normal((rows, generated.dims[0]), dtype=np.float32)
    return path, generated, x


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for the reader to judge a run by."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def print_load_averages(loads: tuple[str, str]) -> None:
    print(f"load average (1, 5, 15 min) at start: {loads[0]}; at end: {loads[1]}. Whatever else "
          f"was running on this machine is in these figures: judge them by that.")


def stop_servers_on_sigterm() -> None:
    """SIGTERM leaves through the ``with`` blocks, which stop the servers this script started."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def require_commands(script: str, *commands: str) -> None:
    """Exit with one line unless every one of ``commands`` is on PATH (the package that has it
    is named after the command in Debian and Ubuntu)."""
    missing = [command for command in commands if shutil.which(command) is None]
    if missing:
        sys.exit(f"{script}: needs {' and '.join(commands)} (apt-get install {' '.join(commands)})")


@dataclass(frozen=True)
class Scratch:
    """What a benchmark run works in: a scratch directory holding the demo model."""

    directory: str
    model: str
    generated: models.GeneratedMlp
    row: np.ndarray
    start_load: str  # the load average when the run began


@contextlib.contextmanager
def scratch_run(script: str, size: int) -> Iterator[Scratch]:
    """A benchmark run: SIGTERM stops the servers it starts, the load average is read at its
    start, and a failure to start or drive a server ends it with one line (exit 1)."""
    stop_servers_on_sigterm()
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix=f"wp-{script}-") as directory:
        model, generated, row = demo_model(directory, size)
        try:
            yield Scratch(directory, model, generated, row, start_load)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"{script}: error: {exc}") from None


@dataclass
class Load:
    """What one server is sent: the model, the workers, their BLAS threads, the request."""

    model: str
    workers: int
    blas_threads: int
    gthreads: int  # gthread threads per gunicorn worker
    row: np.ndarray
    levels: list[int]
    seconds: float
    directory: str

    @classmethod
    def of(cls, scratch: Scratch, workers: int, levels: list[int], seconds: float, *,
           blas_threads: int | None = None, gthreads: int = 1) -> Load:
        """The load on ``scratch``'s model; BLAS threads by default the CPUs divided by the workers."""
        threads = max(1, len(os.sched_getaffinity(0)) // workers) if blas_threads is None else blas_threads
        return cls(scratch.model, workers, threads, gthreads, scratch.row, levels, seconds, scratch.directory)


def write_figures(path: str, script: str, figures: dict[str, Any]) -> None:
    """The raw figures as JSON, after the command line that produced them."""
    with open(path, "w") as f:
        json.dump({"command": [f"scripts/{script}", *sys.argv[1:]], **figures}, f, indent=2)
