"""Running a pool: a supervisor composed with the role it plays (``serve`` or ``workers``)."""

from __future__ import annotations

from ..config.pool import HostConfig, ServeConfig, StartupError
from ..supervisor.core import Supervisor
from .host import HostRole
from .serving import ServingRole

__all__ = ["StartupError", "run_host", "serve"]


def serve(config: ServeConfig) -> int:
    """Run ``workerpool serve`` until it is stopped; raises StartupError when it cannot start."""
    return Supervisor(config, ServingRole(config)).run()


def run_host(config: HostConfig) -> int:
    """Run ``workerpool workers`` until it is stopped; raises StartupError when it cannot start."""
    return Supervisor(config, HostRole(config)).run()
