#!/usr/bin/env python3
"""Reranking over HTTP on the same ONNX cross-encoder, same machine, same run: workerpool's
TEI ``/rerank`` against gunicorn --preload running the app a user would write.

FOLDER is a cross-encoder exported to ONNX (``model.onnx`` and ``tokenizer.json``:
``scripts/cross_encoder_reference.py --onnx DIR`` writes DIR/rerank). The script converts it
with ``workerpool convert`` into a scratch directory; each server runs ``--workers`` workers,
every thread setting left at its default:

- workerpool: ``workerpool serve --http --truncate``, ``POST /rerank`` (``--pool-args`` appended);
- preload: ``embed_apps/gunicorn_rerank.py`` under ``gunicorn --preload`` (sync workers), its
  session made once, in the master;
- preload1: the same, its session with one intra-op thread (``RERANK_THREADS=1``): what a user
  who tuned it for one worker per core runs (by default each worker's session takes a thread
  per core, and two workers on two cores contend);
- gunicorn: the same app without ``--preload``, a session per worker.

Every request is a query and ``--documents`` documents (sentences from the standard library's
docstrings, 6 to 54 words; each request a different query and set). Before timing, each server
ranks one request and must give the same order, its scores within 1e-4 of workerpool's. Then
wrk (one thread, keep-alive) drives each at ``--in-flight`` connections for ``--seconds``, in
``--rounds`` rounds, the order of the servers reversed every other round, each started afresh
in each round. CPU per request is the user and system time of the server's process tree, read
while wrk runs, over the requests it answered.

    python3 -m pip install -e '.[http,onnx,hf,compare]'   # and wrk: apt-get install wrk
    python3 scripts/rerank_bench.py /work/onnx-ce/rerank
    python3 scripts/rerank_bench.py FOLDER --rounds 1 --seconds 3 --in-flight 16
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benchlib.arguments import add_count, add_json, add_levels, parser_for
from benchlib.corpus import sentences
from benchlib.cpu import tree_cpu_seconds, wait_idle
from benchlib.http_load import http_request, post_json, warm_http_workers
from benchlib.paths import SCRIPTS_DIR
from benchlib.pools import warmed_pool
from benchlib.runs import (
    load_average,
    print_load_averages,
    require_commands,
    stop_servers_on_sigterm,
    write_figures,
)
from benchlib.servers import free_port, listening_session
from benchlib.wrk import wrk_bodies_script, wrk_command, wrk_figures

from workerpool.protocol import messages as protocol

PATH = "/rerank"
LABELS = {"workerpool": "workerpool", "preload": "gunicorn --preload (sync)",
          "preload1": "gunicorn --preload, 1 onnxruntime thread", "gunicorn": "gunicorn (sync)"}
WRK_TIMEOUT = 60.0


def bodies(texts: list[str], documents: int, count: int, seed: int) -> list[str]:
    """``count`` different requests: a query and ``documents`` others, drawn with ``seed``."""
    rng = random.Random(seed)
    return [json.dumps({"query": rng.choice(texts), "texts": rng.sample(texts, documents)}) for _ in range(count)]


@contextlib.contextmanager
def started(name: str, folder: str, bpk: str, workers: int, directory: str,
            pool_args: list[str]) -> Iterator[tuple[int, int]]:
    """Server ``name`` once each worker has answered: its root pid and port."""
    if name == "workerpool":
        port = free_port()
        with warmed_pool(bpk, workers, directory, name, protocol.encode_request(0, ["Warm up."]), "--http",
                         f"127.0.0.1:{port}", "--truncate", *pool_args) as pool:
            yield pool.pid, port
        return
    preload = ["--preload"] if name.startswith("preload") else []
    command = [sys.executable, "-m", "gunicorn", *preload, "--workers", str(workers), "--worker-class", "sync",
               "--pythonpath", SCRIPTS_DIR, "--log-level", "warning"]
    env = {**os.environ, "RERANK_FOLDER": folder, **({"RERANK_THREADS": "1"} if name == "preload1" else {})}
    warm = http_request(json.dumps({"query": "q", "texts": ["Warm up."]}).encode(), path=PATH,
                        content_type="application/json")
    with listening_session(lambda fd: [*command, "--bind", f"fd://{fd}", "embed_apps.gunicorn_rerank:application"],
                           env, os.path.join(directory, f"{name}.log")) as (proc, port):
        warm_http_workers(proc, port, warm, workers, LABELS[name])
        yield proc.pid, port


def level(port: int, pid: int, script: str, connections: int, seconds: float) -> dict[str, Any]:
    """wrk's figures at ``connections`` on an idle server, and the server tree's CPU seconds a
    second meanwhile."""
    wait_idle(pid)
    margin = max(0.125, seconds / 8)
    with subprocess.Popen(wrk_command(f"http://127.0.0.1:{port}{PATH}", script, connections, seconds, WRK_TIMEOUT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as wrk:
        time.sleep(margin)
        began, cpu = time.monotonic(), tree_cpu_seconds(pid)
        time.sleep(max(0.0, seconds - 2 * margin))
        rate = (tree_cpu_seconds(pid) - cpu) / (time.monotonic() - began)
        out, err = wrk.communicate(timeout=seconds + WRK_TIMEOUT + 30)
    if wrk.returncode:
        raise RuntimeError(f"wrk failed ({wrk.returncode}): {err.strip()}")
    figures = wrk_figures(out)
    return {"connections": connections, **figures,
            "cpu_ms_per_request": rate * 1e3 / figures["rps"] if figures["rps"] else None}


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("folder", help="a cross-encoder exported to ONNX (model.onnx, tokenizer.json)")
    parser.add_argument("--servers", default="workerpool,preload,preload1",
                        help=f"comma-separated, among {', '.join(LABELS)} (default: the first three)")
    add_count(parser, "--workers", 2, "workers per server")
    add_count(parser, "--documents", 32, "documents per request")
    add_levels(parser, "--in-flight", "16", "connections wrk keeps busy")
    add_count(parser, "--rounds", 3, "alternating rounds")
    parser.add_argument("--seconds", type=float, default=10.0, help="per level, server and round (default: 10)")
    parser.add_argument("--pool-args", type=shlex.split, default=[], metavar="ARGS",
                        help="appended to workerpool serve's command line, as one quoted argument")
    add_json(parser)
    args = parser.parse_args()
    servers = [name for name in LABELS if name in args.servers.split(",")]
    require_commands("rerank_bench", "wrk")
    stop_servers_on_sigterm()
    loads = [load_average()]
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in servers}
    texts = sentences(512, 0)
    with tempfile.TemporaryDirectory(prefix="wp-rerank-") as directory:
        bpk = os.path.join(directory, "rerank.bpk")
        subprocess.run([sys.executable, "-m", "workerpool", "convert", args.folder, bpk], check=True,
                       stdout=subprocess.DEVNULL)
        lines = bodies(texts, args.documents, 256, 0)
        script = wrk_bodies_script(os.path.join(directory, "bodies.lua"), lines)
        reference: list[dict[str, Any]] | None = None
        for number in range(args.rounds):
            for name in servers if number % 2 == 0 else servers[::-1]:
                with started(name, os.path.abspath(args.folder), bpk, args.workers, directory,
                             args.pool_args) as (pid, port):
                    answer = post_json(port, PATH, json.loads(lines[0]))
                    reference = reference or answer
                    if [row["index"] for row in answer] != [row["index"] for row in reference] or max(
                            abs(a["score"] - b["score"]) for a, b in zip(answer, reference, strict=True)) > 1e-4:
                        raise SystemExit(f"rerank_bench: {LABELS[name]} ranks differently: {answer[:3]} against "
                                         f"{reference[:3]}")
                    subprocess.run(wrk_command(f"http://127.0.0.1:{port}{PATH}", script, 16, 1, WRK_TIMEOUT),
                                   capture_output=True, check=True)
                    runs[name].append([level(port, pid, script, k, args.seconds) for k in args.in_flight])
                print(f"  round {number + 1}/{args.rounds}: {LABELS[name]} done", file=sys.stderr, flush=True)
    loads.append(load_average())
    report(args, servers, runs)
    print_load_averages((loads[0], loads[1]))
    if args.json:
        write_figures(args.json, "rerank_bench.py", {"folder": args.folder, "workers": args.workers,
                                                     "documents": args.documents, "runs": runs})
    return 0


def report(args: Any, servers: list[str], runs: dict[str, list[list[dict[str, Any]]]]) -> None:
    print(f"\n{os.path.basename(os.path.normpath(args.folder))} (ONNX), {len(os.sched_getaffinity(0))} CPUs, "
          f"{args.workers} workers per server, a query and {args.documents} documents a request; wrk -t1 "
          f"keep-alive; medians of {args.rounds} rounds of {args.seconds:g} s\n")
    print("| server | in flight | requests/s | pairs/s | p50 | p99 | CPU/request | non-2xx |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    medians: dict[str, list[dict[str, float]]] = {}
    for name in servers:
        medians[name] = []
        for index, connections in enumerate(args.in_flight):
            figures = [run[index] for run in runs[name]]
            median = {key: statistics.median(f[key] for f in figures if f[key] is not None)
                      for key in ("rps", "p50_us", "p99_us", "cpu_ms_per_request")}
            medians[name].append(median)
            print(f"| {LABELS[name]} | {connections} | {median['rps']:,.1f} | {median['rps'] * args.documents:,.0f} | "
                  f"{median['p50_us'] / 1e3:,.1f} ms | {median['p99_us'] / 1e3:,.1f} ms | "
                  f"{median['cpu_ms_per_request']:,.2f} ms | {sum(f['failed'] for f in figures)} |")
    for other in (name for name in servers if name != "workerpool"):
        if "workerpool" in medians:
            for connections, ours, theirs in zip(args.in_flight, medians["workerpool"], medians[other], strict=True):
                print(f"\nworkerpool ÷ {LABELS[other]} at {connections} in flight: requests/s "
                      f"{ours['rps'] / theirs['rps']:.2f}x, p99 {ours['p99_us'] / theirs['p99_us']:.2f}x, CPU per "
                      f"request {ours['cpu_ms_per_request'] / theirs['cpu_ms_per_request']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
