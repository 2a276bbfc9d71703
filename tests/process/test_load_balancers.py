"""Replicas behind a real load balancer, configured as deploy/ ships it: whole pools behind
nginx and HAProxy, under 16 connections, through a drain, a killed supervisor, restarts and new
weights published to one replica after another. No request may fail or be answered by weights
other than those of the generation its answer names."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator

import psutil
import pytest
from benchlib.balancers import balancer, balancer_log, haproxy_up
from support.kserve_load import Load
from support.models import build_local
from support.server import Server
from support.sockets import free_port

from workerpool import models
from workerpool.weights.publish import publish

pytestmark = pytest.mark.xdist_group("timing")  # 3 pools and 16 clients: in turn with the others

PROBE_PERIOD = 1.0  # seconds: deploy/haproxy/workerpool.cfg's inter
MODEL = "mlp"


def installed(name: str):
    return pytest.mark.skipif(shutil.which(name) is None,
                              reason=f"{name} is not installed (Debian: apt-get install {name}); .ci/run installs it")


class Replicas:
    """Pools of one worker, each serving its own copy of the weights on a fixed HTTP port, as
    replicas on machines of their own would."""

    def __init__(self, workdir: str, weights: str, count: int) -> None:
        self.paths = []
        for n in range(count):
            os.makedirs(os.path.join(workdir, f"pool{n}"))
            self.paths.append(os.path.join(workdir, f"pool{n}", "model.bpk"))
            shutil.copyfile(weights, self.paths[-1])
        self.ports = [free_port() for _ in range(count)]
        self.pools: list[Server | None] = [None] * count

    def start(self, n: int) -> None:
        pool = Server(self.paths[n], "--http", f"127.0.0.1:{self.ports[n]}", "--model-name", MODEL,
                      "--graceful-timeout", "10", workers=1)
        self.pools[n] = pool  # stopped on the way out even if it never becomes ready
        pool.start()

    def pool(self, n: int) -> Server:
        pool = self.pools[n]
        assert pool is not None and pool.proc is not None
        return pool

    def drain(self, n: int) -> None:
        """SIGTERM, and the pool's exit: it answers what it holds, then stops."""
        self.pool(n).proc.send_signal(signal.SIGTERM)
        self.drained(n)

    def drained(self, n: int) -> None:
        """The exit of a pool sent SIGTERM (once: a second signal would stop it at once)."""
        pool = self.pool(n)
        assert pool.proc.wait(30) == 0, pool.log()
        pool.stop()

    def kill(self, n: int) -> None:
        """SIGKILL the supervisor alone: its workers see it gone and exit by themselves."""
        pool = self.pool(n)
        left = pool.descendants()
        pool.proc.kill()
        pool.proc.wait(30)
        _, alive = psutil.wait_procs(left, timeout=15)
        assert alive == [], f"still running without their supervisor: {alive}"
        pool.stop()

    def publish(self, n: int, weights: str, generation: int) -> None:
        """``workerpool publish``, then wait until every worker serves the new generation."""
        publish(weights, self.paths[n], control_endpoint=self.pool(n).control)
        self.pool(n).wait_for(lambda s: s["model"]["generation"] == generation and s["workers"]
                              and all(w["generation"] == generation for w in s["workers"]))

    def stop(self) -> None:
        for pool in self.pools:
            if pool is not None:
                pool.stop()


@pytest.fixture
def weights(tmp_path, small_model) -> dict[str, str]:
    newer = str(tmp_path / "newer.bpk")
    models.generate_mlp(newer, 1024 * 1024, seed=2)
    return {"1": small_model, "2": newer}


