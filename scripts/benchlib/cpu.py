"""CPU seconds a process has spent, read from /proc: what a benchmark divides by its requests."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import psutil

IDLE_CPU, IDLE_WINDOW, IDLE_TIMEOUT = 0.1, 0.5, 300.0  # idle: under 10% of a CPU over 0.5 s (5 clock ticks)


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


def busiest_others(sample: float = 0.5, top: int = 5, floor: float = 5.0) -> str:
    """What else runs on this machine: the ``top`` processes outside this one and its
    descendants that used at least ``floor`` % of a CPU over ``sample`` seconds, busiest first."""
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    others = [p for p in psutil.process_iter(["name"]) if p.pid not in ours]
    for process in others:
        with contextlib.suppress(psutil.Error):
            process.cpu_percent(None)
    time.sleep(sample)
    used = []
    for process in others:
        with contextlib.suppress(psutil.Error):
            used.append((process.cpu_percent(None), process.info["name"], process.pid))
    busy = sorted((u for u in used if u[0] >= floor), reverse=True)[:top]
    return ", ".join(f"{name} ({pid}) {percent:.0f}%" for percent, name, pid in busy) or "nothing busy"


def wait_idle(pid: int) -> None:
    """Until the server tree uses less than ``IDLE_CPU`` of a CPU: the requests a wrk run left
    unanswered when it stopped are still served, and would slow the next run down."""
    deadline = time.monotonic() + IDLE_TIMEOUT
    cpu = tree_cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(IDLE_WINDOW)
        earlier, cpu = cpu, tree_cpu_seconds(pid)
        if cpu - earlier < IDLE_CPU * IDLE_WINDOW:
            return
    raise RuntimeError(f"the server was still busy {IDLE_TIMEOUT:g} s after wrk stopped")
