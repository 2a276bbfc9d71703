"""Servers a script starts as child processes, each in a session of its own: a free port for
them, their start on a socket bound here, the wait for them to answer, and their stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping

from .zmq_load import WARMUP_TIMEOUT


def free_port() -> int:
    """A loopback TCP port nothing listens on now (another process may take it before ours)."""
    [port] = free_ports(1)
    return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nothing listens on now (held at once while chosen)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


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


def wait_listening(proc: subprocess.Popen[bytes], port: int, server: str) -> None:
    """Until ``port`` accepts connections (a server that binds before it starts its workers);
    ``server`` names it in the error."""
    deadline = time.monotonic() + WARMUP_TIMEOUT
    while True:
        with contextlib.suppress(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=WARMUP_TIMEOUT).close()
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{server} did not listen on port {port} (exit code {proc.poll()})")
        time.sleep(0.05)


def wait_for_http(url: str, body: bytes, proc: subprocess.Popen[bytes], patience: float = 60.0) -> None:
    """Until ``url`` answers a POST of ``body`` with 200 (the server has started its workers)."""
    give_up = time.monotonic() + patience
    while time.monotonic() < give_up and proc.poll() is None:
        request = urllib.request.Request(url, data=body, method="POST")
        with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {patience:g}s")
