"""The HTTP front door against the ZeroMQ client, gunicorn ``--preload`` and Mosec, same run,
same model.

One pool (``workerpool serve --http``, 2 workers, a 4 MiB ``mlp``, one-row float32 requests) is
driven by wrk over keep-alive connections with binary KServe v2 bodies, and by the ZeroMQ
client (``bench.drive``) on the same pool; ``gunicorn --preload`` (``compare_app``, gthread
workers, keep-alive, the same BLAS budget) and Mosec (``compare_app/mosec_app.py``: its Rust
front, 2 Python workers, dynamic batching up to 16) are driven by wrk with the same row as raw
bytes. Each round runs the servers in turn, the order rotating; the table gives the medians of
the rounds at 1, 16 and 64 connections (requests in flight for the ZeroMQ client), and any
answer that was not 200. Mosec runs where it is installed (``pip install mosec``).

    python3 -m pip install -e '.[http,compare]'   # and wrk: apt-get install wrk
    python3 scripts/http_bench.py [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import drive, load_average, scratch_run, warm_workerpool
from compare import Load
from compare_gunicorn import APP_DIR, gunicorn_server, stop_session

from workerpool.protocol import messages as protocol
from workerpool.testing import ServerProcess, serve_args

LEVELS = (1, 16, 64)
UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}  # as wrk prints a latency


def wrk_script(path: str, body: bytes, headers: dict[str, str]) -> str:
    """A wrk Lua script that POSTs ``body`` (kept in a file beside it) with ``headers``."""
    with open(path + ".body", "wb") as file:
        file.write(body)
    lines = [f'local f = io.open("{path}.body", "rb"); wrk.body = f:read("*all"); f:close()',
             'wrk.method = "POST"']
    lines += [f'wrk.headers["{name}"] = "{value}"' for name, value in headers.items()]
    with open(path, "w") as file:
        file.write("\n".join(lines) + "\n")
    return path


def run_wrk(url: str, script: str, connections: int, seconds: float) -> dict[str, Any]:
    done = subprocess.run(wrk_command(url, script, connections, seconds), capture_output=True, text=True,
                          check=True)
    return wrk_figures(done.stdout)


def wrk_command(url: str, script: str, connections: int, seconds: float,
                timeout: float | None = None) -> list[str]:
    """wrk on one thread with ``--latency``; ``timeout``: its per-request timeout (default 2 s)."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", script, "--latency", url]
    return command if timeout is None else [*command, "--timeout", f"{timeout:g}s"]


def wrk_figures(out: str) -> dict[str, Any]:
    """What wrk printed: requests/s and their count, p50 and p99 latency (microseconds), the
    answers that were not 2xx or 3xx, and the socket errors (timeouts among them); latencies
    are 0 when no request completed."""

    def found(pattern: str) -> re.Match[str]:
        match = re.search(pattern, out, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no {pattern!r} in wrk's output:\n{out}")
        return match

    def latency(percent: str) -> float:
        value, unit = found(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s|m|h)\s*$").groups()
        return float(value) * UNITS[unit]

    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": float(found(r"Requests/sec:\s+([\d.]+)").group(1)),
            "requests": int(found(r"(\d+) requests in").group(1)),
            "p50_us": latency("50"), "p99_us": latency("99"),
            "failed": int(failed.group(1)) if failed else 0, "socket_errors": errors.group(1) if errors else ""}


