#!/usr/bin/env python3
"""Sentence-embedding servers over HTTP on the same ONNX model, same machine, same run:
workerpool against gunicorn (a session per worker, or one made before the fork) and fastembed.

FOLDER is a sentence-transformers model saved with its ONNX backend (onnx/model.onnx,
tokenizer.json, 1_Pooling; README.md, "An ONNX model", says how to export one). The script
converts it with ``workerpool convert`` into a scratch directory and serves it with
``--workers`` workers per server, every thread setting left at the server's default:

- workerpool: ``workerpool serve --http --truncate`` (texts past the model's limit cut, as the
  others cut them), OpenAI's ``POST /v1/embeddings``; ``--pool-args`` is appended to its command
  line (``--pool-args "--threads-per-worker 2 --workers 1"``);
- gunicorn: sync workers serving ``embed_apps/gunicorn_onnx.py``, the WSGI app a user would write
  (onnxruntime, default session options), its session made in each worker after the fork;
- preload: the same app under ``gunicorn --preload``, its session made once, in the master;
- fastembed: ``embed_apps/fastembed_app.py``, fastembed in FastAPI under ``uvicorn --workers``.

Before timing, every server embeds the same texts (one of them past the 256-token cut) in one
request and must agree with workerpool to a cosine of 0.9999. Then wrk (one thread, keep-alive
connections) drives each server with bodies of 1 and of 16 sentences (``--kinds``), every request
a different body, at 1, 16 and 64 connections (``--in-flight``) for ``--seconds`` each, once every
worker has answered and after a one-second warm-up per kind; ``--rounds`` rounds, the order of
the servers reversed every other round, each server started afresh in each round. The sentences
are English from the docstrings of standard-library modules, 6 to 54 words, shuffled with a fixed
seed. Server CPU is the user and system time of the server's whole process tree, and of the
children it reaped, read while wrk runs (past its first and before its last eighth of a second
or more), divided by the sentences per second wrk counted: steady state, without the requests
wrk leaves unanswered when it stops (each level starts on an idle server). Last, each server
alone with ``--memory-workers`` workers, once every worker has answered and then served 5 s of
the first kind at 64 connections: the total PSS of its processes 2 s after that load (at rest;
workerpool's idle workers give back what serving took after 1 s), and right after it.

    python3 -m pip install -e '.[http,onnx,hf,compare]' fastembed uvicorn fastapi   # and wrk: apt-get install wrk
    python3 scripts/embed_http_bench.py minilm-onnx                       # all four, about 12 minutes
    python3 scripts/embed_http_bench.py minilm-onnx --rounds 1 --seconds 2 --servers workerpool,preload --kinds 16

gunicorn's app needs onnxruntime and tokenizers, fastembed's fastembed, fastapi and uvicorn
(none of them pulls PyTorch); a server whose packages are missing is skipped, with a line that
says so.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from benchlib.arguments import add_count, add_json, add_levels, parser_for
from benchlib.corpus import digest, sentences
from benchlib.cpu import tree_cpu_seconds, wait_idle
from benchlib.http_load import http_request, post_json, warm_http_workers
from benchlib.memory import tree_memory
from benchlib.paths import SCRIPTS_DIR
from benchlib.pools import warmed_pool
from benchlib.runs import (
    load_average,
    print_load_averages,
    require_commands,
    stop_servers_on_sigterm,
    write_figures,
)
from benchlib.servers import free_port, listening_session, stop_session, wait_listening
from benchlib.wrk import wrk_bodies_script, wrk_command, wrk_figures

from workerpool.protocol import messages as protocol
from workerpool.units import MiB

PATH = "/v1/embeddings"
LABELS = {"workerpool": "workerpool", "baseline": "workerpool (--baseline)", "gunicorn": "gunicorn (sync)",
          "preload": "gunicorn --preload (sync)", "fastembed": "fastembed (FastAPI, uvicorn)"}
POOLS = ("workerpool", "baseline")  # workerpool itself, from this tree or the --baseline tree
NEEDS = {"workerpool": ("aiohttp", "onnxruntime", "onnx"), "baseline": ("aiohttp", "onnxruntime", "onnx"),
         "gunicorn": ("gunicorn", "onnxruntime", "tokenizers"),
         "preload": ("gunicorn", "onnxruntime", "tokenizers"), "fastembed": ("fastembed", "fastapi", "uvicorn")}
MIN_COSINE = 0.9999
WRK_TIMEOUT = 60.0  # seconds a request may take before wrk counts it as a timeout (its default: 2)
LOAD_CONNECTIONS, LOAD_SECONDS = 64, 5.0  # the load every worker serves before its memory is read
REST_SECONDS = 2.0  # then the wait for the memory at rest (workerpool's idle workers give back at 1 s)


# The sentences.


def bodies(texts: list[str], per_request: int, model: str, seed: int) -> list[str]:
    """One JSON body per sentence: that sentence alone, or it and ``per_request - 1`` others
    drawn with ``seed``; every body different."""
    rng = random.Random(seed)
    groups = [[text] if per_request == 1 else [text, *rng.sample(texts[:i] + texts[i + 1:], per_request - 1)]
              for i, text in enumerate(texts)]
    return [json.dumps({"input": group, "model": model}) for group in groups]


# The servers.


@dataclass(frozen=True)
class Setup:
    """What every server is started with."""

    folder: str  # the exported sentence-transformers folder
    bpk: str  # the folder converted, for workerpool
    model_name: str
    pool_args: tuple[str, ...]
    directory: str  # scratch: logs, sockets, the Lua scripts
    baseline: str | None  # another workerpool tree, served as "baseline"


@dataclass(frozen=True)
class Running:
    """A server whose every worker has answered: its root process, port and workers."""

    pid: int
    port: int
    workers: set[int]
    weights: str  # the model file, whose mapped pages tree_memory counts


def available(names: list[str]) -> list[str]:
    """The servers among ``names`` whose packages are installed; a line for each other."""
    kept = []
    for name in names:
        missing = [package for package in NEEDS[name] if importlib.util.find_spec(package) is None]
        if missing:
            print(f"skipped {LABELS[name]}: {', '.join(missing)} not installed "
                  f"(python3 -m pip install {' '.join(missing)})", flush=True)
        else:
            kept.append(name)
    return kept


@contextlib.contextmanager
def started(name: str, setup: Setup, workers: int, last: tuple[str, ...] = ()) -> Iterator[Running]:
    """Server ``name`` with ``workers`` workers, once each has answered; stopped on leaving.
    ``last``: options that end workerpool's command line."""
    if name in POOLS:
        with workerpool_server(setup, workers, last, setup.baseline if name == "baseline" else None) as running:
            yield running
        return
    request = http_request(json.dumps({"input": ["Warm up."]}).encode(), path=PATH,
                           content_type="application/json")
    env = {**os.environ, "EMBED_FOLDER": setup.folder,
           "EMBED_CACHE": os.path.join(setup.directory, "fastembed")}
    log_path = os.path.join(setup.directory, f"{name}.log")
    session = (uvicorn_session(workers, env, log_path) if name == "fastembed"
               else listening_session(gunicorn_command(name, workers), env, log_path))
    with session as (proc, port):
        pids = warm_http_workers(proc, port, request, workers, LABELS[name])
        yield Running(proc.pid, port, pids, os.path.join(setup.folder, "onnx", "model.onnx"))


