"""What the router knows about each registered worker, read from its READY message."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .. import models
from ..control.status import WorkerState
from ..protocol import messages as protocol
from .batching import size_bucket
from .intake import Pending
from .outbox import Outbox, WorkerKey

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkerRecord:
    """One registered worker. ``address`` is its ZeroMQ routing id on the backend socket it
    registered on; ``local`` is true only on the private ipc backend, whatever the worker says.
    ``pid`` and ``host`` are what it says: shown, never acted on."""

    address: bytes
    pid: int
    host: str
    generation: int
    model: str
    local: bool
    token: str | None  # a local worker's proof that this supervisor started it
    started: float
    last_seen: float
    batching: bool = False  # its model stacks requests along the batch axis (what it says)
    state: WorkerState = WorkerState.READY  # never STARTING: that is a child not registered yet
    served: int = 0
    errors: int = 0
    failed_last: bool = False  # its last answer was an error: it goes to the back of the free list
    batches: int = 0  # messages of requests sent to it, one forward pass each
    rows: int = 0  # rows of the batch axis in them
    batch_sizes: dict[int, int] = field(default_factory=dict)  # size_bucket(rows) -> batches
    inflight: list[Pending] = field(default_factory=list)  # answered in this order
    sent: int = 0  # requests in the last message it was sent: a batch stays one as it is answered
    busy_since: float = 0.0
    batchable: bool = False  # what it runs now could have shared a pass

    def took(self, batch: list[Pending], rows: int, *, batchable: bool) -> None:
        """It was sent ``batch`` (``rows`` rows) to run as one forward pass; ``batchable``: of
        requests that may share one, whose run times tell how long a batch takes."""
        self.batchable = batchable
        self.state = WorkerState.BUSY
        self.busy_since = time.monotonic()
        self.inflight = batch
        self.sent = len(batch)
        self.batches += 1
        self.rows += rows
        bucket = size_bucket(rows)
        self.batch_sizes[bucket] = self.batch_sizes.get(bucket, 0) + 1

    @property
    def key(self) -> WorkerKey:
        return (self.local, self.address)

    @classmethod
    def from_ready(cls, address: bytes, info: dict[str, Any], *, local: bool) -> WorkerRecord:
        """Read a decoded READY as warily as a request: a worker host on TCP is outside.

        Raises ``KeyError`` or ``TypeError`` when it is malformed.
        """
        pid, generation, token = info["pid"], info["generation"], info.get("token")
        if type(pid) is not int or type(generation) is not int:
            raise TypeError("pid and generation must be integers")
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a string")
        return cls(
            address=address,
            pid=pid,
            host=str(info["host"]),
            generation=generation,
            model=str(info["model"]),
            local=local,
            token=token if local else None,
            batching=info.get("batching") is True,
            started=time.time(),
            last_seen=time.monotonic(),
        )


def admit(outbox: Outbox, key: WorkerKey, frames: list[Any], signature: dict[str, Any]) -> WorkerRecord | None:
    """The record of a worker whose READY is well formed and whose model fits ``signature``;
    None otherwise (a misfit is told REFUSE, so that it exits instead of retrying)."""
    local, address = key
    try:
        info = protocol.decode_header(frames[0])
        worker = WorkerRecord.from_ready(address, info, local=local)
    except (IndexError, KeyError, TypeError, protocol.ProtocolError) as exc:
        log.warning("malformed READY from %r ignored: %s", address[:64], exc)
        return None
    reason = models.signature_mismatch(signature, info)
    if reason:
        log.warning("refused worker %d on %s: its model does not fit: %s", worker.pid, worker.host, reason)
        outbox.to_peer(key, [protocol.REFUSE, reason.encode()])
        return None
    return worker
