#!/usr/bin/env python3
"""Why not just ``gunicorn --preload``? workerpool against gunicorn serving the same model.

In the same run, on the same model and machine, alternating the two servers: ``workerpool
serve`` with W workers, driven by one DEALER socket keeping K requests in flight (bench.py's
``drive``); and ``gunicorn --preload`` with W gthread workers running ``compare_app.app``, which
maps the same .bpk and builds the model once in the master (the forked workers share the
mapping), driven by K persistent HTTP/1.1 keep-alive connections with one request in flight
each. Every worker of both servers limits its BLAS threads to max(1, CPUs // W). For each run:
the total PSS of every serving process once every worker has answered (so touched all the
weights), then requests/s and p50 latency of one-row requests at each K.

    python3 -m pip install -e '.[compare]'
    python3 scripts/compare.py                          # 16 MiB mlp, 2 workers, K = 1, 16, 64
    python3 scripts/compare.py --size 256MiB --workers 8 --seconds 2 --repeat 1 --in-flight 1,16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import zmq
from bench import drive, summary

from workerpool import metrics, models, protocol
from workerpool.launcher import NotReady, ServerProcess, serve_args
from workerpool.units import format_size, parse_size

APP_DIR = os.path.dirname(os.path.abspath(__file__))
GUNICORN_CONF = os.path.join(APP_DIR, "compare_app", "gunicorn_conf.py")
WARMUP_TIMEOUT = 60.0  # seconds for every worker of a server to answer once
REPLY_TIMEOUT = 30.0  # seconds any single reply may take before the run is abandoned
SERVERS = ("workerpool", "gunicorn")


@dataclass
class Load:
    """What one server is sent: the model, the workers, their BLAS threads, the request."""

    model: str
    workers: int
    blas_threads: int
    gthreads: int
    row: np.ndarray
    levels: list[int]
    seconds: float
    directory: str


def tree_memory(pid: int, model: str) -> dict[str, Any]:
    """PSS (psutil's ``memory_full_info``) of ``pid`` and each of its descendants, their sum,
    and how much of the model file each descendant (a worker) has resident in its mapping."""
    root = psutil.Process(pid)
    pids = [pid, *(p.pid for p in root.children(recursive=True))]
    figures = metrics.pool_memory(pids, model).workers
    if any(f is None for f in figures.values()):
        raise RuntimeError("a serving process exited while its memory was read")
    read = [f for f in figures.values() if f is not None]
    return {"pss": sum(f["pss"] for f in read), "processes": len(read),
            "pss_by_process": [f["pss"] for f in read],
            "weights_resident": [f["weights_resident"] for f in read[1:]]}


# workerpool


def warm_workerpool(endpoint: str, frames: list, workers: int) -> None:
    """Keep ``workers`` requests in flight until every worker has answered one."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(REPLY_TIMEOUT * 1000))
    sock.connect(endpoint)
    header = json.loads(frames[1])
    seen: set[int] = set()
    deadline = time.monotonic() + WARMUP_TIMEOUT
    try:
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(seen)} of {workers} workerpool workers answered")
            for _ in range(workers):
                header["id"] += 1
                sock.send_multipart([b"", protocol.encode_header(header), *frames[2:]])
            for _ in range(workers):
                reply = json.loads(sock.recv_multipart()[1])
                if reply["status"] != "ok":
                    raise RuntimeError(f"workerpool answered {reply}")
                seen.add(reply["worker_pid"])
    finally:
        sock.close()
        context.term()


def run_workerpool(load: Load) -> dict[str, Any]:
    frames = protocol.encode_request(0, load.row)
    args = serve_args(load.model, load.workers, "--threads-per-worker", str(load.blas_threads),
                      "--log-level", "warning")
    log_path = os.path.join(load.directory, "workerpool.log")
    try:
        with ServerProcess(args, log_path=log_path) as server:
            assert server.proc is not None
            warm_workerpool(server.endpoint, frames, load.workers)
            memory = tree_memory(server.proc.pid, load.model)
            levels = [drive(server.endpoint, frames, k, load.seconds) for k in load.levels]
    except NotReady as exc:
        raise RuntimeError(str(exc)) from None
    return {**memory, "levels": levels}


# gunicorn