def gunicorn_command(name: str, workers: int) -> Callable[[int], list[str]]:
    """gunicorn's command line (sync workers; ``--preload`` for ``preload``), given the listening
    socket's descriptor."""
    preload = ["--preload"] if name == "preload" else []
    return lambda fd: [sys.executable, "-m", "gunicorn", *preload, "--workers", str(workers),
                       "--worker-class", "sync", "--bind", f"fd://{fd}", "--pythonpath", SCRIPTS_DIR,
                       "--log-level", "warning", "embed_apps.gunicorn_onnx:application"]


@contextlib.contextmanager
def uvicorn_session(workers: int, env: dict[str, str],
                    log_path: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """uvicorn serving the fastembed app on a free port, once it listens; stops its whole session.

    Not on a socket handed over (``--fd``) as gunicorn is: uvicorn takes that for a Unix socket,
    so asyncio leaves Nagle's algorithm on for the TCP connections, which adds about 40 ms (the
    delayed ACK) to every reply."""
    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--workers", str(workers), "--host", "127.0.0.1",
                                 "--port", str(port), "--log-level", "warning", "--no-access-log",
                                 "--app-dir", SCRIPTS_DIR, "embed_apps.fastembed_app:app"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        wait_listening(proc, port, "uvicorn")
        yield proc, port
    finally:
        stop_session(proc)


@contextlib.contextmanager
def workerpool_server(setup: Setup, workers: int, last: tuple[str, ...], tree: str | None) -> Iterator[Running]:
    """``workerpool serve --http`` with ``--pool-args``, then ``last``, from ``tree`` (None:
    this one); warmed over its ZeroMQ endpoint until each of the workers its ready line counts
    has answered."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)} if tree else None
    port = free_port()
    with warmed_pool(setup.bpk, workers, setup.directory, "workerpool", protocol.encode_request(0, ["Warm up."]),
                     "--http", f"127.0.0.1:{port}", "--model-name", setup.model_name,
                     *(() if tree else ("--truncate",)), *setup.pool_args, *last,
                     env=env) as pool:
        yield Running(pool.pid, port, pool.workers, setup.bpk)


# What is measured.


def embeddings(port: int, texts: list[str], model: str) -> np.ndarray:
    """The server's embeddings of ``texts``, sent in one request."""
    data = sorted(post_json(port, PATH, {"input": texts, "model": model})["data"], key=lambda item: item["index"])
    return np.array([item["embedding"] for item in data], dtype=np.float64)


def lowest_cosine(got: np.ndarray, expected: np.ndarray) -> float:
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1)
    return float(np.min(np.sum(got * expected, axis=1) / norms))


