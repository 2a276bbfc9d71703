"""gunicorn for ``compare.py``: ``gunicorn --preload`` serving ``compare_app``, warmed and driven
over keep-alive HTTP/1.1 connections, counted as ``bench.drive`` counts workerpool.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench import REPLY_TIMEOUT, WARMUP_TIMEOUT, summary
from server_memory import tree_memory

if TYPE_CHECKING:
    from compare import Load

APP_DIR = os.path.dirname(os.path.abspath(__file__))
GUNICORN_CONF = os.path.join(APP_DIR, "compare_app", "gunicorn_conf.py")


@contextlib.contextmanager
def gunicorn_server(load: Load) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``gunicorn --preload`` serving ``compare_app`` (``listening_session``); yields the arbiter
    and the port."""
    def command(fd: int) -> list[str]:
        return [sys.executable, "-m", "gunicorn", "--preload", "--workers", str(load.workers),
                "--worker-class", "gthread", "--threads", str(load.gthreads), "--keep-alive", "30",
                "--bind", f"fd://{fd}", "--config", GUNICORN_CONF,
                "--pythonpath", APP_DIR, "--log-level", "warning", "compare_app.app:application"]

    env = {**os.environ, "COMPARE_MODEL": load.model, "COMPARE_THREADS": str(load.blas_threads)}
    with listening_session(command, env, os.path.join(load.directory, "gunicorn.log")) as started:
        yield started


@contextlib.contextmanager
def listening_session(command: Callable[[int], list[str]], env: Mapping[str, str],
                      log_path: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A server in a session of its own, on a loopback socket bound here and handed over as the
    file descriptor ``command(fd)`` names, so the port is known before it starts and connections
    wait in the backlog until it accepts; yields the process and the port, and stops its whole
    session. stdout and stderr go to ``log_path``."""
    with socket.create_server(("127.0.0.1", 0), backlog=1024) as listener, open(log_path, "wb") as log:
        port = listener.getsockname()[1]
        proc = subprocess.Popen(command(listener.fileno()), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, env=env, pass_fds=(listener.fileno(),), start_new_session=True)
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


def http_request(body: bytes, method: str = "POST", path: str = "/",
                 content_type: str = "application/octet-stream") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
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


def warm_gunicorn(proc: subprocess.Popen[bytes], port: int, request: bytes, workers: int,
                  server: str = "gunicorn") -> set[int]:
    """Open ``2 * workers`` new connections at a time, one request each, until every worker has
    answered one (each connection stays with the worker that accepted it); their pids, from the
    ``X-Worker-Pid`` header. Any server whose replies carry that header will do (``server``
    names it in errors)."""
    seen: set[str] = set()
    deadline = time.monotonic() + WARMUP_TIMEOUT
    while len(seen) < workers:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {workers} {server} workers answered "
                               f"(exit code {proc.poll()})")
        connections = [Connection.open(port) for _ in range(2 * workers)]
        for connection in connections:
            connection.send(request)
        for connection in connections:
            seen.add(connection.wait()[0]["x-worker-pid"])
            connection.sock.close()
    return {int(pid) for pid in seen}


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
        workers = warm_gunicorn(proc, port, request, load.workers)
        memory = tree_memory(proc.pid, load.model, workers)
        threads = worker_threads(port)
        levels = [http_drive(port, request, k, load.seconds) for k in load.levels]
    return {**memory, "blas_threads": threads, "levels": levels}
