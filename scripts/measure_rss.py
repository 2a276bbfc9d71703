#!/usr/bin/env python3
"""Memory of a real workerpool server against its worker count: fork, spawn, private copies.

For each N, starts ``workerpool serve`` once per pool: ``--start fork`` (workers forked from a
warm template) and ``--start spawn`` (each worker a fresh interpreter), both mapping the weights
(``--load mmap``), then ``--load copy`` (a private copy of the weights in every worker, the naive
pool) unless ``--no-baseline``. Reads every worker's memory right after the ready line (the
*idle* worker: model built), sends requests made from the model's ``info`` (a sentence each for
a model that takes texts, else one row of ones of every declared array) until every worker has
answered ``--answered`` of them and, for a model whose every pass reads all its weights (the
built-in ``mlp`` and ``burn-mnist``), has touched them all (95% of the file resident in its
mapping, or in its heap for ``--load copy``); then reads the memory again through the control
socket's ``status`` and the PSS of every process of the pool (supervisor, template, workers)
with psutil, with how much of the weight file, and of an onnx model's prepacked copy, each
worker holds resident, and stops the server. Then, for each pool, what each added worker costs:
the least-squares slope of the total PSS against N.

The model is a generated ``mlp`` of ``--size``, or any file the server serves (``--model``: a
converted MiniLM or ONNX model, Burn's MNIST...).

    python scripts/measure_rss.py                  # 512 MiB model, N = 1,2,4,8: fork, spawn, copy
    python scripts/measure_rss.py --size 1GiB --workers 8 --repeat 5
    python scripts/measure_rss.py --start fork --no-baseline --size 64MiB --workers 1,4
    python scripts/measure_rss.py --model minilm.bpk --workers 1,2,4
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
from benchlib.arguments import add_json, at_least_one, parser_for
from benchlib.inputs import NoInput, requests_for
from benchlib.memory import residency, tree_memory
from benchlib.runs import stop_servers_on_sigterm, write_figures

import workerpool
from workerpool.control import client as control
from workerpool.linux.procfs import processes_mapping
from workerpool.runtime import default_cache_dir
from workerpool.testing import ServerProcess, serve_args
from workerpool.units import format_size, parse_size

TOUCHED = 0.95  # a worker has touched its weights when this much of the file is resident
READS_EVERY_WEIGHT = ("mlp", "burn-mnist")  # built-in models whose every pass reads all the file
COUNTS = re.compile(r"\s*[+-]?\d+\s*(,\s*[+-]?\d+\s*)*")  # what int() reads, comma-separated
START_METHODS = ("fork", "spawn")
DEFAULT_SIZE = "512MiB"


@dataclass(frozen=True)
class Pool:
    """One kind of pool measured: ``name`` is "fork", "spawn" (both mmap) or "copy"."""

    name: str
    load: str
    start: str

    @property
    def label(self) -> str:
        return f"--load {self.load} --start {self.start}"


@dataclass(frozen=True)
class Reading:
    """How every pool is read: the requests each worker answers first, how long a server may
    take to start or its workers to meet the criterion, and the servers' ``--cache-dir``."""

    answered: int
    timeout: float
    cache_dir: str


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


@dataclass(frozen=True)
class Criterion:
    """When a worker's memory is read: once it has answered ``answered`` requests and, for a
    model whose every pass reads all its weights (``touched``), holds them all. Other models
    never hold all of the file: a text model reads the embedding rows of the tokens it is sent,
    an onnx model's sessions map a prepacked copy instead of most of it."""

    kind: str  # the model as ``info`` names it: mlp, burn-mnist, bert, onnx, yours
    answered: int
    touched: bool

    @classmethod
    def of(cls, info: dict[str, Any], answered: int) -> Criterion:
        kind = str(info.get("model"))
        return cls(kind, answered, kind in READS_EVERY_WEIGHT)

    def met(self, worker: dict[str, Any], load: str, size: int) -> bool:
        return worker["served"] >= self.answered and (not self.touched or touched(worker, load, size))

    def describe(self) -> str:
        text = f"read once every worker had answered {self.answered} requests or more"
        if self.touched:
            return (f"{text} and touched all its weights ({self.kind} reads every weight in every "
                    f"pass: {TOUCHED:.0%} of the file resident in its mapping, or in its heap for "
                    f"--load copy)")
        return (f"{text} ({self.kind} need not read every weight in a pass: 'file' is how much of "
                f"the weight file each worker holds resident, 'prepacked' how much of an onnx "
                f"model's prepacked copy in --cache-dir, both means over the workers)")


