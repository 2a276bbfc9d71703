"""How many CPUs this process may use: what its affinity allows, and no more than its cgroup's
CPU quota (a container's ``--cpus``, Kubernetes' CPU limit), which ``os.cpu_count()`` ignores:
a pool sized by it in a 2-CPU container on a 64-core host would start 64 workers.

Both cgroup versions are read: v2's ``cpu.max`` and v1's ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``, each at the process's own cgroup (``/proc/self/cgroup``), else at the
hierarchy's root, which is the process's own cgroup inside a container's cgroup namespace.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")
V1_CPU_DIRECTORIES = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def usable_cpus(root: Path = CGROUPS, own: Path = OWN_CGROUPS) -> int:
    """The CPUs the affinity allows, fewer when the CPU quota allows less (rounded up)."""
    cpus = len(os.sched_getaffinity(0))
    quota = cpu_quota(root, own)
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def cpu_quota(root: Path = CGROUPS, own: Path = OWN_CGROUPS) -> float | None:
    """The CPUs' worth of time the cgroup may use (1.5: one and a half), None without a quota."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            found = _first(root, [""], path, "cpu.max")
            if found is not None:
                quota, _, period = found[1].partition(" ")
                return None if quota == "max" else _ratio(quota, period)
        elif "cpu" in controllers.split(","):
            found = _first(root, V1_CPU_DIRECTORIES, path, "cpu.cfs_quota_us")
            if found is not None:
                directory, quota = found
                return None if quota.startswith("-") else _ratio(quota, _read(directory / "cpu.cfs_period_us") or "")
    return None


def _first(root: Path, hierarchies: Iterable[str], path: str, name: str) -> tuple[Path, str] | None:
    """The first file ``name`` found, with its directory: in a hierarchy's directory for the
    cgroup at ``path``, else at the hierarchy's root."""
    for hierarchy in hierarchies:
        for directory in (root / hierarchy / path.lstrip("/"), root / hierarchy):
            text = _read(directory / name)
            if text is not None:
                return directory, text
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ratio(quota: str, period: str) -> float | None:
    """``quota`` over ``period`` microseconds; None for what does not read as a positive quota."""
    try:
        value = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return value if value > 0 else None
