"""CPU seconds a process has spent, read from /proc: what a benchmark divides by its requests."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import psutil


def process_cpu(pid: int) -> float:
    """User and system CPU seconds of ``pid``, every thread of it (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` and its descendants, with the children each has
    reaped (``/proc/PID/stat``'s utime, stime, cutime and cstime, through psutil)."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def with_supervisor_cpu(pid: int, run: Callable[[], dict[str, Any]], seconds: float) -> dict[str, Any]:
    """``run()``'s figures, with the supervisor's CPU per request over it (µs, every thread of
    the process, from /proc)."""
    before = process_cpu(pid)
    figures = run()
    figures["supervisor_us"] = (process_cpu(pid) - before) / (figures["rps"] * seconds) * 1e6
    return figures
