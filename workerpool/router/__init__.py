"""The router: clients on one ROUTER socket, workers on another, and what lies between
(intake, registry, batching, rollout, quarantine, connection cap).
"""

from __future__ import annotations

from .core import (
    Router,
)

__all__ = [
    "Router",
]
