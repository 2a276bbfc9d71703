"""workerpool: serve a numpy model from many processes that share one mapped copy of its weights."""

from .aio import AsyncClient
from .client import Client, Result
from .errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    Overloaded,
    RemoteError,
    RequestTimeout,
    ShuttingDown,
    Timeout,
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
    "DeadlineExceeded",
    "InternalError",
    "Overloaded",
    "RemoteError",
    "RequestTimeout",
    "Result",
    "ShuttingDown",
    "Timeout",
    "WorkerFailed",
    "WorkerpoolError",
]
