#!/usr/bin/env python3
"""Requests/s with each worker's BLAS threads limited to its share of the CPUs, against the same
pool with every worker using all of them (numpy's default), alternating in the same run.

    python scripts/cpu_budget.py                           # 16 MiB mlp, 2 workers, 4-row requests
    python scripts/cpu_budget.py --workers 8 --size 256MiB --rows 1 --in-flight 1,8
"""

from __future__ import annotations

import os
import statistics
import tempfile

from benchlib.arguments import add_levels, add_size, parser_for
from benchlib.runs import demo_model
from benchlib.zmq_load import drive

from workerpool.protocol import messages as protocol
from workerpool.testing import ServerProcess, serve_args
from workerpool.units import format_size


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--workers", type=int, default=2)
    add_size(parser, "--size", "16MiB", "model size")
    parser.add_argument("--rows", type=int, default=4, help="rows per request (default: 4)")
    add_levels(parser, "--in-flight", "1,4", "levels")
    parser.add_argument("--seconds", type=float, default=3.0, help="per level and run (default: 3)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, alternating (default: 3)")
    args = parser.parse_args()
    in_flight = args.in_flight
    cpus = len(os.sched_getaffinity(0))
    setups: dict[str, list[str]] = {"budget": [], "all cpus": ["--threads-per-worker", str(cpus)]}
    rates: dict[tuple[str, int], list[float]] = {(name, k): [] for name in setups for k in in_flight}
    with tempfile.TemporaryDirectory() as tmp:
        model, _, x = demo_model(tmp, args.size, args.rows)
        frames = protocol.encode_request(0, x)
        for _ in range(args.repeat):
            for name, extra in setups.items():
                serve = serve_args(model, args.workers, "--control", f"ipc://{tmp}/control",
                                   "--log-level", "warning", *extra)
                with ServerProcess(serve) as server:
                    for k in in_flight:
                        rates[(name, k)].append(drive(server.endpoint, frames, k, args.seconds)["rps"])
    budget = max(1, cpus // args.workers)
    print(f"{args.workers} workers on {cpus} CPUs, {format_size(args.size)} mlp, {args.rows}-row requests; "
          f"median of {args.repeat} alternating runs of {args.seconds:g}s")
    print(f"{'in flight':>9} | {f'{budget} thread(s) each':>18} | {f'{cpus} threads each':>16} | ratio")
    for k in in_flight:
        ours, theirs = statistics.median(rates[("budget", k)]), statistics.median(rates[("all cpus", k)])
        print(f"{k:>9} | {ours:>14.0f} r/s | {theirs:>12.0f} r/s | {ours / theirs:5.2f}")


if __name__ == "__main__":
    main()
