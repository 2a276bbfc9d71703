"""Memory figures of worker processes, as ``status`` reports them."""

from __future__ import annotations

from typing import Any

import psutil


def process_memory(pid: int) -> dict[str, Any] | None:
    """rss, uss, pss, shared and swap in bytes, or None when the process is gone.

    USS and PSS read /proc/<pid>/smaps, which costs a few milliseconds per process.
    """
    try:
        full = psutil.Process(pid).memory_full_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return {"rss": full.rss, "uss": full.uss, "pss": full.pss, "shared": full.shared, "swap": full.swap}