def run_level(port: int, script: str, connections: int, seconds: float, pid: int) -> dict[str, Any]:
    """wrk at ``connections`` for ``seconds`` on an idle server; its figures, and the server
    tree's CPU seconds per second between an eighth of a second or more after wrk's start and as
    long before its end."""
    wait_idle(pid)
    margin = max(0.125, seconds / 8)
    command = wrk_command(f"http://127.0.0.1:{port}{PATH}", script, connections, seconds, WRK_TIMEOUT)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as wrk:
        try:
            time.sleep(margin)
            began, cpu = time.monotonic(), tree_cpu_seconds(pid)
            time.sleep(max(0.0, seconds - 2 * margin))
            cpu_rate = (tree_cpu_seconds(pid) - cpu) / (time.monotonic() - began)
            out, err = wrk.communicate(timeout=seconds + WRK_TIMEOUT + 30)
        finally:
            if wrk.poll() is None:
                wrk.kill()
    if wrk.returncode:
        raise RuntimeError(f"wrk failed ({wrk.returncode}): {err.strip()}")
    return {"connections": connections, **wrk_figures(out), "cpu_seconds_per_second": cpu_rate}


def one_server(name: str, setup: Setup, workers: int, scripts: dict[int, str], in_flight: list[int],
               seconds: float, check: list[str] | None) -> tuple[dict[str, Any], np.ndarray | None]:
    """Every kind at every level on a fresh server (``figures["kinds"][per_request]``, a list of
    levels) and its worker count; with ``check``, its embeddings of those texts."""
    with started(name, setup, workers) as running:
        answers = embeddings(running.port, check, setup.model_name) if check else None
        figures: dict[str, Any] = {"workers": len(running.workers), "kinds": {}}
        url = f"http://127.0.0.1:{running.port}{PATH}"
        for per_request, script in scripts.items():
            wait_idle(running.pid)
            subprocess.run(wrk_command(url, script, 16, 1, WRK_TIMEOUT), capture_output=True, check=True)
            figures["kinds"][per_request] = [run_level(running.port, script, k, seconds, running.pid)
                                             for k in in_flight]
    return figures, answers


