"""Every setting of a pool, each declared once (``settings``); ``sources`` reads them from files
and the environment.
"""

from __future__ import annotations

from .pool import (
    DEFAULT_LOAD,
    DEFAULT_LOG_LEVEL,
    DEFAULT_START,
    GRACEFUL_TIMEOUT_SECONDS,
    HEARTBEAT_SECONDS,
    LIVENESS_BEATS,
    LOAD_MODES,
    MAX_BATCH,
    MAX_QUEUE,
    POLLS_PER_HEARTBEAT,
    RELOAD_TIMEOUT_SECONDS,
    REQUEST_TIMEOUT_SECONDS,
    START_METHODS,
    STOP_TIMEOUT_SECONDS,
    WATCH_INTERVAL_SECONDS,
    HostConfig,
    PoolConfig,
    ServeConfig,
    StartupError,
)
from .settings import QUEUE_BYTES_CAP, default_max_queue_bytes

__all__ = [
    "DEFAULT_LOAD",
    "DEFAULT_LOG_LEVEL",
    "DEFAULT_START",
    "GRACEFUL_TIMEOUT_SECONDS",
    "HEARTBEAT_SECONDS",
    "LIVENESS_BEATS",
    "LOAD_MODES",
    "MAX_BATCH",
    "MAX_QUEUE",
    "POLLS_PER_HEARTBEAT",
    "QUEUE_BYTES_CAP",
    "RELOAD_TIMEOUT_SECONDS",
    "REQUEST_TIMEOUT_SECONDS",
    "START_METHODS",
    "STOP_TIMEOUT_SECONDS",
    "WATCH_INTERVAL_SECONDS",
    "HostConfig",
    "PoolConfig",
    "ServeConfig",
    "StartupError",
    "default_max_queue_bytes",
]