def kserve_body(row) -> tuple[bytes, dict[str, str]]:
    head = json.dumps({"inputs": [{"name": "input", "shape": list(row.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": row.nbytes}}],
                       "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    return head + row.tobytes(), {"Content-Type": "application/octet-stream",
                                  "Inference-Header-Content-Length": str(len(head))}


@contextlib.contextmanager
def pool(load: Load, port: int, *extra: str) -> Iterator[ServerProcess]:
    args = serve_args(load.model, load.workers, "--http", f"127.0.0.1:{port}", "--model-name", "mlp",
                      "--threads-per-worker", str(load.blas_threads), *extra,
                      "--control", f"ipc://{load.directory}/control.sock", "--log-level", "warning")
    with ServerProcess(args, log_path=os.path.join(load.directory, "workerpool.log")) as server:
        warm_workerpool(server.endpoint, protocol.encode_request(0, load.row), load.workers)
        yield server


def run_pool(load: Load, scripts: dict[str, str], seconds: float) -> dict[str, list[dict]]:
    port = free_port()
    with pool(load, port) as server:
        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        run_wrk(url, scripts["kserve"], 16, 1)  # warm the gateway and its connections
        http, zmq = [], []
        for k in LEVELS:
            http.append(with_supervisor_cpu(server.proc.pid, lambda k=k: run_wrk(url, scripts["kserve"], k, seconds),
                                            seconds))
            zmq.append(with_supervisor_cpu(server.proc.pid, lambda k=k: drive(
                server.endpoint, protocol.encode_request(0, load.row), k, seconds), seconds))
    return {"http": http, "zmq": zmq}


def with_supervisor_cpu(pid: int, run: Callable[[], dict[str, Any]], seconds: float) -> dict[str, Any]:
    """``run()``'s figures, with the supervisor's CPU per request over it (µs, every thread of
    the process, from /proc)."""
    before = process_cpu(pid)
    figures = run()
    figures["supervisor_us"] = (process_cpu(pid) - before) / (figures["rps"] * seconds) * 1e6
    return figures


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_gunicorn(load: Load, scripts: dict[str, str], seconds: float) -> dict[str, list[dict]]:
    with gunicorn_server(load) as (_, port):
        url = f"http://127.0.0.1:{port}/"
        run_wrk(url, scripts["raw"], 16, 1)
        return {"gunicorn": [run_wrk(url, scripts["raw"], k, seconds) for k in LEVELS]}


def run_mosec(load: Load, scripts: dict[str, str], seconds: float) -> dict[str, list[dict]]:
    port = free_port()
    env = {**os.environ, "COMPARE_MODEL": load.model, "COMPARE_WORKERS": str(load.workers),
           "COMPARE_THREADS": str(load.blas_threads), "COMPARE_MAX_BATCH": "16"}
    command = [sys.executable, os.path.join(APP_DIR, "compare_app", "mosec_app.py"), "--port", str(port),
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


def wait_for_http(url: str, body: bytes, proc: subprocess.Popen[bytes], patience: float = 60.0) -> None:
    """Until ``url`` answers a POST of ``body`` with 200 (the server has started its workers)."""
    import urllib.error
    import urllib.request

    give_up = time.monotonic() + patience
    while time.monotonic() < give_up and proc.poll() is None:
        request = urllib.request.Request(url, data=body, method="POST")
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {patience:g}s")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def median_of(runs: list[list[dict]], index: int, key: str) -> float:
    return statistics.median(run[index][key] for run in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("http_bench: needs wrk (apt-get install wrk)")
    with scratch_run("http_bench", 4 * 1024 * 1024) as scratch:
        row = scratch.row
        load = Load(model=scratch.model, workers=2, blas_threads=1, gthreads=4, row=row, levels=list(LEVELS),
                    seconds=args.seconds, directory=scratch.directory)
        body, headers = kserve_body(row)
        scripts = {"kserve": wrk_script(os.path.join(scratch.directory, "kserve.lua"), body, headers),
                   "raw": wrk_script(os.path.join(scratch.directory, "raw.lua"), row.tobytes(),
                                     {"Content-Type": "application/octet-stream"})}
        runs: dict[str, list[list[dict]]] = {"http": [], "zmq": [], "gunicorn": []}
        servers = [run_pool, run_gunicorn]
        if importlib.util.find_spec("mosec") is not None:
            servers.append(run_mosec)
            runs["mosec"] = []
        else:
            print("mosec is not installed (pip install mosec): it is left out", file=sys.stderr)
        before = scratch.start_load
        for round_number in range(args.rounds):
            rotation = round_number % len(servers)
            for run in servers[rotation:] + servers[:rotation]:
                for name, levels in run(load, scripts, args.seconds).items():
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
    failed = {name: sum(level.get("failed", 0) for run in runs[name] for level in run)
              for name in runs if name != "zmq"}
    print("\nanswers other than 200: " + ", ".join(f"{name} {count}" for name, count in failed.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
