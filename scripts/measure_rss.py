#!/usr/bin/env python3
"""Memory of a real workerpool server against its worker count: fork, spawn, private copies.

For each N, starts ``workerpool serve`` once per pool: ``--start fork`` (workers forked from a
warm template) and ``--start spawn`` (each worker a fresh interpreter), both mapping the weights
(``--load mmap``), then ``--load copy`` (a private copy of the weights in every worker, the naive
pool) unless ``--no-baseline``. Reads every worker's memory right after the ready line (the
*idle* worker: model built, no weight touched), sends requests until every worker has touched
all its weights, reads the memory again through the control socket's ``status`` and the PSS of
every process of the pool (supervisor, template, workers) with psutil, and stops the server.
Then, for each pool, what each added worker costs: the least-squares slope of the total PSS
against N.

    python scripts/measure_rss.py                  # 512 MiB model, N = 1,2,4,8: fork, spawn, copy
    python scripts/measure_rss.py --size 1GiB --workers 8 --repeat 5
    python scripts/measure_rss.py --start fork --no-baseline --size 64MiB --workers 1,4
    python scripts/measure_rss.py --json scripts/results/memory.json --plot scripts/results/memory.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from statistics import mean, median
from typing import Any

import numpy as np
from benchlib.arguments import add_json, parser_for
from benchlib.memory import tree_memory
from benchlib.runs import stop_servers_on_sigterm, write_figures

import workerpool
from workerpool.control import client as control
from workerpool.testing import ServerProcess, serve_args
from workerpool.units import format_size, parse_size

TOUCHED = 0.95  # a worker has touched its weights when this much of the file is resident
COUNTS = re.compile(r"\s*[+-]?\d+\s*(,\s*[+-]?\d+\s*)*")  # what int() reads, comma-separated
START_METHODS = ("fork", "spawn")


@dataclass(frozen=True)
class Pool:
    """One kind of pool measured: ``name`` is "fork", "spawn" (both mmap) or "copy"."""

    name: str
    load: str
    start: str

    @property
    def label(self) -> str:
        return f"--load {self.load} --start {self.start}"


def pools(starts: list[str], baseline: bool) -> list[Pool]:
    """An mmap pool per start method; then the copy baseline, started as the first of them."""
    chosen = [Pool(start, "mmap", start) for start in starts]
    return chosen + ([Pool("copy", "copy", starts[0])] if baseline else [])


def touched(worker: dict[str, Any], load: str, size: int) -> bool:
    """mmap: the worker's mapping holds the whole file; copy: it holds its copy and has served."""
    memory = worker["memory"] or {}
    if load == "mmap":
        return memory.get("weights_resident", 0) >= TOUCHED * size
    return worker["served"] > 0 and memory.get("anon", 0) >= TOUCHED * size


def touch_all(control_endpoint: str, endpoint: str, workers: int, load: str, size: int,
              timeout: float) -> tuple[dict[str, Any], int]:
    """Send requests, N in flight (the router hands each to a free worker), until every worker
    has touched all its weights; return the status that shows it and the requests sent."""
    deadline = time.monotonic() + timeout
    sent = 0
    with workerpool.Client(endpoint, timeout=60) as client:
        x = np.ones((1, client.info()["inputs"][0]["shape"][1]), np.float32)
        while True:
            for _ in client.infer_many(itertools.repeat(x, 2 * workers), window=workers):
                sent += 1
            status = control.call(control_endpoint, "status", timeout=30)
            if all(touched(w, load, size) for w in status["workers"]):
                return status, sent
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not touch their weights within {timeout:g}s: "
                                   f"{[w['memory'] for w in status['workers']]}")


def pool_tree(pid: int, model: str, status: dict[str, Any]) -> dict[str, Any]:
    """The PSS of every process of the pool (``benchlib.memory.tree_memory``), its workers being
    the ones ``status`` lists."""
    return tree_memory(pid, model, {w["pid"] for w in status["workers"]})


