"""The status document: what ``workerpool status --json`` prints and tests and scripts read."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypedDict

from .process import Child
from .registry import WorkerRecord


class MemoryFigures(TypedDict, total=False):
    """Bytes; see ``workerpool.metrics.MEMORY_FIELDS``."""

    rss: int
    uss: int
    pss: int
    shared: int
    anon: int
    pte: int
    swap: int
    weights_resident: int


class WorkerStatus(TypedDict):
    pid: int
    host: str
    state: str  # starting, ready, busy, reloading or stopping
    generation: int
    served: int
    errors: int
    batches: int  # forward passes it was sent (a request alone is a batch of one)
    rows: int  # rows of the batch axis in them
    batch_sizes: dict[str, int]  # batches by rows, in power-of-two buckets: "1", "2", "4" (3-4), ...
    started: float  # Unix time
    memory: MemoryFigures | None  # None: not read (remote, or status without memory)


class ModelStatus(TypedDict):
    name: str
    path: str
    size: int
    inode: int
    generation: int
    load: str
    watch_interval: float | None
    last_reload: dict[str, Any] | None


class QueueStatus(TypedDict):
    depth: int
    max: int
    in_flight: int


class TemplateStatus(TypedDict):
    pid: int | None  # None while it is being restarted
    restarts: int
    memory: MemoryFigures | None


class Status(TypedDict):
    supervisor_pid: int
    draining: bool  # stopping: new requests are refused
    supervisor_memory: MemoryFigures | None
    template: TemplateStatus | None  # None: workers are spawned (--start spawn)
    endpoint: str
    http: str | None  # the operations endpoint's URL, if --http was given
    threads_per_worker: int  # each worker's BLAS/OpenMP threads
    model: ModelStatus
    queue: QueueStatus
    workers: list[WorkerStatus]
    totals: dict[str, int | None] | None  # see metrics.TOTAL_FIELDS


def worker_rows(children: Iterable[Child], registered: Iterable[WorkerRecord], generation: int,
                memory: dict[int, Any] | None) -> list[WorkerStatus]:
    """One row per local child (registered or still starting), then the remote workers."""
    local = {w.pid: w for w in registered if w.local}
    remote = [w for w in registered if not w.local]
    rows: list[WorkerStatus] = []
    for child in children:
        worker = local.pop(child.pid, None)
        if worker is not None:
            row = _row(worker, memory.get(child.pid) if memory else None)
            if child.stopping:
                row["state"] = "stopping"
        else:
            row = {"pid": child.pid, "host": os.uname().nodename, "generation": generation,
                   "served": 0, "errors": 0, "batches": 0, "rows": 0, "batch_sizes": {},
                   "started": child.started,
                   "state": "stopping" if child.stopping else "starting",
                   "memory": memory.get(child.pid) if memory else None}
        rows.append(row)
    rows.extend(_row(worker, None) for worker in [*local.values(), *remote])
    return sorted(rows, key=lambda row: row["pid"])


def _row(worker: WorkerRecord, memory: MemoryFigures | None) -> WorkerStatus:
    return {"pid": worker.pid, "host": worker.host, "state": worker.state,
            "generation": worker.generation, "served": worker.served, "errors": worker.errors,
            "batches": worker.batches, "rows": worker.rows,
            "batch_sizes": {str(size): count for size, count in sorted(worker.batch_sizes.items())},
            "started": worker.started, "memory": memory}


def unready(status: Status) -> str | None:
    """Why the pool would not answer a request now, in one line; None when it would (what
    ``/readyz`` and ``status --ready`` report). A worker of any generation counts: during a
    rolling reload, or one paused on a file that fails, the pool keeps serving."""
    if status["draining"]:
        return "the server is shutting down"
    if any(w["state"] in ("ready", "busy", "reloading") for w in status["workers"]):
        return None
    starting = sum(1 for w in status["workers"] if w["state"] == "starting")
    return f"no worker is ready yet ({starting} starting)"
