#!/usr/bin/env python3
"""The router's own cost per request, in-process, without a socket or a worker process.

One one-row request at a time crosses the router's core as the serving loop drives it: the
client's frames in (``Router.receive``), the message to the worker out of the outbox, the
worker's reply in (``Router.from_worker``), the client's reply out. What is measured is the
Python the supervisor runs per request between two sockets (intake, scheduling, the request's
record, the reply's count), not ZeroMQ or a model. Microseconds per request, the best of
``--rounds`` rounds of ``--requests`` requests (the least disturbed by anything else running);
``--profile`` prints where the time goes (cProfile, by own time).

    python3 scripts/router_core_bench.py
    python3 scripts/router_core_bench.py --profile
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from typing import Any

import numpy as np
import zmq
from benchlib.arguments import add_count, parser_for

from workerpool.protocol import messages as protocol
from workerpool.router.core import Router
from workerpool.router.outbox import CLIENT
from workerpool.router.registry import WorkerRecord

WIDTH = 512
SIGNATURE = {"inputs": [{"name": None, "dtype": "<f4", "shape": [None, WIDTH]}],
             "outputs": [{"name": None, "dtype": "<f4", "shape": [None, 10]}], "batching": True}


class Owner:
    """The router's owner, as the serving role is, hearing nothing of interest here."""

    def worker_ready(self, worker: WorkerRecord) -> None: ...

    def worker_lost(self, worker: WorkerRecord, why: str) -> None: ...

    def started_here(self, token: str | None) -> bool:
        return True

    def stopped(self, worker: WorkerRecord) -> bool:
        return False

    def reload_failed(self, worker: WorkerRecord, model: str, why: str) -> None: ...

    def models_changed(self, worker: WorkerRecord) -> None: ...


def router_with_a_worker() -> Router:
    router = Router(Owner(), max_queue=1024, max_message_size=1 << 24)
    router.add_model("m", SIGNATURE, max_rows=32)
    ready = {"pid": 1, "host": "h", "token": None,
             "models": {"m": {"generation": 1, "model": "mlp", "batching": True, **SIGNATURE}}}
    router.from_worker(True, b"w1", [zmq.Frame(protocol.READY), zmq.Frame(json.dumps(ready).encode())])
    while router.outbox.take() is not None:
        pass
    return router


def one_request(router: Router, request: list[Any], reply: list[Any]) -> None:
    router.receive(request)
    sent = router.outbox.take()
    if sent is None or sent[0] == CLIENT:
        raise SystemExit(f"router_core_bench: the request was not handed to the worker: {sent}")
    router.from_worker(True, b"w1", [zmq.Frame(protocol.REPLY), zmq.Frame(b"c"), zmq.Frame(b"ok"), *reply])
    answered = router.outbox.take()
    if answered is None or answered[0] != CLIENT:
        raise SystemExit(f"router_core_bench: the client was not answered: {answered}")
    while router.outbox.take() is not None:
        pass


def parse_args() -> argparse.Namespace:
    parser = parser_for(__doc__, epilog=(__doc__ or "").split("\n\n", 1)[1],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_count(parser, "--requests", 20000, "requests a round")
    add_count(parser, "--rounds", 5, "rounds")
    parser.add_argument("--profile", action="store_true", help="print where the time goes")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    router = router_with_a_worker()
    request = [zmq.Frame(b"c"), zmq.Frame(b""),
               *map(zmq.Frame, protocol.encode_request(7, np.ones((1, WIDTH), np.float32))[1:])]
    reply = list(map(zmq.Frame, protocol.encode_reply(7, np.ones((1, 10), np.float32))))
    for _ in range(args.requests // 10):  # warm up
        one_request(router, request, reply)
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.requests):
            one_request(router, request, reply)
        rounds.append((time.perf_counter() - start) / args.requests * 1e6)
    print(f"router core, one one-row request at a time: {min(rounds):.1f} µs a request (best of {args.rounds}; "
          f"rounds: {', '.join(f'{r:.1f}' for r in rounds)})")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.requests):
            one_request(router, request, reply)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
