"""Running a pool: the supervisor composed with the role it plays, ``serve`` (the router and
its control socket) or ``workers`` (local workers for a remote router).
"""

from __future__ import annotations

from .run import (
    StartupError,
    run_host,
    serve,
)

__all__ = [
    "StartupError",
    "run_host",
    "serve",
]
