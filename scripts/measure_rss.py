#!/usr/bin/env python3
"""Memory of a real workerpool server against its worker count: shared mmap versus private copies.

For each N, starts ``workerpool serve`` (mmap, then ``--load copy`` unless ``--no-baseline``),
reads every worker's memory right after the ready line (the *idle* worker: model built, no
weight touched), sends requests until every worker has touched all its weights, reads the
memory again through the control socket's ``status``, and stops the server.

    python scripts/measure_rss.py                          # 512 MiB model, N = 1,2,4,8, both modes
    python scripts/measure_rss.py --size 1GiB --workers 8 --repeat 5
    python scripts/measure_rss.py --json rss.json --plot scripts/results/memory.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from statistics import mean, median
from typing import Any

import numpy as np

import workerpool
from workerpool import control
from workerpool.launcher import ServerProcess, serve_args
from workerpool.units import format_size, parse_size

TOUCHED = 0.95  # a worker has touched its weights when this much of the file is resident
TARGET = 0.10  # mmap: a loaded worker stays within 10% of an idle one
COUNTS = re.compile(r"\s*[+-]?\d+\s*(,\s*[+-]?\d+\s*)*")  # what int() reads, comma-separated


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
        x = np.ones((1, client.info()["input_shape"][1]), np.float32)
        while True:
            for _ in client.infer_many(itertools.repeat(x, 2 * workers), window=workers):
                sent += 1
            status = control.call(control_endpoint, "status", timeout=30)
            if all(touched(w, load, size) for w in status["workers"]):
                return status, sent
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not touch their weights within {timeout:g}s: "
                                   f"{[w['memory'] for w in status['workers']]}")


def measure(model: str, size: int, workers: int, load: str, directory: str,
            timeout: float) -> dict[str, Any]:
    """One server: startup time, idle and loaded memory of every worker, the pool's totals."""
    control_endpoint = f"ipc://{directory}/control-{load}-{workers}"
    args = serve_args(model, workers, "--load", load, "--control", control_endpoint,
                      "--log-level", "warning")
    log_path = os.path.join(directory, f"serve-{load}-{workers}.log")
    started = time.monotonic()
    with ServerProcess(args, log_path=log_path, timeout=timeout) as server:
        startup = time.monotonic() - started  # to the ready line
        idle = control.call(control_endpoint, "status", timeout=30)
        loaded, requests = touch_all(control_endpoint, server.endpoint, workers, load, size,
                                     timeout)
    return {
        "workers": workers,
        "mode": load,
        "startup_s": startup,
        "requests": requests,
        "idle": [w["memory"] for w in idle["workers"]],
        "loaded": [w["memory"] for w in loaded["workers"]],
        "idle_totals": idle["totals"],
        "totals": loaded["totals"],
    }


def ensure_model(path: str, size_text: str) -> None:
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "workerpool", "new-model", path, "--size", size_text],
                       check=True, stdout=subprocess.DEVNULL)


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def print_table(runs: list[dict[str, Any]], model_size: int) -> None:
    print(f"model {format_size(model_size)}; per-worker figures are means over the workers after "
          f"every worker touched all its weights (MiB)")
    print(f"{'N':>3} {'mode':<5} {'anon':>8} {'uss':>8} {'pss':>8} {'pte':>8} "
          f"{'total PSS':>10} {'startup s':>10}")
    for run in runs:
        loaded = run["loaded"]
        cells = [mib(mean(m[k] for m in loaded)) for k in ("anon", "uss", "pss")]
        cells.append(f"{mean(m['pte'] for m in loaded) / 2**20:.2f}")
        print(f"{run['workers']:>3} {run['mode']:<5} " + " ".join(f"{c:>8}" for c in cells)
              + f" {mib(run['totals']['pss']):>10} {run['startup_s']:>10.2f}")


