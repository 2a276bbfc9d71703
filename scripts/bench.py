#!/usr/bin/env python3
"""Requests/s and latency through workerpool, against a bare pyzmq load-balancing echo broker.

The bare broker (ROUTER facing clients, ROUTER facing workers, workers that echo) is the
transport's own cost on this machine; workerpool's figures are read against it. The same broker
with workers that run the model ("bare+model") separates the model's cost from workerpool's.
All are driven by the same client loop: one DEALER socket keeping K requests in flight.

    python scripts/bench.py                     # 1 MiB mlp, 2 workers, K = 1, 4, 16
    python scripts/bench.py --max-batch 1       # workerpool without batching, as the bare brokers
    python scripts/bench.py --workers 4 --seconds 5 --json bench.json

Batching against --max-batch 1 and gunicorn, same run: scripts/compare.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from workerpool import burnpack, models
from workerpool.protocol import messages as protocol
from workerpool.testing import NotReady, ServerProcess, serve_args

WARMUP_TIMEOUT = 60.0  # seconds for every worker of a server to answer once
REPLY_TIMEOUT = 30.0  # seconds any single reply may take before the run is abandoned


def drive(endpoint: str, frames: list, in_flight: int, seconds: float,
          warmed: Callable[[], None] | None = None) -> dict:
    """Keep ``in_flight`` requests outstanding for ``seconds``; return rate and latencies.
    ``frames`` is one request's frames, or a list of requests sent in turn. ``warmed`` is
    called after the warm-up requests, before the timed ones."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    requests = frames if isinstance(frames[0], list) else [frames]
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


def summary(in_flight: int, latencies: list[float], elapsed: float) -> dict:
    """Rate and latency percentiles (microseconds) of one level."""
    lat = np.array(latencies) * 1e6
    return {
        "in_flight": in_flight,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
    }


def demo_model(directory: str, size: int, rows: int = 1) -> tuple[str, models.GeneratedMlp, np.ndarray]:
    """A generated mlp of ``size`` bytes in ``directory``, and a ``rows``-row input for it."""
    path = os.path.join(directory, "model.bpk")
    generated = models.generate_mlp(path, size)
    x = np.random.default_rng(0).standard_normal((rows, generated.dims[0]), dtype=np.float32)
    return path, generated, x


def load_arguments(doc: str, *, workers: int, in_flight: str, seconds: float, repeat: int,
                   **more: tuple[type, Any, str]) -> argparse.Namespace:
    """The command line of a benchmark that drives a pool: the options they all share, and
    ``more`` of its own, each ``name=(type, default, help)``; ``args.in_flight`` is the list of
    levels."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=workers, help=f"(default: {workers})")
    parser.add_argument("--in-flight", type=levels, default=in_flight,
                        help=f"comma-separated requests in flight (default: {in_flight})")
    parser.add_argument("--seconds", type=float, default=seconds, help=f"per figure and run (default: {seconds:g})")
    parser.add_argument("--repeat", type=int, default=repeat, help=f"alternating rounds (default: {repeat})")
    for name, (kind, default, text) in more.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default, help=text)
    return parser.parse_args()


def at_least_one(text: str) -> int:
    """A count on a benchmark's command line: a run of nothing measures nothing."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def levels(text: str) -> list[int]:
    """Requests in flight, comma-separated: ``1,16,64``."""
    return [at_least_one(k) for k in text.split(",")]


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for the reader to judge a run by."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def print_load_averages(loads: tuple[str, str]) -> None:
    print(f"load average (1, 5, 15 min) at start: {loads[0]}; at end: {loads[1]}. Whatever else "
          f"was running on this machine is in these figures: judge them by that.")


