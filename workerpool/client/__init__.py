"""The clients: ``Client`` (blocking, in ``sync``) and ``AsyncClient`` (asyncio, in ``aio``) over
one ``BaseClient`` (``base``) that does no I/O of its own; ``reach`` tells an absent server from
a slow one.

The clients are imported when first named: ``reach`` serves the control client too, which the
supervisor loads, and must not bring the clients with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .calls import Outputs, Result
    from .sync import Client

__all__ = ["Client", "Outputs", "Result"]

_LAZY = {"Client": ".sync", "Outputs": ".calls", "Result": ".calls"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