def measure(model: str, size: int, workers: int, pool: Pool, directory: str,
            timeout: float) -> dict[str, Any]:
    """One server: startup time, idle and loaded memory of every worker, and of every process
    of the pool (supervisor, template, workers)."""
    control_endpoint = f"ipc://{directory}/control-{pool.name}-{workers}"
    args = serve_args(model, workers, "--load", pool.load, "--start", pool.start,
                      "--control", control_endpoint, "--log-level", "warning")
    log_path = os.path.join(directory, f"serve-{pool.name}-{workers}.log")
    started = time.monotonic()
    with ServerProcess(args, log_path=log_path, timeout=timeout) as server:
        startup = time.monotonic() - started  # to the ready line
        assert server.proc is not None
        idle = control.call(control_endpoint, "status", timeout=30)
        idle_tree = pool_tree(server.proc.pid, model, idle)
        loaded, requests = touch_all(control_endpoint, server.endpoint, workers, pool.load, size,
                                     timeout)
        loaded_tree = pool_tree(server.proc.pid, model, loaded)
    return {
        "workers": workers,
        "pool": pool.name,
        "mode": pool.load,
        "start": pool.start,
        "startup_s": startup,
        "requests": requests,
        "idle": [w["memory"] for w in idle["workers"]],
        "loaded": [w["memory"] for w in loaded["workers"]],
        "idle_totals": idle["totals"],
        "totals": loaded["totals"],
        "idle_processes": idle_tree,
        "processes": loaded_tree,
    }


def ensure_model(path: str, size_text: str) -> None:
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "workerpool", "new-model", path, "--size", size_text],
                       check=True, stdout=subprocess.DEVNULL)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def print_table(runs: list[dict[str, Any]], model_size: int) -> None:
    print(f"model {format_size(model_size)}; figures in MiB, read after every worker touched all "
          f"its weights")
    print("anon, uss, pss, pte: means over the workers; supervisor, template, workers: PSS of "
          "each part of the pool; total PSS: every process of the pool")
    print(f"{'N':>3} {'pool':<5} {'anon':>8} {'uss':>8} {'pss':>8} {'pte':>6} {'supervisor':>10} "
          f"{'template':>8} {'workers':>8} {'total PSS':>10} {'startup s':>10}")
    for run in runs:
        loaded, tree = run["loaded"], run["processes"]
        cells = [mib(mean(m[k] for m in loaded)) for k in ("anon", "uss", "pss")]
        template = mib(tree["others_pss"]) if run["start"] == "fork" else "-"
        print(f"{run['workers']:>3} {run['pool']:<5} " + " ".join(f"{c:>8}" for c in cells)
              + f" {mean(m['pte'] for m in loaded) / 2**20:>6.2f} {mib(tree['root_pss']):>10}"
              f" {template:>8} {mib(tree['workers_pss']):>8} {mib(tree['pss']):>10}"
              f" {run['startup_s']:>10.2f}")


def slope(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Least-squares line of total PSS (every process) against N: bytes per worker, and at N=0."""
    ns = [r["workers"] for r in runs]
    per_worker, fixed = np.polyfit(ns, [r["processes"]["pss"] for r in runs], 1)
    return float(per_worker), float(fixed)


def costs(runs: list[dict[str, Any]], model_size: int) -> list[str]:
    """What each added worker costs in each pool: the slope of total PSS against N."""
    counts = sorted({r["workers"] for r in runs})
    if len(counts) < 2:
        return [(f"PSS each added worker costs: not measured, that needs two worker counts or "
                 f"more (ran N = {counts[0]} only)")]
    header = (f"PSS each added worker costs (MiB): the least-squares slope of the total PSS of "
              f"every process of the pool against N, over N = {', '.join(map(str, counts))};\n"
              f"fixed (MiB): that line at N = 0, the supervisor, the template (fork) and, when "
              f"mapped, the weights once (model {mib(model_size)} MiB)")
    lines = [header]
    for name in dict.fromkeys(r["pool"] for r in runs):
        chosen = [r for r in runs if r["pool"] == name]
        per_worker, fixed = slope(chosen)
        lines.append(f"  {name:<5} (--load {chosen[0]['mode']} --start {chosen[0]['start']}): "
                     f"{mib(per_worker):>7} per added worker, fixed {mib(fixed):>7}")
    return lines


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: python3 -m pip install -e '.[plot]' (in the checkout)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


STYLES = {"fork": "o-", "spawn": "^-", "copy": "s--"}
LABELS = {"fork": "shared weights, forked workers (default)", "spawn": "shared weights, spawned workers",
          "copy": "a private copy per worker"}


def plot(runs: list[dict[str, Any]], model_size: int, path: str) -> None:
    """Total PSS against N, one line per pool; and the same less the model's size for the mmap
    pools (fork, spawn), whose lines the copy baseline's would dwarf."""
    plt = pyplot()
    fig, (total, beyond) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=150)
    names = list(dict.fromkeys(r["pool"] for r in runs))
    mapped = [name for name in names if name != "copy"] or names
    for name in names:
        chosen = [r for r in runs if r["pool"] == name]
        ns = [r["workers"] for r in chosen]
        totals = [r["processes"]["pss"] / 2**20 for r in chosen]
        total.plot(ns, totals, STYLES[name], label=LABELS[name])
        if name in mapped:
            beyond.plot(ns, [t - model_size / 2**20 for t in totals], STYLES[name], label=LABELS[name])
    total.axhline(model_size / 2**20, color="grey", linewidth=0.8, linestyle=":",
                  label="model file")
    total.set(title="Memory of the whole pool", xlabel="workers", ylabel="MiB (PSS)", ylim=(0, None))
    beyond.set(title="Beyond one copy of the weights (shared pools)", xlabel="workers",
               ylabel="MiB (PSS)", ylim=(0, None))
    for axes in (total, beyond):
        axes.set_xticks(sorted({r["workers"] for r in runs}))
        axes.grid(alpha=0.3)
        axes.legend()
    fig.suptitle(headline(runs, model_size), fontsize="large", fontweight="bold")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def worker_counts(text: str) -> list[int]:
    """``--workers 1,2,4,8``: the pool sizes to measure, each at least 1."""
    if not COUNTS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}")
    counts = [int(part) for part in text.split(",")]
    if min(counts) < 1:
        raise argparse.ArgumentTypeError("worker counts must be >= 1")
    return counts


