"""What the operations routes of ``serve --http`` answer: Prometheus metrics and probes.

- ``/metrics``: the Prometheus text format, made by ``prometheus_client`` from a snapshot of
  the pool (counts the router keeps) and the processes' memory.
- ``/healthz``: 200 while the supervisor's loop turns (the front door answers on that loop).
- ``/readyz``: 200 while every model is served by a worker and the server is not draining;
  503 with a one-line reason otherwise (the same test as ``workerpool status --ready``).

The families about requests carry a ``model`` label, whose values are the names of the models
served (never a name a client sent: a request for a model not served counts under ``""``), and
the answers a ``route`` label: ``zmq`` or the HTTP route's name, from the route table.

They are answered on the supervisor's loop, between two events. Reading the processes' memory
(parsing smaps) is the one part that costs: it is read again at most every ``MEMORY_MAX_AGE``
seconds, or when the processes changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..control.status import WorkerState, unready
from . import metrics

log = logging.getLogger(__name__)

MEMORY_MAX_AGE = 10.0  # seconds a memory reading serves scrapes before it is read again
Snapshot = dict[str, Any]
Snapshots = Callable[[], Snapshot]


class PoolCollector:
    """The metric families of one scrape (``prometheus_client``'s custom collector protocol)."""

    def __init__(self, snapshots: Snapshots) -> None:
        self.snapshots = snapshots
        self._memory_read: tuple[float, list[int], metrics.PoolMemory] | None = None

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshots()
        status = snapshot["status"]
        models = status["models"]
        requests = CounterMetricFamily("workerpool_requests", "Requests answered, by model, route ('zmq', or "
                                       "the HTTP route's name) and result code ('ok' or the error code).",
                                       labels=["model", "route", "code"])
        for (model, route, code), count in sorted(snapshot["outcomes"].items()):
            requests.add_metric([model, route, code], count)
        yield requests
        durations = HistogramMetricFamily("workerpool_request_duration_seconds", "Time from a request's "
                                          "arrival at the router to its answer, by model and route.",
                                          labels=["model", "route"])
        for (model, route), copied in sorted(snapshot["durations"].items()):
            durations.add_metric([model, route], *_cumulative(copied))
        yield durations
        histograms = snapshot["models"]
        yield _histograms("workerpool_queue_wait_seconds", "Time from a request's arrival to its dispatch "
                          "to a worker (each part's, for a request run in parts).", histograms, "queue_waits")
        yield _histograms("workerpool_run_seconds", "Time from a message's dispatch to a worker to each of "
                          "its replies.", histograms, "run_times")
        yield CounterMetricFamily("workerpool_request_seconds", "Seconds requests spent in the pool, waiting "
                                  "or running, summed: its rate is the average number of requests in "
                                  "the pool, the concurrency to autoscale on.", value=snapshot["request_seconds"])
        yield _per_model(GaugeMetricFamily, "workerpool_queue_depth", "Requests waiting for a worker.",
                         {name: served["queue"] for name, served in models.items()})
        yield _per_model(GaugeMetricFamily, "workerpool_in_flight", "Requests (or parts of them) running on "
                         "workers.", {name: served["in_flight"] for name, served in models.items()})
        yield _per_model(GaugeMetricFamily, "workerpool_degraded", "1 while a model's path holds weights the "
                         "pool refused (it serves the last valid ones; a restart would not).",
                         {name: int(served["degraded"] is not None) for name, served in models.items()})
        connections = status["connections"]
        yield _labelled(GaugeMetricFamily, "workerpool_client_connections",
                        "ZeroMQ client connections: served (sent a request) and open (idle ones too).",
                        "state", {"served": connections["served"], "open": connections["open"]})
        states = {str(state): 0 for state in WorkerState}
        for worker in status["workers"]:
            states[worker["state"]] = states.get(worker["state"], 0) + 1
        yield _labelled(GaugeMetricFamily, "workerpool_workers", "Workers by state.", "state", states)
        yield _per_model(GaugeMetricFamily, "workerpool_generation", "Newest generation of a model's weights "
                         "accepted (workers move to it one at a time).",
                         {name: served["generation"] for name, served in models.items()})
        reloads = CounterMetricFamily("workerpool_reloads", "New weight files taken or refused, by model.",
                                      labels=["model", "outcome"])
        for model, outcomes in sorted(snapshot["reloads"].items()):
            for outcome, count in sorted(outcomes.items()):
                reloads.add_metric([model, outcome], count)
        yield reloads
        yield CounterMetricFamily("workerpool_worker_restarts", "Serving workers that died and were replaced.",
                                  value=snapshot["replacements"])
        yield _histograms("workerpool_batch_rows", "Rows (or texts) a worker ran of a message to it, one "
                          "or more forward passes.", histograms, "batch_rows")
        for name, text, which in TOKENIZER_COUNTERS:
            yield _per_model(CounterMetricFamily, name, text, {model: copies[which] for model, copies in histograms.items()})
        yield from self._memory(status, snapshot)

    def _read_memory(self, snapshot: Snapshot) -> metrics.PoolMemory:
        """The processes' memory, read again only every ``MEMORY_MAX_AGE`` seconds (or when the
        processes changed): parsing smaps holds up the loop."""
        pids = sorted(snapshot["pids"])
        now = time.monotonic()
        cached = self._memory_read
        if cached is None or now - cached[0] > MEMORY_MAX_AGE or cached[1] != pids:
            memory = metrics.pool_memory(pids, list(snapshot["paths"].values()), snapshot["helpers"])
            self._memory_read = cached = (now, pids, memory)
        return cached[2]

    def _memory(self, status: dict[str, Any], snapshot: Snapshot) -> Iterable[Metric]:
        memory = self._read_memory(snapshot)
        per_worker = GaugeMetricFamily("workerpool_worker_memory_bytes", "A worker's memory, by kind.",
                                       labels=["pid", "kind"])
        for pid, figures in sorted(memory.workers.items()):
            for kind in ("anon", "pss", "weights_resident"):
                if figures and kind in figures:
                    per_worker.add_metric([str(pid), kind], figures[kind])
        yield per_worker
        totals = GaugeMetricFamily("workerpool_memory_bytes", "Memory of the whole pool: PSS of every "
                                   "process, of the workers alone, and the model files' size.", labels=["kind"])
        for kind in ("pss", "workers_pss", "model_size"):
            value = memory.totals.get(kind)
            if value is not None:
                totals.add_metric([kind], value)
        yield totals


Family = TypeVar("Family", CounterMetricFamily, GaugeMetricFamily)
TOKENIZER_COUNTERS = (  # a model of texts: what its workers' tokenizers did (0 for a model of arrays)
    ("workerpool_texts", "Texts (or pairs) the model ran, by model (not those refused).", "texts"),
    ("workerpool_input_tokens", "Tokens of the texts run, after the cut at the model's limit.", "tokens"),
    ("workerpool_tokenize_seconds", "Seconds the workers spent tokenizing, by model.", "tokenizing"),
)


def _labelled(kind: type[Family], name: str, text: str, label: str, values: dict[str, int]) -> Family:
    """A counter or gauge family with one sample per value of ``label``."""
    family = kind(name, text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def _per_model(kind: type[Family], name: str, text: str, values: dict[str, int]) -> Family:
    return _labelled(kind, name, text, "model", values)


def _histograms(name: str, text: str, models: dict[str, dict[str, Any]], which: str) -> HistogramMetricFamily:
    """A histogram per model from :meth:`ModelStats.copy`."""
    family = HistogramMetricFamily(name, text, labels=["model"])
    for model, copies in sorted(models.items()):
        family.add_metric([model], *_cumulative(copies[which]))
    return family


def _cumulative(copied: tuple[tuple[float, ...], list[int], float]) -> tuple[list[tuple[str, int]], float]:
    """A :meth:`Histogram.copy`'s buckets as Prometheus wants them, cumulative, and its sum."""
    bounds, counts, total = copied
    buckets, running = [], 0
    for bound, count in zip([*map(str, bounds), "+Inf"], counts, strict=True):
        running += count
        buckets.append((bound, running))
    return buckets, total


class OpsAnswers:
    """Each operations route's status, content type and body."""

    def __init__(self, snapshots: Snapshots) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(PoolCollector(snapshots))
        self.snapshots = snapshots

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/readyz":
            reason = unready(self.snapshots()["status"])
            return _text(503, reason) if reason else _text(200, "ready")
        return _text(200, "ok")


def _text(status: int, body: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", (body + "\n").encode()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``:PORT`` (loopback) to a host and port; ValueError when it is neither."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (such as 127.0.0.1:8002)")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)
