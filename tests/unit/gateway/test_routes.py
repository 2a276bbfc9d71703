"""The front door's decisions without a socket: a request in, a response or a call to the router out."""

from __future__ import annotations

import json

import pytest

from workerpool.codecs.http_call import KSERVE, OPENAI
from workerpool.codecs.view import ModelState
from workerpool.errors import ErrorCode
from workerpool.gateway.http11 import Refusal, Request
from workerpool.gateway.routes import Forward, Reply, Routes
from workerpool.protocol import messages as protocol
from workerpool.protocol.route import read_route

SIGNATURE = {"inputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}],
             "outputs": [{"name": None, "dtype": "<f4", "shape": [None, 2]}]}
TEXTS = {"inputs": [{"name": None, "dtype": "text", "shape": [None]}],
         "outputs": [{"name": "embedding", "dtype": "<f4", "shape": [None, 4]}]}


def routes(token: bytes | None = None, *, several: bool = False) -> Routes:
    """The routes of a server of the model mlp (generation 2), and with ``several`` the text
    model embed beside it (not ready)."""
    served = {"mlp": ModelState(SIGNATURE, "mlp", 2)}
    if several:
        served["embed"] = ModelState(TEXTS, "bert", 1)
    return Routes(lambda: served, lambda model: "no worker is ready yet" if model == "embed" else None,
                  lambda path: (200, "text/plain", path.encode()), token=token)


def request(method: str, path: str, body: bytes = b"", **headers: str) -> Request:
    return Request(method, path, {k.replace("_", "-").lower(): v for k, v in headers.items()}, True, body)


def answered(decision: Reply | Forward) -> tuple[int, dict]:
    assert isinstance(decision, Reply)
    return decision.status, json.loads(decision.body)


def test_description_and_probes_are_answered_here() -> None:
    status, metadata = answered(routes().answer(request("GET", "/v2/models/mlp"), "r-1"))
    assert status == 200 and metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["versions"] == ["2"]
    assert answered(routes().answer(request("GET", "/v2/models/mlp/versions/1"), "r-1"))[0] == 404
    assert answered(routes().answer(request("GET", "/v2/models/other"), "r-1"))[0] == 404
    probe = routes().answer(request("GET", "/v2/health/ready"), "r-1")
    assert isinstance(probe, Reply) and probe.body == b"/readyz"
    wrong = routes().answer(request("GET", "/v2/models/mlp/infer"), "r-1")
    assert isinstance(wrong, Reply) and wrong.status == 405 and wrong.headers == {"Allow": "POST"}


def test_an_inference_goes_to_the_router_with_its_body_unread() -> None:
    decision = routes().answer(request("POST", "/v2/models/mlp/infer", b"{raw}", inference_header_content_length="3",
                                       timeout="1.5"), "r-1")
    assert isinstance(decision, Forward) and decision.api == KSERVE
    header = protocol.decode_header(decision.frames[1])
    assert header["http"]["head"] == 3 and header["deadline_ms"] == 1500.0 and decision.frames[2] == b"{raw}"
    assert read_route(decision.frames[0]).deadline == 1.5
    embeddings = routes(several=True).answer(request("POST", "/v1/embeddings", b'{"input": "hi", "model": "embed"}'), "r-1")
    assert isinstance(embeddings, Forward) and embeddings.api == OPENAI and embeddings.model == "embed"
    assert read_route(embeddings.frames[0]).text_lengths() == (2,) and embeddings.frames[2] == b"hi"


@pytest.mark.parametrize("headers, words", [
    ({"inference_header_content_length": "²"}, "is not a size"),
    ({"inference_header_content_length": "9" * 4000}, "is not a size"),
    ({"inference_header_content_length": "-1"}, "is not a size"),
    ({"timeout": "1e306"}, "Timeout header"),
    ({"timeout": "nan"}, "Timeout header"),
    ({"timeout": "inf"}, "Timeout header"),
    ({"timeout": "soon"}, "Timeout header"),
    ({"timeout": "1_0"}, "Timeout header"),
])
def test_header_values_that_overflow_are_a_json_400(headers, words) -> None:
    status, body = answered(routes().answer(request("POST", "/v2/models/mlp/infer", b"{}", **headers), "r-1"))
    assert status == 400 and words in body["error"]


def test_a_token_guards_all_but_the_probes_and_refuses_any_other_credential() -> None:
    guarded = routes(b"s3cret")
    for credential in ("Bearer s3creT", "Bearer s3cr\u00e9t", "Basic s3cret", "Bearer", ""):
        decision = guarded.answer(request("GET", "/v2/models/mlp", authorization=credential), "r-1")
        assert isinstance(decision, Reply) and decision.status == 401, credential
        assert decision.headers == {"WWW-Authenticate": "Bearer"}
    assert isinstance(guarded.answer(request("GET", "/v2/models/mlp", authorization="Bearer s3cret"), "r-1"), Reply)
    assert guarded.answer(request("GET", "/healthz"), "r-1").status == 200  # type: ignore[union-attr]


