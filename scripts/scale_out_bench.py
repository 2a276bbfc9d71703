"""How one machine's capacity is spent in each scale-out layout, same run, same model.

Every layout runs the same 2 workers on a 4 MiB ``mlp`` (1 BLAS thread each), driven by wrk
over keep-alive connections with one-row binary KServe v2 requests, all on loopback:

- ``pool``: one pool (``workerpool serve --workers 2 --http``), wrk at its HTTP port;
- ``nginx``: 2 pools of 1 worker each behind nginx (deploy/nginx/workerpool.conf);
- ``haproxy``: the same 2 pools behind HAProxy (deploy/haproxy/workerpool.cfg);
- ``router+hosts``: ``serve --workers 0 --backend tcp://...`` with its HTTP front door, and
  ``workers --workers 2 --connect ...`` joining it.

Each round starts the layouts in turn, the order rotating, and drives each at 16 and 64
connections; the table gives the medians of the rounds (answers that were not 2xx and socket
errors are summed). CPU per request is read from /proc (utime + stime, every thread, before and
after each figure) for the front: the pool's supervisor, nginx's master and workers, HAProxy,
the router; for workerpool's own fronts, the supervisors or the router, which every layout
keeps; and for all the processes of the layout. From the supervisor's and the router's CPU per
request comes the most a single-threaded front can answer on one core: where the router tops
out. nginx runs as a stock install sets it (``worker_processes auto``), HAProxy with its default
threads, both without access logs; layouts whose balancer is not installed are left out.

    python3 -m pip install -e '.[http]'   # and wrk, nginx, haproxy: apt-get install wrk nginx haproxy
    python3 scripts/scale_out_bench.py [--rounds 3] [--seconds 5] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

from benchlib.arguments import add_count, parser_for
from benchlib.balancers import balancer
from benchlib.cpu import busiest_others, process_cpu, tree_cpu_seconds
from benchlib.http_load import kserve_body
from benchlib.pools import http_pool, warmed_pool
from benchlib.runs import Load, load_average, require_commands, scratch_run
from benchlib.servers import free_ports
from benchlib.wrk import run_wrk, socket_error_count, wrk_post_script
from benchlib.zmq_load import warm_workerpool

from workerpool.protocol import messages as protocol
from workerpool.testing import ServerProcess, workers_args

LEVELS = (16, 64)
WORKERS = 2
METERS = ("front", "workerpool", "all")  # whose CPU is divided by the requests
CEILINGS = {"pool": "supervisor (pool)", "router+hosts": "router (router+hosts)"}

Meter = Callable[[], float]  # CPU seconds so far
Figures = dict[str, Any]  # wrk's, and the CPU per request of each meter
Runs = dict[str, list[list[Figures]]]  # a layout's name: its figures at each level, each round


@dataclass(frozen=True)
class Layout:
    """A running layout: where wrk sends its requests, and whose CPU is read."""

    url: str
    meters: dict[str, Meter]  # each of METERS


def total(meter: Callable[[int], float], pids: Iterable[int]) -> float:
    return sum(meter(pid) for pid in pids)


def infer_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v2/models/mlp/infer"


def request_frames(load: Load) -> list[Any]:
    return protocol.encode_request(0, load.row)


@contextlib.contextmanager
def pool_layout(load: Load) -> Iterator[Layout]:
    """One pool of every worker, its supervisor the front."""
    [port] = free_ports(1)
    with http_pool(load, port) as pool:
        supervisor = partial(process_cpu, pool.pid)
        yield Layout(infer_url(port), {"front": supervisor, "workerpool": supervisor,
                                       "all": partial(tree_cpu_seconds, pool.pid)})


@contextlib.contextmanager
def balanced_layout(kind: str, load: Load) -> Iterator[Layout]:
    """A pool of 1 worker for each worker, behind nginx or HAProxy (``kind``)."""
    ports = free_ports(load.workers + 1)
    with contextlib.ExitStack() as stack:
        pids = [stack.enter_context(warmed_pool(
            load.model, 1, load.directory, f"replica{n}", request_frames(load), "--http", f"127.0.0.1:{port}",
            "--model-name", "mlp", "--threads-per-worker", str(load.blas_threads))).pid
            for n, port in enumerate(ports[1:], 1)]
        front = stack.enter_context(balancer(kind, os.path.join(load.directory, kind), ports[0], ports[1:]))
        yield Layout(infer_url(ports[0]), {"front": partial(tree_cpu_seconds, front.pid),
                                           "workerpool": partial(total, process_cpu, pids),
                                           "all": partial(total, tree_cpu_seconds, [front.pid, *pids])})


@contextlib.contextmanager
def router_layout(load: Load) -> Iterator[Layout]:
    """A router with no workers of its own and its HTTP front door, and a worker host of every
    worker joining it over TCP."""
    backend_port, port = free_ports(2)
    backend = f"tcp://127.0.0.1:{backend_port}"
    frames = request_frames(load)
    host_args = workers_args(load.model, backend, load.workers, "--threads-per-worker", str(load.blas_threads),
                             "--log-level", "warning")
    with warmed_pool(load.model, 0, load.directory, "router", frames, "--backend", backend,
                     "--http", f"127.0.0.1:{port}", "--model-name", "mlp") as router, \
            ServerProcess(host_args, log_path=os.path.join(load.directory, "host.log")) as host:
        assert host.proc is not None
        warm_workerpool(router.endpoint, frames, load.workers)
        yield Layout(infer_url(port), {"front": partial(process_cpu, router.pid),
                                       "workerpool": partial(process_cpu, router.pid),
                                       "all": partial(total, tree_cpu_seconds, [router.pid, host.proc.pid])})


def measure(layout: Layout, script: str, connections: int, seconds: float) -> Figures:
    """wrk's figures at ``connections``, with each meter's CPU per completed request (µs)."""
    before = {name: meter() for name, meter in layout.meters.items()}
    figures = run_wrk(layout.url, script, connections, seconds)
    for name, meter in layout.meters.items():
        figures[f"{name}_us"] = (meter() - before[name]) / max(figures["requests"], 1) * 1e6
    return figures


def run_layout(start: Callable[[Load], AbstractContextManager[Layout]], load: Load, script: str,
               seconds: float) -> list[Figures]:
    """Start a layout, warm it through its front (every replica behind a balancer), drive it at
    each level, stop it."""
    with start(load) as layout:
        run_wrk(layout.url, script, 16, min(seconds, 1.0))
        return [measure(layout, script, k, seconds) for k in LEVELS]


def available_layouts() -> dict[str, Callable[[Load], AbstractContextManager[Layout]]]:
    layouts: dict[str, Callable[[Load], AbstractContextManager[Layout]]] = {"pool": pool_layout}
    for kind in ("nginx", "haproxy"):
        if shutil.which(kind) is None:
            print(f"{kind} is not installed (apt-get install {kind}): its layout is left out", file=sys.stderr)
        else:
            layouts[kind] = partial(balanced_layout, kind)
    layouts["router+hosts"] = router_layout
    return layouts


def arguments() -> argparse.Namespace:
    parser = parser_for(__doc__)
    add_count(parser, "--rounds", 3, "alternating rounds")
    parser.add_argument("--seconds", type=float, default=5.0, help="per figure (default: 5)")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s per figure: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1.0
    return args


def median_of(runs: list[list[Figures]], index: int, key: str) -> float:
    return statistics.median(run[index][key] for run in runs)


def print_table(runs: Runs) -> None:
    print("| layout | connections | req/s | p50 | p99 | non-2xx / socket errors | CPU µs per request: front "
          "| workerpool fronts | all processes |")
    print("| --- " + "| ---: " * 8 + "|")
    for name, run in runs.items():
        for index, k in enumerate(LEVELS):
            rps, p50, p99, *cpu = (median_of(run, index, key)
                                   for key in ("rps", "p50_us", "p99_us", *(f"{m}_us" for m in METERS)))
            failed = sum(rounds[index]["failed"] for rounds in run)
            errors = sum(socket_error_count(rounds[index]["socket_errors"]) for rounds in run)
            print(f"| {name} | {k} | {rps:.0f} | {p50 / 1e3:.2f} ms | {p99 / 1e3:.2f} ms | {failed} / {errors} | "
                  + " | ".join(f"{us:.0f}" for us in cpu) + " |")


def print_ceilings(runs: Runs) -> None:
    """What a single-threaded front reaches on one core: 1e6 / its µs per request."""
    print("\nwhere a single-threaded front tops out on one core (1e6 / its CPU µs per request):")
    for name, label in CEILINGS.items():
        if name not in runs:
            continue
        parts = []
        for index, k in enumerate(LEVELS):
            us, rps = median_of(runs[name], index, "front_us"), median_of(runs[name], index, "rps")
            ceiling = f"{1e6 / us:.0f} req/s" if us > 0 else "unmeasured (no CPU ticks)"
            parts.append(f"{k} connections: {us:.0f} µs/request -> {ceiling} "
                         f"({us * rps / 1e6:.2f} of a core busy at {rps:.0f} req/s)")
        print(f"  {label}: " + "; ".join(parts))


def main() -> int:
    args = arguments()
    require_commands("scale_out_bench", "wrk")
    layouts = available_layouts()
    runs: Runs = {name: [] for name in layouts}
    with scratch_run("scale_out_bench", 4 * 1024 * 1024) as scratch:
        others_before = busiest_others()
        load = Load.of(scratch, WORKERS, list(LEVELS), args.seconds, blas_threads=1)
        body, headers = kserve_body(scratch.row)
        script = wrk_post_script(os.path.join(scratch.directory, "kserve.lua"), body, headers)
        names = list(layouts)
        for round_number in range(args.rounds):
            rotation = round_number % len(names)
            for name in names[rotation:] + names[:rotation]:
                runs[name].append(run_layout(layouts[name], load, script, args.seconds))
        before = scratch.start_load
    after, others_after = load_average(), busiest_others()
    print(f"4 MiB mlp, {WORKERS} workers in every layout, one-row binary KServe v2 requests; {args.rounds} "
          f"rounds of {args.seconds:g} s per level, medians\nload average (1, 5, 15 min) {before} at start, "
          f"{after} at end; {os.cpu_count()} CPUs; what else ran: {others_before} (start), {others_after} (end)\n")
    print_table(runs)
    print_ceilings(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
