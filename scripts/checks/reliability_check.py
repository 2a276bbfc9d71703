"""Six faults a serving system must answer, measured against real servers on loopback.

Each check starts its own server on a generated 1 MiB ``mlp`` and prints what clients saw:

- ``frames``: a request with one array followed by 10,000 empty frames: answered, and how fast.
- ``connections``: 2,000 raw ZeroMQ clients with one request each, at ``--max-connections
  1024`` and at the default: answered ok, answered ``overloaded``, unanswered after 20 s, and
  the connections they made (a socket monitor on each).
- ``kills``: 3 workers, 6 client threads of 8-row requests, a worker (a busy one if any)
  ``kill -9``ed every 0.5 s: answers by outcome.
- ``sigterm``: 4 client threads that keep sending through a SIGTERM: answers by outcome, and
  the server's own count of the requests it read.
- ``http-reload``: 64 keep-alive HTTP connections (binary KServe v2, one row each) through a
  new weight file, SIGTTIN and SIGTTOU: answers by outcome, and how many were not what the
  model of the version they name computes.
- ``publish``: ``workerpool publish`` of a file that does not fit (another input width) over the
  served one, as a user would (and with ``--no-check``), then a worker ``kill -9``ed: workers
  5 s later, and what ``status --ready`` says.

Run it from a checkout; put another checkout first on ``PYTHONPATH`` to measure that one (its
server, command line and client) with the same script:

    python3 scripts/checks/reliability_check.py [--only frames,kills] [--seconds 10]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import zmq

import workerpool
from workerpool import burnpack, models
from workerpool.control import client as control
from workerpool.protocol import messages as protocol
from workerpool.testing import ServerProcess, serve_args
from workerpool.weights.publish import publish

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/, for benchlib
from benchlib.servers import free_port

WIDTH = 256  # the generated model's input
CHECKS = ("frames", "connections", "kills", "sigterm", "http-reload", "publish")
HTTP_CONNECTIONS = 64


def server(model: str, workers: int, tmp: str, *args: str) -> ServerProcess:
    control_dir = tempfile.mkdtemp(prefix="wp-", dir="/tmp")
    os.chmod(control_dir, 0o700)
    return ServerProcess(serve_args(model, workers, "--control", f"ipc://{control_dir}/control", *args),
                         log_path=os.path.join(tmp, f"server-{time.monotonic_ns()}.log"))


def control_of(pool: ServerProcess) -> str:
    return pool.command[pool.command.index("--control") + 1]


def ready_workers(pool: ServerProcess) -> list[int]:
    """The pids of the workers that serve, busy ones first."""
    status = control.call(control_of(pool), "status", memory=False)
    serving = [w for w in status["workers"] if w["state"] in ("ready", "busy")]
    return [w["pid"] for w in sorted(serving, key=lambda w: w["state"] != "busy")]


def check_frames(model: str, tmp: str, seconds: float) -> str:
    with server(model, 1, tmp) as pool, zmq.Context() as context:
        sock = context.socket(zmq.DEALER)
        sock.connect(pool.endpoint)
        frames = protocol.encode_request(1, np.zeros((1, WIDTH), np.float32))
        began = time.monotonic()
        sock.send_multipart([*frames, *([b""] * 10_000)])
        answered = sock.poll(5000)
        waited = time.monotonic() - began
        code = protocol.decode_header(sock.recv_multipart()[1]).get("error", {}).get("code") if answered else None
        sock.close(linger=0)
    return f"answered {code} in {waited * 1e3:.1f} ms" if answered else "no answer in 5 s"


def check_connections(model: str, tmp: str, seconds: float, cap: str | None) -> str:
    clients, window = 2000, 20.0
    args = () if cap is None else ("--max-connections", cap)
    with server(model, 2, tmp, *args) as pool, zmq.Context() as context:
        context.set(zmq.MAX_SOCKETS, 4 * clients + 64)
        sockets, monitors = [], []
        for number in range(clients):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            monitors.append(sock.get_monitor_socket(zmq.EVENT_CONNECTED))
            sock.connect(pool.endpoint)
            sock.send_multipart(protocol.encode_request(number, np.zeros((1, WIDTH), np.float32)))
            sockets.append(sock)
        poller = zmq.Poller()
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        outcomes: Counter[str] = Counter()
        waiting = set(sockets)
        began = time.monotonic()
        while waiting and time.monotonic() - began < window:
            for sock, _ in poller.poll(100):
                header = protocol.decode_header(sock.recv_multipart()[1])
                outcomes[header.get("error", {}).get("code", "ok")] += 1
                waiting.discard(sock)
                poller.unregister(sock)
        answered_in = time.monotonic() - began
        connects = sum(_drain(monitor) for monitor in monitors)
        for sock, monitor in zip(sockets, monitors):
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
    last = f"all answered in {answered_in:.1f} s" if not waiting else f"{len(waiting)} unanswered after {window:g} s"
    return (f"{clients} clients, {cap or 'default'} cap: {dict(outcomes)}; {last}; "
            f"{connects} connections made ({connects / clients:.1f} per client)")


def _drain(monitor: zmq.Socket) -> int:
    count = 0
    while monitor.poll(0):
        monitor.recv_multipart()
        count += 1
    return count


def load(endpoint: str, threads: int, stop: threading.Event, outcomes: Counter[str], *,
         rows: int = 1) -> list[threading.Thread]:
    """Client threads sending requests of ``rows`` rows until ``stop`` (or until their client
    refuses to send); each outcome counted by name."""
    lock = threading.Lock()

    def run(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with workerpool.Client(endpoint, timeout=5, retries=0) as client:
            while not stop.is_set():
                try:
                    client.request(rng.standard_normal((rows, WIDTH)).astype(np.float32))
                    outcome = "ok"
                except workerpool.RemoteError as exc:
                    outcome = exc.code + (" (not sent)" if "not sent" in str(exc) else "")
                except workerpool.WorkerpoolError as exc:
                    outcome = type(exc).__name__
                with lock:
                    outcomes[outcome] += 1
                if outcome.endswith("(not sent)"):
                    return

    workers = [threading.Thread(target=run, args=(seed,), daemon=True) for seed in range(threads)]
    for thread in workers:
        thread.start()
    return workers


def check_kills(model: str, tmp: str, seconds: float) -> str:
    outcomes: Counter[str] = Counter()
    stop = threading.Event()
    kills = 0
    with server(model, 3, tmp) as pool:
        threads = load(pool.endpoint, 6, stop, outcomes, rows=8)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.5)  # the attack's own cadence
            pids = ready_workers(pool)
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                kills += 1
        stop.set()
        for thread in threads:
            thread.join(30)
    total = sum(outcomes.values())
    return f"{kills} kills, {total} requests: {dict(outcomes)}; {100 * outcomes['ok'] / max(total, 1):.1f}% ok"


def check_sigterm(model: str, tmp: str, seconds: float) -> str:
    outcomes: Counter[str] = Counter()
    stop = threading.Event()
    with server(model, 2, tmp) as pool:
        threads = load(pool.endpoint, 4, stop, outcomes)
        time.sleep(1.0)  # under load for a second
        assert pool.proc is not None
        pool.proc.send_signal(signal.SIGTERM)
        pool.proc.wait(60)
        stop.set()
        for thread in threads:
            thread.join(30)
        log = pool.log()
    counted = [line.split(": ", 1)[-1] for line in log.splitlines() if "requests read" in line]
    return f"{dict(outcomes)}; server: {counted[-1] if counted else 'no count of requests read'}"


def check_http_reload(model: str, tmp: str, seconds: float) -> str:
    served, newer = os.path.join(tmp, "reloaded.bpk"), os.path.join(tmp, "newer.bpk")
    models.generate_mlp(served, 1024 * 1024, width=WIDTH, seed=0)
    models.generate_mlp(newer, 1024 * 1024, width=WIDTH, seed=5)
    x = np.random.default_rng(3).random((1, WIDTH), dtype=np.float32)
    expected = {"1": local_model(served)(x), "2": local_model(newer)(x)}
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, WIDTH], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    body, headers = head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}
    outcomes: Counter[str] = Counter()
    stop = threading.Event()
    port = free_port()
    with server(served, 2, tmp, "--http", f"127.0.0.1:{port}", "--model-name", "m", "--watch-interval", "0.1") as pool:
        def drive() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while not stop.is_set():
                try:
                    conn.request("POST", "/v2/models/m/infer", body, headers)
                    reply = conn.getresponse()
                    data, length = reply.read(), reply.getheader("Inference-Header-Content-Length")
                except (OSError, http.client.HTTPException) as exc:
                    outcomes[type(exc).__name__] += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    continue
                if reply.status != 200 or length is None:
                    outcomes[str(reply.status)] += 1
                    continue
                version = json.loads(data[:int(length)])["model_version"]
                output = np.frombuffer(data[int(length):], np.float32).reshape(1, -1)
                outcomes["200" if np.allclose(output, expected[version], rtol=1e-5, atol=1e-5) else "200 but wrong"] += 1
            conn.close()

        threads = [threading.Thread(target=drive) for _ in range(HTTP_CONNECTIONS)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        publish(newer, served)
        time.sleep(2.0)
        assert pool.proc is not None
        pool.proc.send_signal(signal.SIGTTIN)
        time.sleep(2.0)
        pool.proc.send_signal(signal.SIGTTOU)
        time.sleep(2.0)
        stop.set()
        for thread in threads:
            thread.join(30)
        generations = {w["generation"] for w in control.call(control_of(pool), "status", memory=False)["workers"]}
    return f"{dict(outcomes)}; workers at generation {sorted(generations)}"


def local_model(path: str) -> Callable[[np.ndarray], np.ndarray]:
    """The model of ``path``, built in this process."""
    pack = burnpack.read(path)
    return models.build_model(pack.tensors, pack.metadata)


def check_publish(model: str, tmp: str, seconds: float, *options: str) -> str:
    served = os.path.join(tmp, "served.bpk")
    models.generate_mlp(served, 1024 * 1024, width=WIDTH, seed=1)
    other = os.path.join(tmp, "other.bpk")
    models.generate_mlp(other, 1024 * 1024, width=WIDTH // 2, seed=2)
    with server(served, 2, tmp) as pool:
        env = dict(os.environ, WORKERPOOL_CONTROL=control_of(pool))
        published = subprocess.run([sys.executable, "-m", "workerpool", "publish", other, served, *options],
                                   capture_output=True, text=True, env=env, check=False)
        time.sleep(1.0)  # past the watch interval: the server has looked at the path
        os.kill(ready_workers(pool)[0], signal.SIGKILL)
        time.sleep(5.0)  # what a user would see a few seconds later
        workers = len(ready_workers(pool))
        probe = subprocess.run([sys.executable, "-m", "workerpool", "status", "--ready"],
                               capture_output=True, text=True, env=env, check=False)
    said = (published.stdout + published.stderr).strip().splitlines()[-1]
    ready = (probe.stdout + probe.stderr).strip()
    return (f"publish {' '.join(options)} exit {published.returncode} ({said}); {workers} of 2 workers 5 s after a kill; "
            f"status --ready exit {probe.returncode} ({ready})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks to run")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the kills go on")
    args = parser.parse_args()
    checks: dict[str, list[Callable[[str, str, float], str]]] = {
        "frames": [check_frames],
        "connections": [lambda m, t, s: check_connections(m, t, s, "1024"),
                        lambda m, t, s: check_connections(m, t, s, None)],
        "kills": [check_kills], "sigterm": [check_sigterm], "http-reload": [check_http_reload],
        "publish": [check_publish, lambda m, t, s: check_publish(m, t, s, "--no-check")],
    }
    print(f"workerpool from {os.path.dirname(workerpool.__file__)}")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "small.bpk")
        models.generate_mlp(model, 1024 * 1024, width=WIDTH, seed=0)
        for name in args.only.split(","):
            for check in checks[name]:
                print(f"{name}: {check(model, tmp, args.seconds)}", flush=True)


if __name__ == "__main__":
    main()
