"""Running a pool: a supervisor composed with the role it plays (``serve`` or ``workers``)."""

from __future__ import annotations

from .config import HostConfig, ServeConfig
from .supervisor import StartupError, Supervisor

__all__ = ["StartupError", "run_host", "serve"]


def serve(config: ServeConfig) -> int:
    """Run ``workerpool serve`` until it is stopped; raises StartupError when it cannot start."""
    return Supervisor(config).run()  # type: ignore[arg-type]


def run_host(config: HostConfig) -> int:
    """Run ``workerpool workers`` until it is stopped; raises StartupError when it cannot start."""
    from .host import WorkerHost

    return WorkerHost(config, config.connect, config.keys).run()  # type: ignore[arg-type]
