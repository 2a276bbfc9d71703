"""The main job end to end: a real supervisor, real worker processes, real sockets."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from support.commands import cli
from support.models import SLOW, build_local
from support.paths import ROOT
from support.processes import Background, slow_request
from support.server import Server, refused_at_start
from support.status import busy_pids, pool_ready

import workerpool
from workerpool import burnpack
from workerpool.testing import ServerProcess, serve_args

pytestmark = pytest.mark.usefixtures("start_method")  # each test with fork and spawn


def digits(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 255, size=(count, 28, 28)).astype(np.float32)


def test_mnist_answers_equal_the_model_run_in_process(burn_mnist_path):
    """Many concurrent clients; every answer equals the same model run locally on the input."""
    local = build_local(burn_mnist_path)
    failures: list[str] = []
    pids: set[int] = set()

    def client(seed: int) -> None:
        with workerpool.Client(server.endpoint, timeout=30) as c:
            for i in range(10):
                x = digits(1 + i % 3, seed * 100 + i)
                result = c.request(x)
                pids.add(result.worker_pid)
                if not np.allclose(result.outputs, local(x), rtol=1e-5, atol=1e-5):
                    failures.append(f"client {seed} request {i} differs")

    with Server(burn_mnist_path, workers=3) as server:
        assert "model burn-mnist" in server.ready_line and "with 3 workers" in server.ready_line
        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert failures == []
        # Which workers answer is the scheduler's choice: the most recently freed, so one warm
        # worker may take every batch. test_slow_request_does_not_delay_free_workers checks the
        # spread where it is owed.
        assert pids and pids <= set(server.worker_pids())


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the router's, not the start's
def test_slow_request_does_not_delay_free_workers(small_model):
    """Load-awareness: while one worker sleeps on a request, the others answer meanwhile."""
    with Server(small_model, *SLOW, workers=3) as server:

        def slow() -> workerpool.Result:
            with workerpool.Client(server.endpoint, timeout=30) as c:
                return c.request(np.full((1, 4), -3.0, np.float32))

        slow_call = Background(slow)
        server.wait_for(busy_pids)
        answered = 0
        with workerpool.Client(server.endpoint, timeout=30) as c:
            for _ in range(40):
                out = c.infer(np.ones((1, 4), np.float32))
                assert np.array_equal(out, np.full((1, 4), 2.0, np.float32))
                answered += 1
                assert slow_call.running or answered > 20
        fast_finished_first = slow_call.running
        slow_result = slow_call.join(30)
        assert fast_finished_first, "40 fast requests should finish while one 3 s request runs"
        assert np.array_equal(slow_result.outputs, np.full((1, 4), -6.0, np.float32))


@pytest.fixture(scope="module")
def shared_pool(small_model) -> Iterator[Server]:
    """One pool of two forked workers for the tests that only read from it (info, requests,
    the clients): each of them would otherwise pay a pool's start and stop."""
    with Server(small_model, "--start", "fork", workers=2) as server:
        yield server


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the client's, not the start's
def test_infer_many_and_info(shared_pool, local_model):
    with workerpool.Client(shared_pool.endpoint) as c:
        info = c.info()
        assert info["model"] == "mlp" and info["inputs"][0]["shape"][1] > 0
        width = info["inputs"][0]["shape"][1]
        xs = [np.full((1, width), float(i), np.float32) for i in range(30)]
        for x, y in zip(xs, c.infer_many(xs, window=6)):
            np.testing.assert_allclose(y, local_model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the client's, not the start's
def test_info_describes_arrays_as_the_wire_does(shared_pool, local_model):
    """One format: ``inputs`` and ``outputs`` with dtypes as array descriptors write them; the
    README's first request reads the input width as ``info["inputs"][0]["shape"][1]``."""
    with workerpool.Client(shared_pool.endpoint) as client:
        info = client.info()
        x = np.ones((2, info["inputs"][0]["shape"][1]), dtype=np.float32)
        result = client.request(x)
    width = local_model.input_shape[1]
    assert info["inputs"] == [{"name": None, "dtype": "<f4", "shape": [None, width]}]
    assert info["outputs"] == [{"name": None, "dtype": "<f4", "shape": [None, 10]}]
    assert result.outputs.dtype.str == info["outputs"][0]["dtype"] and result.outputs.shape == (2, 10)
    assert not {"input_shape", "output_shape", "input_dtype", "output_dtype", "accepts_text"} & set(info)


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the client's, not the start's
def test_async_client(small_model, shared_pool):
    import asyncio

    async def run(endpoint: str, width: int) -> list[np.ndarray]:
        async with workerpool.AsyncClient(endpoint) as c:
            return await asyncio.gather(*(c.infer(np.ones((2, width), np.float32)) for _ in range(8)))

    width = burnpack.read(small_model).tensors["layers.0.weight"].shape[0]
    outputs = asyncio.run(run(shared_pool.endpoint, width))
    assert len(outputs) == 8 and all(o.shape == (2, 10) for o in outputs)


def test_status_reports_every_worker(small_model):
    with Server(small_model, workers=2) as server:
        status = server.status()
        assert status["supervisor_pid"] == server.proc.pid
        assert set(status) >= {"supervisor_pid", "model", "queue", "workers"}
        model = status["model"]
        assert model["path"] == small_model and model["size"] == os.path.getsize(small_model)
        assert model["inode"] == os.stat(small_model).st_ino and model["generation"] == 1
        assert len(status["workers"]) == 2
        for worker in status["workers"]:
            assert worker["state"] == "ready"
            assert {"pid", "host", "generation", "served", "errors", "started"} <= set(worker)
            assert {"rss", "uss", "pss", "shared"} <= set(worker["memory"])
            assert psutil.pid_exists(worker["pid"])
        human = cli("status", "--control", server.control, timeout=30)
        assert human.returncode == 0 and str(status["workers"][0]["pid"]) in human.stdout


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # no server starts
def test_status_without_server_exits_1_at_once(tmp_path):
    """``--timeout 60`` against a 30 s limit: the answer must not wait for the timeout."""
    done = cli("status", "--control", f"ipc://{tmp_path}/none", "--timeout", "60", timeout=30)
    assert done.returncode == 1
    assert done.stderr == f"workerpool: error: nothing listens at ipc://{tmp_path}/none: " \
        f"{tmp_path}/none does not exist\n"
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(tmp_path / "left"))
    left.close()  # the file stays, as a server killed with SIGKILL leaves it
    done = cli("status", "--control", f"ipc://{tmp_path}/left", "--timeout", "60", timeout=30)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "connection refused (a server that stopped left that socket file behind)" in done.stderr


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # it stops before any start
@pytest.mark.parametrize("defect", ["missing", "garbage", "misfit"])
def test_bad_model_file_exits_2_without_starting_workers(tmp_path, small_model, defect):
    path = tmp_path / "model.bpk"
    args = []
    if defect == "garbage":
        path.write_bytes(b"NRUB\x01\x00" + b"\xff" * 64)
    elif defect == "misfit":
        path.write_bytes(Path(small_model).read_bytes())
        args = ["--model", "burn-mnist"]
    server = Server(path, *args)
    try:
        with pytest.raises(RuntimeError):
            server.start(timeout=30)
        assert server.proc.wait(30) == 2
        lines = server.log().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("workerpool: error: ")
        assert server._known == {}  # no worker was ever started
    finally:
        server.stop()


