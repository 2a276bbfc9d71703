"""Batching through real servers: requests that wait share one forward pass, and each is still
answered as if it had run alone.

``--batch-wait`` makes the batches certain: requests sent together wait for each other instead
of racing a free worker. Batched answers are compared with the model run on each request alone
in this process, to float32 rounding: rtol 1e-5, atol 1e-6 (a stacked matrix product may sum in
another order, nothing more).
"""

from __future__ import annotations

import os
import signal
import threading
from collections import defaultdict

import numpy as np
import pytest
import zmq
from batch_model import WIDTH
from support import onnx_texts
from support.server import Server
from support.sockets import collect, dealer, f32, raw_request, reply_header

import workerpool
from workerpool import models
from workerpool.protocol import messages as protocol
from workerpool.weights.publish import publish

WAIT = ("--batch-wait", "300")  # every request sent at once joins the first one's batch
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # float32 BLAS: a batch of another height may sum in another order


def send_all(sock: zmq.Socket, inputs: list[np.ndarray]) -> dict[int, dict]:
    """Send every input at once; each reply's header with its outputs, by request id."""
    for request_id, x in enumerate(inputs):
        sock.send_multipart(protocol.encode_request(request_id, x))
    replies = {}
    for frames in collect(sock, len(inputs)):
        message = protocol.decode_reply(frames[1:])
        replies[message.id] = {**message.header, "outputs": message.payload()}
    assert sorted(replies) == list(range(len(inputs)))
    return replies


def batch_sizes(server: Server) -> dict[int, int]:
    """The pool's batches by size bucket (rows), summed over its workers."""
    sizes: dict[int, int] = defaultdict(int)
    for worker in server.status(memory=False)["workers"]:
        for size, count in worker["batch_sizes"].items():
            sizes[int(size)] += count
    return dict(sizes)


def test_batched_replies_equal_each_request_run_alone(small_model, local_model, context):
    width = local_model.input_shape[1]
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(shape, dtype=np.float32)
              for shape in [(1, width)] * 12 + [(width,)] * 4 + [(3, width)] * 4]
    with Server(small_model, *WAIT, workers=1) as server, dealer(context, server.endpoint) as sock:
        replies = send_all(sock, inputs)
        status = server.status(memory=False)
    for request_id, x in enumerate(inputs):
        assert replies[request_id]["status"] == "ok"
        expected = local_model(np.atleast_2d(x))  # a bare row is served with its batch axis
        assert replies[request_id]["outputs"].shape == expected.shape
        np.testing.assert_allclose(replies[request_id]["outputs"], expected, **TOLERANCE)
    worker = status["workers"][0]
    assert (worker["served"], worker["rows"]) == (20, 12 + 4 + 12)
    assert worker["batches"] < 20 and max(map(int, worker["batch_sizes"])) > 1  # shared passes


def test_a_malformed_request_inside_a_batch_fails_alone(small_model, local_model, context):
    width = local_model.input_shape[1]
    x = np.ones((1, width), np.float32)
    with Server(small_model, *WAIT, workers=1) as server, dealer(context, server.endpoint) as sock:
        sock.send_multipart([*raw_request(1, [f32([1, width])]), x.tobytes()])
        sock.send_multipart([*raw_request(2, [f32([1, width])]), x.tobytes()[:-4]])  # a short frame
        sock.send_multipart([*raw_request(3, [f32([1, width])], v=4), x.tobytes()])  # another version
        sock.send_multipart([*raw_request(4, [f32([1, width])]), np.full((1, width), np.nan, np.float32).tobytes()])
        sock.send_multipart([*raw_request(5, [f32([1, width])]), x.tobytes()])
        # A route frame that says one row where the header has three: it would pass --max-batch.
        lying = raw_request(6, [f32([1, width])])[:2] + raw_request(6, [f32([3, width])])[2:]
        sock.send_multipart([*lying, np.ones((3, width), np.float32).tobytes()])
        replies = {h["id"]: h for h in map(reply_header, collect(sock, 6))}
        assert max(batch_sizes(server)) >= 4  # they shared a batch
    assert {i: replies[i]["status"] for i in replies} == {1: "ok", 2: "error", 3: "error", 4: "ok", 5: "ok",
                                                          6: "error"}
    assert replies[2]["error"]["code"] == replies[3]["error"]["code"] == replies[6]["error"]["code"] == "bad_request"
    assert "bytes" in replies[2]["error"]["message"] and "version" in replies[3]["error"]["message"]
    assert "route frame does not repeat" in replies[6]["error"]["message"]


def test_a_model_that_fails_on_a_stack_answers_each_request_alone(small_model, context):
    inputs = [np.full((1, WIDTH), i, np.float32) for i in range(8)]
    with Server(small_model, "--model", "batch_model:no_stacks", *WAIT, workers=1) as server, \
            dealer(context, server.endpoint) as sock:
        first = send_all(sock, inputs)
        second = send_all(sock, inputs)
        assert max(batch_sizes(server)) > 1
    for replies in (first, second):
        for request_id, x in enumerate(inputs):
            assert replies[request_id]["status"] == "ok", replies[request_id]
            np.testing.assert_array_equal(replies[request_id]["outputs"], x * 2)
    assert server.log().count("failed on a stacked batch") == 1


