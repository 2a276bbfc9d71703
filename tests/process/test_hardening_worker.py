"""Hostile requests and hostile models against real workers: none of them may take a worker
down, hand a client a wrong answer as a success, grow a worker without bound, or leave a
worker behind its supervisor."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import hostile_models as hostile
import numpy as np
import psutil
import pytest
import zmq
from support.models import SLOW
from support.processes import Background, slow_request, vm_hwm
from support.server import Host, Server
from support.sockets import dealer, f32, free_port, raw_request, reply_header
from support.status import busy_pids, pool_ready
from test_hosts import free_backend

import workerpool
from workerpool.protocol import messages as protocol
from workerpool.protocol.route import route_for
from workerpool.units import MS_PER_SECOND, KiB, MiB
from workerpool.worker.spec import STOP_SIGNAL

HOSTILE = ("--model", "hostile_models:factory")
POISON_SHAPES = [
    [0, 2**62],
    [2**40, 0, 2**40],
    [0, 2**61, 4],
    [2**62, 0],
    [0, 2**63 - 1],
    [0] * 32 + [1],  # one axis too many
    [-1, 0],
]
MEMORY_LIMIT = 256 * MiB
BOUNDED = ("--max-worker-memory", str(MEMORY_LIMIT))


def poison(request_id: int, shape: list[int]) -> list[bytes]:
    """A request for an empty array whose other axes are huge (or a shape no array has)."""
    return [*raw_request(request_id, [f32(shape)]), b""]


def ask(sock: zmq.Socket, frames: list[bytes]) -> dict:
    sock.send_multipart(frames)
    assert sock.poll(10 * MS_PER_SECOND), "no reply"
    return reply_header(sock.recv_multipart())


def hostile_input(code: int, amount_mib: int = 0) -> np.ndarray:
    return np.array([[code, amount_mib, 0, 0]], np.float32)


def pids(status: dict) -> list[int]:
    return sorted(w["pid"] for w in status["workers"])


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no RssAnon")


@pytest.fixture(scope="module")
def mlp_server(small_model: str) -> Iterator[Server]:
    with Server(small_model, workers=2) as server:
        server.wait_for(pool_ready(2))
        yield server


@pytest.fixture(scope="module")
def hostile_server(small_model: str) -> Iterator[Server]:
    with Server(small_model, *HOSTILE, workers=2) as server:
        server.wait_for(pool_ready(2))
        yield server


# Finding 1: a zero-size axis beside huge ones.


def test_poison_shapes_are_bad_requests_and_kill_no_worker(mlp_server, context):
    before = sorted(mlp_server.worker_pids())
    with dealer(context, mlp_server.endpoint) as sock:
        for request_id, shape in enumerate(POISON_SHAPES):
            reply = ask(sock, poison(request_id, shape))
            assert reply["id"] == request_id and reply["error"]["code"] == "bad_request", (shape, reply)
    assert pids(mlp_server.wait_for(pool_ready(2))) == before


def test_a_flood_of_poison_under_load_fails_no_legitimate_request(mlp_server, local_model, context):
    before = sorted(mlp_server.worker_pids())
    width = local_model.input_shape[1]

    def load(seed: int) -> int:
        rng = np.random.default_rng(seed)
        with workerpool.Client(mlp_server.endpoint, timeout=20, retries=0) as client:
            for _ in range(40):
                x = rng.standard_normal((2, width)).astype(np.float32)
                np.testing.assert_allclose(client.infer(x), local_model(x), rtol=1e-5, atol=1e-5)
        return 40

    loads = [Background(lambda seed=seed: load(seed)) for seed in range(4)]
    codes = []
    with dealer(context, mlp_server.endpoint) as sock:
        for request_id in range(30):  # paced by the replies, interleaved with the load
            codes.append(ask(sock, poison(request_id, POISON_SHAPES[request_id % 3]))["error"]["code"])
    assert [b.join(60) for b in loads] == [40] * 4
    assert codes == ["bad_request"] * 30
    assert pids(mlp_server.wait_for(pool_ready(2))) == before


# Finding 2: a model that raises what is not an Exception.


@pytest.mark.parametrize("code, raised", [
    (hostile.KEYBOARD_INTERRUPT, "KeyboardInterrupt"),
    (hostile.SYSTEM_EXIT, "SystemExit"),
    (hostile.CUSTOM_BASE_EXCEPTION, "Escape"),
])
def test_a_base_exception_from_the_model_is_an_internal_error(hostile_server, code, raised):
    before = sorted(hostile_server.worker_pids())
    with workerpool.Client(hostile_server.endpoint, timeout=10, retries=0) as client:
        for _ in range(3):
            with pytest.raises(workerpool.InternalError, match=f"^{raised}") as caught:
                client.request(hostile_input(code))
            assert caught.value.worker_pid in before
        assert client.request(hostile_input(hostile.ANSWER)).outputs.shape == (1, 2)
    assert pids(hostile_server.status()) == before


def test_the_stop_signal_makes_a_busy_worker_leave_after_its_answer(small_model):
    with Server(small_model, *SLOW, workers=1) as server:
        pid = server.wait_for(pool_ready(1))["workers"][0]["pid"]
        call = slow_request(server.endpoint, 1.0)
        server.wait_for(lambda s: busy_pids(s) == [pid])
        psutil.Process(pid).send_signal(STOP_SIGNAL)
        assert call.join(20).worker_pid == pid
        server.wait_for(pool_ready(1, without=(pid,)))
        assert f"worker {pid}: asked to stop (SIGUSR1), leaving the pool" in server.log()


# Finding 3: output that breaks the model's declaration.


def test_outputs_that_break_the_declaration_are_internal_errors_logged_once(hostile_server):
    answered_by = set()
    with workerpool.Client(hostile_server.endpoint, timeout=10, retries=0) as client:
        for _ in range(4):
            for code, wrong in [(hostile.WRONG_SHAPE, r"float32 \[3\], declared float32 \[1, 2\]"),
                                (hostile.WRONG_DTYPE, r"float64 \[1, 2\], declared float32 \[1, 2\]"),
                                (hostile.NOTHING, r"nothing, declared float32 \[1, 2\]")]:
                with pytest.raises(workerpool.InternalError, match=wrong) as caught:
                    client.request(hostile_input(code))
                answered_by.add(caught.value.worker_pid)
        batch = np.zeros((5, 4), np.float32)
        assert client.infer(batch).shape == (5, 2)
    logged = re.findall(r"worker (\d+): model hostile_models:factory returned .* \(logged once\)",
                        hostile_server.log())
    assert sorted(map(int, logged)) == sorted(answered_by)


def test_undeclared_outputs_must_still_be_arrays(small_model):
    with Server(small_model, "--model", "hostile_models:undeclared", workers=1) as server:
        server.wait_for(pool_ready(1))
        with workerpool.Client(server.endpoint, timeout=10, retries=0) as client:
            with pytest.raises(workerpool.InternalError, match="returned nothing, not an array"):
                client.request(hostile_input(hostile.NOTHING))
            assert client.infer(hostile_input(hostile.WRONG_SHAPE)).shape == (3,)  # nothing declared
            assert client.infer(hostile_input(hostile.WRONG_DTYPE)).dtype == np.float64


# Finding 4: a memory bound per worker.


def test_an_allocation_past_the_memory_limit_fails_only_its_request(small_model):
    with Server(small_model, *HOSTILE, *BOUNDED, workers=1) as server:
        pid = server.wait_for(pool_ready(1))["workers"][0]["pid"]
        with workerpool.Client(server.endpoint, timeout=20, retries=0) as client:
            with pytest.raises(workerpool.InternalError, match="^MemoryError"):
                client.request(hostile_input(hostile.ALLOCATE, 1024))
            with pytest.raises(workerpool.InternalError, match="^MemoryError"):
                client.request(hostile_input(hostile.HOARD))  # many small allocations, all held
            assert vm_hwm(pid) < 2 * MEMORY_LIMIT  # the weights' pages count here too
            assert client.request(hostile_input(hostile.ALLOCATE, 128)).worker_pid == pid
        assert server.status()["workers"][0]["pid"] == pid


def test_a_worker_left_over_the_memory_limit_is_recycled_losing_nothing(small_model):
    with Server(small_model, *HOSTILE, *BOUNDED, workers=1) as server:
        pid = server.wait_for(pool_ready(1))["workers"][0]["pid"]
        # Just over the limit, within the allocation bound (the limit past the ready worker's mappings).
        keep = (MEMORY_LIMIT - rss_anon(pid)) // MiB + 8
        with workerpool.Client(server.endpoint, timeout=20, retries=0) as client:
            assert client.request(hostile_input(hostile.KEEP, keep)).worker_pid == pid
            answers = [client.request(hostile_input(hostile.ANSWER)) for _ in range(20)]
        assert all(a.outputs.shape == (1, 2) for a in answers)
        server.wait_for(pool_ready(1, without=(pid,)))
        assert not psutil.pid_exists(pid)
        assert f"worker {pid} recycled" in server.log()
        assert f"worker {pid}: private memory" in server.log()


# Finding 5: workers die with their supervisor, whatever they are doing.


def slow_requests(sock: zmq.Socket, count: int, seconds: float) -> None:
    x = np.full((1, 2), -seconds, np.float32)
    for request_id in range(count):
        sock.send_multipart([*raw_request(request_id, [f32([1, 2])]), x.tobytes()])


def living(candidates: list[int]) -> list[int]:
    """Those of ``candidates`` still running (a zombie waiting for init to reap it is dead)."""
    alive = []
    for pid in candidates:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def assert_all_gone(workers: list[int], within: float) -> None:
    deadline = time.monotonic() + within
    while living(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not living(workers), f"workers {living(workers)} outlived their supervisor by {within}s"


def test_busy_workers_die_with_their_supervisor(small_model, context):
    with Server(small_model, *SLOW, workers=2) as server, dealer(context, server.endpoint) as sock:
        server.wait_for(pool_ready(2))
        slow_requests(sock, 2, 30)
        busy = busy_pids(server.wait_for(lambda s: len(busy_pids(s)) == 2))
        server.proc.kill()
        assert_all_gone(busy, within=3)


def test_busy_workers_of_a_worker_host_die_with_the_host(small_model, context):
    backend = free_backend()
    # Its requests go unanswered: the router need not wait for them when the test ends.
    with Server(small_model, *SLOW, "--backend", backend, "--graceful-timeout", "1", workers=0) as router, \
            Host(small_model, backend, *SLOW, workers=2) as host, dealer(context, router.endpoint) as sock:
        router.wait_for(lambda s: sum(w["state"] == "ready" for w in s["workers"]) == 2)
        slow_requests(sock, 2, 30)
        busy = busy_pids(router.wait_for(lambda s: len(busy_pids(s)) == 2))
        host.proc.kill()
        assert_all_gone(busy, within=3)


# Silence is never an answer.


@pytest.mark.parametrize("extra", [[b""] * 10_000, [b"abcd"] * 5_000], ids=["empty", "four-byte"])
def test_a_request_followed_by_too_many_frames_is_answered_bad_request(mlp_server, context, extra):
    """One declared array, then thousands of frames: the request's own id gets the answer."""
    request = protocol.encode_request(41, np.zeros((2, 256), np.float32))
    with dealer(context, mlp_server.endpoint) as sock:
        sock.send_multipart([*request, *extra])
        assert sock.poll(10_000), "a message of too many frames got no answer"
        reply = protocol.decode_header(sock.recv_multipart()[1])
    assert reply["id"] == 41 and reply["error"]["code"] == "bad_request"
    assert f"a message of {len(extra) + 4} frames" in reply["error"]["message"]


