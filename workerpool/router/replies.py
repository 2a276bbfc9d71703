"""The answers the router sends clients, counted by model and outcome: the one place an answer
leaves the router's core (into its outbox), so that every answer is counted once."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..errors import ErrorCode
from ..protocol import messages as protocol
from .outbox import Outbox

UNKNOWN_MODEL = ""  # the model label of an answer to a request whose model is not served


class Replies:
    """Sends answers through ``outbox``; ``outcomes`` counts them by (model, ``ok`` or code)."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.outcomes: Counter[tuple[str, str]] = Counter()

    def send(self, client: bytes, frames: list[Any], model: str, outcome: str) -> None:
        self.count(model, outcome)
        self.outbox.to_client(client, frames)

    def count(self, model: str, outcome: str) -> None:
        """Count an answer: one sent here, or one the HTTP front door gave itself."""
        self.outcomes[(model, outcome)] += 1

    def error(self, client: bytes, request_id: Any, code: ErrorCode, message: str,
              model: str = UNKNOWN_MODEL) -> None:
        self.send(client, protocol.encode_error(request_id, code, message), model, code)
