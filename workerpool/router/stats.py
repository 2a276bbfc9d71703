"""The router's tallies: what ``/metrics`` reports of queue waits, run times, batches and how
many requests the pool holds over time."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

BATCH_BUCKETS = tuple(2**i for i in range(11))  # 1, 2, 4 ... 1024 rows
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    """How many values fell at or under each of ``bounds`` (then above them all), and their
    sum: what a Prometheus histogram reports, counted without a lock in the loop."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> tuple[tuple[float, ...], list[int], float]:
        """Bounds, counts and sum as they are now, for another thread to read."""
        return self.bounds, list(self.counts), self.total


class Occupancy:
    """The requests in the pool (waiting or running) integrated over time: seconds spent in the
    pool, summed over requests. Its rate over a window is the average number of requests in the
    pool (Little's law), the concurrency an autoscaler compares with what a replica can take.
    A gauge sampled at each scrape would miss every burst between two scrapes; this misses none.
    The count changes only while the loop handles events, so reading it once after each turn
    makes the integral exact."""

    def __init__(self, now: float) -> None:
        self._seconds = 0.0
        self._requests = 0
        self._since = now

    def count(self, now: float, requests: int) -> None:
        """The pool holds ``requests`` from ``now`` on."""
        self._seconds += self._requests * (now - self._since)
        self._requests, self._since = requests, now

    def seconds(self, now: float) -> float:
        """Request-seconds so far, the current stretch included."""
        return self._seconds + self._requests * (now - self._since)


def _latencies() -> Histogram:
    return Histogram(LATENCY_BUCKETS)


@dataclass
class ModelStats:
    """One model's histograms and its tokenizers' counts, kept since it was first served."""

    queue_waits: Histogram = field(default_factory=_latencies)  # seconds from arrival to dispatch
    run_times: Histogram = field(default_factory=_latencies)  # seconds from dispatch to reply
    batch_rows: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))  # run, per message to a worker
    texts: int = 0  # texts its workers tokenized
    tokens: int = 0  # their tokens, after the cut at the model's limit
    tokenizing: float = 0.0  # seconds its workers spent tokenizing

    def tokenized(self, texts: int, tokens: int, seconds: float) -> None:
        self.texts += texts
        self.tokens += tokens
        self.tokenizing += seconds

    def handed(self, waits: list[float]) -> None:
        """A message went to a worker, its parts having waited ``waits``."""
        for wait in waits:
            self.queue_waits.observe(wait)

    def ran(self, rows: int) -> None:
        """A worker answered a message to it, running ``rows`` rows of it (none: no batch)."""
        if rows:
            self.batch_rows.observe(rows)

    def copy(self) -> dict[str, Any]:
        return {"queue_waits": self.queue_waits.copy(), "run_times": self.run_times.copy(),
                "batch_rows": self.batch_rows.copy(), "texts": self.texts, "tokens": self.tokens,
                "tokenizing": self.tokenizing}


@dataclass
class RouterStats:
    """Each model's histograms (a model's name comes from the pool's own list, never from a
    client) and the occupancy, kept since the start."""

    models: dict[str, ModelStats] = field(default_factory=dict)
    occupancy: Occupancy = field(default_factory=lambda: Occupancy(time.monotonic()))

    def of(self, model: str) -> ModelStats:
        found = self.models.get(model)
        if found is None:
            found = self.models[model] = ModelStats()
        return found