def touch_all(control_endpoint: str, endpoint: str, workers: int, load: str, size: int,
              answered: int, timeout: float) -> tuple[dict[str, Any], int, Criterion]:
    """Send requests made from the model's ``info``, N in flight (the router hands each to a
    free worker), until every worker meets the model's :class:`Criterion`; return the status
    that shows it, the requests sent and the criterion."""
    deadline = time.monotonic() + timeout
    sent = 0
    with workerpool.Client(endpoint, timeout=60) as client:
        info = client.info()
        criterion, requests = Criterion.of(info, answered), itertools.cycle(requests_for(info))
        while True:
            for _ in client.infer_many(itertools.islice(requests, 2 * workers), window=workers):
                sent += 1
            status = control.call(control_endpoint, "status", timeout=30)
            if all(criterion.met(w, load, size) for w in status["workers"]):
                return status, sent, criterion
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not meet the criterion within {timeout:g}s "
                                   f"({criterion.describe()}): served "
                                   f"{[w['served'] for w in status['workers']]}, memory "
                                   f"{[w['memory'] for w in status['workers']]}")


def pool_tree(pid: int, model: str, status: dict[str, Any]) -> dict[str, Any]:
    """The PSS of every process of the pool (``benchlib.memory.tree_memory``), its workers being
    the ones ``status`` lists."""
    return tree_memory(pid, model, {w["pid"] for w in status["workers"]})


def measure(model: str, size: int, workers: int, pool: Pool, directory: str,
            reading: Reading) -> dict[str, Any]:
    """One server: startup time, idle and loaded memory of every worker, and of every process
    of the pool (supervisor, template, workers); what each worker holds of the weights."""
    control_endpoint = f"ipc://{directory}/control-{pool.name}-{workers}"
    args = serve_args(model, workers, "--load", pool.load, "--start", pool.start,
                      "--control", control_endpoint, "--cache-dir", reading.cache_dir,
                      "--log-level", "warning")
    log_path = os.path.join(directory, f"serve-{pool.name}-{workers}.log")
    started = time.monotonic()
    with ServerProcess(args, log_path=log_path, timeout=reading.timeout) as server:
        startup = time.monotonic() - started  # to the ready line
        assert server.proc is not None
        idle = control.call(control_endpoint, "status", timeout=30)
        idle_tree = pool_tree(server.proc.pid, model, idle)
        loaded, requests, criterion = touch_all(control_endpoint, server.endpoint, workers,
                                                pool.load, size, reading.answered,
                                                reading.timeout)
        loaded_tree = pool_tree(server.proc.pid, model, loaded)
        resident = residency(loaded, model, reading.cache_dir)
    return {
        "kind": criterion.kind,
        "criterion": criterion.describe(),
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
        "resident": resident,
    }


def generate_model(path: str, size_text: str) -> None:
    subprocess.run([sys.executable, "-m", "workerpool", "new-model", path, "--size", size_text],
                   check=True, stdout=subprocess.DEVNULL)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def percent(fractions: list[float]) -> str:
    """The mean of fractions, as a percentage; "-" for none."""
    return f"{100 * mean(fractions):.0f}%" if fractions else "-"