@pytest.mark.parametrize(("factory", "sizes"), [("unbatched", {1: 8}), ("stacking", {8: 1})])
def test_a_factory_model_is_batched_only_when_it_opts_in(small_model, context, factory, sizes):
    inputs = [np.full((1, WIDTH), i, np.float32) for i in range(8)]
    with Server(small_model, "--model", f"batch_model:{factory}", *WAIT, workers=1) as server, \
            dealer(context, server.endpoint) as sock:
        replies = send_all(sock, inputs)
        assert batch_sizes(server) == sizes
        with workerpool.Client(server.endpoint) as client:
            assert client.info()["batching"] is (factory == "stacking")
    for request_id, x in enumerate(inputs):
        np.testing.assert_array_equal(replies[request_id]["outputs"], x * 2)


def test_max_batch_bounds_rows_and_a_larger_request_runs_in_parts(small_model, local_model, context):
    width = local_model.input_shape[1]
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((2, width), dtype=np.float32) for _ in range(6)] + \
        [rng.standard_normal((6, width), dtype=np.float32)]
    with Server(small_model, "--max-batch", "4", *WAIT, workers=1) as server, \
            dealer(context, server.endpoint) as sock:
        replies = send_all(sock, inputs)
        sizes = batch_sizes(server)
        assert max(sizes) == 4 and sum(sizes.values()) >= 5  # no pass past 4 rows: the six went in parts
    for request_id, x in enumerate(inputs):
        np.testing.assert_allclose(replies[request_id]["outputs"], local_model(x), **TOLERANCE)


def test_a_worker_killed_with_a_batch_in_flight_loses_no_request(small_model, context):
    inputs = [np.full((1, WIDTH), -1.0 if i == 0 else i, np.float32) for i in range(6)]  # 1 s pass
    with Server(small_model, "--model", "batch_model:stacking", *WAIT, workers=2) as server, \
            dealer(context, server.endpoint) as sock:
        for request_id, x in enumerate(inputs):
            sock.send_multipart(protocol.encode_request(request_id, x))
        status = server.wait_for(lambda s: s["queue"]["in_flight"] == 6)
        victim = next(w["pid"] for w in status["workers"] if w["state"] == "busy")
        server.track()
        os.kill(victim, signal.SIGKILL)
        replies = {h["id"]: h for h in map(reply_header, collect(sock, 6, timeout=30))}
    assert sorted(replies) == list(range(6))
    assert all(h["status"] == "ok" and h["worker_pid"] != victim for h in replies.values())
    assert "with a batch of 6 requests in flight; retrying each alone" in server.log()


def test_a_reload_under_batched_load_keeps_each_client_on_one_side_of_it(tmp_path, context):
    versions = []
    for seed in range(3):
        versions.append(tmp_path / f"v{seed}.bpk")
        models.generate_mlp(versions[-1], 256 * 1024, width=64, seed=seed)
    served = tmp_path / "served.bpk"
    publish(versions[0], served)
    stop, failures = threading.Event(), []
    generations: dict[int, list[int]] = defaultdict(list)

    def run(endpoint: str, index: int) -> None:
        x = np.full((1, 64), index, np.float32)
        with workerpool.Client(endpoint, timeout=20, retries=1) as client:
            while not stop.is_set():
                try:
                    generations[index].append(client.request(x).generation)
                except workerpool.WorkerpoolError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")

    with Server(served, "--batch-wait", "5", workers=2) as server:
        threads = [threading.Thread(target=run, args=(server.endpoint, i)) for i in range(8)]
        for thread in threads:
            thread.start()
        try:
            for generation, version in enumerate(versions[1:], start=2):
                publish(version, served)
                server.wait_for(lambda s, g=generation: all(w["generation"] == g for w in s["workers"]))
                done = sum(map(len, generations.values()))
                server.wait_for(lambda s, done=done: sum(map(len, generations.values())) > done + 40)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert max(batch_sizes(server)) > 1
    assert failures == []
    for seen in generations.values():
        assert seen == sorted(seen), "a client saw generations go backwards"
    assert {g for seen in generations.values() for g in seen} == {1, 2, 3}


@pytest.mark.xdist_group("timing")  # tens of milliseconds between replies: in turn with the loads of other tests
def test_a_batchs_first_request_is_answered_before_the_rest_of_the_batch_is_done(tmp_path, context):
    """One batch (``--batch-wait``) of a request of a short text, then four of 900 long texts
    from another client: the first request's pass runs first and its reply leaves at once,
    well before the 3,600 texts of the rest are embedded."""
    path = onnx_texts.converted(tmp_path / "st", onnx_texts.encoder())
    short, long = ["hello"], [" ".join(["a"] * 29)] * 900
    with Server(path, "--max-batch", "4096", *WAIT, workers=1) as server, \
            dealer(context, server.endpoint) as first, dealer(context, server.endpoint) as second:
        first.send_multipart(protocol.encode_request(1, short))
        for request_id in range(2, 6):
            second.send_multipart(protocol.encode_request(request_id, long))
        quick = collect(first, 1)
        early = collect(second, 4, timeout=0)  # those already here: the rest takes some 40 ms more
        slow = early + collect(second, 4 - len(early))
        worker = server.status(memory=False)["workers"][0]
    assert reply_header(quick[0])["status"] == "ok"
    assert [reply_header(reply)["status"] for reply in slow] == ["ok"] * 4
    assert len(early) < 4  # answered all at once, they would all be here with the first
    assert (worker["batches"], worker["rows"]) == (1, 3601)  # one batch, answered in parts
