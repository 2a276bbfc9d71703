"""Every setting of a pool, each default written once.

``serve`` and ``workers`` share :class:`PoolConfig` (the weights, the workers, their
supervision); :class:`ServeConfig` adds the router's settings and :class:`HostConfig` the
uplink to a remote router. The command line takes its defaults from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..endpoints import DEFAULT_BIND

if TYPE_CHECKING:  # only for annotations: loading a model must not import ZeroMQ
    from .. import security

DEFAULT_LOAD = "mmap"
LOAD_MODES = ("mmap", "copy")
DEFAULT_START = "fork"
START_METHODS = ("fork", "spawn")
DEFAULT_LOG_LEVEL = "info"
HEARTBEAT_SECONDS = 1.0
LIVENESS_BEATS = 5  # heartbeats missed before a peer counts as gone
POLLS_PER_HEARTBEAT = 4  # an idle loop wakes this often per heartbeat interval
STOP_TIMEOUT_SECONDS = 5.0  # a local worker told to stop gets this long before it is killed
MAX_QUEUE = 1024
GRACEFUL_TIMEOUT_SECONDS = 30.0
WATCH_INTERVAL_SECONDS = 0.5
RELOAD_TIMEOUT_SECONDS = 120.0
# Below the clients' default 30 s timeout, so a stuck request is answered before a client
# resends it to a second worker.
REQUEST_TIMEOUT_SECONDS = 20.0
MAX_CONNECTIONS = 1024
MAX_BATCH = 32  # rows of the batch axis one forward pass may take; 1 turns batching off
QUEUE_BYTES_CAP = 1 << 30  # queued requests may hold at most this, or 1/8 of the memory


class StartupError(Exception):
    """The pool cannot start (bad model file, endpoint in use); nothing was started."""


def default_max_queue_bytes() -> int:
    """1 GiB, or an eighth of this machine's memory if that is less."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(QUEUE_BYTES_CAP, memory // 8)


@dataclass(kw_only=True)
class PoolConfig:
    """What ``serve`` and ``workers`` share: the weights, the workers and their supervision."""

    path: str
    workers: int
    model: str | None = None
    load: str = DEFAULT_LOAD
    graceful_timeout: float = GRACEFUL_TIMEOUT_SECONDS
    heartbeat: float = HEARTBEAT_SECONDS
    liveness: int = LIVENESS_BEATS
    log_level: str = DEFAULT_LOG_LEVEL
    log_format: str = "text"  # or json: one object per line
    watch_interval: float | None = WATCH_INTERVAL_SECONDS  # None: reload only when asked
    max_worker_memory: int | None = None  # bytes of private memory before a worker is recycled
    threads_per_worker: int | None = None  # None: the CPUs this process may use, shared out
    start: str = DEFAULT_START  # fork: from the warm template; spawn: a fresh interpreter each

    def cpu_budget(self) -> int:
        """Threads each worker's BLAS and OpenMP pools may use: with more workers than cores,
        more threads only make them take turns (and each wait is a cold pool)."""
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return max(1, len(os.sched_getaffinity(0)) // max(1, self.workers))


@dataclass(kw_only=True)
class ServeConfig(PoolConfig):
    """``workerpool serve``: the router, its endpoints and its limits."""

    bind: str = DEFAULT_BIND
    control: str | None = None  # None: an ipc socket in the private runtime directory
    max_queue: int = MAX_QUEUE
    max_queue_bytes: int = field(default_factory=default_max_queue_bytes)
    max_connections: int = MAX_CONNECTIONS
    request_timeout: float = REQUEST_TIMEOUT_SECONDS
    max_batch: int = MAX_BATCH
    batch_wait: float = 0.0  # seconds a batch's first request may wait for more to join it
    max_message_size: int | None = None  # None: sized to the model's input
    reload_timeout: float = RELOAD_TIMEOUT_SECONDS
    backend: str | None = None  # None: a private ipc socket
    http: str | None = None  # HOST:PORT of the operations endpoint; None: none
    server_keys: security.ServerKeys | None = None


@dataclass(kw_only=True)
class HostConfig(PoolConfig):
    """``workerpool workers``: local workers serving through a router on another host."""

    connect: str
    keys: security.ClientKeys | None = None
