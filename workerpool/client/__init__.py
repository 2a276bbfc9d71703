"""The clients: ``Client`` (blocking) and ``AsyncClient`` (asyncio, in ``aio``) over one
``BaseClient`` that does no I/O of its own; ``reach`` tells an absent server from a slow one.
"""

from __future__ import annotations

from .calls import Outputs, Result
from .sync import Client

__all__ = ["Client", "Outputs", "Result"]
