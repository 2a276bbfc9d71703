"""``handle_request`` in-process: requests and replies cross a real inproc:// socket pair."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from workerpool import models, protocol
from workerpool.models.loaded import LoadedModel
from workerpool.worker import handle_request


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> LoadedModel:
    path = tmp_path_factory.mktemp("model") / "unit.bpk"
    models.generate_mlp(path, 64 * 1024, width=16)
    return LoadedModel(str(path), None, generation=3)


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    context = zmq.Context()
    client, worker = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    worker.bind("inproc://worker")
    client.connect("inproc://worker")
    yield client, worker
    context.destroy(linger=0)


def exchange(pair, loaded: LoadedModel, frames: list) -> tuple[bool, protocol.Message]:
    """Send request frames to the worker side, run them, send the reply back, decode it."""
    client, worker = pair
    client.send_multipart(frames[1:])  # without the DEALER's empty delimiter
    ok, reply = handle_request(loaded, worker.recv_multipart(copy=False))
    worker.send_multipart(reply)
    return ok, protocol.decode_reply(client.recv_multipart())


def test_an_inference_matches_the_model(pair, loaded):
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    ok, reply = exchange(pair, loaded, protocol.encode_request(1, x))
    assert ok and reply.header["generation"] == 3
    np.testing.assert_array_equal(reply.payload(), loaded.model(x))


def test_info_describes_the_model(pair, loaded):
    ok, reply = exchange(pair, loaded, protocol.encode_request(2, None, method=protocol.METHOD_INFO))
    assert ok and reply.header["info"]["model"] == "mlp"


@pytest.mark.parametrize("x", [np.zeros((2, 5), np.float32), np.zeros((2, 16), np.float64)])
def test_an_input_that_does_not_fit_is_a_bad_request(pair, loaded, x):
    ok, reply = exchange(pair, loaded, protocol.encode_request(3, x))
    assert not ok and reply.header["error"]["code"] == "bad_request" and reply.id == 3


def test_a_malformed_request_is_a_bad_request_that_keeps_its_id(pair, loaded):
    frames = [b"", b'{"v": 1, "id": 4, "method": "infer", "arrays": [{"dtype": "<f4", "shape": [9]}]}', b"x"]
    ok, reply = exchange(pair, loaded, frames)
    assert not ok and reply.id == 4 and reply.header["error"]["code"] == "bad_request"


def test_a_model_failure_is_an_internal_error(pair, loaded, monkeypatch):
    def broken(x):
        raise RuntimeError("boom")

    monkeypatch.setattr(loaded, "model", broken)
    ok, reply = exchange(pair, loaded, protocol.encode_request(5, np.zeros((1, 16), np.float32)))
    assert not ok and reply.header["error"] == {"code": "internal", "message": "RuntimeError: boom"}
