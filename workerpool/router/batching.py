"""Adaptive batching, the router's side: which waiting requests share one forward pass.

On a CPU a forward pass streams the weights through memory once per call, so rows that share
a call cost little more than one. When a worker becomes free, the request it takes brings
along the requests queued behind it that fit with it, up to ``max_rows`` rows (the model's
batch axis, ``--max-batch``). Nothing waits for company unless the operator asks
(``--batch-wait``), so an idle server answers a lone request at once.

For a model of texts a pass's time grows with its texts, and a request that arrives while a
worker runs one waits for all of it. So texts join a message only while the model's measured
time per text (a moving average, from batches answered) says it would run within ``budget``
(``--pass-budget``); the head of the queue always goes, whatever its size.

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
from typing import NamedTuple

from ..protocol import messages as protocol
from ..protocol.route import FRAMES, Form, Route

SERVICE_SMOOTHING = 0.2  # weight of the newest run in the moving average of run times
OUTLIER_FACTOR = 4.0  # a run is counted as at most this many times the average


# An array's key begins with its form's byte (1), so no array's key is one of these.
TEXT_KEY = b"text"
HTTP_KEY = b"http"  # HTTP requests' bodies are the worker's to read: they batch by count


class BatchShape(NamedTuple):
    """What must match for two requests to be stacked, and the rows a request brings."""

    key: bytes  # an array's dtype, name and shape past the batch axis, or one of the keys above
    rows: int


HTTP_SHAPE = BatchShape(HTTP_KEY, 1)


@dataclass
class BatchPolicy:
    """How the router forms batches; ``max_rows`` 1 turns batching off."""

    max_rows: int = 1
    wait: float = 0.0  # seconds the first request of a batch may wait for more (--batch-wait)
    budget: float = 0.0  # seconds one message of texts may run (--pass-budget); 0: max_rows alone
    running_cap: int | None = None  # local workers that can run at once; None: no cap
    rank: int | None = None  # axes of the model's declared input with its batch axis; None: none
    text: bool = False  # the model takes texts, which batch as one list
    splits: bool = False  # a request's rows or texts may run apart (the model stacks them)
    service: float = 0.0  # moving average of a worker's time from sending a batch to its last reply
    row_seconds: float = 0.0  # moving average of that time per row (per text)

    @property
    def on(self) -> bool:
        return self.max_rows > 1 and (self.rank is not None or self.text)

    def split(self, shape: BatchShape | None) -> bool:
        """Whether a request of ``shape`` runs in parts: it brings more rows (or texts) than one
        pass may take, and the model stacks them (an HTTP body is the worker's to read)."""
        return self.splits and shape is not None and shape.key != HTTP_KEY and shape.rows > self.max_rows

    def shape_of(self, route: Route, frames: int) -> BatchShape | None:
        """The batch shape of an ``infer`` request of one array, of texts, or from the HTTP
        front door (a row each: the worker groups them by what it decodes); None for any other
        request (it goes alone). Only the route frame is read, and the count of ``frames``: a
        batch is sent with one stride, so a request with more frames than its form has goes
        alone whatever its route frame says (the worker checks that against the request)."""
        if route.method != protocol.METHOD_INFER or FRAMES.get(route.form) != frames:
            return None
        if route.form == Form.HTTP:
            return HTTP_SHAPE
        if route.form == Form.TEXTS:
            return BatchShape(TEXT_KEY, route.count) if self.text else None
        if route.form != Form.ARRAY or self.rank is None:
            return None
        if route.count == self.rank:  # an empty request counts as a row: it costs a reply
            return BatchShape(route.array_key(past_first_axis=True), max(route.first_axis(), 1))
        if route.count == self.rank - 1:  # a bare row: a batch of one
            return BatchShape(route.array_key(past_first_axis=False), 1)
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

    def finished(self, seconds: float, rows: int) -> None:
        """A worker answered the last request of what it was sent (``rows`` rows), ``seconds`` after."""
        self.service = smoothed(self.service, seconds)
        self.row_seconds = smoothed(self.row_seconds, seconds / max(rows, 1))

    @property
    def batch_rows(self) -> int:
        """The rows the requests joining a message may bring it to: ``max_rows``, or for texts
        what the budget leaves room for at the measured time per text (at least one)."""
        if not (self.text and self.budget and self.row_seconds):
            return self.max_rows
        return max(1, min(self.max_rows, int(self.budget / self.row_seconds)))


def smoothed(average: float, seconds: float) -> float:
    """The moving average of run times ``average`` (0: none yet) once a run took ``seconds``."""
    if not average:
        return seconds
    return average + SERVICE_SMOOTHING * (min(seconds, OUTLIER_FACTOR * average) - average)


def size_bucket(rows: int) -> int:
    """The histogram bucket of a batch of ``rows`` rows: the power of two at or above it."""
    return 1 << max(rows - 1, 0).bit_length()