def test_sigterm_finishes_in_flight_requests(small_model):
    server = Server(small_model, *SLOW, workers=2).start()
    try:
        slow = [slow_request(server.endpoint, 1.5, timeout=30) for _ in range(2)]
        server.wait_for(lambda s: len(busy_pids(s)) == 2)
        pids = server.worker_pids()
        server.signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        results = [call.join(30).outputs for call in slow]
        assert len(results) == 2 and all(np.array_equal(r, np.full((1, 2), -3.0)) for r in results)
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids)
    finally:
        server.stop()


def test_supervisor_sigkill_leaves_no_orphans(small_model):
    server = Server(small_model, workers=2).start()
    try:
        workers = [psutil.Process(pid) for pid in server.worker_pids()]
        server.proc.kill()
        server.proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == [], f"workers outlived the supervisor: {alive}"
        assert os.path.exists(server.control.removeprefix("ipc://"))  # left behind
        successor = Server(small_model, "--control", server.control, workers=1)
        successor.control = server.control
        with successor:
            assert successor.status()["supervisor_pid"] == successor.proc.pid
    finally:
        server.stop()


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the endpoints', not the start's
def test_a_second_server_is_told_what_it_shares_with_the_first(small_model, tmp_path):
    with Server(small_model, workers=1) as first:
        refused_at_start(Server(small_model, "--bind", first.endpoint, workers=1),
                         f"cannot bind --bind {first.endpoint}: Address already in use: stop what uses "
                         "it, or choose another with --bind")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        second = Server(small_model, "--http", address, workers=1)
        refused_at_start(second, f"workerpool: error: cannot serve --http {address}: Address already in "
                         "use: stop what uses it, or choose another with --http\n")
        assert "requests read" not in second.log()  # it served nothing: nothing to account for
    os.chmod(tmp_path, 0o700)
    (tmp_path / "file").write_bytes(b"")
    for control, message in ((tmp_path / "file", "exists and is not a socket; choose another --control"),
                             (tmp_path / "no" / "control", f"(create it: mkdir -m 700 {tmp_path / 'no'})")):
        refused_at_start(Server(small_model, "--control", f"ipc://{control}", workers=1), message)


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the router's, not the start's
def test_a_live_server_keeps_its_control_socket_even_when_stopped(small_model):
    with Server(small_model, workers=1) as first:
        refused_at_start(Server(small_model, "--control", first.control, workers=1),
                         f"another server listens on control endpoint {first.control}")
        first.signal(signal.SIGSTOP)  # answers nothing now, but its socket still accepts
        try:
            refused_at_start(Server(small_model, "--control", first.control, workers=1),
                             f"another server listens on control endpoint {first.control}")
        finally:
            first.signal(signal.SIGCONT)
        assert first.status()["supervisor_pid"] == first.proc.pid


