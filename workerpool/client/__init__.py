"""The clients: ``Client`` (blocking, in ``sync``) and ``AsyncClient`` (asyncio, in ``aio``) over
one ``BaseClient`` (``base``) that keeps what they share: the connection's state (``link``) and
the calls in flight with their retries (``calls``)."""

from __future__ import annotations

from .calls import Outputs, Result
from .sync import Client

__all__ = ["Client", "Outputs", "Result"]