@contextlib.contextmanager
def gunicorn_server(load: Load) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``gunicorn --preload`` on a loopback socket bound here and handed over, so the port is
    known before it starts; yields the arbiter and the port, and stops its whole session."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port = listener.getsockname()[1]
    command = [
        sys.executable, "-m", "gunicorn", "--preload", "--workers", str(load.workers),
        "--worker-class", "gthread", "--threads", str(load.gthreads), "--keep-alive", "30",
        "--bind", f"fd://{listener.fileno()}", "--config", GUNICORN_CONF,
        "--pythonpath", APP_DIR, "--log-level", "warning", "compare_app.app:application",
    ]
    env = {**os.environ, "COMPARE_MODEL": load.model, "COMPARE_THREADS": str(load.blas_threads)}
    with open(os.path.join(load.directory, "gunicorn.log"), "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                pass_fds=(listener.fileno(),), start_new_session=True)
    listener.close()
    try:
        yield proc, port
    finally:
        stop_session(proc)


def stop_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM and up to 30 s to finish, then SIGKILL for whatever is left of its session."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def http_request(body: bytes, method: str = "POST", path: str = "/") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


Reply = tuple[dict[str, str], bytes]


def parse_reply(buffer: bytearray) -> tuple[int, Reply] | None:
    """The length, headers and body of the whole 200 reply at the start of ``buffer``, if it is
    there."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    status, *lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    if not status.startswith("HTTP/1.1 200"):
        raise RuntimeError(f"gunicorn answered {status!r}")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    total = end + 4 + int(headers["content-length"])
    if len(buffer) < total:
        return None
    return total, (headers, bytes(buffer[end + 4:total]))


@dataclass
class Connection:
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    sent_at: float = 0.0

    @classmethod
    def open(cls, port: int) -> Connection:
        sock = socket.create_connection(("127.0.0.1", port), timeout=REPLY_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def send(self, request: bytes) -> None:
        self.sent_at = time.perf_counter()
        self.sock.sendall(request)

    def read(self) -> Reply | None:
        """Take what has arrived; the reply once it is whole."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise RuntimeError("gunicorn closed a keep-alive connection")
        self.buffer += data
        parsed = parse_reply(self.buffer)
        if parsed is None:
            return None
        del self.buffer[:parsed[0]]
        return parsed[1]

    def wait(self) -> Reply:
        """Block until the reply is whole (the socket's timeout bounds each read)."""
        while (reply := self.read()) is None:
            pass
        return reply

    def exchange(self, request: bytes) -> Reply:
        self.send(request)
        return self.wait()


def warm_gunicorn(proc: subprocess.Popen[bytes], port: int, request: bytes, workers: int) -> None:
    """Open ``2 * workers`` new connections at a time, one request each, until every worker has
    answered one (each connection stays with the worker that accepted it)."""
    seen: set[str] = set()
    deadline = time.monotonic() + WARMUP_TIMEOUT
    while len(seen) < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {workers} gunicorn workers answered "
                               f"(exit code {proc.poll()})")
        connections = [Connection.open(port) for _ in range(2 * workers)]
        for connection in connections:
            connection.send(request)
        for connection in connections:
            seen.add(connection.wait()[0]["x-worker-pid"])
            connection.sock.close()


def worker_threads(port: int) -> dict[str, int]:
    """The BLAS and OpenMP thread counts one gunicorn worker reports."""
    connection = Connection.open(port)
    try:
        _, body = connection.exchange(http_request(b"", "GET", "/threads"))
    finally:
        connection.sock.close()
    return json.loads(body)


def http_drive(port: int, request: bytes, in_flight: int, seconds: float) -> dict[str, Any]:
    """``drive`` over HTTP: ``in_flight`` keep-alive connections, one request outstanding on
    each, for ``seconds``; counted the same way (replies after the end are drained, not counted)."""
    connections = [Connection.open(port) for _ in range(in_flight)]
    for _ in range(3):  # warm up connections and caches
        for connection in connections:
            connection.exchange(request)
    latencies: list[float] = []
    with selectors.DefaultSelector() as selector:
        for connection in connections:
            selector.register(connection.sock, selectors.EVENT_READ, connection)
            connection.send(request)
        start = time.perf_counter()
        end = start + seconds
        outstanding = in_flight
        counting = True
        while outstanding:
            events = selector.select(REPLY_TIMEOUT)
            if not events:
                raise RuntimeError(f"no reply from gunicorn in {REPLY_TIMEOUT:g}s")
            for key, _ in events:
                connection = key.data
                if connection.read() is None:
                    continue
                now = time.perf_counter()
                if counting:
                    latencies.append(now - connection.sent_at)
                    counting = now < end
                if counting:
                    connection.send(request)
                else:
                    outstanding -= 1
        elapsed = time.perf_counter() - start
    for connection in connections:
        connection.sock.close()
    return summary(in_flight, latencies, elapsed)


def run_gunicorn(load: Load) -> dict[str, Any]:
    request = http_request(load.row.tobytes())
    with gunicorn_server(load) as (proc, port):
        warm_gunicorn(proc, port, request, load.workers)
        memory = tree_memory(proc.pid, load.model)
        threads = worker_threads(port)
        levels = [http_drive(port, request, k, load.seconds) for k in load.levels]
    return {**memory, "blas_threads": threads, "levels": levels}


# the comparison


def run_alternating(load: Load, repeat: int) -> dict[str, list[dict[str, Any]]]:
    """workerpool, gunicorn, workerpool, gunicorn...: ``repeat`` runs of each."""
    runners = {"workerpool": run_workerpool, "gunicorn": run_gunicorn}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SERVERS}
    for round_number in range(1, repeat + 1):
        for name in SERVERS:
            runs[name].append(runners[name](load))
            print(f"  run {round_number}/{repeat}: {name} done", file=sys.stderr, flush=True)
    return runs


