#!/usr/bin/env python3
"""workerpool against gunicorn --preload, head to head: one request at a time, and memory.

Prints two tables from one run, on this machine, on the same generated numpy mlp:

1. Speed (``--speed-size``, 4 MiB, 2 workers): the total PSS of each server once every worker
   has answered (each server measured alone), then requests/s and p50 of one-row requests at
   each number in flight. Both servers run side by side for this part, each on its own copy of
   the model file, and are driven in turn, ``--seconds`` at a time, ``--rounds`` times, the
   order swapped every round; the figures are medians over the rounds. workerpool is driven by
   one DEALER socket keeping K requests in flight, gunicorn by K keep-alive HTTP/1.1
   connections with one request each: minimal clients, so that the servers are measured. One
   more row, at one in flight, uses the clients a user would: ``workerpool.Client.infer`` and
   ``http.client``.
2. Memory (``--memory-size``, 256 MiB, 8 workers): each server alone, ``--memory-runs`` times
   in turn, every worker having answered: the total PSS of every serving process, and where it
   goes (workerpool's supervisor and template, gunicorn's arbiter, each worker: its share of
   the mapped weights, its anonymous and private dirty memory). "Each added worker" is a
   worker's USS, what the machine would get back if it exited.

workerpool runs ``serve --start fork --threads-per-worker T``; gunicorn ``--preload`` with
gthread workers serving ``compare_app`` (compare.py's), its BLAS threads limited to the same T
(the CPUs divided by the workers).

    python3 -m pip install -e '.[compare]'
    python3 scripts/head_to_head.py                     # both tables, about 4 minutes
    python3 scripts/head_to_head.py --tables speed --rounds 9
    python3 scripts/head_to_head.py --tables memory --memory-size 64MiB --json h2h.json
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
from benchlib.arguments import add_count, add_json, add_levels, add_size, parser_for
from benchlib.gunicorn import gunicorn_warmed
from benchlib.http_load import http_drive, http_request
from benchlib.memory import tree_memory
from benchlib.pools import WarmPool, warmed_pool
from benchlib.runs import Load, load_average, print_load_averages, scratch_run, write_figures
from benchlib.zmq_load import drive

import workerpool
from workerpool.protocol import messages as protocol
from workerpool.units import MiB, format_size

LIBRARY_CALLS_WARMUP = 20  # calls through each library client before the timed ones
WORKERPOOL, GUNICORN = "workerpool", "gunicorn"
LABELS = {WORKERPOOL: "workerpool (fork template)", GUNICORN: "gunicorn --preload"}


# The servers, started and warmed.

WORKERPOOL_OPTIONS: list[str] = []  # more options of workerpool serve (--http)


@contextmanager
def workerpool_server(load: Load, name: str) -> Iterator[WarmPool]:
    """``workerpool serve --start fork`` on ``load.model``, once each worker has answered."""
    with warmed_pool(load.model, load.workers, load.directory, name, protocol.encode_request(0, load.row),
                     "--start", "fork", "--threads-per-worker", str(load.blas_threads),
                     *WORKERPOOL_OPTIONS) as pool:
        yield pool


def server_memory(load: Load, server: str) -> dict[str, Any]:
    """The memory of ``server`` running alone on ``load``, every worker having answered."""
    if server == WORKERPOOL:
        with workerpool_server(load, "memory") as pool:
            return tree_memory(pool.pid, load.model, pool.workers)
    with gunicorn_warmed(load) as (pid, _, workers):
        return tree_memory(pid, load.model, workers)


def memory_runs(load: Load, runs: int) -> dict[str, list[dict[str, Any]]]:
    """``runs`` of each server alone, alternating, the first server swapped every run."""
    figures: dict[str, list[dict[str, Any]]] = {WORKERPOOL: [], GUNICORN: []}
    for run in range(runs):
        for server in (WORKERPOOL, GUNICORN) if run % 2 == 0 else (GUNICORN, WORKERPOOL):
            figures[server].append(server_memory(load, server))
            print(f"  memory, {format_size(os.path.getsize(load.model))}, {load.workers} workers: "
                  f"{server} run {run + 1}/{runs} done", file=sys.stderr, flush=True)
    return figures


# Speed: both servers up, driven in turn.


def library_calls(call: Callable[[], object], seconds: float) -> dict[str, Any]:
    """One call at a time for ``seconds``, after a warm-up: calls/s and p50."""
    for _ in range(LIBRARY_CALLS_WARMUP):
        call()
    latencies = []
    start = time.perf_counter()
    end = start + seconds
    while (now := time.perf_counter()) < end:
        call()
        latencies.append(time.perf_counter() - now)
    elapsed = time.perf_counter() - start
    return {"rps": len(latencies) / elapsed, "p50_us": float(np.percentile(latencies, 50) * 1e6)}


def speed_rounds(load: Load, rounds: int, seconds: float) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Both servers side by side, each on its own copy of the model; every round drives each
    at every level, and then through its library's client, the order swapped every round."""
    gunicorn_load = Load(**{**vars(load), "model": os.path.join(load.directory, "gunicorn-model.bpk")})
    shutil.copyfile(load.model, gunicorn_load.model)
    frames = protocol.encode_request(0, load.row)
    body = load.row.tobytes()
    figures: dict[str, dict[str, list[dict[str, Any]]]] = {WORKERPOOL: {}, GUNICORN: {}}
    with ExitStack() as stack:
        endpoint = stack.enter_context(workerpool_server(load, "speed")).endpoint
        _, port, _ = stack.enter_context(gunicorn_warmed(gunicorn_load))
        client = stack.enter_context(workerpool.Client(endpoint, timeout=30))
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        stack.callback(connection.close)

        def http_call() -> None:
            connection.request("POST", "/", body, {"Content-Type": "application/octet-stream"})
            reply = connection.getresponse()
            reply.read()
            if reply.status != 200:
                raise RuntimeError(f"gunicorn answered {reply.status}")

        drives: dict[str, Callable[[int], dict[str, Any]]] = {
            WORKERPOOL: lambda k: drive(endpoint, frames, k, seconds),
            GUNICORN: lambda k: http_drive(port, http_request(body), k, seconds)}
        clients: dict[str, Callable[[], object]] = {WORKERPOOL: lambda: client.infer(load.row),
                                                  GUNICORN: http_call}
        for number in range(rounds):
            order = (WORKERPOOL, GUNICORN) if number % 2 == 0 else (GUNICORN, WORKERPOOL)
            for k in load.levels:
                for server in order:
                    figures[server].setdefault(str(k), []).append(drives[server](k))
            for server in order:
                figures[server].setdefault("client", []).append(library_calls(clients[server], seconds))
            print(f"  speed round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
    return figures


# The tables.


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def mib(value: float) -> str:
    return f"{value / MiB:.1f} MiB"


def print_speed(load: Load, memory: dict[str, list[dict[str, Any]]],
                speed: dict[str, dict[str, list[dict[str, Any]]]], rounds: int, seconds: float) -> None:
    size = format_size(os.path.getsize(load.model))
    print(f"## {size} mlp, {load.workers} workers, one-row requests ({len(os.sched_getaffinity(0))} "
          f"CPUs, {load.blas_threads} BLAS thread per worker; medians of {rounds} alternating rounds "
          f"of {seconds:g} s)")
    print()
    head = ["total PSS", *(f"{k} in flight: req/s (p50)" for k in load.levels),
            "1 in flight, library client: calls/s (p50)"]
    print("| server | " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * len(head))
    for server in (WORKERPOOL, GUNICORN):
        cells = [mib(median_of(memory[server], "pss"))]
        for key in [*(str(k) for k in load.levels), "client"]:
            runs = speed[server][key]
            cells.append(f"{median_of(runs, 'rps'):,.0f} ({median_of(runs, 'p50_us'):,.0f} us)")
        print(f"| {LABELS[server]} | " + " | ".join(cells) + " |")
    ratios = [f"{median_of(memory[WORKERPOOL], 'pss') / median_of(memory[GUNICORN], 'pss'):.2f}x"]
    for key in [*(str(k) for k in load.levels), "client"]:
        ours, theirs = speed[WORKERPOOL][key], speed[GUNICORN][key]
        ratios.append(f"{median_of(ours, 'rps') / median_of(theirs, 'rps'):.2f}x "
                      f"({median_of(ours, 'p50_us') / median_of(theirs, 'p50_us'):.2f}x)")
    print("| workerpool / gunicorn | " + " | ".join(ratios) + " |")
    print()
    print("Library clients: workerpool.Client.infer against http.client.HTTPConnection, one call "
          "at a time; the other columns use minimal clients (a DEALER socket, raw HTTP sockets).")
    print()


def process_rows(run: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in run["by_process"] if p["role"] == role]


def print_memory(load: Load, memory: dict[str, list[dict[str, Any]]]) -> None:
    size = format_size(os.path.getsize(load.model))
    runs = len(memory[WORKERPOOL])
    print(f"## {size} mlp, {load.workers} workers, every worker has answered (each server alone; "
          f"medians of {runs} alternating runs)")
    print()
    print("| server | total PSS | where it goes |")
    print("| --- | ---: | --- |")
    totals = {}
    for server in (WORKERPOOL, GUNICORN):
        server_runs = memory[server]
        totals[server] = median_of(server_runs, "pss")
        spread = f"{mib(min(r['pss'] for r in server_runs))} to {mib(max(r['pss'] for r in server_runs))}"
        root = "supervisor" if server == WORKERPOOL else "arbiter"
        parts = [(f"{root} {figure(server_runs, 'root', 'pss')} ({figure(server_runs, 'root', 'pss_anon')} "
                  "anonymous)")]
        if server == WORKERPOOL:
            parts.append(f"template {figure(server_runs, 'other', 'pss')}")
        parts.append(f"each worker {figure(server_runs, 'worker', 'pss')} ({figure(server_runs, 'worker', 'weights_pss')} "
                     f"its share of the mapped weights, {figure(server_runs, 'worker', 'pss_anon')} anonymous, "
                     f"{figure(server_runs, 'worker', 'private_dirty')} private dirty)")
        parts.append(f"each added worker {figure(server_runs, 'worker', 'uss')} (a worker's USS)")
        print(f"| {LABELS[server]} | {mib(totals[server])} ({spread}) | {'; '.join(parts)} |")
    print(f"| workerpool / gunicorn | {totals[WORKERPOOL] / totals[GUNICORN]:.2f}x | |")
    print()


def figure(runs: list[dict[str, Any]], role: str, key: str) -> str:
    """The median over runs and over the processes of ``role`` of one figure."""
    return mib(statistics.median(p[key] for run in runs for p in process_rows(run, role)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    parser.add_argument("--tables", choices=("both", "speed", "memory"), default="both",
                        help="which tables to make (default: both)")
    add_size(parser, "--speed-size", "4MiB", "mlp size of the speed table")
    add_count(parser, "--speed-workers", 2, "workers of each server in the speed table")
    add_levels(parser, "--in-flight", "1,16,64")
    add_count(parser, "--rounds", 5, "alternating rounds of the speed table")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="per figure, server and round (default: 1)")
    add_size(parser, "--memory-size", "256MiB", "mlp size of the memory table")
    add_count(parser, "--memory-workers", 8, "workers of each server in the memory table")
    add_count(parser, "--memory-runs", 2, "alternating runs of each server for the memory table")
    parser.add_argument("--http", action="store_true",
                        help="run workerpool with its HTTP front door open too (--http on a free port)")
    add_json(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.http:
        WORKERPOOL_OPTIONS.extend(["--http", "127.0.0.1:0"])
    start_load = load_average()
    figures: dict[str, Any] = {}
    if args.tables in ("both", "speed"):
        with scratch_run("head-to-head", args.speed_size) as run:
            load = Load.of(run, args.speed_workers, args.in_flight, args.seconds)
            figures["speed_memory"] = memory_runs(load, 1)
            figures["speed"] = speed_rounds(load, args.rounds, args.seconds)
            print_speed(load, figures["speed_memory"], figures["speed"], args.rounds, args.seconds)
    if args.tables in ("both", "memory"):
        with scratch_run("head-to-head", args.memory_size) as run:
            load = Load.of(run, args.memory_workers, args.in_flight, args.seconds)
            figures["memory"] = memory_runs(load, args.memory_runs)
            print_memory(load, figures["memory"])
    loads = (start_load, load_average())
    print_load_averages(loads)
    if args.json:
        write_figures(args.json, "head_to_head.py", {**figures, "load_average": loads})
    return 0


if __name__ == "__main__":
    sys.exit(main())
