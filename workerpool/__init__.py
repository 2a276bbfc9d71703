"""workerpool: serve a numpy model from many processes that share one mapped copy of its weights.

The clients are imported when first named, so that a supervisor or a worker, which import this
package too, do not load asyncio (and through it OpenSSL) for nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BadRequest,
    ConnectionLost,
    DeadlineExceeded,
    ErrorCode,
    InternalError,
    ModelNotFound,
    Overloaded,
    RemoteError,
    RequestTimeout,
    RequestTooLarge,
    ShuttingDown,
    Timeout,
    Unreachable,
    WorkerFailed,
    WorkerpoolError,
)

if TYPE_CHECKING:
    from .client.aio import AsyncClient
    from .client.sync import Client, Result
    from .security import ClientKeys

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "ClientKeys",
    "ConnectionLost",
    "DeadlineExceeded",
    "ErrorCode",
    "InternalError",
    "ModelNotFound",
    "Overloaded",
    "RemoteError",
    "RequestTimeout",
    "RequestTooLarge",
    "Result",
    "ShuttingDown",
    "Timeout",
    "Unreachable",
    "WorkerFailed",
    "WorkerpoolError",
]

_LAZY = {"AsyncClient": ".client.aio", "Client": ".client.sync", "Result": ".client.calls", "ClientKeys": ".security"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazy ones among them, rather than whatever submodules and helpers
    this module holds at the moment: what completion and ``help`` show."""
    return sorted([*__all__, "__version__"])