def print_table(runs: list[dict[str, Any]], model_size: int) -> None:
    prepacked = max(run["resident"]["prepacked_size"] for run in runs)
    print(f"model {runs[0]['kind']}, {format_size(model_size)}; figures in MiB, "
          f"{runs[0]['criterion']}")
    print("anon, uss, pss, pte: means over the workers; supervisor, template, workers: PSS of "
          "each part of the pool; total PSS: every process of the pool; file: the weight file "
          "resident in a worker's mapping (--load mmap)"
          + (f"; prepacked: the model's prepacked copy ({format_size(prepacked)}, in "
             f"--cache-dir) resident in it" if prepacked else ""))
    print(f"{'N':>3} {'pool':<5} {'anon':>8} {'uss':>8} {'pss':>8} {'pte':>6} {'supervisor':>10} "
          f"{'template':>8} {'workers':>8} {'total PSS':>10} {'startup s':>10} {'file':>5}"
          + (f" {'prepacked':>9}" if prepacked else ""))
    for run in runs:
        loaded, tree = run["loaded"], run["processes"]
        cells = [mib(mean(m[k] for m in loaded)) for k in ("anon", "uss", "pss")]
        template = mib(tree["others_pss"]) if run["start"] == "fork" else "-"
        file = percent(run["resident"]["file"]) if run["mode"] == "mmap" else "-"
        print(f"{run['workers']:>3} {run['pool']:<5} " + " ".join(f"{c:>8}" for c in cells)
              + f" {mean(m['pte'] for m in loaded) / 2**20:>6.2f} {mib(tree['root_pss']):>10}"
              f" {template:>8} {mib(tree['workers_pss']):>8} {mib(tree['pss']):>10}"
              f" {run['startup_s']:>10.2f} {file:>5}"
              + (f" {percent(run['resident']['prepacked']):>9}" if prepacked else ""))


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
    parser.add_argument("--size", help=f"size of the generated mlp model (default: {DEFAULT_SIZE})")
    parser.add_argument("--workers", type=worker_counts, default=[1, 2, 4, 8],
                        help="comma-separated worker counts (default: 1,2,4,8)")
    parser.add_argument("--model", metavar="FILE",
                        help="serve this weight file instead of a generated mlp: any .bpk the "
                        "server serves (converted with 'workerpool convert', or Burn's)")
    parser.add_argument("--answered", type=at_least_one, default=4, metavar="K",
                        help="requests each worker answers before its memory is read "
                        "(default: %(default)s)")
    parser.add_argument("--cache-dir", default=default_cache_dir(), metavar="DIR",
                        help="the servers' --cache-dir, where an onnx model's prepacked copy is "
                        "made once and mapped by every worker (default: %(default)s)")
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
    if args.model is not None and args.size is not None:
        parser.error("--size sizes the generated model; a --model FILE is served as it is")
    if args.model is not None and not args.from_json:
        problem = model_problem(args.model)
        if problem:
            parser.error(f"--model {args.model}: {problem}")
    args.size = args.size or DEFAULT_SIZE
    try:
        parse_size(args.size)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def model_problem(path: str) -> str | None:
    """Why the server could not serve ``path`` as a weight file, or None."""
    convert = ("an ONNX model or a model folder is converted first: workerpool convert "
               f"{path} model.bpk (docs/models.md)")
    if os.path.isdir(path):
        return f"a folder, not a weight file; {convert}"
    if not os.path.exists(path):
        return "no such file"
    if path.endswith(".onnx"):
        return convert
    if not os.access(path, os.R_OK):
        return "not readable"
    return None


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
    reading = Reading(args.answered, args.timeout, args.cache_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="wp-rss-") as directory:
            model = args.model or os.path.join(directory, "model.bpk")
            if args.model is None:
                generate_model(model, args.size)
            model_size = os.path.getsize(model)
            others = processes_mapping(model)
            if others:  # their share of the file's pages is taken off the pool's PSS and USS
                print(f"measure_rss: warning: processes {', '.join(map(str, others[:8]))} already map {model}: "
                      "the pool's figures will read lower than alone (stop them for a true figure)",
                      file=sys.stderr, flush=True)
            runs = []
            for pool, n in itertools.product(chosen, args.workers):
                repeats = [measure(model, model_size, n, pool, directory, reading)
                           for _ in range(args.repeat)]
                startups = [r["startup_s"] for r in repeats]
                runs.append({**repeats[-1], "startup_s": median(startups), "startups": startups})
                print(f"  measured N={n} {pool.name} ({pool.label})", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted; servers stopped and temporary files removed", file=sys.stderr)
        return 130
    except (RuntimeError, NoInput, subprocess.CalledProcessError, control.ControlError,
            workerpool.WorkerpoolError) as exc:
        print(f"measure_rss: error: {exc}", file=sys.stderr)
        return 1
    print_table(runs, model_size)
    print()
    print("\n".join(costs(runs, model_size)))
    if args.json:
        write_figures(args.json, "measure_rss.py", {
            "model": model if args.model else None, "model_size": model_size,
            "answered": args.answered, "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "runs": runs})
    if args.plot:
        plot(runs, model_size, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
