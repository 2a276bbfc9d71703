"""The router: clients on one ROUTER socket, workers on another, and what lies between
(sockets, intake, registry, dispatch and batching, recovery and quarantine, rollout, stats,
connection cap).
"""

from __future__ import annotations

from .core import (
    Router,
)

__all__ = [
    "Router",
]