def stop_servers_on_sigterm() -> None:
    """SIGTERM leaves through the ``with`` blocks, which stop the servers this script started."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@dataclass(frozen=True)
class Scratch:
    """What a benchmark run works in: a scratch directory holding the demo model."""

    directory: str
    model: str
    generated: models.GeneratedMlp
    row: np.ndarray
    start_load: str  # the load average when the run began


@contextlib.contextmanager
def scratch_run(script: str, size: int) -> Iterator[Scratch]:
    """A benchmark run: SIGTERM stops the servers it starts, the load average is read at its
    start, and a failure to start or drive a server ends it with one line (exit 1)."""
    stop_servers_on_sigterm()
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix=f"wp-{script}-") as directory:
        model, generated, row = demo_model(directory, size)
        try:
            yield Scratch(directory, model, generated, row, start_load)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"{script}: error: {exc}") from None


def write_figures(path: str, script: str, figures: dict[str, Any]) -> None:
    """The raw figures as JSON, after the command line that produced them."""
    with open(path, "w") as f:
        json.dump({"command": [f"scripts/{script}", *sys.argv[1:]], **figures}, f, indent=2)


def warm_workerpool(endpoint: str, frames: list, workers: int) -> set[int]:
    """Keep ``workers`` requests in flight until every worker has answered one; their pids."""
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
            for _ in range(workers):
                header["id"] += 1
                sock.send_multipart([delimiter, route, protocol.encode_header(header), *arrays])
            for _ in range(workers):
                reply = json.loads(sock.recv_multipart()[1])
                if reply["status"] != "ok":
                    raise RuntimeError(f"workerpool answered {reply}")
                seen.add(reply["worker_pid"])
    finally:
        sock.close()
        context.term()
    return seen


def echo_broker(backend: str, bound: multiprocessing.Queue) -> None:
    """The guide's load-balancing broker, minimal: the transport's own cost."""
    context = zmq.Context()
    clients = context.socket(zmq.ROUTER)
    clients.bind("tcp://127.0.0.1:*")
    bound.put(clients.getsockopt_string(zmq.LAST_ENDPOINT))
    workers = context.socket(zmq.ROUTER)
    workers.bind(backend)
    poller = zmq.Poller()
    poller.register(workers, zmq.POLLIN)
    free: list[bytes] = []
    while True:
        if free:
            poller.register(clients, zmq.POLLIN)
        events = dict(poller.poll())
        if events.get(workers):
            message = workers.recv_multipart(copy=False)
            free.append(message[0].bytes)
            if len(message) > 2:
                clients.send_multipart(message[2:], copy=False)
        if events.get(clients):
            message = clients.recv_multipart(copy=False)
            workers.send_multipart([free.pop(0), b"", *message], copy=False)
        if not free:
            poller.unregister(clients)


def echo_worker(backend: str, model_path: str | None = None) -> None:
    """Echo the arrays back or, given ``model_path``, run workerpool's model and protocol on them:
    the same work a workerpool worker does, without its supervision, heartbeats and checks."""
    model = None
    if model_path is not None:
        pack = burnpack.read(model_path)
        model = models.build_model(pack.tensors, pack.metadata)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.connect(backend)
    sock.send(b"")
    while True:
        message = sock.recv_multipart(copy=False)
        client = message[1:3]
        if model is None:
            header = json.loads(message[4].bytes)  # after the route frame
            reply = [protocol.encode_header({"v": protocol.VERSION, "id": header["id"], "status": "ok",
                                             "arrays": header["arrays"]}), *message[5:]]
        else:
            request = protocol.decode_request(message[3:])
            reply = protocol.encode_reply(request.id, model(request.payload()), worker_pid=0, generation=1)
        sock.send_multipart([b"", *client, *reply], copy=False)


def run_bare(workers: int, frames: list, levels: list[int], seconds: float, tmp: str,
             model_path: str | None = None) -> list[dict]:
    spawn = multiprocessing.get_context("spawn")
    backend = f"ipc://{tmp}/bare-backend"
    bound = spawn.Queue()
    procs = [spawn.Process(target=echo_broker, args=(backend, bound), daemon=True)]
    procs += [spawn.Process(target=echo_worker, args=(backend, model_path), daemon=True)
              for _ in range(workers)]
    for proc in procs:
        proc.start()
    try:
        frontend = bound.get(timeout=30)
        return [drive(frontend, frames, k, seconds) for k in levels]
    finally:
        for proc in procs:
            proc.kill()
            proc.join()


def run_workerpool(model: str, workers: int, frames: list, levels: list[int], seconds: float, tmp: str,
                   *options: str) -> list[dict]:
    args = serve_args(model, workers, "--control", f"ipc://{tmp}/control", "--log-level", "warning", *options)
    try:
        with ServerProcess(args) as server:
            return [drive(server.endpoint, frames, k, seconds) for k in levels]
    except NotReady as exc:
        raise SystemExit(str(exc)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--in-flight", default="1,4,16", help="comma-separated levels (default: 1,4,16)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per level (default: 3)")
    parser.add_argument("--max-batch", type=int, metavar="ROWS",
                        help="workerpool's --max-batch (default: the server's); the bare brokers "
                        "never batch, so --max-batch 1 compares like with like")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures here")
    args = parser.parse_args()
    in_flight = levels(args.in_flight)
    with tempfile.TemporaryDirectory() as tmp:
        model, _, x = demo_model(tmp, 1024 * 1024)
        frames = protocol.encode_request(0, x)
        bare = run_bare(args.workers, frames, in_flight, args.seconds, tmp)
        same = run_bare(args.workers, frames, in_flight, args.seconds, tmp, model_path=model)
        options = () if args.max_batch is None else ("--max-batch", str(args.max_batch))
        pool = run_workerpool(model, args.workers, frames, in_flight, args.seconds, tmp, *options)
    print(f"{args.workers} workers, 1 MiB mlp, one-row float32 input; {args.seconds:g}s per level")
    print("bare: echo broker and echo workers; bare+model: the same broker, workers running the model")
    print(f"{'in flight':>9} | {'bare req/s':>10} {'p50 us':>7} | {'bare+model':>10} {'p50 us':>7} | "
          f"{'pool req/s':>10} {'p50 us':>7} {'p99 us':>7} | {'rps ratio':>9} {'p50 ratio':>9}")
    for b, m, p in zip(bare, same, pool):
        print(f"{b['in_flight']:>9} | {b['rps']:>10.0f} {b['p50_us']:>7.0f} | {m['rps']:>10.0f} "
              f"{m['p50_us']:>7.0f} | {p['rps']:>10.0f} {p['p50_us']:>7.0f} {p['p99_us']:>7.0f} | "
              f"{p['rps'] / b['rps']:>9.2f} {p['p50_us'] / b['p50_us']:>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workers": args.workers, "bare": bare, "bare_model": same, "workerpool": pool},
                      f, indent=2)


if __name__ == "__main__":
    main()