def start_methods(text: str) -> list[str]:
    """``--start fork,spawn``: the start methods to measure, in the order given."""
    methods = list(dict.fromkeys(part.strip() for part in text.split(",")))
    unknown = [m for m in methods if m not in START_METHODS]
    if unknown:
        raise argparse.ArgumentTypeError(f"not among {', '.join(START_METHODS)}: "
                                         f"{', '.join(unknown)}")
    return methods


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    parser.add_argument("--size", default="512MiB", help="model size (default: %(default)s)")
    parser.add_argument("--workers", type=worker_counts, default=[1, 2, 4, 8],
                        help="comma-separated worker counts (default: 1,2,4,8)")
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="the model to serve, created with 'workerpool new-model' when absent "
                        "and then kept (default: a temporary one)")
    parser.add_argument("--start", type=start_methods, default=list(START_METHODS),
                        metavar="fork,spawn", help="comma-separated start methods of the mmap "
                        "pools; the copy baseline is started with the first (default: fork,spawn)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the --load copy runs")
    add_json(parser)
    parser.add_argument("--plot", metavar="PATH.png", help="draw the figures here (matplotlib)")
    parser.add_argument("--from-json", metavar="PATH",
                        help="draw --plot from figures saved by --json, without measuring")
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="start each server K times and report the median startup time; "
                        "memory is from the last start (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds a server may take to start, or its workers to touch their "
                        "weights (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    try:
        parse_size(args.size)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def headline(runs: list[dict[str, Any]], model_size: int) -> str:
    """The chart's one sentence: shared against copied at the most workers measured."""
    most = max(r["workers"] for r in runs)
    at = {r["pool"]: r["processes"]["pss"] for r in runs if r["workers"] == most}
    shared = at.get("fork", at.get("spawn"))
    text = f"{format_size(model_size)} model, {most} workers"
    if shared is not None and "copy" in at:
        return f"{text}: {format_size(int(shared))} shared vs {format_size(int(at['copy']))} copied"
    return text + (f": {format_size(int(shared))} in all" if shared is not None else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        if not args.plot:
            raise SystemExit("--from-json draws a chart: give --plot PATH.png")
        plot(saved["runs"], saved["model_size"], args.plot)
        return 0
    if args.plot:
        pyplot()  # fail before measuring, not after
    stop_servers_on_sigterm()  # run the clean-up below
    chosen = pools(args.start, not args.no_baseline)
    try:
        with tempfile.TemporaryDirectory(prefix="wp-rss-") as directory:
            model = args.model or os.path.join(directory, "model.bpk")
            ensure_model(model, args.size)
            model_size = os.path.getsize(model)
            runs = []
            for pool, n in itertools.product(chosen, args.workers):
                repeats = [measure(model, model_size, n, pool, directory, args.timeout)
                           for _ in range(args.repeat)]
                startups = [r["startup_s"] for r in repeats]
                runs.append({**repeats[-1], "startup_s": median(startups), "startups": startups})
                print(f"  measured N={n} {pool.name} ({pool.label})", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted; servers stopped and temporary files removed", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.CalledProcessError, control.ControlError,
            workerpool.WorkerpoolError) as exc:
        print(f"measure_rss: error: {exc}", file=sys.stderr)
        return 1
    print_table(runs, model_size)
    print()
    print("\n".join(costs(runs, model_size)))
    if args.json:
        write_figures(args.json, "measure_rss.py", {
            "model_size": model_size, "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "runs": runs})
    if args.plot:
        plot(runs, model_size, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
