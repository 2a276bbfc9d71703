"""The memory of a whole server, every process of it, as the benchmarks report it.

A server is a root process (workerpool's supervisor, gunicorn's arbiter) and its descendants:
the workers, and for ``workerpool --start fork`` the template the workers are forked from.
"""

from __future__ import annotations

from typing import Any

import psutil

from workerpool.linux import procfs
from workerpool.ops import metrics


def tree_memory(pid: int, model: str | list[str], workers: set[int]) -> dict[str, Any]:
    """PSS (``smaps_rollup``, read by workerpool.linux.procfs) of ``pid`` and each of its
    descendants, and their sum split into the root, the ``workers`` (the pids that answered
    requests) and the others (the template); with how much of the model file (or files) each
    process has resident in its mappings.

    Raises RuntimeError when a process exits while it is read, or when a worker that answered
    is no longer among the descendants (it was replaced: the figures would mix two pools)."""
    root = psutil.Process(pid)
    children = [p.pid for p in root.children(recursive=True)]
    figures = metrics.pool_memory([pid, *children], model).workers
    if any(f is None for f in figures.values()):
        raise RuntimeError("a serving process exited while its memory was read")
    missing = workers - set(children)
    if missing:
        raise RuntimeError(f"workers {sorted(missing)} answered but are no longer running")
    processes: list[dict[str, Any]] = []
    for p, f in figures.items():
        assert f is not None
        role = "root" if p == pid else "worker" if p in workers else "other"
        processes.append({"pid": p, "role": role, **f, **smaps_figures(p, model)})

    def pss(role: str) -> int:
        return sum(p["pss"] for p in processes if p["role"] == role)

    return {
        "pss": sum(p["pss"] for p in processes),
        "root_pss": pss("root"),
        "others_pss": pss("other"),
        "workers_pss": pss("worker"),
        "processes": len(processes),
        "others": sum(p["role"] == "other" for p in processes),
        "workers": sum(p["role"] == "worker" for p in processes),
        "weights_resident": [p["weights_resident"] for p in processes if p["role"] == "worker"],
        "by_process": processes,
    }


def smaps_figures(pid: int, model: str | list[str]) -> dict[str, int]:
    """From ``/proc/PID/smaps_rollup`` and ``smaps`` (read by ``workerpool.linux.procfs``), in
    bytes: ``private_dirty`` (the pages this process alone has written), ``pss_anon`` (its share
    of anonymous memory) and ``weights_pss`` (its share of the resident pages of the file now at
    ``model``, or of each file, its mappings told by procfs's one rule)."""
    files = [found for path in ([model] if isinstance(model, str) else model)
             if (found := procfs.MappedFile.of(path)) is not None]
    try:
        rollup = procfs.rollup_figures(pid)
        mapped = procfs.file_figures(pid, files) if files else {}
    except OSError as exc:
        raise RuntimeError(f"process {pid} exited while its memory was read") from exc
    return {"private_dirty": rollup.get("Private_Dirty", 0), "pss_anon": rollup.get("Pss_Anon", 0),
            "weights_pss": mapped.get("Pss", 0)}
