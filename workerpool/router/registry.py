"""What the router knows about each registered worker, read from its READY message."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import models
from ..control.status import WorkerState
from ..protocol import messages as protocol
from .batching import size_bucket
from .outbox import Outbox, WorkerKey
from .requests import Part

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerRecord:
    """One registered worker. ``address`` is its local link's (``local_links.py``) or its ZeroMQ
    routing id on the worker hosts' backend; ``local`` is true only for a worker on a local
    link, whatever the worker says.
    ``pid`` and ``host`` are what it says: shown, never acted on. Only the scheduler changes
    its state."""

    address: bytes
    pid: int
    host: str
    local: bool
    token: str | None  # a local worker's proof that this supervisor started it
    started: float
    last_seen: float
    models: dict[str, int] = field(default_factory=dict)  # the models it serves: name -> generation
    stale: set[str] = field(default_factory=set)  # names it holds of files no longer served, to drop
    batching: dict[str, bool] = field(default_factory=dict)  # name -> it stacks requests (what it says)
    state: WorkerState = WorkerState.READY  # never STARTING: that is a child not registered yet
    served: int = 0
    errors: int = 0
    failed_last: bool = False  # its last answer was an error: it goes to the back of the free list
    batches: int = 0  # messages of requests sent to it, one forward pass each
    rows: int = 0  # rows of the batch axis it ran (its answers, never what a request claims)
    batch_sizes: dict[int, int] = field(default_factory=dict)  # size_bucket(rows it ran) -> messages
    inflight: list[Part] = field(default_factory=list)  # answered in this order
    running: str = ""  # the model of what it runs
    sent: int = 0  # parts in the last message it was sent: a batch stays one as it is answered
    ran_rows: int = 0  # rows of that message it answered well so far
    busy_since: float = 0.0
    batchable: bool = False  # what it runs now could have shared a pass
    charged: float = 0.0  # the worker-seconds its model was charged in advance for what it runs

    def took(self, model: str, batch: list[Part], *, batchable: bool, now: float) -> None:
        """It was sent ``batch`` of ``model`` to run as one message at ``now``;
        ``batchable``: of requests that may share a pass, whose run times tell how long a
        batch takes."""
        self.running = model
        self.batchable = batchable
        self.state = WorkerState.BUSY
        self.busy_since = now
        self.inflight = batch
        for part in batch:  # for its access line: when it first went to a worker, and the last one
            if part.request.started is None:
                part.request.started = now
            part.request.worker = self.pid
        self.sent, self.ran_rows = len(batch), 0
        self.batches += 1

    def answered(self, rows: int, *, ok: bool) -> None:
        """It answered a part of ``rows`` rows, counted as run only when it succeeded: a route
        frame's rows are a claim until the worker, which holds the route frame against the
        header and the header against the data, runs them."""
        self.served += 1
        self.errors += not ok
        self.failed_last = not ok
        if ok:
            self.rows += rows
            self.ran_rows += rows

    def finished(self) -> int:
        """It answered the last part of the message it was sent: the rows it ran of it, its
        batch counted by them (a message it ran none of is no batch of any size)."""
        if self.ran_rows:
            bucket = size_bucket(self.ran_rows)
            self.batch_sizes[bucket] = self.batch_sizes.get(bucket, 0) + 1
        return self.ran_rows

    @property
    def key(self) -> WorkerKey:
        return (self.local, self.address)

    @property
    def generation(self) -> int:
        """The newest generation it serves of any model (of the one model, in a pool of one)."""
        return max(self.models.values(), default=0)

    @classmethod
    def from_ready(cls, address: bytes, info: dict[str, Any], *, local: bool) -> WorkerRecord:
        """Read a decoded READY as warily as a request: a worker host on TCP is outside.

        Raises ``KeyError`` or ``TypeError`` when it is malformed.
        """
        pid, token, served = info["pid"], info.get("token"), info["models"]
        if type(pid) is not int or not isinstance(served, dict) or not served:
            raise TypeError("pid must be an integer and models a non-empty object")
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a string")
        generations, batching = {}, {}
        for name, described in served.items():
            if not isinstance(described, dict) or type(described.get("generation")) is not int:
                raise TypeError(f"model {str(name)[:60]!r}: its generation must be an integer")
            generations[name] = described["generation"]
            batching[name] = described.get("batching") is True
        return cls(address=address, pid=pid, host=str(info["host"]), local=local,
                   token=token if local else None, models=generations, batching=batching,
                   started=time.time(), last_seen=time.monotonic())


def admit(outbox: Outbox, key: WorkerKey, frames: list[Any],
          signatures: Mapping[str, Mapping[str, Any]]) -> WorkerRecord | None:
    """The record of a worker whose READY is well formed and whose every model this router
    serves fits what the router serves under that name; None otherwise (a misfit is told
    REFUSE, so that it exits instead of retrying). A model the router does not serve (one
    just removed, or one a worker host has besides) is kept in the record, never routed to.

    A worker host's worker of one model, to a router of one model, serves it whatever either
    calls it: the host's copy of the weights need not have the router's file's name. A local
    worker is started with the router's names, so one that names another model was started for
    a set of models no longer served, and is refused."""
    local, address = key
    try:
        info = protocol.decode_header(frames[0])
        worker = WorkerRecord.from_ready(address, info, local=local)
    except (IndexError, KeyError, TypeError, AttributeError, protocol.ProtocolError) as exc:
        log.warning("malformed READY from %r ignored: %s", address[:64], exc)
        return None
    described = info["models"]
    if not local and len(signatures) == 1 and len(worker.models) == 1:
        (served,), (own,) = signatures, worker.models
        worker.models, worker.batching = {served: worker.models[own]}, {served: worker.batching[own]}
        described = {served: described[own]}
    reasons = [reason if len(signatures) == 1 else f"{name}: {reason}" for name, model in described.items()
               if name in signatures and (reason := models.signature_mismatch(signatures[name], model))]
    if not reasons and not any(name in signatures for name in worker.models):
        reasons = [(f"it serves {', '.join(sorted(worker.models))[:200]}, none of the models served here "
                   f"({', '.join(sorted(signatures))})")]
    if reasons:
        reason = "; ".join(reasons)
        log.warning("refused worker %d on %s: its model does not fit: %s", worker.pid, worker.host, reason)
        outbox.to_peer(key, [protocol.REFUSE, reason.encode()])
        return None
    return worker