@pytest.fixture
def replicas(weights) -> Iterator[Replicas]:
    workdir = tempfile.mkdtemp(prefix="wp-lb-")
    started = Replicas(workdir, weights["1"], 3)
    try:
        for n in range(3):
            started.start(n)
        yield started
    finally:
        started.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def drain_kill_restart_and_roll(replicas: Replicas, load: Load, weights: dict[str, str]) -> None:
    """The operator's day, under load: each step waits for answers to flow again."""
    load.await_answers(200)
    replicas.drain(0)
    load.await_answers(100)
    replicas.start(0)
    replicas.kill(1)
    load.await_answers(100)
    replicas.start(1)
    load.await_answers(100)
    for n in range(3):
        replicas.publish(n, weights["2"], 2)
        load.await_answers(100)


def expected(weights: dict[str, str]) -> dict:
    return {version: build_local(path) for version, path in weights.items()}


@installed("nginx")
def test_replicas_behind_nginx_lose_no_request_through_drain_kill_restart_and_rolling_publish(
    replicas, weights, tmp_path, local_model
):
    port = free_port()
    width = local_model.input_shape[1]
    with balancer("nginx", str(tmp_path), port, replicas.ports), \
            Load(port, MODEL, width, expected(weights)) as load:
        drain_kill_restart_and_roll(replicas, load, weights)
        rolled = dict(load.answers)
        load.await_answers(200)
    print(f"nginx: {load.answered} answers, {len(load.failures)} failed")
    assert load.failures == []
    assert rolled.get("1", 0) > 0 and rolled.get("2", 0) > 0
    assert load.answers["1"] == rolled["1"]  # once every replica rolled, only the new weights answer


def rotation_change(workdir: str, name: str, up: bool, timeout: float = 30.0) -> float:
    """Seconds until the HAProxy running in ``workdir`` has server ``name`` in rotation
    (``up``) or out of it."""
    began = time.monotonic()
    while haproxy_up(workdir)[name] != up:
        assert time.monotonic() - began < timeout, balancer_log(workdir)
        time.sleep(0.01)
    return time.monotonic() - began


@installed("haproxy")
def test_replicas_behind_haproxy_lose_no_request_and_a_draining_or_degraded_one_leaves_rotation(
    replicas, weights, tmp_path, local_model
):
    """Each fault waits for the replica before it to be back in rotation: with two of three
    out, killing the third would leave HAProxy nothing to retry on."""
    port = free_port()
    width = local_model.input_shape[1]
    misfit = str(tmp_path / "misfit.bpk")
    models.generate_mlp(misfit, 1024 * 1024, width=2 * width, seed=5)
    with balancer("haproxy", str(tmp_path), port, replicas.ports), \
            Load(port, MODEL, width, expected(weights)) as load:
        load.await_answers(200)
        replicas.pool(0).proc.send_signal(signal.SIGTERM)
        drained = rotation_change(str(tmp_path), "pool1", up=False)
        replicas.drained(0)
        replicas.start(0)
        rotation_change(str(tmp_path), "pool1", up=True)
        shutil.copyfile(misfit, replicas.paths[2] + ".new")  # published without the server's check
        os.replace(replicas.paths[2] + ".new", replicas.paths[2])
        refused = rotation_change(str(tmp_path), "pool3", up=False)
        replicas.pool(2).wait_for(lambda s: s["degraded"] is not None)
        replicas.publish(2, weights["2"], 2)
        rotation_change(str(tmp_path), "pool3", up=True)
        replicas.kill(1)
        load.await_answers(100)
        replicas.start(1)
        for n in range(2):
            replicas.publish(n, weights["2"], 2)
            load.await_answers(100)
        rolled = dict(load.answers)
        load.await_answers(200)
    print(f"HAProxy: {load.answered} answers, {len(load.failures)} failed; out of rotation after a "
          f"drain in {drained:.3f} s, after a refused file in {refused:.3f} s")
    assert load.failures == [], "\n".join(load.failures)
    assert load.answers["1"] == rolled["1"] and rolled.get("2", 0) > 0
    assert drained < 2 * PROBE_PERIOD and refused < 2 * PROBE_PERIOD  # the next check, and its answer
