"""Adaptive batching, the router's side: which waiting requests share one forward pass.

On a CPU a forward pass streams the weights through memory once per call, so rows that share
a call cost little more than one. When a worker becomes free, the request it takes brings
along the requests queued behind it that fit with it, up to ``max_rows`` rows (the model's
batch axis, ``--max-batch``). Nothing waits for company unless the operator asks
(``--batch-wait``), so an idle server answers a lone request at once.

Batches only grow if requests queue. With more local workers than cores, handing every idle
worker whatever is queued at that instant keeps the queue empty and the batches small while
the CPU is already saturated. So at most ``running_cap`` local workers run at once (the cores
divided by each worker's threads); the rest of the requests wait for the next worker to
finish, and it takes them as one batch. A request held that way is released to an idle worker
once it has waited about as long as a run usually takes (a moving average), so a few slow
requests cannot hold the queue behind them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..models.base import INPUT_NAME
from ..protocol import messages as protocol

SERVICE_SMOOTHING = 0.2  # weight of the newest run in the moving average of run times
OUTLIER_FACTOR = 4.0  # a run is counted as at most this many times the average


TEXT_KEY = ("text",)
HTTP_KEY = ("http",)  # HTTP requests' bodies are the worker's to read: they batch by count


class BatchShape(NamedTuple):
    """What must match for two requests to be stacked, and the rows a request brings."""

    key: tuple[Any, ...]  # dtype and the shape past the batch axis
    rows: int


HTTP_SHAPE = BatchShape(HTTP_KEY, 1)


@dataclass
class BatchPolicy:
    """How the router forms batches; ``max_rows`` 1 turns batching off."""

    max_rows: int = 1
    wait: float = 0.0  # seconds the first request of a batch may wait for more (--batch-wait)
    running_cap: int | None = None  # local workers that can run at once; None: no cap
    rank: int | None = None  # axes of the model's declared input with its batch axis; None: none
    text: bool = False  # the model takes texts, which batch as one list
    service: float = 0.0  # moving average of a worker's time from sending a batch to its last reply

    @property
    def on(self) -> bool:
        return self.max_rows > 1 and (self.rank is not None or self.text)

    def shape_of(self, header: dict[str, Any] | None, frames: int) -> BatchShape | None:
        """The batch shape of an ``infer`` request of one array (``frames`` 2: the header and
        the array), of texts (``frames`` 1) or from the HTTP front door (the header and the
        body, a row each: the worker groups them by what it decodes), None for any other
        request (it goes alone). Only the header is read: the worker validates the request."""
        if header is None or header.get("method") != protocol.METHOD_INFER:
            return None
        if "http" in header:
            return HTTP_SHAPE if frames == 2 else None
        if "text" in header:
            text = header["text"]
            if not self.text or frames != 1 or not isinstance(text, list) or not text:
                return None
            return BatchShape(TEXT_KEY, len(text))
        if self.rank is None or frames != 2:
            return None
        arrays = header.get("arrays")
        if not isinstance(arrays, list) or len(arrays) != 1 or not isinstance(arrays[0], dict):
            return None
        descriptor = arrays[0]
        dtype, shape = descriptor.get("dtype"), descriptor.get("shape")
        if descriptor.get("name", INPUT_NAME) != INPUT_NAME \
                or not isinstance(dtype, str) or not isinstance(shape, list) \
                or not all(type(size) is int and size >= 0 for size in shape):
            return None
        if len(shape) == self.rank:  # an empty request counts as a row: it costs a reply
            return BatchShape((dtype, *shape[1:]), max(shape[0], 1))
        if len(shape) == self.rank - 1:  # a bare row: a batch of one
            return BatchShape((dtype, *shape), 1)
        return None

    def hold_until(self, received: float, queued: int, running: int) -> float | None:
        """Until when a request received at ``received`` waits before an idle local worker takes
        it, with ``queued`` others waiting and ``running`` local workers busy; None: no wait."""
        if not self.on:
            return None
        hold = 0.0
        if self.running_cap is not None and running >= self.running_cap:
            hold = self.service
        if self.wait and queued + 1 < self.max_rows:
            hold = max(hold, self.wait)
        return received + hold if hold else None

    def finished(self, seconds: float) -> None:
        """A worker answered the last request of what it was sent, ``seconds`` after."""
        if not self.service:
            self.service = seconds
            return
        seconds = min(seconds, OUTLIER_FACTOR * self.service)
        self.service += SERVICE_SMOOTHING * (seconds - self.service)


def size_bucket(rows: int) -> int:
    """The histogram bucket of a batch of ``rows`` rows: the power of two at or above it."""
    return 1 << max(rows - 1, 0).bit_length()
