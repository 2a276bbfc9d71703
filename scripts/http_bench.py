"""The HTTP front door against the ZeroMQ client, gunicorn ``--preload`` and Mosec, same run,
same model.

One pool (``workerpool serve --http``, 2 workers, a 4 MiB ``mlp``, one-row float32 requests) is
driven by wrk over keep-alive connections with binary KServe v2 bodies, and by the ZeroMQ
client (``benchlib.zmq_load.drive``) on the same pool; ``gunicorn --preload`` (``compare_app``, gthread
workers, keep-alive, the same BLAS budget) and Mosec (``compare_app/mosec_app.py``: its Rust
front, 2 Python workers, dynamic batching up to 16) are driven by wrk with the same row as raw
bytes. Each round runs the servers in turn, the order rotating; the table gives the medians of
the rounds at 1, 16 and 64 connections (requests in flight for the ZeroMQ client), and any
answer that was not 200. Mosec runs where it is installed (``pip install mosec``). With
``--baseline TREE`` the pool of another checkout runs in every round too (``baseline``), for a
before-and-after in one run.

This is the benchmark the HTTP and supervisor-CPU figures of docs/benchmarks.md come from,
with its defaults: 3 rounds of 5 s per level.

    python3 -m pip install -e '.[http,compare]'   # and wrk: apt-get install wrk
    python3 scripts/http_bench.py [--rounds 3] [--seconds 5] [--baseline ../baseline]
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from benchlib.arguments import rounds_arguments
from benchlib.cpu import with_supervisor_cpu
from benchlib.gunicorn import gunicorn_server
from benchlib.http_load import kserve_body
from benchlib.paths import SCRIPTS_DIR
from benchlib.pools import http_pool
from benchlib.runs import Load, load_average, require_commands, scratch_run
from benchlib.servers import free_port, stop_session, wait_for_http
from benchlib.wrk import run_wrk, wrk_post_script
from benchlib.zmq_load import drive

from workerpool.protocol import messages as protocol

LEVELS = (1, 16, 64)

Runs = dict[str, list[dict[str, Any]]]  # a server's name: its figures at each level


def run_pool(load: Load, scripts: dict[str, str], seconds: float, tree: str | None = None) -> Runs:
    """One pool with its HTTP front door open, driven at each level by wrk, then by the ZeroMQ
    client; the supervisor's CPU per request with each. ``tree``: the baseline's checkout."""
    port = free_port()
    frames = protocol.encode_request(0, load.row)
    with http_pool(load, port, tree=tree) as pool:
        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        run_wrk(url, scripts["kserve"], 16, 1)  # warm the gateway and its connections
        http, zmq = [], []
        for k in LEVELS:
            http.append(with_supervisor_cpu(pool.pid, partial(run_wrk, url, scripts["kserve"], k, seconds), seconds))
            zmq.append(with_supervisor_cpu(pool.pid, partial(drive, pool.endpoint, frames, k, seconds), seconds))
    return {"baseline": http, "baseline zmq": zmq} if tree else {"http": http, "zmq": zmq}


def run_gunicorn(load: Load, scripts: dict[str, str], seconds: float) -> Runs:
    with gunicorn_server(load) as (_, port):
        url = f"http://127.0.0.1:{port}/"
        run_wrk(url, scripts["raw"], 16, 1)
        return {"gunicorn": [run_wrk(url, scripts["raw"], k, seconds) for k in LEVELS]}


def run_mosec(load: Load, scripts: dict[str, str], seconds: float) -> Runs:
    port = free_port()
    env = {**os.environ, "COMPARE_MODEL": load.model, "COMPARE_WORKERS": str(load.workers),
           "COMPARE_THREADS": str(load.blas_threads), "COMPARE_MAX_BATCH": "16"}
    command = [sys.executable, os.path.join(SCRIPTS_DIR, "compare_app", "mosec_app.py"), "--port", str(port),
               "--address", "127.0.0.1", "--log-level", "warning"]
    with open(os.path.join(load.directory, "mosec.log"), "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/inference"
        wait_for_http(url, load.row.tobytes(), proc)
        run_wrk(url, scripts["raw"], 16, 1)
        return {"mosec": [run_wrk(url, scripts["raw"], k, seconds) for k in LEVELS]}
    finally:
        stop_session(proc)


def print_baseline(runs: dict[str, list[list[dict[str, Any]]]]) -> None:
    """This tree's pool against the baseline's, over HTTP and the ZeroMQ client."""
    print("\n| connections | baseline HTTP: req/s, p50 | baseline ZeroMQ: req/s | HTTP ÷ baseline | "
          "ZeroMQ ÷ baseline | baseline supervisor CPU µs: HTTP, ZeroMQ |")
    print("| ---: " * 6 + "|")
    for i, k in enumerate(LEVELS):
        ours, theirs = median_of(runs["http"], i, "rps"), median_of(runs["baseline"], i, "rps")
        ours_zmq, theirs_zmq = median_of(runs["zmq"], i, "rps"), median_of(runs["baseline zmq"], i, "rps")
        print(f"| {k} | {theirs:.0f}, {median_of(runs['baseline'], i, 'p50_us') / 1e3:.2f} ms | {theirs_zmq:.0f} | "
              f"{ours / theirs:.2f}x | {ours_zmq / theirs_zmq:.2f}x | "
              f"{median_of(runs['baseline'], i, 'supervisor_us'):.0f}, "
              f"{median_of(runs['baseline zmq'], i, 'supervisor_us'):.0f} |")


def median_of(runs: list[list[dict[str, Any]]], index: int, key: str) -> float:
    return statistics.median(run[index][key] for run in runs)


def main() -> int:
    args = rounds_arguments(__doc__, rounds=3, seconds=5.0, baseline=True)
    require_commands("http_bench", "wrk")
    with scratch_run("http_bench", 4 * 1024 * 1024) as scratch:
        row = scratch.row
        load = Load.of(scratch, 2, list(LEVELS), args.seconds, blas_threads=1, gthreads=4)
        body, headers = kserve_body(row)
        scripts = {"kserve": wrk_post_script(os.path.join(scratch.directory, "kserve.lua"), body, headers),
                   "raw": wrk_post_script(os.path.join(scratch.directory, "raw.lua"), row.tobytes(),
                                          {"Content-Type": "application/octet-stream"})}
        runs: dict[str, list[list[dict[str, Any]]]] = {"http": [], "zmq": [], "gunicorn": []}
        servers: list[Callable[[Load, dict[str, str], float], Runs]] = [run_pool, run_gunicorn]
        if args.baseline:
            servers.append(partial(run_pool, tree=args.baseline))
            runs.update({"baseline": [], "baseline zmq": []})
        if importlib.util.find_spec("mosec") is not None:
            servers.append(run_mosec)
            runs["mosec"] = []
        else:
            print("mosec is not installed (pip install mosec): it is left out", file=sys.stderr)
        before = scratch.start_load
        for round_number in range(args.rounds):
            rotation = round_number % len(servers)
            for server in servers[rotation:] + servers[:rotation]:
                for name, levels in server(load, scripts, args.seconds).items():
                    runs[name].append(levels)
        after = load_average()
    print(f"4 MiB mlp, 2 workers, one-row float32 requests; {args.rounds} rounds of {args.seconds:g} s per "
          f"level, medians; load average {before} before, {after} after\n")
    mosec = "mosec" in runs
    print("| connections | HTTP (KServe v2, binary): req/s, p50, p99 | ZeroMQ client | gunicorn --preload "
          + ("| Mosec " if mosec else "") + "| HTTP ÷ gunicorn: req/s, p50 | HTTP ÷ ZeroMQ: req/s "
          + ("| HTTP ÷ Mosec: req/s |" if mosec else "|"))
    print("| ---: " * (6 + 2 * mosec) + "|")
    for index, k in enumerate(LEVELS):
        cells = {}
        for name, run in runs.items():
            rps, p50, p99 = (median_of(run, index, key) for key in ("rps", "p50_us", "p99_us"))
            cells[name] = (rps, p50, p99)
        text = {name: f"{rps:.0f}, {p50 / 1e3:.2f} ms, {p99 / 1e3:.2f} ms" for name, (rps, p50, p99) in cells.items()}
        print(f"| {k} | {text['http']} | {text['zmq']} | {text['gunicorn']} | "
              + (f"{text['mosec']} | " if mosec else "")
              + f"{cells['http'][0] / cells['gunicorn'][0]:.2f}x, {cells['http'][1] / cells['gunicorn'][1]:.2f}x | "
              f"{cells['http'][0] / cells['zmq'][0]:.2f}x |"
              + (f" {cells['http'][0] / cells['mosec'][0]:.2f}x |" if mosec else ""))
    print("\nthe supervisor's CPU per request (µs, medians): " + "; ".join(
        f"{k} in flight: HTTP {median_of(runs['http'], i, 'supervisor_us'):.0f}, "
        f"ZeroMQ {median_of(runs['zmq'], i, 'supervisor_us'):.0f}" for i, k in enumerate(LEVELS)))
    if args.baseline:
        print_baseline(runs)
    failed = {name: sum(level.get("failed", 0) for run in runs[name] for level in run)
              for name in runs if not name.endswith("zmq")}
    print("\nanswers other than 200: " + ", ".join(f"{name} {count}" for name, count in failed.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
