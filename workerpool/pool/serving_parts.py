"""What the ``serve`` role is made of, once bound (``serving_build.py`` builds it): read by the
role and by its control commands."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.pool import ServeConfig
from ..control.server import ControlServer
from ..router.connections import ConnectionLimit
from ..router.core import Router
from ..router.links import RouterLinks
from ..supervisor.role import Pool


@dataclass(frozen=True)
class ServingParts:
    """What the serve role and its control commands are made of, bound and ready."""

    config: ServeConfig
    pool: Pool
    router: Router
    links: RouterLinks
    connections: ConnectionLimit
    control_server: ControlServer
    switch_failures: dict[str, str]  # by model: why a worker could not switch to its newest weights
    http_url: str | None
    max_message_size: int
