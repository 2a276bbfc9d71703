"""Each worker's BLAS and OpenMP pools get its share of the CPUs, read back inside the worker."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from support.server import Server
from support.status import pool_ready

import workerpool

pytestmark = [pytest.mark.usefixtures("start_method"),  # each test with fork and spawn
              pytest.mark.xdist_group("timing")]  # CPU time is measured: in turn with the other timing tests

REPORT = ("--model", "thread_model:factory")  # answers with its worker's thread limits


def reported_threads(endpoint: str) -> set[int]:
    with workerpool.Client(endpoint, timeout=10) as client:
        return set(client.infer(np.zeros((1, 1), np.float32)).ravel().tolist())


@pytest.mark.parametrize("workers", [1, 4])
def test_the_default_shares_the_cpus_among_the_workers(small_model, workers):
    cpus = len(os.sched_getaffinity(0))
    with Server(small_model, *REPORT, workers=workers) as server:
        expected = max(1, cpus // workers)
        assert reported_threads(server.endpoint) == {expected}
        assert server.status()["threads_per_worker"] == expected
        assert f"{expected} BLAS thread{'' if expected == 1 else 's'} each" in server.log()


def test_an_explicit_budget_is_applied_and_kept_when_scaling(small_model):
    with Server(small_model, *REPORT, "--threads-per-worker", "3", workers=1) as server:
        assert reported_threads(server.endpoint) == {3}
        server.signal(signal.SIGTTIN)
        server.wait_for(pool_ready(2))
        assert {threads for _ in range(6) for threads in reported_threads(server.endpoint)} == {3}
        assert server.status()["threads_per_worker"] == 3
