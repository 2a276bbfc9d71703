"""The HTTP protocols' bodies, read and written as the worker does: KServe v2 (JSON and binary
tensors), OpenAI embeddings, and the frames an HTTP request and its answer cross the router in."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import pytest

from workerpool.codecs import kserve, openai, rerank, tei, text_calls
from workerpool.codecs.http_call import (
    KSERVE,
    OPENAI,
    decode_call,
    read_reply,
    request_frames,
    text_request_frames,
)
from workerpool.codecs.view import Answer, view_of
from workerpool.errors import BadRequest, DeadlineExceeded, ErrorCode
from workerpool.protocol import messages as protocol
from workerpool.protocol.route import route_for

MLP = view_of("mlp", {"model": "mlp", "inputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}],
                      "outputs": [{"name": None, "dtype": "<f4", "shape": [None, 2]}]}, 3)
TEXTS = view_of("bert", {"model": "bert", "task": "embed", "inputs": [{"name": None, "dtype": "text", "shape": [None]}],
                         "outputs": [{"name": "embedding", "dtype": "<f4", "shape": [None, 8]},
                                     {"name": "tokens", "dtype": "<i4", "shape": [None]}]}, 1)


def binary(x: np.ndarray, **document) -> tuple[bytes, int]:
    head = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}], **document}).encode()
    return head + x.tobytes(), len(head)


def test_json_and_binary_tensors_give_the_same_array() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    as_json = json.dumps({"id": "a", "inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                                 "data": x.ravel().tolist()}]}).encode()
    from_json = kserve.decode_infer(as_json, None, MLP)
    body, head = binary(x)
    from_binary = kserve.decode_infer(body, head, MLP)
    np.testing.assert_array_equal(from_json.inputs["input"], x)
    np.testing.assert_array_equal(from_binary.inputs["input"], x)
    assert from_json.id == "a"


@pytest.mark.parametrize("document, words", [
    ({"inputs": [{"name": "input", "shape": [2**62, 2**62, 0], "datatype": "FP32", "data": []}]}, "spans more than"),
    ({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}],
      "parameters": {"timeout": int("9" * 400)}}, "'timeout'"),
    ({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP64", "data": [0] * 4}]}, "takes FP32"),
    ({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}, "no input 'x'"),
    ({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0] * 3}]}, "'data' has 3"),
    ({"inputs": []}, "1 to 64 tensors"),
    ({"inputs": [{"name": "input", "shape": [-1], "datatype": "FP32", "data": []}]}, "sizes >= 0"),
])
def test_bad_values_are_a_bad_request_never_an_overflow(document, words) -> None:
    with pytest.raises(BadRequest, match=words):
        kserve.decode_infer(json.dumps(document).encode(), None, MLP)


def test_numbers_sent_to_a_text_input_are_told_it_takes_bytes() -> None:
    document = {"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [0.5]}]}
    with pytest.raises(BadRequest, match="^input 'input' takes BYTES, not FP32$"):
        kserve.decode_infer(json.dumps(document).encode(), None, TEXTS)


def test_binary_sizes_are_checked_before_anything_is_allocated() -> None:
    body, head = binary(np.ones((1, 4), np.float32))
    with pytest.raises(BadRequest, match="not a size within"):
        kserve.decode_infer(body[:-4], head, MLP)
    with pytest.raises(BadRequest, match="past the body"):
        kserve.decode_infer(body, len(body) + 1, MLP)
    with pytest.raises(BadRequest, match="4 bytes of binary data follow"):
        kserve.decode_infer(body + b"more", head, MLP)


def test_outputs_are_written_as_asked() -> None:
    request = kserve.decode_infer(json.dumps({"id": 7, "inputs": [{"name": "input", "shape": [1, 4],
                                  "datatype": "FP32", "data": [0] * 4}],
                                  "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode(),
                                  None, MLP)
    y = np.array([[1.5, -2.0]], np.float32)
    body, head = kserve.encode_infer(request, MLP, Answer({"output": y}, 3, 42))
    document = json.loads(body[:head])
    assert document["id"] == 7 and document["model_version"] == "3"
    assert document["parameters"] == {"worker_pid": 42}
    np.testing.assert_array_equal(np.frombuffer(body[head:], np.float32), y.ravel())
    request.outputs = {}
    with pytest.raises(BadRequest, match="NaN or infinity"):
        kserve.encode_infer(request, MLP, Answer({"output": np.array([np.nan], np.float32)}, 3, None))


BASE64 = {"encoding": "base64", "dimensions": None}
FLOAT = {"encoding": "float", "dimensions": None}


def test_openai_bodies_in_and_out() -> None:
    document, model = openai.requested_model(b'{"model": "bert", "input": "hi", "encoding_format": "base64", '
                                             b'"user": "someone"}')
    read = openai.decode_embeddings(document, TEXTS)
    assert (model, read.texts, read.options) == ("bert", ["hi"], BASE64)
    with pytest.raises(BadRequest, match="takes no texts"):
        openai.decode_embeddings({"input": "hi"}, MLP)
    rows = np.arange(16, dtype=np.float32).reshape(2, 8)
    items, tokens = openai.encode_items(Answer({"embedding": rows, "tokens": np.array([3, 4])}, 1, 1), 5, BASE64)
    more, tokens_more = openai.encode_items(Answer({"embedding": rows[:1], "tokens": np.array([2])}, 1, 1), 7, FLOAT)
    body = json.loads(read.finish([items, more], tokens + tokens_more))
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9} and body["model"] == "bert"
    assert [item["index"] for item in body["data"]] == [5, 6, 7]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), "<f4"), rows[1])
    assert body["data"][2]["embedding"] == rows[0].tolist()


def request_message(api: str, body: bytes, *, head: int | None = None) -> protocol.Message:
    return protocol.decode_request(request_frames(5, api, "mlp" if api == KSERVE else "bert", body,
                                                  head=head, deadline=2.0))


def test_an_http_request_crosses_the_router_and_its_answer_comes_back() -> None:
    x = np.ones((2, 4), np.float32)
    body, head = binary(x, outputs=[{"name": "output", "parameters": {"binary_data": True}}])
    message = request_message(KSERVE, body, head=head)
    assert message.header["deadline_ms"] == 2000.0 and bytes(message.body) == body
    call = decode_call(message, lambda name: MLP)
    np.testing.assert_array_equal(call.payload, x)
    reply = read_reply(call.reply(np.zeros((2, 2), np.float32), worker_pid=9, generation=3))
    assert reply.code is None and reply.content_type == "application/octet-stream"
    assert json.loads(reply.bodies[0][:reply.head])["outputs"][0]["shape"] == [2, 2]
    error = read_reply(protocol.encode_error(5, ErrorCode.OVERLOADED, "full"))
    assert (error.code, error.message) == (ErrorCode.OVERLOADED, "full")


def test_a_text_apis_parts_cross_the_router_and_their_shares_come_back_as_one_body() -> None:
    frames = text_request_frames(5, OPENAI, "bert", ["one", "two", "three"], deadline=None, **FLOAT)
    first = decode_call(protocol.decode_request([frames[0], frames[1], b"onetwo"], (0, 2)), lambda name: TEXTS)
    last = decode_call(protocol.decode_request([frames[0], frames[1], b"three"], (2, 3)), lambda name: TEXTS)
    assert (first.payload, first.first, last.payload, last.first) == (["one", "two"], 0, ["three"], 2)
    embeddings = np.ones((3, 8), np.float32)
    replies = [first.reply({"embedding": embeddings[:2], "tokens": np.array([3, 3])}, worker_pid=1, generation=1),
               last.reply({"embedding": embeddings[2:], "tokens": np.array([4])}, worker_pid=2, generation=1)]
    reply = read_reply([frame for part in replies for frame in part])
    body = json.loads(openai.join_embeddings("bert", reply.bodies, reply.tokens))
    assert [item["index"] for item in body["data"]] == [0, 1, 2] and body["usage"]["prompt_tokens"] == 10


def test_texts_are_bounded_and_a_passed_timeout_is_answered_without_running() -> None:
    with pytest.raises(BadRequest, match="1 to 1024 texts, not 1025"):
        text_request_frames(1, OPENAI, "bert", ["a"] * 1025, deadline=None)
    with pytest.raises(BadRequest, match="lone surrogate"):
        text_request_frames(1, OPENAI, "bert", ["\ud800"], deadline=None)
    late = request_frames(1, KSERVE, "mlp", json.dumps({"inputs": [{"name": "input", "shape": [1, 4],
                          "datatype": "FP32", "data": [0] * 4}], "parameters": {"timeout": 1000}}).encode(),
                          head=None, deadline=None)
    header = json.loads(late[1])
    header["http"]["at"] = time.time() - 1.0
    with pytest.raises(DeadlineExceeded, match="parameters.timeout"):
        decode_call(protocol.decode_request([late[0], json.dumps(header).encode(), late[2]]), lambda name: MLP)


@pytest.mark.parametrize("http", [[], {"api": "soap", "model": "m", "head": None, "at": 0},
                                  {"api": "kserve", "model": 1, "head": None, "at": 0},
                                  {"api": "kserve", "model": "m", "head": "12", "at": 0}])
def test_a_malformed_http_header_is_a_bad_request(http) -> None:
    header = {"v": protocol.VERSION, "id": 1, "method": "infer", "http": http}
    frames = [route_for(header), json.dumps(header).encode(), b"{}"]
    with pytest.raises((BadRequest, protocol.ProtocolError)):
        decode_call(protocol.decode_request(frames), lambda name: MLP)
    with pytest.raises(protocol.ProtocolError, match="body frame"):
        protocol.decode_request(frames[:2])


@pytest.mark.parametrize("data, words", [
    (["0.5", 1, 2, 3], "must be numbers"), ([1e39, 0, 0, 0], "cannot hold"), ([None, 0, 0, 0], "hold null"),
])
def test_json_data_must_be_numbers_that_fit_the_datatype(data, words) -> None:
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": data}]}).encode()
    with pytest.raises(BadRequest, match=words):
        kserve.decode_infer(body, None, MLP)


def test_openai_dimensions_are_the_first_components_renormalised() -> None:
    rows = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], np.float32)
    items, _ = openai.encode_items(Answer({"embedding": rows}, 1, 1), 0, {"encoding": "float", "dimensions": 2})
    cut = [item["embedding"] for item in json.loads(f"[{items.decode()}]")]
    np.testing.assert_allclose(cut, [[0.6, 0.8], [1.0, 0.0]], rtol=1e-6)
    document = {"input": "hi", "dimensions": 3}
    assert openai.decode_embeddings(document, TEXTS).options["dimensions"] == 3
    for dimensions, words in ((9, "more than the 8"), (0, "from 1 up"), (True, "from 1 up"), ("4", "from 1 up")):
        with pytest.raises(BadRequest, match=words):
            openai.decode_embeddings({"input": "hi", "dimensions": dimensions}, TEXTS)


@pytest.mark.parametrize("given", [[1, 2, 3], [[1, 2], [3]]])
def test_openai_token_ids_are_refused_naming_the_langchain_setting(given) -> None:
    with pytest.raises(BadRequest, match="check_embedding_ctx_length=False"):
        openai.decode_embeddings({"input": given}, TEXTS)


RERANKER = view_of("ce", {"model": "bert", "inputs": [{"name": None, "dtype": "text", "shape": [None]}],
                          "task": "classify", "labels": ["relevance"], "max_input_tokens": 512}, 1)
CLASSES = view_of("cls", {"model": "bert", "inputs": [{"name": None, "dtype": "text", "shape": [None]}],
                          "task": "classify", "labels": ["no", "yes"], "max_input_tokens": 512}, 1)


def test_rerank_parts_are_joined_best_first_with_the_top_n_and_documents() -> None:
    read = rerank.read({"query": "q", "documents": ["a", {"text": "b"}, "c"], "top_n": 2}, RERANKER, 1)
    assert read.texts == ["a", "b", "c"] and read.options["query"] == "q"  # the query once, in the header
    assert text_calls.payload(read.texts, read.options) == [("q", "a"), ("q", "b"), ("q", "c")]
    first = tei.write(Answer({"logits": np.array([[0.0], [2.0]])}, 1, 1), 0, read.options, RERANKER.labels)[0]
    last = tei.write(Answer({"logits": np.array([[-1.0]])}, 1, 1), 2, read.options, RERANKER.labels)[0]
    body = json.loads(read.finish([first, last], 7))
    assert [r["index"] for r in body["results"]] == [1, 0] and body["usage"]["total_tokens"] == 7
    assert body["results"][0]["document"] == {"text": "b"}
    np.testing.assert_allclose(body["results"][0]["relevance_score"], 1 / (1 + np.exp(-2.0)))
    assert "document" not in json.loads(rerank.read({"query": "q", "documents": ["a"]}, RERANKER, 2)
                                        .finish([b"[0,0.5]"], 1))["results"][0]
    with pytest.raises(BadRequest, match="has 2 labels"):
        rerank.read({"query": "q", "documents": ["a"]}, CLASSES, 2)
    with pytest.raises(BadRequest, match="string 'text'"):
        rerank.read({"query": "q", "documents": [{"title": "a"}]}, RERANKER, 2)
    with pytest.raises(BadRequest, match="over 8192"):
        rerank.read({"query": "q" * 9000, "documents": ["a"]}, RERANKER, 2)
    with pytest.raises(BadRequest, match="NUL"):
        tei.read_predict({"inputs": [["a\0", "b"]]}, CLASSES)


def test_tei_predict_writes_each_inputs_labels_best_first_and_scores_by_the_labels_count() -> None:
    read = tei.read_predict({"inputs": [["a", "b"], ["c", "d"]]}, CLASSES)
    assert read.texts == ["a\0b", "c\0d"] and text_calls.payload(read.texts, read.options) == [("a", "b"), ("c", "d")]
    share = tei.write(Answer({"logits": np.array([[0.0, 1.0], [3.0, 1.0]])}, 1, 1), 0, read.options, CLASSES.labels)[0]
    rows = json.loads(read.finish([share], 4))
    assert [[r["label"] for r in row] for row in rows] == [["yes", "no"], ["no", "yes"]]
    np.testing.assert_allclose(rows[0][0]["score"], np.exp(1) / (1 + np.exp(1)))
    single = tei.read_predict({"inputs": "a", "raw_scores": True}, CLASSES)
    assert single.texts == ["a"] and json.loads(single.finish([b'[{"score":1,"label":"yes"}]'], 1))[0]["label"] == "yes"
    np.testing.assert_allclose(text_calls.scores(np.array([[0.0]]), False), [[0.5]])
    np.testing.assert_allclose(text_calls.scores(np.array([[0.0, 0.0]]), False), [[0.5, 0.5]])


def test_tei_embed_normalises_cuts_and_refuses_what_it_cannot_do() -> None:
    read = tei.read_embed({"inputs": "hi", "dimensions": 2, "truncate": True}, TEXTS)
    assert read.options == {"op": "embed", "normalize": True, "dimensions": 2, "truncate": True}
    share = tei.write(Answer({"embedding": np.array([[3.0, 4.0, 12.0]], np.float32)}, 1, 1), 0, read.options, ())[0]
    np.testing.assert_allclose(json.loads(read.finish([share], 1)), [[0.6, 0.8]], rtol=1e-6)
    normalised = view_of("bert", {"inputs": [{"name": None, "dtype": "text", "shape": [None]}], "task": "embed",
                                  "normalized": True}, 1)
    for document, view, words in (({"inputs": "hi", "normalize": False}, normalised, "normalises its embeddings"),
                                  ({"inputs": "hi"}, RERANKER, "needs an embedding model"),
                                  ({"inputs": []}, TEXTS, "non-empty list"),
                                  ({"inputs": "hi", "truncate": "yes"}, TEXTS, "true or false")):
        with pytest.raises(BadRequest, match=words):
            tei.read_embed(document, view)
