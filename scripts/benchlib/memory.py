"""The memory of a whole server, every process of it, as the benchmarks report it, and how much
of a model's files its workers hold.

A server is a root process (workerpool's supervisor, gunicorn's arbiter) and its descendants:
the workers, and for ``workerpool --start fork`` the template the workers are forked from.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
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


def files_mapped_under(pids: Iterable[int], folder: str) -> list[str]:
    """The files under ``folder`` that any of ``pids`` maps: for an onnx model, the prepacked
    copy in the pool's ``--cache-dir``, which its sessions map instead of the weight file's
    tensors."""
    prefix = os.path.join(os.path.realpath(folder), "")
    found: set[str] = set()
    for pid in pids:
        try:
            found.update(m.path for m in psutil.Process(pid).memory_maps(grouped=True)
                         if m.path.startswith(prefix))
        except psutil.Error as exc:
            raise RuntimeError(f"process {pid} exited while its mappings were read") from exc
    return sorted(found)


def resident_in(pid: int, paths: list[str]) -> int:
    """Bytes of the files at ``paths`` resident in the mappings of ``pid`` (procfs's rule)."""
    files = [found for found in map(procfs.MappedFile.of, paths) if found is not None]
    try:
        return procfs.file_figures(pid, files).get("Rss", 0) if files else 0
    except OSError as exc:
        raise RuntimeError(f"process {pid} exited while its memory was read") from exc


def residency(status: dict[str, Any], model: str, cache_dir: str) -> dict[str, Any]:
    """How much of the weight file ``model`` each worker ``status`` lists holds resident, and
    of the files under the pool's ``cache_dir`` the workers map (an onnx model's prepacked
    copy): fractions of the pages the files span, as residency is counted in pages."""
    pids = [w["pid"] for w in status["workers"]]
    prepacked = files_mapped_under(pids, cache_dir)
    prepacked_pages = sum(map(in_pages, prepacked))
    return {
        "file": [(w["memory"] or {}).get("weights_resident", 0) / in_pages(model)
                 for w in status["workers"]],
        "prepacked_files": prepacked,
        "prepacked_size": sum(map(os.path.getsize, prepacked)),
        "prepacked": [resident_in(pid, prepacked) / prepacked_pages for pid in pids]
        if prepacked_pages else [],
    }


def in_pages(path: str) -> int:
    """The bytes of the pages the file at ``path`` spans."""
    page = os.sysconf("SC_PAGE_SIZE")
    return max(1, -(-os.path.getsize(path) // page)) * page
