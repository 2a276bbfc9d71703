"""Helpers shared by the tests that drive real servers: raw sockets, protocol frames, status
predicates for ``Server.wait_for``, calls in the background, subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

import workerpool
from workerpool import burnpack, models, security

SLOW = ("--model", "slow_model:factory")  # doubles its input; x[0] < 0 sleeps -x[0] seconds

# Subprocesses.


def python(*args: str | os.PathLike, timeout: float = 120,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with this interpreter, output captured as text; the exit code is checked
    by the caller. ``env``: variables set on top of ``os.environ``, which is then all it gets
    (not the COLUMNS and LINES that readline, once imported, puts in the process's own)."""
    return subprocess.run(
        [sys.executable, *map(str, args)], check=False, capture_output=True, text=True, timeout=timeout,
        env=None if env is None else os.environ | env,
    )


def cli(*args: str | os.PathLike, timeout: float = 120,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``workerpool ARGS``, as a user runs it."""
    return python("-m", "workerpool", *args, timeout=timeout, env=env)


# Models.


def build_local(path: str | os.PathLike) -> Callable[..., Any]:
    """The model in ``path``, built in this process as a worker builds it: the reference answers."""
    pack = burnpack.read(path)
    return models.build_model(pack.tensors, pack.metadata)


# Raw sockets and protocol frames.


@contextlib.contextmanager
def dealer(context: zmq.Context, endpoint: str, **options: int) -> Iterator[zmq.Socket]:
    """A raw DEALER connected to ``endpoint``, always closed."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    try:
        sock.connect(endpoint)
        yield sock
    finally:
        sock.close(linger=0)


@contextlib.contextmanager
def monitored_dealer(
    context: zmq.Context, endpoint: str
) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A raw DEALER and a monitor of its connections, set up before it connects."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(endpoint)
        yield sock, monitor
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def next_event(monitor: zmq.Socket, timeout: float = 5.0) -> int | None:
    if not monitor.poll(timeout * 1000):
        return None
    return recv_monitor_message(monitor)["event"]


def exchange(
    context: zmq.Context, endpoint: str, frames: list[bytes], timeout: float = 5.0
) -> list[bytes] | None:
    """Send ``frames`` on a fresh DEALER; the reply's frames, or None if none came in time."""
    with dealer(context, endpoint) as sock:
        sock.send_multipart(frames)
        if not sock.poll(timeout * 1000):
            return None
        return sock.recv_multipart()


def collect(sock: zmq.Socket, count: int, timeout: float = 10.0) -> list[list[bytes]]:
    """Up to ``count`` replies from ``sock``, waiting at most ``timeout`` for each."""
    replies: list[list[bytes]] = []
    while len(replies) < count and sock.poll(timeout * 1000):
        replies.append(sock.recv_multipart())
    return replies


def reply_header(frames: list[bytes] | None) -> dict[str, Any]:
    assert frames is not None, "no reply"
    assert len(frames) >= 2 and frames[0] == b"", f"reply is not [b'', header, ...]: {frames[:2]}"
    header = json.loads(frames[1])
    assert isinstance(header, dict)
    return header


def header(
    request_id: Any, arrays: list | None = None, method: str = "infer", **extra: Any
) -> bytes:
    return json.dumps(
        {"v": 1, "id": request_id, "method": method, "arrays": arrays or [], **extra}
    ).encode()


def f32(shape: list[int]) -> dict[str, Any]:
    return {"dtype": "<f4", "shape": shape}


# Status predicates.


def registered(status: dict) -> list[dict]:
    return [w for w in status["workers"] if w["state"] in ("ready", "busy")]


def pool_ready(count: int, *, without: tuple[int, ...] = ()) -> Callable[[dict], bool]:
    """Exactly ``count`` workers, all ready, none of them ``without``."""

    def check(status: dict) -> bool:
        workers = status["workers"]
        return (
            len(workers) == count
            and all(w["state"] == "ready" for w in workers)
            and not {w["pid"] for w in workers} & set(without)
        )

    return check


def busy_pids(status: dict) -> list[int]:
    return [w["pid"] for w in status["workers"] if w["state"] == "busy"]


# Processes, threads, logs.


def vm_hwm(pid: int) -> int:
    """Peak resident set size of ``pid`` in bytes (Linux ``VmHWM``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def log_time(line: str) -> float:
    stamp = " ".join(line.split()[:2])
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Background:
    """Run ``target`` in a thread; ``join`` returns its result or raises its exception."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self.thread.start()

    def _run(self, target: Callable[[], Any]) -> None:
        try:
            self.result = target()
        except BaseException as exc:  # noqa: BLE001 - re-raised in join()
            self.error = exc

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"background call still running after {timeout}s"
        if self.error is not None:
            raise self.error
        return self.result


def slow_request(endpoint: str, seconds: float, *, timeout: float = 20.0) -> Background:
    """A slow_model request that sleeps ``seconds`` on its worker; answers -2 * seconds."""

    def run() -> workerpool.Result:
        with workerpool.Client(endpoint, timeout=timeout, retries=0) as c:
            return c.request(np.full((1, 2), -seconds, np.float32))

    return Background(run)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[psutil.Process]:
    """SIGSTOP ``pid``; on the way out SIGCONT and SIGKILL it if it still exists."""
    proc = psutil.Process(pid)
    proc.suspend()
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.resume()
            proc.kill()


def flood(sock: zmq.Socket, x: np.ndarray, count: int) -> int:
    """Send ``count`` requests for ``x`` without reading a reply; how many were sent."""
    request = [b"", header(0, [f32(list(x.shape))]), x]
    sent = 0
    while sent < count:
        try:
            sock.send_multipart(request, flags=zmq.NOBLOCK, copy=False)
            sent += 1
        except zmq.Again:
            if not sock.poll(5000, zmq.POLLOUT):
                break  # the server stopped reading
    return sent


def free_port() -> int:
    """A loopback TCP port free right now: nothing listens there until a test binds it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_backend() -> str:
    """A loopback TCP endpoint on a port free right now, for a worker backend (or as an
    endpoint where nothing listens)."""
    return f"tcp://127.0.0.1:{free_port()}"


class CurveKeys:
    """A server's key pair and its two allow-lists (clients, worker hosts) under ``directory``;
    ``client`` and ``host`` add an allowed key pair and return its secret file."""

    def __init__(self, directory: Path) -> None:
        self.clients, self.hosts = directory / "clients", directory / "hosts"
        self.hosts.mkdir(parents=True)
        _, self.server_secret = security.generate(str(directory / "server"), "server")
        self.server_public = str(directory / "server" / "server.key")

    def client(self, name: str) -> str:
        return security.generate(str(self.clients), name)[1]

    def host(self, name: str) -> str:
        return security.generate(str(self.hosts), name)[1]

    def serve_args(self) -> tuple[str, ...]:
        return ("--curve-secret-key", self.server_secret, "--curve-client-keys", str(self.clients),
                "--curve-worker-keys", str(self.hosts))

    def host_args(self, secret: str) -> tuple[str, ...]:
        return ("--curve-key", secret, "--curve-server-key", self.server_public)


def refused_at_start(server: Any, message: str) -> None:
    """``server`` (not yet started) exits 2 before its ready line, logging ``message``; stopped
    whatever happens."""
    try:
        with pytest.raises(RuntimeError):
            server.start(timeout=30)
        assert server.proc.wait(30) == 2
        assert message in server.log()
    finally:
        server.stop()