def medians(runs: list[dict[str, Any]], levels: list[int]) -> dict[str, float]:
    """Median over the runs of each figure: ``pss``, then ``rps@K``, ``p50_us@K``, ``p99_us@K``."""
    figures = {"pss": statistics.median(r["pss"] for r in runs)}
    for i, k in enumerate(levels):
        for key in ("rps", "p50_us", "p99_us"):
            figures[f"{key}@{k}"] = statistics.median(r["levels"][i][key] for r in runs)
    return figures


def process_counts(runs: list[dict[str, Any]]) -> str:
    return "/".join(str(n) for n in sorted({r["processes"] for r in runs}))


def least_resident(runs: list[dict[str, Any]]) -> str:
    return format_size(min(min(r["weights_resident"]) for r in runs))


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def print_table(load: Load, runs: dict[str, list[dict[str, Any]]],
                figures: dict[str, dict[str, float]], repeat: int, loads: tuple[str, str]) -> None:
    cpus = len(os.sched_getaffinity(0))
    size = format_size(os.path.getsize(load.model))
    print(f"{load.workers} workers on {cpus} CPUs, {size} mlp, one-row float32 requests, "
          f"{load.seconds:g} s per level; medians of {repeat} alternating runs of each")
    print(f"BLAS threads per worker: {load.blas_threads} in both (workerpool "
          f"--threads-per-worker; gunicorn post_fork threadpoolctl, a worker reports "
          f"{runs['gunicorn'][-1]['blas_threads']})")
    print(f"gunicorn --preload --worker-class gthread --threads {load.gthreads}, keep-alive: "
          f"one HTTP/1.1 connection per request in flight; workerpool: one DEALER socket")
    print(f"PSS of every serving process after every worker answered: workerpool "
          f"{process_counts(runs['workerpool'])} processes (supervisor + workers), gunicorn "
          f"{process_counts(runs['gunicorn'])} (arbiter + workers); the least of the model any "
          f"worker had resident: workerpool {least_resident(runs['workerpool'])}, gunicorn "
          f"{least_resident(runs['gunicorn'])}")
    print()
    print("| figure | workerpool | gunicorn --preload | workerpool / gunicorn |")
    print("| --- | ---: | ---: | ---: |")
    ours, theirs = figures["workerpool"], figures["gunicorn"]
    print(f"| total PSS | {ours['pss'] / 2**20:.1f} MiB | {theirs['pss'] / 2**20:.1f} MiB | "
          f"{ours['pss'] / theirs['pss']:.2f}x |")
    for k in load.levels:
        for key, label, unit in (("rps", "req/s", ""), ("p50_us", "p50", " µs"),
                                 ("p99_us", "p99", " µs")):
            a, b = ours[f"{key}@{k}"], theirs[f"{key}@{k}"]
            print(f"| {label}, {k} in flight | {a:.0f}{unit} | {b:.0f}{unit} | {a / b:.2f}x |")
    print()
    print(f"load average (1, 5, 15 min) at start: {loads[0]}; at end: {loads[1]}. Whatever else "
          f"was running on this machine is in these figures: judge them by that.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("16MiB"),
                        help="mlp model size (default: 16MiB)")
    parser.add_argument("--workers", type=int, default=2, help="workers of each server (default: 2)")
    parser.add_argument("--in-flight", default="1,16,64",
                        help="comma-separated requests in flight (default: 1,16,64)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per level and run (default: 3)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each server, alternating (default: 2)")
    parser.add_argument("--gunicorn-threads", type=int, default=1,
                        help="gthread threads per gunicorn worker (default: 1)")
    parser.add_argument("--json", metavar="PATH", help="write the raw figures here")
    args = parser.parse_args(argv)
    args.levels = [int(k) for k in args.in_flight.split(",")]
    if min(args.levels) < 1 or args.workers < 1 or args.repeat < 1 or args.gunicorn_threads < 1:
        parser.error("--in-flight, --workers, --repeat and --gunicorn-threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    start_load = load_average()
    blas_threads = max(1, len(os.sched_getaffinity(0)) // args.workers)
    with tempfile.TemporaryDirectory(prefix="wp-compare-") as directory:
        model = os.path.join(directory, "model.bpk")
        generated = models.generate_mlp(model, args.size)
        row = np.random.default_rng(0).standard_normal((1, generated.dims[0]), dtype=np.float32)
        load = Load(model, args.workers, blas_threads, args.gunicorn_threads, row, args.levels,
                    args.seconds, directory)
        try:
            runs = run_alternating(load, args.repeat)
        except (RuntimeError, OSError) as exc:
            print(f"compare: error: {exc}", file=sys.stderr)
            return 1
        figures = {name: medians(runs[name], args.levels) for name in SERVERS}
        loads = (start_load, load_average())
        print_table(load, runs, figures, args.repeat, loads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": ["scripts/compare.py", *sys.argv[1:]], "workers": args.workers,
                       "model_size": generated.size_bytes, "blas_threads": blas_threads,
                       "gunicorn_threads": args.gunicorn_threads, "load_average": loads,
                       "medians": figures, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
