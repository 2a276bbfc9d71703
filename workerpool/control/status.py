"""The status document: what ``workerpool status --json`` prints and tests and scripts read."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypedDict


class WorkerState(StrEnum):
    """What a worker is doing; the values are the status document's and /metrics' strings."""

    STARTING = "starting"  # started, not registered yet
    READY = "ready"
    BUSY = "busy"
    RELOADING = "reloading"
    STOPPING = "stopping"


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
    generation: int  # the newest it serves of any model (of the one model, in a pool of one)
    models: dict[str, int]  # the models it serves (or is starting with), with their generations
    served: int
    errors: int
    batches: int  # forward passes it was sent (a request alone is a batch of one)
    rows: int  # rows of the batch axis in them
    batch_sizes: dict[str, int]  # batches by rows, in power-of-two buckets: "1", "2", "4" (3-4), ...
    started: float  # Unix time
    memory: MemoryFigures | None  # None: not read (remote, or status without memory)


class ModelStatus(TypedDict):
    name: str  # its kind: mlp, burn-mnist, bert, onnx or a factory's name
    path: str
    size: int
    inode: int
    generation: int
    load: str
    watch_interval: float | None
    last_reload: dict[str, Any] | None
    degraded: str | None  # why its path is not what is served of it (new weights refused)
    max_batch: int
    workers: int  # workers that serve it (or are starting with it)
    queue: int  # its requests waiting
    in_flight: int  # its requests (or parts of them) running
    switch_failure: str | None  # why a worker could not switch it to its newest generation
    reloading: bool  # workers are moving to its newest generation


class QueueStatus(TypedDict):
    depth: int
    max: int
    in_flight: int


class ConnectionStatus(TypedDict):
    served: int  # client connections that have sent a request and not closed
    open: int  # every client connection accepted and not closed, idle ones too
    max: int  # --max-connections


class TemplateStatus(TypedDict):
    pid: int | None  # None while it is being restarted
    restarts: int
    memory: MemoryFigures | None


class Status(TypedDict):
    supervisor_pid: int
    draining: bool  # stopping: new requests are refused
    degraded: str | None  # why the pool is not whole though it serves (new weights refused), or None
    supervisor_memory: MemoryFigures | None
    template: TemplateStatus | None  # None: workers are spawned (--start spawn)
    endpoint: str
    http: str | None  # the HTTP front door's URL, if --http was given
    threads_per_worker: int  # each worker's BLAS/OpenMP threads
    model: ModelStatus | None  # the one model served; None when there are several
    models: dict[str, ModelStatus]  # every model served, by the name requests give
    queue: QueueStatus
    connections: ConnectionStatus
    workers: list[WorkerStatus]
    totals: dict[str, int | None] | None  # see metrics.TOTAL_FIELDS


SERVING = (WorkerState.READY, WorkerState.BUSY, WorkerState.RELOADING)


def unready(status: Status) -> str | None:
    """Why the pool is not ready, in one line; None when it is (what ``/readyz`` and ``status
    --ready`` report): when every model is (:func:`model_unready`), but one being added that no
    worker has loaded yet (its own readiness says so: the others serve meanwhile)."""
    if status["draining"]:
        return "the server is shutting down"
    reasons = [(name, model_unready(status, name)) for name, served in status["models"].items()
               if not (served["reloading"] and not served["workers"])]
    unready_models = [(name, why) for name, why in reasons if why is not None]
    if not unready_models:
        return None
    if len(reasons) == 1:
        return unready_models[0][1]
    return "; ".join(f"{name}: {why}" for name, why in unready_models)


def model_unready(status: Status, model: str) -> str | None:
    """Why ``model`` is not ready, in one line; None when it is: it would not answer a request
    now, or it is degraded (it serves, but its path holds weights it refused, which a restart
    would load). A worker of any generation counts: during a rolling reload, or one paused on
    a file that fails, the model keeps serving."""
    if status["draining"]:
        return "the server is shutting down"
    served = status["models"].get(model)
    if served is None:
        return f"no model named {model!r} is served"
    if served["degraded"]:
        return served["degraded"]
    workers = [w for w in status["workers"] if model in w["models"]]
    if any(w["state"] in SERVING for w in workers):
        return None
    if not workers and served["reloading"]:
        return "being added: no worker has loaded it yet"
    starting = sum(1 for w in workers if w["state"] == WorkerState.STARTING)
    return f"no worker is ready yet ({starting} starting)"
