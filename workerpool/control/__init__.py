"""The control socket: ``call`` asks a running server (``client``), the supervisor answers
(``server``), and ``status`` is the document it answers ``status`` with.
"""

from __future__ import annotations

from .client import (
    ControlError,
    NoServer,
    Unanswered,
    call,
)

__all__ = [
    "ControlError",
    "NoServer",
    "Unanswered",
    "call",
]
