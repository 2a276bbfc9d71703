"""The access log and request ids, read from a real server's stderr after real requests: HTTP
(urllib) and ZeroMQ (the client library), text and JSON, sampled and off; and what /metrics
counts of a model's texts and their tokens."""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from support.bert import tiny_bert, tiny_tokenizer
from support.server import Server
from support.sockets import free_port

import workerpool

LINE = re.compile(r"workerpool\.access: (?P<door>\w+) (?P<route>\S+(?: \S+)?) (?P<status>\S+) model=(?P<model>\S+) "
                  r"code=(?P<code>\S+) in=(?P<bytes_in>\d+) out=(?P<bytes_out>\d+) queue_ms=(?P<queue>\S+) "
                  r"run_ms=(?P<run>\S+) worker=(?P<worker>\S+) id=(?P<id>\S+)$")


def http_server(model: str, *args: str) -> Server:
    return Server(model, "--http", f"127.0.0.1:{free_port()}", *args, workers=2)


def post(url: str, body: dict | bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
    """POST ``body``: the status, the JSON document answered and the response's headers."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read()), dict(error.headers)


def inference(width: int, rows: int = 1) -> dict:
    return {"inputs": [{"name": "input", "shape": [rows, width], "datatype": "FP32", "data": [0.5] * (rows * width)}]}


def access_lines(log: str) -> list[dict[str, str]]:
    return [found.groupdict() for line in log.splitlines() if (found := LINE.search(line))]


def test_each_answer_gets_a_line_and_each_http_request_an_id_it_gets_back(small_model, local_model):
    width = local_model.input_shape[1]
    with http_server(small_model) as server, workerpool.Client(server.endpoint) as client:
        url = server.status(memory=False)["http"]
        infer = url + "/v2/models/small/infer"
        status, _, headers = post(infer, inference(width), {"X-Request-Id": "trace-1"})
        assert status == 200 and headers["X-Request-Id"] == "trace-1"
        status, wrong, headers = post(infer, inference(width + 1))
        made = headers["X-Request-Id"]
        assert status == 400 and wrong["request_id"] == made and made != "trace-1"
        status, unknown, headers = post(url + "/v1/embeddings", {"model": "nope", "input": "hi"},
                                        {"X-Request-Id": "no spaces please"})  # not an id: one is made
        assert status == 404 and unknown["request_id"] == headers["X-Request-Id"] != "no spaces please"
        assert "error" in unknown and unknown["error"]["code"] == "model_not_found"  # OpenAI's shape, kept
        client.infer(np.ones((1, width), np.float32))
        workers = {str(pid) for pid in server.worker_pids()}
    lines = access_lines(server.log())
    assert [(line["door"], line["route"], line["status"], line["code"]) for line in lines] == [
        ("http", "POST /v2/models/small/infer", "200", "ok"),
        ("http", "POST /v2/models/small/infer", "400", "bad_request"),
        ("http", "POST /v1/embeddings", "404", "model_not_found"),
        ("zmq", "infer", "200", "ok"),  # a ZeroMQ answer's status as HTTP would give it
    ]
    good, bad, refused, zmq = lines
    assert good["id"] == "trace-1" and bad["id"] == made and refused["id"] == unknown["request_id"]
    assert good["model"] == bad["model"] == zmq["model"] == "small" and refused["model"] == "-"
    for ran in (good, bad, zmq):  # each reached a worker, which is named, and was timed
        assert ran["worker"] in workers and float(ran["queue"]) >= 0 and float(ran["run"]) > 0
    assert refused["worker"] == refused["queue"] == refused["run"] == "-"  # refused at the door
    assert int(good["bytes_in"]) == len(json.dumps(inference(width))) and int(good["bytes_out"]) > 0
    assert int(zmq["bytes_in"]) >= 4 * width and zmq["id"] != "-"


def test_json_lines_sampled_to_errors_alone_and_no_lines_when_off(small_model, local_model):
    width = local_model.input_shape[1]
    with http_server(small_model, "--log-format", "json", "--access-log-sample", "0") as server:
        infer = server.status(memory=False)["http"] + "/v2/models/small/infer"
        for _ in range(3):
            assert post(infer, inference(width))[0] == 200
        status, wrong, _ = post(infer, inference(width + 1), {"X-Request-Id": "bad-one"})
        assert status == 400 and wrong["request_id"] == "bad-one"
        workers = server.worker_pids()
    objects = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    access = [entry for entry in objects if entry["logger"] == "workerpool.access"]
    assert len(access) == 1, access  # the error alone: successes are sampled at 0
    entry = access[0]
    assert {key: entry[key] for key in ("door", "route", "status", "code", "model", "request_id")} == {
        "door": "http", "route": "POST /v2/models/small/infer", "status": 400, "code": "bad_request",
        "model": "small", "request_id": "bad-one"}
    assert entry["worker"] in workers and entry["run_ms"] > 0 and entry["bytes_out"] > 0

    with http_server(small_model, "--no-access-log") as server:
        infer = server.status(memory=False)["http"] + "/v2/models/small/infer"
        assert post(infer, inference(width + 1))[0] == 400
        assert post(infer, inference(width))[0] == 200
    assert access_lines(server.log()) == [] and "workerpool.access" not in server.log()


def test_a_sample_keeps_one_success_in_every_n(small_model, local_model):
    width = local_model.input_shape[1]
    with http_server(small_model, "--access-log-sample", "0.25") as server, \
            workerpool.Client(server.endpoint) as client:
        for _ in range(12):
            client.infer(np.ones((1, width), np.float32))
    assert [line["code"] for line in access_lines(server.log())] == ["ok"] * 3


def test_metrics_count_a_models_texts_and_tokens_as_its_answers_report_them(tmp_path):
    path = tmp_path / "embed.bpk"
    tiny_bert(path, tokenizer=tiny_tokenizer())
    texts = ["hello world", "a longer sentence than the first one", "x"]
    with http_server(str(path)) as server, workerpool.Client(server.endpoint) as client:
        url = server.status(memory=False)["http"]
        status, answer, _ = post(url + "/v1/embeddings", {"input": texts})
        assert status == 200
        ran = client.infer(texts[:2])
        assert post(url + "/v1/embeddings", {"input": ["hi", "word " * 5000]})[0] == 400  # over the limit
        with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
            families = {family.name: family for family in text_string_to_metric_families(reply.read().decode())}
    def value(name: str, **labels: str) -> float:
        return next(sample.value for sample in families[name].samples if sample.labels == labels)
    assert value("workerpool_texts", model="embed") == 5  # what ran: the refused request's texts never did
    assert value("workerpool_input_tokens", model="embed") == answer["usage"]["prompt_tokens"] + ran["tokens"].sum()
    assert value("workerpool_tokenize_seconds", model="embed") > 0
    assert value("workerpool_requests", model="embed", route="embeddings", code="ok") == 1
    assert value("workerpool_requests", model="embed", route="zmq", code="ok") == 1


def raw_exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a connection of its own; what the server answered before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_refusals_before_a_request_is_read_keep_its_id_and_get_a_line(small_model, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret")
    port = free_port()
    with Server(small_model, "--http", f"127.0.0.1:{port}", "--http-token-file", str(token),
                "--max-connections", "1", "--http-timeout", "0.5", workers=1) as server:
        unauthorized = raw_exchange(port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Request-Id: client-401\r\n"
                                          b"Content-Length: 2\r\n\r\n{}")
        too_large = raw_exchange(port, b"POST /v2/models/small/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                       b"s3cret\r\nX-Request-Id: client-413\r\nContent-Length: 99999999999\r\n\r\n")
        stalled = raw_exchange(port, b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                                     b"X-Request-Id: client-408\r\nContent-Length: 100\r\n\r\n{\"in")  # then nothing
        with socket.create_connection(("127.0.0.1", port), timeout=10) as held:  # the one connection allowed
            held.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert held.recv(65536).startswith(b"HTTP/1.1 200")
            turned_away = raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert unauthorized.startswith(b"HTTP/1.1 401") and b"X-Request-Id: client-401\r\n" in unauthorized
    assert b'"request_id": "client-401"' in unauthorized
    assert too_large.startswith(b"HTTP/1.1 413") and b"X-Request-Id: client-413\r\n" in too_large
    assert stalled.startswith(b"HTTP/1.1 408") and b"X-Request-Id: client-408\r\n" in stalled
    assert json.loads(stalled.split(b"\r\n\r\n", 1)[1])["error"]["message"].startswith("the request body stopped")
    made = re.search(rb"X-Request-Id: (\S+)\r\n", turned_away).group(1).decode()
    assert turned_away.startswith(b"HTTP/1.1 503") and f'"request_id": "{made}"'.encode() in turned_away
    lines = {line["id"]: line for line in access_lines(server.log())}
    assert (lines["client-401"]["route"], lines["client-401"]["status"]) == ("POST /v1/embeddings", "401")
    assert (lines["client-413"]["route"], lines["client-413"]["status"]) == ("POST /v2/models/small/infer", "413")
    assert (lines["client-408"]["route"], lines["client-408"]["status"]) == ("POST /v1/embeddings", "408")
    assert (lines[made]["status"], lines[made]["code"]) == ("503", "overloaded")
