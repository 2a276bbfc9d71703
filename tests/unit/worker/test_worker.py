"""``handle_batch`` in-process: requests and replies cross a real inproc:// socket pair."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from support.sockets import raw_request

from workerpool import models
from workerpool.models.loaded import LoadedModel
from workerpool.protocol import messages as protocol
from workerpool.worker.requests import handle_batch, in_batch_order


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> LoadedModel:
    path = tmp_path_factory.mktemp("model") / "unit.bpk"
    models.generate_mlp(path, 64 * 1024, width=16)
    return LoadedModel(str(path), None, "mmap", generation=3)


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
    _, (status, reply) = next(handle_batch(loaded, [(worker.recv_multipart(copy=False), None)]))
    worker.send_multipart(reply)
    decoded = protocol.decode_reply(client.recv_multipart())
    assert status == (b"ok" if decoded.header["status"] == "ok" else decoded.header["error"]["code"].encode())
    return status == b"ok", decoded


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
    frames = [*raw_request(4, [{"dtype": "<f4", "shape": [9]}]), b"x"]
    ok, reply = exchange(pair, loaded, frames)
    assert not ok and reply.id == 4 and reply.header["error"]["code"] == "bad_request"


def test_a_model_failure_is_an_internal_error(pair, loaded, monkeypatch):
    def broken(x):
        raise RuntimeError("boom")

    monkeypatch.setattr(loaded, "model", broken)
    ok, reply = exchange(pair, loaded, protocol.encode_request(5, np.zeros((1, 16), np.float32)))
    assert not ok and reply.header["error"] == {"code": "internal", "message": "RuntimeError: boom"}


# Hardening: hostile shapes, hostile models, outputs checked against the declaration.

POISON_SHAPES = [[0, 2**62], [2**40, 0, 2**40], [0, 2**61, 4], [0, 2**47], [2**63, 0], [0, -1],
                 [True, 0]]


def empty_request(request_id: int, shape: list) -> list[bytes]:
    return [*raw_request(request_id, [{"dtype": "<f4", "shape": shape}]), b""]


@pytest.mark.parametrize("shape", POISON_SHAPES)
def test_an_empty_array_with_huge_axes_is_a_bad_request(pair, loaded, shape):
    ok, reply = exchange(pair, loaded, empty_request(6, shape))
    assert not ok and reply.id == 6 and reply.header["error"]["code"] == "bad_request"


def test_an_empty_array_within_the_extent_limit_reaches_the_model(loaded):
    message = protocol.decode_request(empty_request(7, [0, 2**46])[1:])
    assert message.arrays[0].shape == (0, 2**46)
    with pytest.raises(models.ModelInputError):
        loaded.infer(message.payload())


class Escape(BaseException):
    pass


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(2), Escape("out")])
def test_a_base_exception_from_the_model_is_an_internal_error(pair, loaded, monkeypatch, raised):
    def model(x):
        raise raised

    monkeypatch.setattr(loaded, "model", model)
    ok, reply = exchange(pair, loaded, protocol.encode_request(8, np.zeros((1, 16), np.float32)))
    assert not ok and reply.header["error"]["code"] == "internal"
    assert reply.header["error"]["message"].startswith(type(raised).__name__)


class Declared:
    """Declares float32 [B, 16] in, [B, 2] out; returns what it is given to return."""

    input_shape, input_dtype = (None, 16), "float32"
    output_shape, output_dtype = (None, 2), np.float32

    def __init__(self, output) -> None:
        self.output, self.calls = output, 0

    def __call__(self, x):
        self.calls += 1
        return self.output(x) if callable(self.output) else self.output


@pytest.fixture
def declared(loaded, monkeypatch):
    """Serve a :class:`Declared` model, with the output a test sets, on ``loaded``."""

    def serve(output) -> Declared:
        model = Declared(output)
        monkeypatch.setattr(loaded, "model", model)
        monkeypatch.setattr(loaded, "contract", models.Contract.of(model, "declared"))
        monkeypatch.setattr(loaded, "misfit_logged", False)
        return model

    return serve


@pytest.mark.parametrize("x", [np.zeros((2, 5), np.float32), np.zeros((2, 16), np.float64),
                               np.zeros((2, 16, 1), np.float32)])
def test_an_input_off_the_declaration_is_refused_before_the_model_runs(pair, loaded, declared, x):
    model = declared(lambda x: np.zeros((len(x), 2), np.float32))
    ok, reply = exchange(pair, loaded, protocol.encode_request(9, x))
    assert not ok and reply.header["error"]["code"] == "bad_request" and model.calls == 0


@pytest.mark.parametrize("output, wrong", [
    (np.zeros(3, np.float32), "float32 [3], declared float32 [4, 2]"),
    (np.zeros((4, 2), np.float64), "float64 [4, 2], declared float32 [4, 2]"),
    (np.zeros((3, 2), np.float32), "float32 [3, 2], declared float32 [4, 2]"),  # not the input's batch
    (None, "nothing, declared float32 [4, 2]"),
    ({"y": np.zeros((4, 2), np.float32)}, "arrays named ['y'], declared float32 [4, 2]"),
])
def test_an_output_off_the_declaration_is_an_internal_error_logged_once(
    pair, loaded, declared, caplog, output, wrong
):
    declared(output)
    x = np.zeros((4, 16), np.float32)
    for request_id in range(3):
        ok, reply = exchange(pair, loaded, protocol.encode_request(request_id, x))
        assert not ok
        assert reply.header["error"] == {"code": "internal", "message": f"model declared returned {wrong}"}
    logged = f"worker {os.getpid()}: model declared returned {wrong}; every such request is answered"
    assert [r.getMessage() for r in caplog.records if "logged once" in r.getMessage()] == [
        f"{logged} 'internal' (logged once)"
    ]


def test_an_unbatched_input_makes_a_batch_of_one(pair, loaded, declared):
    declared(lambda x: np.zeros((1, 2), np.float32))
    ok, reply = exchange(pair, loaded, protocol.encode_request(10, np.zeros(16, np.float32)))
    assert ok and reply.payload().shape == (1, 2)


def test_an_output_the_wire_refuses_is_an_internal_error(pair, loaded, monkeypatch):
    monkeypatch.setattr(loaded, "contract", models.Contract.of(object(), "bare"))
    monkeypatch.setattr(loaded, "misfit_logged", False)
    for output in (np.zeros((0, 2**50), np.uint8), np.zeros(2, np.complex64)):
        monkeypatch.setattr(loaded, "model", lambda x, output=output: output)
        ok, reply = exchange(pair, loaded, protocol.encode_request(11, np.zeros(16, np.float32)))
        assert not ok and reply.header["error"]["code"] == "internal"
        assert reply.header["error"]["message"].startswith("model mlp's output cannot be sent")


# The contract by itself.

ROW = np.zeros((3, 4), np.float32)


class Named:
    """Declares two named outputs, one with an axis of any size besides the batch axis."""

    input_shape, input_dtype = (None, 4), np.float32

    def __init__(self) -> None:
        self.output_shape = {"logits": (None, 10), "embedding": (None, None)}
        self.output_dtype = {"logits": np.float32, "embedding": np.float16}


def test_named_outputs_are_checked_by_name():
    contract = models.Contract.of(Named(), "named")
    batch = contract.check_input({"input": ROW})
    assert batch == 3
    good = {"logits": np.zeros((3, 10), np.float32), "embedding": np.zeros((3, 7), np.float16)}
    contract.check_output(good, batch)
    for bad, wrong in [
        ({"logits": good["logits"]}, "arrays named ['logits'], declared arrays named ['embedding', 'log"),
        ({**good, "embedding": good["embedding"][1:]}, "embedding: float16 [2, 7], declared float16 [3, any]"),
        ({**good, "logits": good["logits"].astype(np.float64)}, "logits: float64 [3, 10], declared float32"),
        (good["logits"], "float32 [3, 10], declared arrays named"),
    ]:
        with pytest.raises(models.ModelOutputError, match=re.escape(f"model named returned {wrong}")):
            contract.check_output(bad, batch)


def test_an_undeclared_model_must_return_arrays():
    contract = models.Contract.of(object(), "bare")
    assert contract.check_input(None) is None
    contract.check_output(ROW, None)
    contract.check_output({"a": ROW}, None)
    for bad in (None, [1.0], {}, {"a": [1.0]}):
        with pytest.raises(models.ModelOutputError, match="not an array or named arrays"):
            contract.check_output(bad, None)


def test_info_lists_every_declared_array_in_one_format():
    """Named outputs, dtypes as the wire's descriptors write them, extra accepted dtypes, and
    None for what a model leaves undeclared."""
    named = type("Mixed", (Named,), {"also_accepted": (np.uint8,)})()
    assert models.Contract.of(named, "named").info() == {
        "inputs": [{"name": None, "dtype": "<f4", "shape": [None, 4], "also_accepted": ["|u1"]}],
        "outputs": [{"name": "logits", "dtype": "<f4", "shape": [None, 10]},
                    {"name": "embedding", "dtype": "<f2", "shape": [None, None]}],
    }
    undeclared = {"name": None, "dtype": None, "shape": None}
    assert models.Contract.of(object(), "bare").info() == {"inputs": [undeclared], "outputs": [undeclared]}


def test_the_built_in_models_declare_what_they_return(loaded):
    assert loaded.contract.check_input(np.zeros((0, 16), np.float32)) == 0
    loaded.contract.check_output(loaded.infer(np.zeros((2, 16), np.float32)), 2)


@pytest.mark.parametrize("declaration", [
    {"input_shape": 4},
    {"output_dtype": "no-such-dtype"},
    {"output_shape": (None, 2), "output_dtype": {"a": np.float32}},
    {"output_shape": {"a": (None, 2)}, "output_dtype": {"b": np.float32}},
])
def test_an_unreadable_declaration_stops_the_model_from_loading(declaration):
    model = type("Odd", (), declaration)()
    with pytest.raises(models.ModelError, match="declares an unreadable signature"):
        models.Contract.of(model, "odd")


def test_a_batchs_answers_go_as_soon_as_those_before_them_have():
    finished = iter([(3, "d"), (0, "a"), (2, "c"), (4, "e"), (1, "b")])
    assert list(in_batch_order(finished)) == [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "e")]
    pulled = []

    def answers():
        for answer in [(0, "a"), (2, "c"), (1, "b")]:
            pulled.append(answer[0])
            yield answer
    ordered = in_batch_order(answers())
    assert next(ordered) == (0, "a") and pulled == [0]  # sent before the next answer is run
    assert list(ordered) == [(1, "b"), (2, "c")]


def test_a_batch_answers_every_request_even_one_the_model_left_out(loaded, monkeypatch):
    x = np.ones((1, 16), np.float32)
    frames = [protocol.encode_request(request_id, x)[1:] for request_id in range(3)]
    original = loaded.infer_batch
    monkeypatch.setattr(loaded, "infer_batch", lambda inputs: (answer for answer in original(inputs)
                                                                if answer[0] != 1))
    answers = dict(handle_batch(loaded, [(request, None) for request in frames]))
    assert sorted(answers) == [0, 1, 2]
    assert [answers[index][0] for index in range(3)] == [b"ok", b"internal", b"ok"]
    error = protocol.decode_reply(answers[1][1])
    assert error.id == 1 and error.header["error"]["code"] == "internal"
