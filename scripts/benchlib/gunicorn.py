"""``gunicorn --preload`` serving ``compare_app``, the app a user would write instead of
workerpool: started, warmed and driven over keep-alive HTTP/1.1 connections."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from .http_load import Connection, http_drive, http_request, warm_http_workers
from .memory import tree_memory
from .paths import SCRIPTS_DIR
from .runs import Load
from .servers import listening_session

GUNICORN_CONF = os.path.join(SCRIPTS_DIR, "compare_app", "gunicorn_conf.py")


@contextlib.contextmanager
def gunicorn_server(load: Load) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``gunicorn --preload`` serving ``compare_app`` (``listening_session``); yields the arbiter
    and the port."""
    def command(fd: int) -> list[str]:
        return [sys.executable, "-m", "gunicorn", "--preload", "--workers", str(load.workers),
                "--worker-class", "gthread", "--threads", str(load.gthreads), "--keep-alive", "30",
                "--bind", f"fd://{fd}", "--config", GUNICORN_CONF,
                "--pythonpath", SCRIPTS_DIR, "--log-level", "warning", "compare_app.app:application"]

    env = {**os.environ, "COMPARE_MODEL": load.model, "COMPARE_THREADS": str(load.blas_threads)}
    with listening_session(command, env, os.path.join(load.directory, "gunicorn.log")) as started:
        yield started


@contextlib.contextmanager
def gunicorn_warmed(load: Load) -> Iterator[tuple[int, int, set[int]]]:
    """``gunicorn --preload`` on ``load.model``; the arbiter's pid, the port and the workers'
    pids, once each has answered."""
    with gunicorn_server(load) as (proc, port):
        workers = warm_http_workers(proc, port, http_request(load.row.tobytes()), load.workers)
        yield proc.pid, port, workers


def worker_threads(port: int) -> dict[str, int]:
    """The BLAS and OpenMP thread counts one gunicorn worker reports."""
    connection = Connection.open(port)
    try:
        _, body = connection.exchange(http_request(b"", "GET", "/threads"))
    finally:
        connection.sock.close()
    threads: dict[str, int] = json.loads(body)
    return threads


def run_gunicorn(load: Load) -> dict[str, Any]:
    """gunicorn's memory once every worker answered, its workers' thread counts, and each level."""
    request = http_request(load.row.tobytes())
    with gunicorn_warmed(load) as (pid, port, workers):
        memory = tree_memory(pid, load.model, workers)
        threads = worker_threads(port)
        levels = [http_drive(port, request, k, load.seconds) for k in load.levels]
    return {**memory, "blas_threads": threads, "levels": levels}