def rounds(servers: list[str], setup: Setup, args: argparse.Namespace, scripts: dict[int, str],
           check: list[str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Every server in every round, the order reversed every other round: each server's figures
    per round, and its lowest cosine to the first server's answers (in the first round)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    cosines: dict[str, float] = {}
    reference: np.ndarray | None = None
    for number in range(args.rounds):
        for name in servers if number % 2 == 0 else servers[::-1]:
            figures, answers = one_server(name, setup, args.workers, scripts, args.in_flight, args.seconds,
                                          check if number == 0 else None)
            if answers is not None:
                reference = answers if reference is None else reference
                cosines[name] = lowest_cosine(answers, reference)
                if cosines[name] < MIN_COSINE:
                    raise RuntimeError(f"{LABELS[name]} disagrees with {LABELS[servers[0]]}: lowest cosine "
                                       f"{cosines[name]:.6f} < {MIN_COSINE}")
            runs[name].append(figures)
            print(f"  round {number + 1}/{args.rounds}: {LABELS[name]} done", file=sys.stderr, flush=True)
    return runs, cosines


def memory(servers: list[str], setup: Setup, workers: int, script: str) -> dict[str, dict[str, Any]]:
    """Each server alone with ``workers`` workers (workerpool's last on its command line, past
    ``--pool-args``), once each has answered and then served :data:`LOAD_SECONDS` of ``script``
    at :data:`LOAD_CONNECTIONS` connections: the PSS of its processes right after that load
    (``busy``) and at rest, :data:`REST_SECONDS` after it (the figures themselves)."""
    figures = {}
    for name in servers:
        with started(name, setup, workers, ("--workers", str(workers))) as running:
            run_level(running.port, script, LOAD_CONNECTIONS, LOAD_SECONDS, running.pid)
            wait_idle(running.pid)
            busy = tree_memory(running.pid, running.weights, running.workers)
            time.sleep(REST_SECONDS)
            figures[name] = {**tree_memory(running.pid, running.weights, running.workers), "busy": busy}
        print(f"  memory: {LABELS[name]} done", file=sys.stderr, flush=True)
    return figures


# The report.


def summarise(server_runs: list[dict[str, Any]], per_request: int) -> list[dict[str, Any]]:
    """Per level, medians over the rounds: sentences/s, p50 and p99 (ms), CPU ms per sentence;
    the sum of non-2xx answers, the rounds with socket errors and the fewest requests answered."""
    out = []
    for index in range(len(server_runs[0]["kinds"][per_request])):
        runs = [run["kinds"][per_request][index] for run in server_runs]
        rates = [r["rps"] * per_request for r in runs]
        served = [r for r in runs if r["requests"]]
        out.append({
            "sentences_per_s": statistics.median(rates),
            "p50_ms": statistics.median(r["p50_us"] for r in served) / 1e3 if served else None,
            "p99_ms": statistics.median(r["p99_us"] for r in served) / 1e3 if served else None,
            "cpu_ms": statistics.median(r["cpu_seconds_per_second"] * 1e3 / rate
                                        for r, rate in zip(runs, rates) if rate) if any(rates) else None,
            "non_2xx": sum(r["failed"] for r in runs),
            "socket_errors": sum(bool(r["socket_errors"]) for r in runs),
            "requests": min(r["requests"] for r in runs)})
    return out


def cell(value: float | None, digits: int = 1, unit: str = "", thin: bool = False) -> str:
    return "—" if value is None else f"{value:,.{digits}f}{unit}{' †' if thin else ''}"


def thin(figures: dict[str, Any], connections: int) -> bool:
    """Too few answers to trust a level: fewer than 3 per connection in a round, or socket errors."""
    return figures["requests"] < 3 * connections or figures["socket_errors"] > 0


def print_kind(servers: list[str], per_request: int, figures: dict[str, list[dict[str, Any]]],
               pss: dict[str, dict[str, Any]], in_flight: list[int], memory_workers: int) -> None:
    middle = len(in_flight) // 2
    head = [*(f"sentences/s at {k}" for k in in_flight), f"p50 at {in_flight[0]}", f"p99 at {in_flight[middle]}",
            *(f"CPU/sentence at {k}" for k in in_flight),
            *([f"PSS, {memory_workers} workers: at rest (right after load)"] if pss else []),
            "non-2xx"]
    print(f"### {per_request} sentence{'s' if per_request > 1 else ''} per request\n")
    print("| server | " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * len(head))
    marked = False
    for name in servers:
        per_level = figures[name]
        weak = [thin(f, k) for f, k in zip(per_level, in_flight, strict=True)]
        marked = marked or any(weak)
        cells = [cell(f["sentences_per_s"], 0, thin=w) for f, w in zip(per_level, weak)]
        cells += [cell(per_level[0]["p50_ms"], 1, " ms", weak[0]),
                  cell(per_level[middle]["p99_ms"], 1, " ms", weak[middle])]
        cells += [cell(f["cpu_ms"], 2, " ms", w) for f, w in zip(per_level, weak)]
        cells += [f"{cell(pss[name]['pss'] / MiB, 1, ' MiB')} ({cell(pss[name]['busy']['pss'] / MiB, 1, ' MiB')})"] \
            if pss else []
        cells.append(str(sum(f["non_2xx"] for f in per_level)))
        print(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    if marked:
        print("\n†: fewer than 3 answers per connection in a round, or socket errors: the run was not much "
              "longer than a request's wait, so the latencies leave the longest waits out, and a server "
              "that runs its requests side by side may have answered few or none yet. A longer --seconds "
              "measures these.")
    for pool in (name for name in POOLS if "preload" in servers and name in servers):
        print()
        for k, ours, theirs in zip(in_flight, figures[pool], figures["preload"], strict=True):
            print(f"{LABELS[pool]} ÷ gunicorn --preload at {k} in flight: sentences/s "
                  f"{ratio(ours, theirs, 'sentences_per_s')}, p99 {ratio(ours, theirs, 'p99_ms')}, "
                  f"CPU per sentence {ratio(ours, theirs, 'cpu_ms')}")
    print()


def ratio(ours: dict[str, Any], theirs: dict[str, Any], key: str) -> str:
    return f"{ours[key] / theirs[key]:.2f}x" if ours[key] and theirs[key] else "—"


def print_report(args: argparse.Namespace, servers: list[str], texts: list[str], check: list[str],
                 cosines: dict[str, float], summary: dict[int, dict[str, list[dict[str, Any]]]],
                 pss: dict[str, dict[str, Any]], pool_workers: int | None) -> None:
    words = [len(t.split()) for t in texts]
    differs = f" (workerpool: {pool_workers})" if pool_workers not in (None, args.workers) else ""
    print(f"\n{os.path.basename(os.path.normpath(args.folder))} (ONNX), {len(os.sched_getaffinity(0))} CPUs, "
          f"{args.workers} workers per server{differs}, "
          f"thread settings left at each server's default; workerpool --pool-args: "
          f"{shlex.join(args.pool_args) or 'none'}")
    print(f"wrk -t1, keep-alive, every request a different body; {len(texts)} sentences of {min(words)}-"
          f"{max(words)} words (median {statistics.median(words):g}) from standard-library docstrings, seed "
          f"{args.seed}, sha256 {digest(texts)}; medians of {args.rounds} rounds of {args.seconds:g} s per level; "
          f"CPU/sentence: the server's process tree, ms of CPU per sentence served")
    if len(cosines) > 1:
        reference = LABELS[servers[0]]
        print(f"answers: lowest cosine to {reference}'s over {len(check)} texts in one request "
              f"({max(len(t.split()) for t in check)} words the longest, past the 256-token cut): "
              + ", ".join(f"{LABELS[n]} {c:.7f}" for n, c in cosines.items() if n != servers[0]))
    print()
    for per_request, figures in summary.items():
        print_kind(servers, per_request, figures, pss, args.in_flight, args.memory_workers)


# The run.


def parse_args() -> argparse.Namespace:
    parser = parser_for(__doc__, epilog=(__doc__ or "").split("\n\n", 1)[1],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a sentence-transformers model folder exported to ONNX")
    parser.add_argument("--servers", type=server_list, default=list(LABELS),
                        help=f"comma-separated, among {', '.join(LABELS)} (default: all)")
    add_levels(parser, "--kinds", "1,16", "sentences per request")
    add_levels(parser, "--in-flight", "1,16,64", "connections wrk keeps busy")
    add_count(parser, "--workers", 2, "workers per server")
    add_count(parser, "--rounds", 3, "alternating rounds")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="per level, kind, server and round (default: 5)")
    parser.add_argument("--memory-workers", type=int, default=8,
                        help="workers per server in the memory phase; 0 skips it (default: 8)")
    parser.add_argument("--pool-args", type=shlex.split, default=[], metavar="ARGS",
                        help="appended to workerpool serve's command line, as one quoted argument "
                        "(one option alone: --pool-args=--no-watch)")
    parser.add_argument("--baseline", metavar="TREE",
                        help="another workerpool source tree (a git worktree of an older commit) to serve "
                        "beside this one, as the server baseline (with --servers' default)")
    parser.add_argument("--model-name", help="workerpool's --model-name (default: the folder's name)")
    add_count(parser, "--sentences", 512, "different sentences, and bodies of each kind")
    parser.add_argument("--seed", type=int, default=0, help="of the sentences' order and groups (default: 0)")
    add_json(parser)
    return parser.parse_args()


def server_list(text: str) -> list[str]:
    """``--servers preload,workerpool``: which to run, in the order of ``LABELS``."""
    names = {name.strip() for name in text.split(",")}
    if unknown := names - set(LABELS):
        raise argparse.ArgumentTypeError(f"not among {', '.join(LABELS)}: {', '.join(sorted(unknown))}")
    return [name for name in LABELS if name in names]


def prepare(args: argparse.Namespace, servers: list[str], directory: str,
            texts: list[str]) -> tuple[Setup, dict[int, str]]:
    """The folder converted (when workerpool runs) and a wrk script per kind."""
    stem = os.path.basename(os.path.normpath(args.folder))
    bpk = os.path.join(directory, f"{stem}.bpk")
    if set(POOLS) & set(servers):
        subprocess.run([sys.executable, "-m", "workerpool", "convert", args.folder, bpk], check=True,
                       stdout=subprocess.DEVNULL)
    setup = Setup(os.path.abspath(args.folder), bpk, args.model_name or stem, tuple(args.pool_args), directory,
                  args.baseline)
    scripts = {n: wrk_bodies_script(os.path.join(directory, f"bodies-{n}.lua"),
                             bodies(texts, n, setup.model_name, args.seed)) for n in args.kinds}
    return setup, scripts


def check_texts(texts: list[str]) -> list[str]:
    """Six sentences, and one text of the first 40 joined, far past the 256-token cut."""
    return [*texts[:6], " ".join(texts[:40])]


def main() -> int:
    args = parse_args()
    require_commands("embed_http_bench", "wrk")
    servers = available([name for name in args.servers if name != "baseline" or args.baseline])
    if not servers:
        sys.exit("embed_http_bench: no server to run")
    stop_servers_on_sigterm()
    start_load = load_average()
    texts = sentences(args.sentences, args.seed)
    check = check_texts(texts)
    with tempfile.TemporaryDirectory(prefix="wp-embed-http-") as directory:
        try:
            setup, scripts = prepare(args, servers, directory, texts)
            runs, cosines = rounds(servers, setup, args, scripts, check)
            loads = (start_load, load_average())
            pss = memory(servers, setup, args.memory_workers, scripts[args.kinds[0]]) \
                if args.memory_workers else {}
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(f"embed_http_bench: error: {exc}") from None
    summary = {n: {name: summarise(runs[name], n) for name in servers} for n in args.kinds}
    pool_workers = runs["workerpool"][0]["workers"] if "workerpool" in servers else None
    print_report(args, servers, texts, check, cosines, summary, pss, pool_workers)
    print_load_averages(loads)
    if args.json:
        write_figures(args.json, "embed_http_bench.py", {
            "folder": args.folder, "servers": servers, "workers": args.workers, "pool_args": args.pool_args,
            "sentences": {"count": len(texts), "seed": args.seed, "sha256": digest(texts)},
            "check_texts": check, "lowest_cosine": cosines, "runs": runs, "medians": summary,
            "memory": pss, "load_average": [*loads, load_average()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