def test_a_codec_that_fails_answers_its_request_internal_and_the_worker_serves_on(small_model, context):
    """A text model without an embedding: the front door refuses /v1/embeddings for it, and an
    OpenAI call's header written by a ZeroMQ client, which gets past that, fails alone."""
    port = free_port()
    with Server(small_model, "--model", "text_scorer:factory", "--http", f"127.0.0.1:{port}",
                workers=1) as server, dealer(context, server.endpoint) as sock:
        pid = server.worker_pids()[0]
        body = json.dumps({"model": "small", "input": ["a text"]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", body,
                                         {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400 and b"gives no embeddings" in refused.value.read()
        header = {"v": protocol.VERSION, "id": 1, "method": "infer", "arrays": [], "texts": 1,
                  "http": {"api": "openai", "model": "small", "at": time.time()}}
        sock.send_multipart([b"", route_for(header, [6]), protocol.encode_header(header), b"a text"])
        answer = reply_header(sock.recv_multipart())
        assert answer["error"]["code"] == "internal" and "its reply could not be written" in answer["error"]["message"]
        with workerpool.Client(server.endpoint) as client:
            assert client.infer(["four"])["score"].tolist() == [4.0]
        assert server.worker_pids() == [pid]  # the same worker: none died
        assert "its reply could not be written" in server.log() and "Traceback" in server.log()
