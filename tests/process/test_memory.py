"""Per-worker memory of a real server: mmap workers share the weights, copy workers each hold them.

A small version of what ``scripts/measure_rss.py`` measures: a 64 MiB model, 3 workers, every
worker's weights touched by requests. Structural bounds only, no timings.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from support.commands import cli
from support.processes import private_dirty
from support.server import Server

import workerpool
from workerpool import models
from workerpool.ops import metrics

pytestmark = pytest.mark.xdist_group("timing")  # measures time or memory: in turn with the others

MiB = 1024 * 1024
WORKERS = 3


@pytest.fixture(scope="module")
def model_64mib(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "model-64.bpk"
    models.generate_mlp(path, 64 * MiB)
    return str(path)


def touch_weights(server: Server, done, timeout: float = 30.0) -> dict:
    """Send requests, one per worker in flight, until ``done(worker)`` holds for every worker."""
    deadline = time.monotonic() + timeout
    with workerpool.Client(server.endpoint) as client:
        x = np.ones((1, client.info()["inputs"][0]["shape"][1]), np.float32)
        while True:
            for _ in client.infer_many([x] * 2 * WORKERS, window=WORKERS):
                pass
            status = server.status()
            if all(done(worker) for worker in status["workers"]):
                return status
            assert time.monotonic() < deadline, f"weights not touched: {status['workers']}"


def helper_pss(status: dict) -> tuple[int, int]:
    """PSS of the supervisor and of the template (0 without one)."""
    template = status["template"]["memory"]["pss"] if status["template"] else 0
    return status["supervisor_memory"]["pss"], template


def worker_uss(model_64mib: str, start: str) -> list[int]:
    with Server(model_64mib, "--start", start, workers=2) as server:
        status = touch_weights(server, lambda w: w["served"] > 0)
    return [w["memory"]["uss"] for w in status["workers"]]


def test_a_forked_worker_holds_far_less_private_memory_than_a_spawned_one(model_64mib):
    """The template's imports are shared with the workers it forks; a spawned interpreter holds
    its own. (Both map the weights and have served: the weights are shared in either.)"""
    forked, spawned = worker_uss(model_64mib, "fork"), worker_uss(model_64mib, "spawn")
    assert max(forked) < min(spawned) / 2, (forked, spawned)


def test_mmap_workers_share_the_weights(model_64mib):
    size = os.path.getsize(model_64mib)
    with Server(model_64mib, workers=WORKERS) as server:
        idle = {w["pid"]: w["memory"] for w in server.status()["workers"]}
        assert all(m["weights_resident"] < size / 2 for m in idle.values())
        status = touch_weights(server, lambda w: w["memory"]["weights_resident"] >= 0.95 * size)
    idle_pss = max(m["pss"] for m in idle.values())
    for worker in status["workers"]:
        memory, before = worker["memory"], idle[worker["pid"]]
        assert memory["anon"] - before["anon"] < 8 * MiB
        assert memory["uss"] - before["uss"] < 8 * MiB  # with N >= 2 the weights are not private
    totals = status["totals"]
    assert totals["workers"] == WORKERS and totals["model_size"] == size
    assert totals["workers_pss"] == sum(w["memory"]["pss"] for w in status["workers"])
    assert totals["workers_pss"] < size + WORKERS * (idle_pss + 8 * MiB)
    assert totals["pss"] == totals["workers_pss"] + sum(helper_pss(status))


def test_copy_workers_each_hold_the_weights(model_64mib):
    size = os.path.getsize(model_64mib)
    with Server(model_64mib, "--load", "copy", workers=WORKERS) as server:
        status = touch_weights(server, lambda w: w["served"] > 0)
    assert all(w["memory"]["weights_resident"] == 0 for w in status["workers"])  # nothing mapped
    assert all(w["memory"]["anon"] >= size for w in status["workers"])
    assert status["totals"]["pss"] > 2.5 * size


def test_status_json_and_explain_carry_every_memory_figure(model_64mib):
    with Server(model_64mib, workers=2) as server:
        raw, human = (
            cli("status", "--control", server.control, flag, timeout=30, env={"COLUMNS": "200"})
            for flag in ("--json", "--explain")
        )
    assert raw.returncode == 0, raw.stderr
    status = json.loads(raw.stdout)
    assert len(status["workers"]) == 2
    for worker in status["workers"]:
        memory = worker["memory"]
        assert set(memory) == set(metrics.MEMORY_FIELDS)
        assert all(isinstance(value, int) and value >= 0 for value in memory.values())
        assert memory["anon"] > 0 and memory["pte"] > 0 and memory["pss"] <= memory["rss"]
    assert set(status["totals"]) == set(metrics.TOTAL_FIELDS)
    assert status["totals"]["workers_pss"] == sum(w["memory"]["pss"] for w in status["workers"])
    supervisor, template = helper_pss(status)
    assert supervisor > 0 and template > 0
    assert status["totals"]["pss"] == status["totals"]["workers_pss"] + supervisor + template
    assert human.returncode == 0, human.stderr
    for column in ("anon", "pte", "weights", "supervisor", "template",
                   "total PSS of the supervisor, template and 2 workers"):
        assert column in human.stdout
    assert metrics.MEMORY_FIELDS["anon"] in human.stdout


# What a forked worker writes of its own: its interpreter's copy-on-write pages, its ZeroMQ
# threads, its requests' buffers; some 4 to 5.5 MiB measured (scripts/head_to_head.py).
WORKER_PRIVATE_BOUND = 8 * MiB
WORKER_GROWTH_BOUND = 1 * MiB  # from the 100th request to the 1000th: nothing accumulates


def test_a_forked_workers_private_memory_stays_bounded_over_a_thousand_requests(small_model):
    with Server(small_model, workers=2) as server, workerpool.Client(server.endpoint) as client:
        x = np.ones((1, client.info()["inputs"][0]["shape"][1]), np.float32)
        pids = [w["pid"] for w in server.status()["workers"]]
        for _ in client.infer_many([x] * 100, window=2):
            pass
        early = {pid: private_dirty(pid) for pid in pids}
        for _ in client.infer_many([x] * 900, window=2):
            pass
        late = {pid: private_dirty(pid) for pid in pids}
        served = {w["pid"]: w["served"] for w in server.status()["workers"]}
    assert sum(served.values()) >= 1000 and all(served.values()), served
    for pid in pids:
        assert late[pid] <= WORKER_PRIVATE_BOUND, (pid, late[pid])
        assert late[pid] - early[pid] <= WORKER_GROWTH_BOUND, (pid, early[pid], late[pid])
