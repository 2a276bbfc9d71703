#!/usr/bin/env python3
"""How long the client library takes to report each way of not getting an answer, with its
default connect_timeout, timeout and retries, against real servers on loopback.

    python3 scripts/checks/client_failures.py            # each case 3 times, medians and maxima
    python3 scripts/checks/client_failures.py --repeat 1

Cases: nothing listens; a listener that never speaks ZeroMQ; the server SIGKILLed while a
request runs; the server frozen (SIGSTOP) while a request runs; the server restarted (SIGTERM,
then a new one on the same port) under a client sending one request after another, where the
figure is the longest request and the count of errors (which should be none).
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

import workerpool
from workerpool import models
from workerpool.control import client as control
from workerpool.testing import ServerProcess, serve_args

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scripts/, for benchlib
from benchlib.arguments import add_count, parser_for
from benchlib.paths import TEST_MODELS_DIR
from benchlib.servers import free_port

HOLD = 120.0  # seconds a held request sleeps on its worker: far past any wait measured here


_controls = itertools.count(1)


class Server(ServerProcess):
    """One worker serving the tests' ``slow_model`` (an input whose first element is -S sleeps
    S seconds), with a control socket of its own beside ``model``."""

    def __init__(self, model: str, *args: str) -> None:
        self.control = f"ipc://{os.path.dirname(model)}/control-{next(_controls)}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([TEST_MODELS_DIR, os.environ.get("PYTHONPATH", "")]))
        super().__init__(serve_args(model, 1, "--model", "slow_model:factory", "--control",
                                    self.control, "--log-level", "error", *args), env=env)


def failure_wait(call: Callable[[], object]) -> tuple[float, str]:
    started = time.monotonic()
    try:
        call()
    except workerpool.WorkerpoolError as exc:
        return time.monotonic() - started, type(exc).__name__
    raise AssertionError("the call succeeded")


def nothing_listens(model: str) -> tuple[float, str]:
    with workerpool.Client(f"tcp://127.0.0.1:{free_port()}") as client:
        return failure_wait(client.info)


def silent_listener(model: str) -> tuple[float, str]:
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            workerpool.Client(f"tcp://127.0.0.1:{listener.getsockname()[1]}") as client:
        return failure_wait(client.info)


def held_request_after(model: str, fault: int) -> tuple[float, str]:
    """Seconds from ``fault`` (a signal to the whole server) to the held request's error."""
    with Server(model) as pool, workerpool.Client(pool.endpoint) as client:
        failed: list[tuple[float, str]] = []

        def hold() -> None:
            try:
                client.request(np.full((1, 4), -HOLD, np.float32))
            except workerpool.WorkerpoolError as exc:
                failed.append((time.monotonic(), type(exc).__name__))

        thread = threading.Thread(target=hold, daemon=True)
        thread.start()
        assert pool.control is not None
        while control.call(pool.control, "status", memory=False)["queue"]["in_flight"] < 1:
            time.sleep(0.02)
        assert pool.proc is not None
        faulted = time.monotonic()
        os.killpg(pool.proc.pid, fault)
        thread.join(HOLD)
        if fault == signal.SIGSTOP:
            os.killpg(pool.proc.pid, signal.SIGCONT)
        if not failed:
            raise AssertionError(f"the held request did not fail within {HOLD:g} s")
        return failed[0][0] - faulted, failed[0][1]


def killed(model: str) -> tuple[float, str]:
    return held_request_after(model, signal.SIGKILL)


def frozen(model: str) -> tuple[float, str]:
    return held_request_after(model, signal.SIGSTOP)


def restarted(model: str) -> tuple[float, str]:
    """The longest request while the server is replaced, and how many raised."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    longest, errors, done = [0.0], [0], threading.Event()

    def keep_sending() -> None:
        with workerpool.Client(endpoint, connect_timeout=30) as client:
            while not done.is_set():
                started = time.monotonic()
                try:
                    client.request(np.ones((1, 4), np.float32))
                except workerpool.WorkerpoolError:
                    errors[0] += 1
                longest[0] = max(longest[0], time.monotonic() - started)

    with Server(model, "--bind", endpoint):
        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        time.sleep(0.5)
    with Server(model, "--bind", endpoint):
        time.sleep(0.5)
        done.set()
        sender.join(60)
    return longest[0], f"{errors[0]} errors"


CASES = {
    "nothing listens": nothing_listens,
    "a listener that is not ZeroMQ": silent_listener,
    "server SIGKILLed mid-request": killed,
    "server frozen (SIGSTOP) mid-request": frozen,
    "server restarted (longest request)": restarted,
}


def main() -> int:
    parser = parser_for(__doc__)
    add_count(parser, "--repeat", 3, "rounds of every case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wp-failures-") as directory:
        model = os.path.join(directory, "small.bpk")
        models.generate_mlp(model, 1 << 20)
        print(f"{'case':<38} {'median s':>9} {'max s':>7}  outcome")
        for name, case in CASES.items():
            results = [case(model) for _ in range(args.repeat)]
            waits = [wait for wait, _ in results]
            outcomes = sorted({outcome for _, outcome in results})
            print(f"{name:<38} {statistics.median(waits):>9.2f} {max(waits):>7.2f}  "
                  f"{', '.join(outcomes)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
