"""More workers than the machine can run: the pool says so at start, stops in order, and a
status that waits in vain says how to wait longer. Real servers, pinned to one CPU."""

from __future__ import annotations

import os
import stat

import pytest
import zmq
from support.commands import cli
from support.server import Server

pytestmark = pytest.mark.xdist_group("timing")  # measures time or memory: in turn with the others

WORKERS = 12


def test_workers_far_over_the_cpus_warn_at_start_and_stop_without_kills(small_model):
    """Pinned to one CPU, 12 workers: one warning that says what each gets, then a stop that
    tells each worker once, kills none, calls none lost, and sums itself up in one line."""
    server = Server(small_model, workers=WORKERS)
    cpus = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(cpus)})  # the server inherits it
        try:
            server.start()
        finally:
            os.sched_setaffinity(0, cpus)
        server.wait_for(lambda status: len(status["workers"]) == WORKERS)
    finally:
        server.stop()
    log = server.log()
    assert (f"--workers {WORKERS} is {WORKERS} times the 1 CPU this process may use: with 1 BLAS "
            f"thread each, 1 run at a time and the other {WORKERS - 1} wait") in log, log
    assert "--workers 1 serves as fast here" in log
    assert f"INFO workerpool.supervisor.core: stopped: {WORKERS} workers in " in log, log
    for noise in ("did not stop", "killing", " lost (", "stopped (exited"):
        assert noise not in log, (noise, log)


def test_a_few_workers_per_cpu_start_without_a_warning(small_model):
    with Server(small_model, workers=2) as server:
        server.stop()
    assert "times the" not in server.log()


def test_a_server_too_busy_to_answer_status_gets_a_hint_to_wait_longer(tmp_path):
    """A control socket that completes the handshake and never answers, as a loop busy with
    a thousand workers does."""
    folder = tmp_path / "control"
    folder.mkdir(mode=stat.S_IRWXU)
    endpoint = f"ipc://{folder / 'control.sock'}"
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)
    try:
        silent.bind(endpoint)
        done = cli("status", "--control", endpoint, "--timeout", "0.5", timeout=30)
    finally:
        silent.close(linger=0)
        context.term()
    assert done.returncode == 1, done
    assert "did not answer in 0.5 s: its loop is stuck or very busy (give it longer with --timeout)" \
        in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