def test_kill_9_worker_is_replaced(small_model):
    with Server(small_model, workers=2) as server:
        victim = server.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        status = server.wait_for(pool_ready(2, without=(victim,)))
        assert len(status["workers"]) == 2
        assert "was killed by SIGKILL; starting a replacement" in server.log()


def test_ttin_ttou_change_the_worker_count(small_model):
    with Server(small_model, workers=2) as server:
        server.signal(signal.SIGTTIN)
        server.wait_for(pool_ready(3))
        server.signal(signal.SIGTTOU)
        server.wait_for(lambda s: len(s["workers"]) == 2)
        with workerpool.Client(server.endpoint) as c:
            assert c.infer(np.ones((1, c.info()["inputs"][0]["shape"][1]), np.float32)).shape == (1, 10)


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the command line's, not the start's
def test_infer_command_round_trip(small_model, shared_pool, tmp_path):
    server = shared_pool
    width = burnpack.read(small_model).tensors["layers.0.weight"].shape[0]
    np.save(tmp_path / "x.npy", np.ones((3, width), np.float32))
    done = cli("infer", "--endpoint", server.endpoint, "--input", tmp_path / "x.npy",
               "--output", tmp_path / "y.npy", timeout=60)
    assert done.returncode == 0, done.stderr
    assert np.load(tmp_path / "y.npy").shape == (3, 10)
    np.save(tmp_path / "bad.npy", np.ones((3, width + 1), np.float32))
    bad = cli("infer", "--endpoint", server.endpoint, "--input", tmp_path / "bad.npy", timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.startswith("workerpool: error: ") and "BadRequest" in bad.stderr
    assert "Traceback" not in bad.stderr
    np.savez(tmp_path / "named.npz", input=np.ones((2, width), np.float32))
    named = cli("infer", "--endpoint", server.endpoint, "--input", tmp_path / "named.npz",
                "--output", tmp_path / "z.npy", timeout=60)
    assert named.returncode == 0, named.stderr
    assert np.array_equal(np.load(tmp_path / "z.npy"), np.load(tmp_path / "y.npy")[:2])
    np.save(tmp_path / "wide.npy", np.ones((3, width)))  # numpy's default: float64
    wide = cli("infer", "--endpoint", server.endpoint, "--input", tmp_path / "wide.npy", timeout=60)
    assert wide.returncode == 1 and wide.stderr.count("\n") == 1
    assert "numpy makes float64 by default: send x.astype(np.float32)" in wide.stderr


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)  # the pool's defaults
def test_the_testing_example_of_the_client_docs_runs(small_model, tmp_path):
    """docs/client.md shows how to start a pool from a test: its example, as written, serves,
    beside a server that holds the default control socket (the example's pool takes its own)."""
    text = (ROOT / "docs" / "client.md").read_text().split("## Pools in your tests", 1)[1]
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(example.replace('"model.bpk"', repr(str(small_model))))
    run = tempfile.mkdtemp(prefix="wp-")  # the default sockets' directory, short: ipc paths are limited
    env = dict(os.environ, XDG_RUNTIME_DIR=run)
    os.mkdir(f"{run}/workerpool", 0o700)  # as the server makes it for its default socket
    default = f"ipc://{run}/workerpool/control.sock"
    try:
        with ServerProcess(serve_args(small_model, 1, "--control", default), env=env,
                           log_path=tmp_path / "default.log") as holder:
            assert holder.control == default
            done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=60, check=False, env=env)
    finally:
        shutil.rmtree(run, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 10)"
    assert "ready" in (tmp_path / "pool.log").read_text()
