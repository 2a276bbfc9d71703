"""workerpool: serve a numpy model from many processes that share one mapped copy of its weights.

Every public name is imported when first named: the clients, so that a supervisor or a worker,
which import this package too, do not load asyncio (and through it OpenSSL) for nothing; the
errors, so that ``python -m workerpool`` and the ``workerpool`` command import nothing before
``workerpool.command`` holds Ctrl-C back (an import is where a Ctrl-C raised at once can be
dropped, and the pool then start and serve on).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's own costs an import: see the module's docstring
if TYPE_CHECKING:
    from typing import Any

    from .client.aio import AsyncClient
    from .client.sync import Client, Result
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

_CLIENTS = {"AsyncClient": ".client.aio", "Client": ".client.sync", "Result": ".client.calls", "ClientKeys": ".security"}
_LAZY = {name: _CLIENTS.get(name, ".errors") for name in __all__}  # the errors are the rest


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazy ones among them, rather than whatever submodules and helpers
    this module holds at the moment: what completion and ``help`` show."""
    return sorted([*__all__, "__version__"])
