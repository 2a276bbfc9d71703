"""SIGINT (a terminal's Ctrl-C, to the whole process group) and SIGTERM (``kill PID``) at any
moment of ``serve``'s start-up stop the pool: each a fresh server with 2 workers and the HTTP
front door, signalled after a delay spread from 0 to past the start-up time measured first.
Each time, every process of its session is gone within a bound, and stderr holds no traceback.

The delays count from the moment the command holds Ctrl-C back (``workerpool.command``, seen
in ``/proc``): before it, the interpreter is starting (``site`` and the ``.pth`` files of the
environment), which no code of the pool can guard; on Python 3.11 a Ctrl-C there can even be
swallowed by ``site``, which then reports a ``.pth`` line it could not process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
from support.server import START
from support.sockets import free_port

from workerpool.testing import serve_args

STEPS = 18  # delays from 0 to a little past the start-up time, each a fresh server
EXIT_BOUND = 15.0  # seconds from the signal until the whole session is gone
TRACES = ("Traceback", "Exception ignored", "KeyboardInterrupt", "Fatal Python error")
SIGINT_BIT = 1 << (signal.SIGINT - 1)  # in /proc/PID/status's SigBlk


def guarded(pid: int, timeout: float = 30.0) -> float:
    """Wait until ``pid``'s main thread blocks SIGINT, as ``workerpool.command`` does first; when."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as status:
            blocked = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
        if blocked & SIGINT_BIT:
            return time.monotonic()
        time.sleep(0.0005)
    raise AssertionError(f"{pid} never held SIGINT back")


def session(pid: int, tree: Sequence[psutil.Process] = ()) -> list[psutil.Process]:
    """Every live process of the session ``pid`` leads (the pool runs in a session of its own),
    and of ``tree``, the descendants it had when signalled (psutil tells a reused pid apart)."""
    found = []
    for proc in [*psutil.process_iter(), *tree]:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if (proc in tree or os.getsid(proc.pid) == pid) and proc.is_running() \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return list(dict.fromkeys(found))


def start(model: str, folder: str) -> subprocess.Popen[bytes]:
    args = serve_args(model, 2, "--http", f"127.0.0.1:{free_port()}", "--control", f"ipc://{folder}/control",
                      "--start", START)
    with open(f"{folder}/stderr", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "workerpool", *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err, start_new_session=True)


def startup_seconds(model: str) -> float:
    """How long a server takes from its command's first lines to its ready line."""
    with tempfile.TemporaryDirectory(prefix="wp-") as folder:
        proc = start(model, folder)
        try:
            started = guarded(proc.pid)
            assert proc.stdout is not None
            assert proc.stdout.readline(), Path(folder, "stderr").read_text()
            return time.monotonic() - started
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for leftover in session(proc.pid):
        with contextlib.suppress(psutil.Error):
            leftover.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def signalled(model: str, signum: int, delay: float) -> str:
    """A server signalled ``delay`` seconds into its start-up: what went wrong ('' when all is well)."""
    with tempfile.TemporaryDirectory(prefix="wp-") as folder:
        proc = start(model, folder)
        try:
            guarded(proc.pid)
            time.sleep(delay)  # a moment inside start-up: there is no signal to wait for
            if signum == signal.SIGINT:
                os.killpg(proc.pid, signum)  # as a terminal's Ctrl-C: the whole foreground group
            else:
                proc.send_signal(signum)
            signalled_at = time.monotonic()
            tree: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess):  # it may be gone already
                tree = psutil.Process(proc.pid).children(recursive=True)
            try:
                code = proc.wait(EXIT_BOUND)
            except subprocess.TimeoutExpired:
                return f"still running {EXIT_BOUND}s after the signal"
            while (left := session(proc.pid, tree)) and time.monotonic() - signalled_at < EXIT_BOUND:
                time.sleep(0.05)
            err = Path(folder, "stderr").read_text(errors="replace")
            if left:
                return f"exit {code} but {[p.pid for p in left]} outlived it: {err}"
            if code not in (0, 130, -signum) or any(trace in err for trace in TRACES):
                return f"exit {code}: {err}"
            return ""
        finally:
            stop(proc)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_at_any_moment_of_start_up_stops_the_whole_pool(small_model, signum):
    whole = startup_seconds(small_model)
    failures = {}
    for step in range(STEPS):
        delay = 1.1 * whole * step / (STEPS - 1)
        failure = signalled(small_model, signum, delay)
        if failure:
            failures[f"{delay:.3f}s"] = failure
    assert not failures, f"start-up takes {whole:.2f}s; {failures}"