def test_heads_that_cannot_carry_a_body_are_refused_before_it_is_read() -> None:
    with pytest.raises(Refusal) as no_length:
        routes().admit(request("POST", "/v2/models/mlp/infer"))
    assert no_length.value.status == 411
    with pytest.raises(Refusal) as gzip:
        routes().admit(request("POST", "/v1/embeddings", content_length="3", content_encoding="gzip"))
    assert gzip.value.status == 415
    routes().admit(request("GET", "/v2/models/mlp"))


@pytest.mark.parametrize("code, status, openai_type", [
    (ErrorCode.BAD_REQUEST, 400, "invalid_request_error"), (ErrorCode.MODEL_NOT_FOUND, 404, "invalid_request_error"),
    (ErrorCode.OVERLOADED, 429, "invalid_request_error"), (ErrorCode.SHUTTING_DOWN, 503, "server_error"),
    (ErrorCode.DEADLINE_EXCEEDED, 504, "server_error"), (ErrorCode.WORKER_FAILED, 500, "server_error"),
])
def test_every_error_code_has_its_status_on_both_apis(code, status, openai_type) -> None:
    frames = protocol.encode_error(1, code, "why")
    kserve = routes().answer_forwarded(Forward([], KSERVE, "mlp", "infer", "r-1"), frames)
    openai = routes().answer_forwarded(Forward([], OPENAI, "mlp", "embeddings", "r-1", OPENAI), frames)
    assert kserve.status == openai.status == status
    assert json.loads(openai.body)["error"]["type"] == openai_type
    assert ("why" in json.loads(kserve.body)["error"]) and kserve.close == (code == ErrorCode.SHUTTING_DOWN)
    assert ("Retry-After" in kserve.headers) == (status in (429, 503))


def test_a_malformed_reply_is_a_500_not_a_crash() -> None:
    reply = routes().answer_forwarded(Forward([], KSERVE, "mlp", "infer", "r-1"), [b"not json"])
    assert reply.status == 500 and "malformed reply" in json.loads(reply.body)["error"]


def test_each_model_has_its_routes_and_the_server_lists_them_all() -> None:
    several = routes(several=True)
    assert answered(several.answer(request("GET", "/v2/models/embed"), "r-1"))[1]["platform"] == "workerpool_bert"
    ready = several.answer(request("GET", "/v2/models/mlp/ready"), "r-1")
    unready = several.answer(request("GET", "/v2/models/embed/ready"), "r-1")
    assert isinstance(ready, Reply) and isinstance(unready, Reply)
    assert (ready.status, unready.status, unready.body) == (200, 503, b"no worker is ready yet\n")
    status, index = answered(several.answer(request("POST", "/v2/repository/index"), "r-1"))
    assert status == 200 and index == [{"name": "mlp", "version": "2", "state": "READY", "reason": ""},
                     {"name": "embed", "version": "1", "state": "UNAVAILABLE", "reason": "no worker is ready yet"}]
    listed = answered(several.answer(request("GET", "/v1/models"), "r-1"))[1]["data"]
    assert [model["id"] for model in listed] == ["mlp", "embed"]
    forward = several.answer(request("POST", "/v2/models/embed/infer", b"{}"), "r-1")
    assert isinstance(forward, Forward) and read_route(forward.frames[0]).model == b"embed"
    unknown = several.answer(request("POST", "/v2/models/nope/infer", b"{}"), "r-1")
    assert isinstance(unknown, Reply) and unknown.status == 404 and unknown.refused == ("", "model_not_found", "infer")
    metadata = several.answer(request("GET", "/v2/models/nope"), "r-1")
    assert isinstance(metadata, Reply) and metadata.status == 404 and metadata.refused is None  # no inference


@pytest.mark.parametrize("body, status, words, counted", [
    (b'{"input": "hi"}', 404, "name a model: this server serves 'mlp', 'embed'", ("", "model_not_found", "embeddings")),
    (b'{"input": "hi", "model": "gpt-4"}', 404, "the model 'gpt-4' does not exist here", ("", "model_not_found", "embeddings")),
    (b'{"input": "hi", "model": 5}', 400, "'model' must be a string", ("", "bad_request", "embeddings")),
    (b'{"input": "hi", "model": "mlp"}', 400, "takes no texts", ("mlp", "bad_request", "embeddings")),
    (b'{"input": 7, "model": "embed"}', 400, "'input' must be a string", ("embed", "bad_request", "embeddings")),
    (b'[]', 400, "JSON object", ("", "bad_request", "embeddings")),
])
def test_an_openai_request_names_a_model_that_takes_texts(body, status, words, counted) -> None:
    """What the front door refuses itself is counted as the router counts its answers."""
    decision = routes(several=True).answer(request("POST", "/v1/embeddings", body), "r-1")
    assert isinstance(decision, Reply) and decision.status == status
    assert words in json.loads(decision.body)["error"]["message"]
    assert decision.refused == counted


def test_an_openai_request_to_the_one_model_served_may_leave_its_name_out() -> None:
    one = Routes(lambda: {"embed": ModelState(TEXTS, "bert", 1)}, lambda model: None,
                 lambda path: (200, "text/plain", b""), token=None)
    decision = one.answer(request("POST", "/v1/embeddings", b'{"input": ["a", "b"]}'), "r-1")
    assert isinstance(decision, Forward) and decision.model == "embed"
