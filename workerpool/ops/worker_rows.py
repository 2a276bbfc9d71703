"""The status document's worker rows: the supervisor's children joined with the router's
registry, so a worker still starting (not yet registered) is listed too."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ..control.status import MemoryFigures, WorkerState, WorkerStatus
from ..router.registry import WorkerRecord
from ..supervisor.process import Child


def worker_rows(children: Iterable[Child], registered: Iterable[WorkerRecord],
                memory: dict[int, Any] | None) -> list[WorkerStatus]:
    """One row per local child (registered or still starting, with the generation it was
    started on), then the remote workers."""
    local = {w.pid: w for w in registered if w.local}
    remote = [w for w in registered if not w.local]
    rows: list[WorkerStatus] = []
    for child in children:
        worker = local.pop(child.pid, None)
        if worker is not None:
            row = _row(worker, memory.get(child.pid) if memory else None)
            if child.stopping:
                row["state"] = WorkerState.STOPPING
        else:
            row = {"pid": child.pid, "host": os.uname().nodename,
                   "generation": max(child.generations.values(), default=0),
                   "models": dict(child.generations), "served": 0, "errors": 0, "batches": 0, "rows": 0, "batch_sizes": {},
                   "started": child.started,
                   "state": WorkerState.STOPPING if child.stopping else WorkerState.STARTING,
                   "memory": memory.get(child.pid) if memory else None}
        rows.append(row)
    rows.extend(_row(worker, None) for worker in [*local.values(), *remote])
    return sorted(rows, key=lambda row: row["pid"])


def _row(worker: WorkerRecord, memory: MemoryFigures | None) -> WorkerStatus:
    return {"pid": worker.pid, "host": worker.host, "state": worker.state,
            "generation": worker.generation, "models": dict(worker.models),
            "served": worker.served, "errors": worker.errors,
            "batches": worker.batches, "rows": worker.rows,
            "batch_sizes": {str(size): count for size, count in sorted(worker.batch_sizes.items())},
            "started": worker.started, "memory": memory}
