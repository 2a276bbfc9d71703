#!/usr/bin/env python3
"""Why not just ``gunicorn --preload``? workerpool (fork, spawn) against gunicorn, same model.

In the same run, on the same model and machine, alternating three servers: ``workerpool serve
--start fork`` (workers forked from a warm template process) and ``workerpool serve --start
spawn`` (each worker a fresh interpreter), each with W workers and driven by one DEALER socket
keeping K requests in flight (``benchlib.zmq_load.drive``); and ``gunicorn --preload`` with W gthread
workers running ``compare_app.app``, which maps the same .bpk and builds the model once in the
master (the forked workers share the mapping), driven by K persistent HTTP/1.1 keep-alive
connections with one request in flight each. Every worker of every server limits its BLAS
threads to max(1, CPUs // W). For each run: the total PSS of every serving process (supervisor,
template and workers; arbiter and workers) once every worker has answered (so touched all the
weights), then requests/s and p50 and p99 latency of one-row requests at each K. In each round
too, the same one-row forward pass in this script's process with one BLAS thread
(``LoadedModel.infer``, as a worker calls it; no transport at all), whose p50 the servers' p50
at 1 in flight is divided by.

    python3 -m pip install -e '.[compare]'
    python3 scripts/compare.py                          # 16 MiB mlp, 2 workers, K = 1, 16, 64
    python3 scripts/compare.py --size 256MiB --workers 8 --seconds 2 --repeat 1 --in-flight 1,16
    python3 scripts/compare.py --servers fork,spawn     # workerpool alone; no gunicorn needed
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from benchlib.arguments import add_count, add_json, add_levels, add_mlp_pool, parser_for
from benchlib.gunicorn import run_gunicorn
from benchlib.memory import tree_memory
from benchlib.pools import warmed_pool
from benchlib.runs import Load, load_average, print_load_averages, scratch_run, write_figures
from benchlib.zmq_load import drive
from threadpoolctl import threadpool_limits

from workerpool.control import client as control
from workerpool.models.loaded import LoadedModel
from workerpool.protocol import messages as protocol
from workerpool.units import format_size

IN_PROCESS_WARMUP = 20  # forward passes in this process before the timed ones
IN_PROCESS_CALLS = 200  # timed forward passes in this process, per round


@dataclass(frozen=True)
class Server:
    """One of the servers compared: its column, and what its processes are called."""

    label: str
    root: str  # the process the others descend from
    helper: str | None  # the one process that is neither the root nor a worker, if any
    options: tuple[str, ...] = ()  # workerpool serve's options


SERVERS = {
    "fork": Server("workerpool fork", "supervisor", "template", ("--start", "fork")),
    "unbatched": Server("workerpool fork --max-batch 1", "supervisor", "template",
                        ("--start", "fork", "--max-batch", "1")),
    "spawn": Server("workerpool spawn", "supervisor", None, ("--start", "spawn")),
    "gunicorn": Server("gunicorn --preload", "arbiter", None),
}


# workerpool


def run_workerpool(load: Load, name: str) -> dict[str, Any]:
    """``workerpool serve`` with the server's options, its memory once every worker answered,
    and each level with the rows per forward pass the server counted over it."""
    frames = protocol.encode_request(0, load.row)
    with warmed_pool(load.model, load.workers, load.directory, name, frames, *SERVERS[name].options,
                     "--threads-per-worker", str(load.blas_threads)) as pool:
        memory = tree_memory(pool.pid, load.model, pool.workers)
        levels = []
        warm: list[tuple[int, int]] = []  # the counts once each level's warm-up is done
        for k in load.levels:
            level = drive(pool.endpoint, frames, k, load.seconds,
                          warmed=lambda: warm.append(batch_counts(pool.control)))
            batches, rows = (after - earlier for after, earlier in
                             zip(batch_counts(pool.control), warm[-1], strict=True))
            levels.append({**level, "rows_per_batch": rows / batches if batches else 0.0})
    return {**memory, "levels": levels}


def batch_counts(endpoint: str) -> tuple[int, int]:
    """The forward passes the server's workers were sent, and the rows in them (so far)."""
    workers = control.call(endpoint, "status", timeout=10.0, memory=False)["workers"]
    return sum(w["batches"] for w in workers), sum(w["rows"] for w in workers)


# no server


