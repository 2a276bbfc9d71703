"""Every setting of a pool, as the code that runs a pool reads them.

``serve`` and ``workers`` share :class:`PoolConfig` (the weights, the workers, their
supervision); :class:`ServeConfig` adds the router's settings and :class:`HostConfig` the
uplink to a remote router. The defaults of options come from their declaration in
:mod:`.settings`, like the command line's.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as plain_field
from typing import TYPE_CHECKING, Any

from ..linux.cpus import usable_cpus
from .models import ModelEntry, entry_for
from .settings import field, setting

if TYPE_CHECKING:  # only for annotations: loading a model must not import ZeroMQ
    from .. import security

# The defaults of options, by the names other modules know them by.
DEFAULT_LOAD: str = setting("load").default
LOAD_MODES: tuple[str, ...] = setting("load").choices or ()
DEFAULT_START: str = setting("start").default
START_METHODS: tuple[str, ...] = setting("start").choices or ()
DEFAULT_LOG_LEVEL: str = setting("log_level").default
MAX_QUEUE: int = setting("max_queue").default
GRACEFUL_TIMEOUT_SECONDS: float = setting("graceful_timeout").default
WATCH_INTERVAL_SECONDS: float = setting("watch_interval").default
REQUEST_TIMEOUT_SECONDS: float = setting("request_timeout").default
MAX_BATCH: int = setting("max_batch").default  # rows of the batch axis one forward pass may take

# Settings no option changes.
HEARTBEAT_SECONDS = 1.0
LIVENESS_BEATS = 5  # heartbeats missed before a peer counts as gone
POLLS_PER_HEARTBEAT = 4  # an idle loop wakes this often per heartbeat interval
STOP_TIMEOUT_SECONDS = 5.0  # a local worker told to stop gets this long before it is killed
RELOAD_TIMEOUT_SECONDS = 120.0
CROWDED = 4  # workers per CPU past which a pool warns at start


class StartupError(Exception):
    """The pool cannot start (bad model file, endpoint in use); nothing was started."""


@dataclass(kw_only=True)
class PoolConfig:
    """What ``serve`` and ``workers`` share: the weights, the workers and their supervision."""

    models: list[ModelEntry]
    workers: int
    folders: list[str] = plain_field(default_factory=list)  # whose every weight file is served: read again on SIGHUP
    # The per-model settings (config.models.PER_MODEL) for every model, and those given for
    # single models by name: what a model added later (a folder read again) is served with.
    model_defaults: dict[str, Any] = plain_field(default_factory=dict)
    model_settings: dict[str, dict[str, Any]] = plain_field(default_factory=dict)
    load: str = field("load")
    graceful_timeout: float = field("graceful_timeout")
    heartbeat: float = HEARTBEAT_SECONDS
    liveness: int = LIVENESS_BEATS
    log_level: str = field("log_level")
    log_format: str = field("log_format")  # or json: one object per line
    watch_interval: float | None = field("watch_interval")  # None: reload only when asked
    max_worker_memory: int | None = None  # bytes of private memory before a worker is recycled
    threads_per_worker: int | None = None  # None: the CPUs this process may use, shared out
    cache_dir: str | None = field("cache_dir")  # None: models prepare nothing
    start: str = field("start")  # fork: from the warm template; spawn: a fresh interpreter each

    def entry(self, name: str, path: str, folder: str | None = None) -> ModelEntry:
        """The entry of a model added while the pool runs, with the settings it would have had."""
        return entry_for(name, path, folder, self.model_defaults, self.model_settings)

    def cpu_budget(self) -> int:
        """Threads each worker's BLAS and OpenMP pools may use: with more workers than cores,
        more threads only make them take turns (and each wait is a cold pool)."""
        if self.threads_per_worker is not None:
            return self.threads_per_worker
        return max(1, usable_cpus() // max(1, self.workers))

    def crowding(self) -> str | None:
        """What each of the workers gets when they are far more than the CPUs, or None: the
        others only wait, each costing memory and start-up time."""
        workers, cpus = self.workers, usable_cpus()
        if workers <= CROWDED * cpus:
            return None
        threads = self.cpu_budget()
        running = max(1, cpus // threads)
        return (f"--workers {workers} is {workers // cpus} times the {cpus} CPU{'' if cpus == 1 else 's'} "
                f"this process may use: with {threads} BLAS thread{'' if threads == 1 else 's'} each, "
                f"{running} run at a time and the other {workers - running} wait, each costing memory "
                f"and start-up time; --workers {running} serves as fast here")


@dataclass(kw_only=True)
class ServeConfig(PoolConfig):
    """``workerpool serve``: the router, its endpoints and its limits."""

    bind: str = field("bind")
    control: str | None = None  # None: an ipc socket in the private runtime directory
    max_queue: int = field("max_queue")
    max_queue_bytes: int = field("max_queue_bytes")
    max_connections: int | None = None  # None: follows the open file limit
    request_timeout: float = field("request_timeout")
    max_message_size: int | None = None  # None: sized to the models' inputs
    reload_timeout: float = RELOAD_TIMEOUT_SECONDS
    backend: str | None = None  # where worker hosts join; None: no worker hosts (local workers have links)
    http: str | None = None  # HOST:PORT of the HTTP front door; None: none
    http_timeout: float = field("http_timeout")
    http_token_file: str | None = None
    http_cert: str | None = None
    http_key: str | None = None
    server_keys: security.ServerKeys | None = None
    access_log_sample: float = field("access_log_sample")
    no_access_log: bool = field("no_access_log")


@dataclass(kw_only=True)
class HostConfig(PoolConfig):
    """``workerpool workers``: local workers serving through a router on another host."""

    connect: str
    keys: security.ClientKeys | None = None
