"""Running a pool: a supervisor composed with the role it plays (``serve`` or ``workers``)."""

from __future__ import annotations

from ..config.pool import HostConfig, ServeConfig, StartupError
from ..supervisor.core import Supervisor
from .host import HostRole
from .serving_build import open_serving

__all__ = ["StartupError", "run_host", "serve"]


def serve(config: ServeConfig) -> int:
    """Run ``workerpool serve`` until it is stopped; raises StartupError when it cannot start."""
    return Supervisor(config, lambda pool, cleanup: open_serving(config, pool, cleanup)).run()


def run_host(config: HostConfig) -> int:
    """Run ``workerpool workers`` until it is stopped; raises StartupError when it cannot start."""
    return Supervisor(config, lambda pool, _: HostRole(config, pool)).run()