def run_in_process(load: Load) -> dict[str, Any]:
    """The one-row forward pass in this process, one BLAS thread: ``LoadedModel.infer`` on the
    request's decoded payload, as a worker's ``_infer`` calls it; ``IN_PROCESS_CALLS`` timed
    calls after ``IN_PROCESS_WARMUP``. The model is dropped before returning: a mapping of the
    file left in this process would take its share of the servers' PSS."""
    inputs = protocol.decode_request(protocol.encode_request(0, load.row)[1:]).payload()
    loaded = LoadedModel(load.model, None, "mmap")
    timings: list[float] = []
    try:
        with threadpool_limits(limits=1):
            for _ in range(IN_PROCESS_WARMUP):
                loaded.infer(inputs)
            for _ in range(IN_PROCESS_CALLS):
                began = time.perf_counter()
                loaded.infer(inputs)
                timings.append(time.perf_counter() - began)
    finally:
        del loaded
        gc.collect()
    with open("/proc/self/maps") as maps:
        if load.model in maps.read():
            raise RuntimeError(f"{load.model} is still mapped in this process")
    lat = np.array(timings) * 1e6
    return {"calls": IN_PROCESS_CALLS, "p50_us": float(np.percentile(lat, 50)),
            "p99_us": float(np.percentile(lat, 99))}


# the comparison