def check_targets(runs: list[dict[str, Any]], model_size: int) -> list[str]:
    """The README's targets, as measured: mmap against the idle worker, copy against N copies;
    and what one more worker adds to the total PSS in each mode."""
    lines = []
    for run in runs:
        n, idle, loaded = run["workers"], run["idle"], run["loaded"]
        total = run["totals"]["pss"]
        if run["mode"] == "mmap":
            anon = max(m["anon"] for m in loaded) / mean(m["anon"] for m in idle) - 1
            uss = max(m["uss"] for m in loaded) / mean(m["uss"] for m in idle) - 1
            bound = model_size + n * (1 + TARGET) * mean(m["pss"] for m in idle)
            ok = anon <= TARGET and (n < 2 or uss <= TARGET) and total <= bound
            uss_text = f"uss {uss:+.1%}" if n >= 2 else "uss not compared (lone mapper)"
            lines.append(f"N={n} mmap: anon {anon:+.1%}, {uss_text} against idle; total PSS "
                         f"{mib(total)} <= {mib(bound)} MiB: {'ok' if ok else 'MISSED'}")
        else:
            lines.append(f"N={n} copy: total PSS {mib(total)} MiB = "
                         f"{total / model_size:.2f} x model size")
    for mode in ("mmap", "copy"):
        chosen = sorted((r["workers"], r["totals"]["pss"]) for r in runs if r["mode"] == mode)
        if len(chosen) >= 2:
            (n0, pss0), (n1, pss1) = chosen[0], chosen[-1]
            lines.append(f"{mode}: each added worker adds {mib((pss1 - pss0) / (n1 - n0))} MiB of "
                         f"total PSS (N={n0} to {n1}; model {mib(model_size)} MiB)")
    return lines


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'workerpool[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(runs: list[dict[str, Any]], model_size: int, path: str) -> None:
    """Total PSS and per-worker private (anonymous) memory against N, one line per mode."""
    plt = pyplot()
    fig, (total, private) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=90)
    for mode, style in (("mmap", "o-"), ("copy", "s--")):
        chosen = [r for r in runs if r["mode"] == mode]
        if not chosen:
            continue
        ns = [r["workers"] for r in chosen]
        total.plot(ns, [r["totals"]["pss"] / 2**20 for r in chosen], style, label=mode)
        private.plot(ns, [mean(m["anon"] for m in r["loaded"]) / 2**20 for r in chosen], style,
                     label=mode)
    total.axhline(model_size / 2**20, color="grey", linewidth=0.8, linestyle=":",
                  label="model file")
    total.set(title="total PSS of the workers", xlabel="workers (N)", ylabel="MiB", ylim=(0, None))
    private.set(title="private (anon) memory per worker", xlabel="workers (N)", ylabel="MiB",
                ylim=(0, None))
    for axes in (total, private):
        axes.set_xticks(sorted({r["workers"] for r in runs}))
        axes.grid(alpha=0.3)
        axes.legend()
    fig.suptitle(f"{format_size(model_size)} mlp model, weights touched by every worker",
                 fontsize="medium")
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="512MiB", help="model size (default: %(default)s)")
    parser.add_argument("--workers", type=worker_counts, default=[1, 2, 4, 8],
                        help="comma-separated worker counts (default: 1,2,4,8)")
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="the model to serve, created with 'workerpool new-model' when absent "
                        "and then kept (default: a temporary one)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the --load copy runs")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures here")
    parser.add_argument("--plot", metavar="PATH.png", help="draw the figures here (matplotlib)")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        pyplot()  # fail before measuring, not after
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    modes = ["mmap"] + ([] if args.no_baseline else ["copy"])
    try:
        with tempfile.TemporaryDirectory(prefix="wp-rss-") as directory:
            model = args.model or os.path.join(directory, "model.bpk")
            ensure_model(model, args.size)
            model_size = os.path.getsize(model)
            runs = []
            for load, n in itertools.product(modes, args.workers):
                repeats = [measure(model, model_size, n, load, directory, args.timeout)
                           for _ in range(args.repeat)]
                startups = [r["startup_s"] for r in repeats]
                runs.append({**repeats[-1], "startup_s": median(startups), "startups": startups})
                print(f"  measured N={n} {load}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted; servers stopped and temporary files removed", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.CalledProcessError, control.ControlError,
            workerpool.WorkerpoolError) as exc:
        print(f"measure_rss: error: {exc}", file=sys.stderr)
        return 1
    print_table(runs, model_size)
    print("\n".join(check_targets(runs, model_size)))
    if args.json:
        report = {
            "command": ["scripts/measure_rss.py", *(sys.argv[1:] if argv is None else argv)],
            "model_size": model_size,
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "runs": runs,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plot:
        plot(runs, model_size, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
