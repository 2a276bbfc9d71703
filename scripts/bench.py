#!/usr/bin/env python3
"""Requests/s and latency through workerpool, against a bare pyzmq load-balancing echo broker.

The bare broker (ROUTER facing clients, ROUTER facing workers, workers that echo) is the
transport's own cost on this machine; workerpool's figures are read against it. The same broker
with workers that run the model ("bare+model") separates the model's cost from workerpool's.
All are driven by the same client loop: one DEALER socket keeping K requests in flight.

    python scripts/bench.py                     # 1 MiB mlp, 2 workers, K = 1, 4, 16
    python scripts/bench.py --max-batch 1       # workerpool without batching, as the bare brokers
    python scripts/bench.py --workers 4 --seconds 5 --json bench.json
    python scripts/bench.py --quick             # a few seconds: does it still run? (CI)

Batching against --max-batch 1 and gunicorn, same run: scripts/compare.py.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from typing import Any

import zmq
from benchlib.arguments import levels, parser_for
from benchlib.runs import demo_model
from benchlib.zmq_load import Frames, drive

from workerpool import burnpack, models
from workerpool.protocol import messages as protocol
from workerpool.testing import NotReady, ServerProcess, serve_args

QUICK_LEVEL, QUICK_SECONDS = "4", 1.0  # --quick: one level, one second of each server


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
        reply: list[Any]
        if model is None:
            header = json.loads(message[4].bytes)  # after the route frame
            reply = [protocol.encode_header({"v": protocol.VERSION, "id": header["id"], "status": "ok",
                                             "arrays": header["arrays"]}), *message[5:]]
        else:
            request = protocol.decode_request(message[3:])
            reply = protocol.encode_reply(request.id, model(request.payload()), worker_pid=0, generation=1)
        sock.send_multipart([b"", *client, *reply], copy=False)


def run_bare(workers: int, frames: Frames, levels: list[int], seconds: float, tmp: str,
             model_path: str | None = None) -> list[dict[str, Any]]:
    """The bare broker and ``workers`` echo workers (or workers running the model at
    ``model_path``), in processes of their own, driven at each level."""
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


def run_workerpool(model: str, workers: int, frames: Frames, levels: list[int], seconds: float, tmp: str,
                   *options: str) -> list[dict[str, Any]]:
    args = serve_args(model, workers, "--control", f"ipc://{tmp}/control", "--log-level", "warning", *options)
    try:
        with ServerProcess(args) as server:
            return [drive(server.endpoint, frames, k, seconds) for k in levels]
    except NotReady as exc:
        raise SystemExit(str(exc)) from None


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--in-flight", default="1,4,16", help="comma-separated levels (default: 1,4,16)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per level (default: 3)")
    parser.add_argument("--max-batch", type=int, metavar="ROWS",
                        help="workerpool's --max-batch (default: the server's); the bare brokers "
                        "never batch, so --max-batch 1 compares like with like")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_LEVEL} in flight alone, {QUICK_SECONDS:g} s a server: a check "
                        "that the benchmark runs, in seconds, not figures to quote (overrides "
                        "--in-flight and --seconds)")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures here")
    args = parser.parse_args()
    if args.quick:
        args.in_flight, args.seconds = QUICK_LEVEL, QUICK_SECONDS
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
    for b, m, p in zip(bare, same, pool, strict=True):
        print(f"{b['in_flight']:>9} | {b['rps']:>10.0f} {b['p50_us']:>7.0f} | {m['rps']:>10.0f} "
              f"{m['p50_us']:>7.0f} | {p['rps']:>10.0f} {p['p50_us']:>7.0f} {p['p99_us']:>7.0f} | "
              f"{p['rps'] / b['rps']:>9.2f} {p['p50_us'] / b['p50_us']:>9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workers": args.workers, "bare": bare, "bare_model": same, "workerpool": pool},
                      f, indent=2)


if __name__ == "__main__":
    main()