def run_alternating(load: Load, servers: list[str],
                    repeat: int) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """in-process, fork, unbatched, spawn, gunicorn, in-process, fork, ...: ``repeat`` runs
    of each server, and as many of the in-process forward pass."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    in_process: list[dict[str, Any]] = []
    for round_number in range(1, repeat + 1):
        in_process.append(run_in_process(load))
        print(f"  run {round_number}/{repeat}: in-process forward pass done", file=sys.stderr,
              flush=True)
        for name in servers:
            run = run_gunicorn(load) if name == "gunicorn" else run_workerpool(load, name)
            runs[name].append(run)
            print(f"  run {round_number}/{repeat}: {SERVERS[name].label} done", file=sys.stderr,
                  flush=True)
    return runs, in_process


MEMORY_ROWS = ("pss", "root_pss", "others_pss", "workers_pss")


def medians(runs: list[dict[str, Any]], levels: list[int]) -> dict[str, float]:
    """Median over the runs of each figure: ``pss`` (every process), ``root_pss``,
    ``others_pss`` (the template), ``workers_pss``, then ``rps@K``, ``p50_us@K``, ``p99_us@K``
    and, for workerpool, ``rows_per_batch@K``."""
    figures = {key: statistics.median(r[key] for r in runs) for key in MEMORY_ROWS}
    for i, k in enumerate(levels):
        for key in ("rps", "p50_us", "p99_us", "rows_per_batch"):
            values = [r["levels"][i][key] for r in runs if key in r["levels"][i]]
            if values:  # gunicorn has no batches
                figures[f"{key}@{k}"] = statistics.median(values)
    return figures


def processes(name: str, runs: list[dict[str, Any]]) -> str:
    """What the serving processes were, e.g. "10 processes (supervisor + template + 8 workers)"."""
    server = SERVERS[name]
    described = set()
    for run in runs:
        parts = [server.root]
        if run["others"] == 1 and server.helper:
            parts.append(server.helper)
        elif run["others"]:
            parts.append(f"{run['others']} other")
        parts.append(f"{run['workers']} workers")
        described.add(f"{run['processes']} processes ({' + '.join(parts)})")
    return f"{server.label}: " + " / ".join(sorted(described))


def least_resident(runs: list[dict[str, Any]]) -> str:
    """The least of the model file any worker (a process that answered) had resident."""
    return format_size(min(min(r["weights_resident"]) for r in runs))


def ratios(servers: list[str]) -> list[tuple[str, str]]:
    """The columns divided by others: fork by unbatched (what batching gains), every workerpool
    server by gunicorn, else fork by spawn."""
    pairs = [("fork", "unbatched")] if {"fork", "unbatched"} <= set(servers) else []
    if "gunicorn" in servers:
        pairs += [(name, "gunicorn") for name in servers if name != "gunicorn"]
    elif {"fork", "spawn"} <= set(servers):
        pairs.append(("fork", "spawn"))
    return pairs


def print_setup(load: Load, servers: list[str], runs: dict[str, list[dict[str, Any]]],
                in_process: list[dict[str, Any]], repeat: int) -> float:
    """What was run, and how: the lines above the table; the in-process p50, which the table
    divides by."""
    cpus = len(os.sched_getaffinity(0))
    size = format_size(os.path.getsize(load.model))
    print(f"{load.workers} workers on {cpus} CPUs, {size} mlp, one-row float32 requests, "
          f"{load.seconds:g} s per level; medians of {repeat} alternating runs of each")
    ours = [name for name in servers if name != "gunicorn"]
    threads = [f"{load.blas_threads} in every server"]
    if ours:
        threads.append("workerpool --threads-per-worker")
    if "gunicorn" in servers:
        threads.append(f"gunicorn post_fork threadpoolctl, a worker reports "
                       f"{runs['gunicorn'][-1]['blas_threads']}")
    print(f"BLAS threads per worker: {threads[0]} ({'; '.join(threads[1:])})")
    clients = [f"workerpool {', '.join(ours)}: one DEALER socket"] if ours else []
    if "gunicorn" in servers:
        clients.append(f"gunicorn --preload --worker-class gthread --threads {load.gthreads}, "
                       f"keep-alive: one HTTP/1.1 connection per request in flight")
    print("; ".join(clients))
    forward = statistics.median(r["p50_us"] for r in in_process)
    each = ", ".join(f"{r['p50_us']:.0f}" for r in in_process)
    print(f"in-process forward pass (this process, 1 BLAS thread, LoadedModel.infer, no "
          f"transport): p50 {forward:.0f} µs, median over the rounds of the p50 of "
          f"{IN_PROCESS_CALLS} calls ({each} µs)")
    print("PSS of every serving process, read once every worker had answered:")
    for name in servers:
        print(f"  {processes(name, runs[name])}; the least of the model any worker had "
              f"resident: {least_resident(runs[name])}")
    return forward


def print_table(load: Load, servers: list[str], runs: dict[str, list[dict[str, Any]]],
                figures: dict[str, dict[str, float]], in_process: list[dict[str, Any]],
                repeat: int, loads: tuple[str, str]) -> None:
    forward = print_setup(load, servers, runs, in_process, repeat)
    print()
    divided = ratios(servers)
    head = [SERVERS[name].label for name in servers]
    head += [f"{a} / {b}" for a, b in divided]
    print("| figure | " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * len(head))

    def row(label: str, key: str, unit: str, scale: float = 1.0, digits: int = 0) -> None:
        values: dict[str, float | None] = {
            name: figures[name].get(key) if key != "others_pss" or SERVERS[name].helper else None
            for name in servers}
        cells = ["—" if v is None else f"{v / scale:.{digits}f}{unit}" for v in values.values()]
        for a, b in divided:
            ours, theirs = values[a], values[b]
            cells.append(f"{ours / theirs:.2f}x" if ours and theirs else "—")
        print(f"| {label} | " + " | ".join(cells) + " |")

    roots = " / ".join(dict.fromkeys(SERVERS[name].root for name in servers))
    for label, key in (("total PSS", "pss"), (f"  {roots}", "root_pss"),
                       ("  template", "others_pss"), ("  workers (sum)", "workers_pss")):
        if key != "others_pss" or any(SERVERS[name].helper for name in servers):
            row(label, key, " MiB", 2**20, 1)
    for k in load.levels:
        row(f"req/s, {k} in flight", f"rps@{k}", "")
        row(f"p50, {k} in flight", f"p50_us@{k}", " µs")
        row(f"p99, {k} in flight", f"p99_us@{k}", " µs")
        if any(name != "gunicorn" for name in servers):
            row(f"rows per forward pass, {k} in flight", f"rows_per_batch@{k}", "", digits=1)
    if 1 in load.levels:
        cells = [f"{figures[name]['p50_us@1'] / forward:.1f}x" for name in servers]
        print("| p50, 1 in flight / in-process forward pass | "
              + " | ".join(cells + ["—"] * len(divided)) + " |")
    print()
    print_load_averages(loads)


def server_list(text: str) -> list[str]:
    """``--servers fork,gunicorn``: which to run, in the order of ``SERVERS``."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in SERVERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"not among {', '.join(SERVERS)}: {', '.join(unknown)}")
    return [name for name in SERVERS if name in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    add_mlp_pool(parser, "16MiB", 2, "workers of each server")
    add_levels(parser, "--in-flight", "1,16,64", dest="levels")
    parser.add_argument("--seconds", type=float, default=3.0, help="per level and run (default: 3)")
    add_count(parser, "--repeat", 2, "runs of each server, alternating")
    parser.add_argument("--servers", type=server_list, default=list(SERVERS),
                        help="comma-separated servers to compare, among fork (workerpool --start "
                        "fork), unbatched (the same with --max-batch 1), spawn (--start spawn) and "
                        "gunicorn (default: all four)")
    add_count(parser, "--gunicorn-threads", 1, "gthread threads per gunicorn worker")
    add_json(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with scratch_run("compare", args.size) as run:
        load = Load.of(run, args.workers, args.levels, args.seconds, gthreads=args.gunicorn_threads)
        runs, in_process = run_alternating(load, args.servers, args.repeat)
        figures = {name: medians(runs[name], args.levels) for name in args.servers}
        loads = (run.start_load, load_average())
        print_table(load, args.servers, runs, figures, in_process, args.repeat, loads)
    if args.json:
        write_figures(args.json, "compare.py", {
            "workers": args.workers, "servers": args.servers, "model_size": run.generated.size_bytes,
            "blas_threads": load.blas_threads, "gunicorn_threads": args.gunicorn_threads,
            "load_average": loads, "medians": figures, "runs": runs, "in_process": in_process})
    return 0


if __name__ == "__main__":
    sys.exit(main())
