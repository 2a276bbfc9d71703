"""What the router knows about each registered worker, read from its READY message."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .intake import Pending


@dataclass(eq=False)
class WorkerRecord:
    """One registered worker. ``address`` is its ZeroMQ routing id on the backend socket."""

    address: bytes
    pid: int
    host: str
    generation: int
    model: str
    local: bool  # started by this host's supervisor (worker hosts' workers are not)
    started: float
    last_seen: float
    state: str = "ready"  # ready, busy, reloading or stopping
    served: int = 0
    errors: int = 0
    inflight: Pending | None = None

    @classmethod
    def from_ready(cls, address: bytes, info: dict[str, Any]) -> WorkerRecord:
        """Read a decoded READY as warily as a request: a worker host on TCP is outside.

        Raises ``KeyError`` or ``TypeError`` when it is malformed.
        """
        pid, generation = info["pid"], info["generation"]
        if type(pid) is not int or type(generation) is not int:
            raise TypeError("pid and generation must be integers")
        return cls(
            address=address,
            pid=pid,
            host=str(info["host"]),
            generation=generation,
            model=str(info["model"]),
            local=bool(info.get("local", True)),
            started=time.time(),
            last_seen=time.monotonic(),
        )
