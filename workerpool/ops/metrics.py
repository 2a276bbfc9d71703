"""Memory figures of worker processes, as ``status`` and ``scripts/measure_rss.py`` report them.

No single number tells what a worker costs. Linux counts a clean file page as private (USS) to
a process while it is the only one mapping it and as shared once two or more map it, so a lone
worker's USS holds every weight it touched, and RSS counts shared pages in full in every worker.
PSS divides each page among the processes mapping it, so PSS summed over the workers is the
honest total; anonymous memory (the heap) is what each added worker really costs.

rss, uss, pss and swap come from ``/proc/<pid>/smaps_rollup``, shared, anon and pte from
``/proc/<pid>/status``, the weights' residency from ``/proc/<pid>/smaps`` (all read by
``linux.procfs``). The kernel walks a process's page tables for each smaps file, so a
``status`` call costs about 5 ms per worker for a 64 MiB model and 20 ms per worker for 1 GiB
(measured on 2 cores: 42 ms and 150 ms for 8 workers), half of it for the weights' residency;
the supervisor reads them on a thread beside its loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..linux.procfs import MappedFile, file_figures, rollup_figures, status_figures

MEMORY_FIELDS: dict[str, str] = {
    "rss": "resident memory, every page counted in full even when other processes share it",
    "uss": "pages no other process maps; a lone worker's touched weights count here",
    "pss": "each resident page divided by the number of processes mapping it; sums honestly",
    "shared": "file-backed and shmem resident memory (weights, libraries), shared or not",
    "anon": "anonymous resident memory (RssAnon): heap and stacks (and --load copy's weights)",
    "pte": "page tables (VmPTE): about 2 MiB per GiB of weights touched, less with huge pages",
    "swap": "memory swapped out",
    "weights_resident": "bytes of the model files resident in this worker's mappings",
}
"""One line on each per-worker figure (all in bytes), for ``status`` and the README."""

TOTAL_FIELDS: dict[str, str] = {
    "pss": "PSS summed over every process of the pool (supervisor, template, workers): what it costs",
    "workers_pss": "PSS summed over the workers alone",
    "model_size": "size of the model files, the most the shared weights can add to that sum",
    "workers": "workers whose memory could be read",
}
"""One line on each pool figure in ``status``'s ``totals``."""

@dataclass(frozen=True)
class PoolMemory:
    """``workers`` and ``helpers`` (the supervisor, the template) map each pid to its figures
    (None when it could not be read)."""

    workers: dict[int, dict[str, int] | None]
    helpers: dict[int, dict[str, int] | None]
    totals: dict[str, int | None]


def pool_memory(pids: list[int], model_paths: str | Sequence[str], helpers: Sequence[int] = ()) -> PoolMemory:
    """Every worker's figures (see ``MEMORY_FIELDS``), the helper processes', and the pool's
    (see ``TOTAL_FIELDS``).

    ``weights_resident`` counts the files now at ``model_paths`` (one path, or a path for each
    model); it is 0 in a worker that does not map them (``--load copy``); ``model_size`` is
    None when every file is gone.
    """
    paths = [model_paths] if isinstance(model_paths, str) else list(model_paths)
    weights = [found for found in map(MappedFile.of, paths) if found is not None]
    workers = {pid: _process_memory(pid, weights) for pid in pids}
    others = {pid: _process_memory(pid, weights) for pid in helpers}
    read = [m for m in workers.values() if m is not None]
    workers_pss = sum(m["pss"] for m in read)
    totals = {
        "pss": workers_pss + sum(m["pss"] for m in others.values() if m is not None),
        "workers_pss": workers_pss,
        "model_size": sum(found.size for found in weights) if weights else None,
        "workers": len(read),
    }
    return PoolMemory(workers, others, totals)


def _process_memory(pid: int, weights: Sequence[MappedFile]) -> dict[str, int] | None:
    """One process's figures in bytes, or None when it is gone (it may exit at any moment)."""
    try:
        rollup = rollup_figures(pid)
        status = status_figures(pid)
        resident = file_figures(pid, weights).get("Rss", 0) if weights else 0
    except OSError:
        return None
    return {
        "rss": rollup.get("Rss", 0),
        "uss": rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0),
        "pss": rollup.get("Pss", 0),
        "shared": status.get("RssFile", 0) + status.get("RssShmem", 0),
        "anon": status.get("RssAnon", 0),
        "pte": status.get("VmPTE", 0),
        "swap": rollup.get("Swap", 0),
        "weights_resident": resident,
    }
