"""Load over ZeroMQ: one DEALER socket keeping requests in flight, timed, as every benchmark of
workerpool drives it; and a warm-up that reaches every worker first."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from workerpool.protocol import messages as protocol

WARMUP_TIMEOUT = 60.0  # seconds for every worker of a server to answer once
REPLY_TIMEOUT = 30.0  # seconds any single reply may take before the run is abandoned

Frames = list[Any]  # one request's frames, as protocol.encode_request makes them


def drive(endpoint: str, frames: Frames | list[Frames], in_flight: int, seconds: float,
          warmed: Callable[[], None] | None = None) -> dict[str, Any]:
    """Keep ``in_flight`` requests outstanding for ``seconds``; return rate and latencies.
    ``frames`` is one request's frames, or a list of requests sent in turn. ``warmed`` is
    called after the warm-up requests, before the timed ones."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    requests: list[Frames] = frames if isinstance(frames[0], list) else [frames]
    headers = [json.loads(request[2]) for request in requests]  # after the delimiter and route

    def send(request_id: int) -> None:
        turn = request_id % len(requests)
        header = headers[turn]
        header["id"] = request_id
        delimiter, route, _, *arrays = requests[turn]
        sock.send_multipart([delimiter, route, protocol.encode_header(header), *arrays], copy=False)
        sent[request_id] = time.perf_counter()

    next_id = 0
    for _ in range(3 * in_flight):  # warm up connections and caches
        send(next_id)
        next_id += 1
        sock.recv_multipart()
    sent.clear()
    if warmed is not None:
        warmed()
    for _ in range(in_flight):
        send(next_id)
        next_id += 1
    start = time.perf_counter()
    end = start + seconds
    while True:
        reply = sock.recv_multipart()
        now = time.perf_counter()
        request_id = json.loads(reply[1])["id"]
        latencies.append(now - sent.pop(request_id))
        if now >= end:
            break
        send(next_id)
        next_id += 1
    while sent:
        reply = sock.recv_multipart()
        sent.pop(json.loads(reply[1])["id"])
    elapsed = time.perf_counter() - start
    sock.close()
    context.term()
    return summary(in_flight, latencies, elapsed)


def summary(in_flight: int, latencies: list[float], elapsed: float) -> dict[str, Any]:
    """Rate and latency percentiles (microseconds) of one level."""
    lat = np.array(latencies) * 1e6
    return {
        "in_flight": in_flight,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
    }


WARMUP_BURST = 4  # requests sent at once per worker: a quick model's answers outrun a burst of one each


def warm_workerpool(endpoint: str, frames: Frames, workers: int) -> set[int]:
    """Send bursts of requests until every worker has answered one; their pids. The router
    hands a request to the worker freed last, so a burst of one request per worker can miss an
    idle one whenever a quick model answers the first before the last arrives."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT * 1000))
    sock.connect(endpoint)
    delimiter, route, encoded, *arrays = frames
    header = json.loads(encoded)
    seen: set[int] = set()
    deadline = time.monotonic() + WARMUP_TIMEOUT
    try:
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(seen)} of {workers} workerpool workers answered")
            for _ in range(WARMUP_BURST * workers):
                header["id"] += 1
                sock.send_multipart([delimiter, route, protocol.encode_header(header), *arrays])
            for _ in range(WARMUP_BURST * workers):
                reply = json.loads(sock.recv_multipart()[1])
                if reply["status"] != "ok":
                    raise RuntimeError(f"workerpool answered {reply}")
                seen.add(reply["worker_pid"])
    finally:
        sock.close()
        context.term()
    return seen
