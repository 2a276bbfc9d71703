"""The HTTP front door (``serve --http``): KServe v2 and OpenAI embeddings, by their own clients
(``tritonclient.http``, the ``openai`` SDK), every error status by raw sockets where a client
library would refuse to send the request, and the pool serving correctly afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import http.client
import json
import shutil
import signal
import socket
import ssl
import subprocess
import threading

import aiohttp
import numpy as np
import pytest
from support.bert import tiny_bert, tiny_tokenizer
from support.keys import CurveKeys
from support.models import SLOW, build_local
from support.processes import slow_request
from support.server import Server
from support.sockets import free_port

import workerpool
from workerpool import models
from workerpool.weights.publish import publish

tritonclient_http = pytest.importorskip("tritonclient.http", reason="needs tritonclient[http]")
openai = pytest.importorskip("openai", reason="needs the openai SDK")

pytestmark = pytest.mark.process
TEXTS = ["hello world", "a text", "hello", ""]
CLIENT_TIMEOUT = 2.0  # --http-timeout of the shared servers
WIDTH = 256  # the small_model's input


def http_server(model, *args: str, workers: int = 2) -> tuple[Server, str]:
    port = free_port()
    return Server(model, "--http", f"127.0.0.1:{port}", *args, workers=workers), f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def mlp(small_model):
    server, address = http_server(small_model, "--model-name", "mlp", "--http-timeout", str(CLIENT_TIMEOUT))
    with server:
        yield server, address


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    path = tiny_bert(tmp_path_factory.mktemp("bert") / "tiny.bpk", tokenizer=tiny_tokenizer())
    server, address = http_server(path, "--model-name", "minibert", workers=1)
    with server:
        yield server, address


def call(address: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None, *, tls: ssl.SSLContext | None = None,
         ) -> tuple[int, dict[str, str], bytes]:
    host, port = address.split(":")
    conn = (http.client.HTTPConnection(host, int(port), timeout=30) if tls is None else
            http.client.HTTPSConnection(host, int(port), timeout=30, context=tls))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read()
    finally:
        conn.close()


def raw(address: str, data: bytes, *, timeout: float = 30.0) -> bytes:
    """Send ``data`` as it is and read until the server closes or has answered one response."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received or len(received) < _expected(received):
            part = sock.recv(65536)
            if not part:
                break
            received += part
        return received


def _expected(received: bytes) -> int:
    head, _, _ = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(received)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def binary_body(x: np.ndarray, name: str = "input", **change) -> tuple[bytes, str]:
    head = {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}], **change}
    encoded = json.dumps(head).encode()
    return encoded + x.tobytes(), str(len(encoded))


def test_tritonclient_health_metadata_and_infer_give_the_zeromq_clients_answers(mlp):
    server, address = mlp
    client = tritonclient_http.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("mlp")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    metadata = client.get_model_metadata("mlp")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, WIDTH]}]
    assert metadata["versions"] == ["1"] and client.get_model_metadata("mlp", "1") == metadata
    x = np.random.default_rng(0).random((3, WIDTH), dtype=np.float32)
    with workerpool.Client(server.endpoint) as zmq_client:
        expected = zmq_client.infer(x)
    for binary in (True, False):
        tensor = tritonclient_http.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        output = tritonclient_http.InferRequestedOutput("output", binary_data=binary)
        result = client.infer("mlp", [tensor], outputs=[output], request_id=f"r-{binary}")
        np.testing.assert_array_equal(result.as_numpy("output"), expected)
        assert result.get_response()["id"] == f"r-{binary}"
        assert result.get_response()["model_version"] == "1"


def test_texts_by_kserve_bytes_and_openai_embeddings_give_the_zeromq_clients_answers(texts):
    server, address = texts
    with workerpool.Client(server.endpoint) as zmq_client:
        expected = zmq_client.infer(TEXTS)
    client = tritonclient_http.InferenceServerClient(address)
    metadata = client.get_model_metadata("minibert")
    assert metadata["inputs"][0] == {"name": "input", "datatype": "BYTES", "shape": [-1]}
    for binary in (True, False):
        tensor = tritonclient_http.InferInput("input", [len(TEXTS)], "BYTES")
        tensor.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=binary)
        result = client.infer("minibert", [tensor])
        np.testing.assert_array_equal(result.as_numpy("embedding"), expected["embedding"])
    sdk = openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused", max_retries=0)
    floats = sdk.embeddings.create(model="minibert", input=TEXTS, encoding_format="float")
    np.testing.assert_allclose(np.array([d.embedding for d in floats.data]), expected["embedding"], rtol=1e-6)
    assert floats.usage.prompt_tokens == int(expected["tokens"].sum()) > 0
    encoded = call(address, "POST", "/v1/embeddings",
                   json.dumps({"model": "minibert", "input": TEXTS, "encoding_format": "base64"}).encode(),
                   {"Content-Type": "application/json"})
    assert encoded[0] == 200
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in json.loads(encoded[2])["data"]]
    np.testing.assert_array_equal(np.stack(rows), expected["embedding"])
    one = sdk.embeddings.create(model="minibert", input="hello world")
    assert len(one.data) == 1
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        sdk.embeddings.create(model="gpt-5", input="hello")
    with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length=False"):
        sdk.embeddings.create(model="minibert", input=[[1, 2, 3]])
    with pytest.raises(openai.BadRequestError, match="1 to 1024 texts"):
        sdk.embeddings.create(model="minibert", input=["hello"] * 1025)
    with pytest.raises(openai.BadRequestError, match="longer than the model's limit of 12 tokens"):
        sdk.embeddings.create(model="minibert", input=["hello " * 20_000])  # past the door: no header limit
    with pytest.raises(openai.BadRequestError, match="more than the 8"):
        sdk.embeddings.create(model="minibert", input="hello", dimensions=9)
    cut = np.array([d.embedding for d in sdk.embeddings.create(model="minibert", input=TEXTS[:3], dimensions=3).data])
    first = expected["embedding"][:3, :3]
    np.testing.assert_allclose(cut, first / np.linalg.norm(first, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    alone = sdk.embeddings.create(model="minibert", input="").data[0].embedding
    sdk.close()  # its connection: a socket left to the collector warns in whichever test it runs
    assert alone == [0.0] * len(alone) == floats.data[3].embedding  # "": the same alone or in company
    flat = json.dumps({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "BYTES",
                                   "data": ["a", "b"]}]}).encode()
    assert call(address, "POST", "/v2/models/minibert/infer", flat)[0] == 400


def test_every_malformed_request_gets_its_status_and_the_pool_serves_on(mlp):
    server, address = mlp
    x = np.ones((2, WIDTH), np.float32)
    good, length = binary_body(x)
    json_headers = {"Content-Type": "application/json"}
    cases = [
        (("GET", "/v2/models/nope"), 404, "no model named 'nope'"),
        (("GET", "/v2/models/mlp/versions/7"), 404, "serves version 1"),
        (("GET", "/nowhere"), 404, "no route"),
        (("GET", "/v2/models/mlp/infer"), 405, "takes POST"),
        (("POST", "/v2/models/mlp/infer", b"{not json", json_headers), 400, "not valid JSON"),
        (("POST", "/v2/models/mlp/infer", *binary_body(x, name="x")[:1],
          {"Inference-Header-Content-Length": binary_body(x, name="x")[1]}), 400, "has no input 'x'"),
        (("POST", "/v2/models/mlp/infer", json.dumps({"inputs": [{"name": "input", "shape": [2, WIDTH],
          "datatype": "FP64", "data": [0.0] * 2 * WIDTH}]}).encode(), json_headers), 400, "takes FP32, not FP64"),
        (("POST", "/v2/models/mlp/infer", json.dumps({"inputs": [{"name": "input", "shape": [2, 7],
          "datatype": "FP32", "data": [0.0] * 14}]}).encode(), json_headers), 400, "got float32 [2, 7]"),
        (("POST", "/v2/models/mlp/infer", json.dumps({"inputs": [{"name": "input", "shape": [2, WIDTH],
          "datatype": "FP32", "data": [0.0] * 3}]}).encode(), json_headers), 400, "'data' has 3"),
        (("POST", "/v2/models/mlp/infer", good[:-10], {"Inference-Header-Content-Length": length}),
         400, "not a size within"),
        (("POST", "/v2/models/mlp/infer", good, {"Inference-Header-Content-Length": str(len(good) + 1)}),
         400, "past the body"),
        (("POST", "/v2/models/mlp/infer", good + b"extra", {"Inference-Header-Content-Length": length}),
         400, "5 bytes of binary data follow"),
        (("POST", "/v2/models/mlp/infer", good, {"Inference-Header-Content-Length": length, "Timeout": "soon"}),
         400, "Timeout header"),
        (("POST", "/v2/models/mlp/infer", gzip.compress(good), {"Content-Encoding": "gzip"}), 415, "gzip"),
        (("POST", "/v2/models/mlp/infer", (b'{"inputs": [{"name": "input", "shape": [1, 1], "datatype": "FP32", '
          b'"data": [NaN]}]}'), json_headers), 400, "NaN is not JSON"),
        (("POST", "/v2/models/mlp/infer", json.dumps({"inputs": [{"name": "input", "shape": [1, WIDTH],
          "datatype": "FP32", "data": [None] * WIDTH}]}).encode(), json_headers), 400, "hold null"),
    ]
    for request, status, message in cases:
        answer = call(address, *request)
        assert (answer[0], message in answer[2].decode()) == (status, True), (request[:2], answer)
        assert json.loads(answer[2])["error"]
    post = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n"
    no_length = raw(address, post + b"Content-Type: application/json\r\n\r\n")
    assert status_of(no_length) == 411
    huge = raw(address, post + b"Content-Length: 314572800\r\n\r\n")  # 300 MiB announced, none sent
    assert status_of(huge) == 413 and b"over the" in huge
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (good[:100], good[100:])) + b"0\r\n\r\n"
    chunked = raw(address, post + b"Transfer-Encoding: chunked\r\nInference-Header-Content-Length: "
                  + length.encode() + b"\r\n\r\n" + chunks)
    assert status_of(chunked) == 200 and b'"outputs"' in chunked
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
    assert status_of(raw(address, b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")) == 400
    assert status_of(raw(address, b"GARBAGE\x00\x01\r\n\r\n")) == 400
    host, port = address.split(":")
    with socket.create_connection((host, int(port))) as gone:  # leaves mid-body
        gone.sendall(post + b"Content-Length: 100\r\n\r\nabc")
    answer = call(address, "POST", "/v2/models/mlp/infer", good, {"Inference-Header-Content-Length": length})
    assert answer[0] == 200
    assert all(w["state"] != "lost" for w in server.status(memory=False)["workers"])
    assert "Traceback" not in server.log()  # a client's garbage is no error of the server's


def test_many_connections_at_once_are_all_answered(mlp):
    """Requests handed to the router from the front door's thread while the router answers
    others: none is left waiting (a lost wake-up once stranded them all)."""
    _, address = mlp
    body, length = binary_body(np.ones((1, WIDTH), np.float32))

    async def drive() -> list[int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64),
                                         timeout=aiohttp.ClientTimeout(total=30)) as session:
            async def one() -> int:
                async with session.post(f"http://{address}/v2/models/mlp/infer", data=body,
                                        headers={"Inference-Header-Content-Length": length}) as reply:
                    await reply.read()
                    return reply.status
            return await asyncio.gather(*(one() for _ in range(2000)))

    assert asyncio.run(drive()) == [200] * 2000


def test_a_slowloris_holds_no_worker_and_is_closed(mlp):
    _, address = mlp
    host, port = address.split(":")
    slow = [socket.create_connection((host, int(port))) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        x = np.ones((1, WIDTH), np.float32)
        body, length = binary_body(x)
        assert call(address, "POST", "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": length})[0] == 200
        for sock in slow:
            sock.settimeout(CLIENT_TIMEOUT + 10)
            assert sock.recv(100) == b""  # closed by the server, with nothing sent
    finally:
        for sock in slow:
            sock.close()


def test_queue_limits_deadlines_and_draining_answer_429_504_and_503(small_model):
    server, address = http_server(small_model, "--model-name", "mlp", *SLOW, "--max-queue", "1", "--graceful-timeout", "20", workers=1)
    with server:
        assert call(address, "GET", "/v2/models/mlp")[0] == 200  # the gateway is up and knows the model
        held = slow_request(server.endpoint, 3.0)
        server.wait_for(lambda s: s["queue"]["in_flight"] == 1)
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32",
                                       "data": [1.0, 2.0]}]}).encode()
        late = call(address, "POST", "/v2/models/mlp/infer", body, {"Timeout": "0.2"})
        assert late[0] == 504 and b"deadline_exceeded" in late[2]
        queued = slow_request(server.endpoint, 0.1)
        server.wait_for(lambda s: s["queue"]["depth"] == 1)
        full = call(address, "POST", "/v2/models/mlp/infer", body)
        assert full[0] == 429 and full[1]["Retry-After"] == "1" and b"overloaded" in full[2]
        server.signal(signal.SIGTERM)
        server.wait_for(lambda s: s["draining"], timeout=10)
        drained = call(address, "POST", "/v2/models/mlp/infer", body)
        assert drained[0] == 503 and b"shutting_down" in drained[2] and drained[1]["Retry-After"] == "1"
        assert drained[1]["Connection"] == "close"  # a keep-alive client sends nothing more there
        assert call(address, "GET", "/v2/health/ready")[0] == 503
        assert held.join(10).outputs[0, 0] == -6.0 and queued.join(10).outputs[0, 0] == -0.2
        assert server.proc.wait(20) == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_with_a_token_guards_every_route_but_the_probes_with_curve_on_the_zeromq_side(small_model,
                                                                                            tmp_path):
    token, cert, key = tmp_path / "token", tmp_path / "cert.pem", tmp_path / "key.pem"
    token.write_text("s3cret-token\n")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    keys = CurveKeys(tmp_path / "keys")
    keys.client("someone")  # ZeroMQ clients need a key; the HTTP front door does not
    server, address = http_server(small_model, "--model-name", "mlp", "--http-token-file", str(token),
                                  "--http-cert", str(cert), "--http-key", str(key), *keys.serve_args(),
                                  workers=1)
    trusted = ssl.create_default_context(cafile=str(cert))
    with server:
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, WIDTH], "datatype": "FP32",
                                       "data": [0.5] * WIDTH}]}).encode()
        assert call(address, "POST", "/v2/models/mlp/infer", body, tls=trusted)[0] == 401
        wrong = call(address, "POST", "/v2/models/mlp/infer", body, {"Authorization": "Bearer s3cret-tokeN"},
                     tls=trusted)
        assert wrong[0] == 401 and wrong[1]["WWW-Authenticate"] == "Bearer"
        assert call(address, "GET", "/v2/models/mlp", tls=trusted)[0] == 401
        assert call(address, "GET", "/v2/health/ready", tls=trusted)[0] == 200
        assert call(address, "GET", "/healthz", tls=trusted)[0] == 200
        allowed = call(address, "POST", "/v2/models/mlp/infer", body, {"Authorization": "Bearer s3cret-token"},
                       tls=trusted)
        assert allowed[0] == 200 and len(json.loads(allowed[2])["outputs"][0]["data"]) == 10
        with pytest.raises(ssl.SSLError):  # a certificate nobody vouched for is refused
            call(address, "GET", "/v2/health/ready", tls=ssl.create_default_context())
        assert raw(address, b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n") == b""  # plain HTTP: no answer, closed
        assert call(address, "GET", "/v2/health/live", tls=trusted)[0] == 200


def test_no_request_is_lost_or_wrong_across_a_reload_and_ttin_ttou(small_model, tmp_path):
    model, newer = tmp_path / "model.bpk", tmp_path / "newer.bpk"
    publish(small_model, str(model))
    models.generate_mlp(newer, 1024 * 1024, seed=2)
    x = np.random.default_rng(1).random((1, WIDTH), dtype=np.float32)
    expected = {"1": build_local(small_model)(x), "2": build_local(newer)(x)}
    body, length = binary_body(x, outputs=[{"name": "output", "parameters": {"binary_data": True}}])
    answers: list[tuple[int, str, np.ndarray | None]] = []
    stop = threading.Event()
    server, address = http_server(model, "--model-name", "mlp", "--watch-interval", "0.1", workers=1)

    def drive() -> None:
        host, port = address.split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        while not stop.is_set():
            try:
                conn.request("POST", "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": length})
                reply = conn.getresponse()
                data, head = reply.read(), reply.getheader("Inference-Header-Content-Length")
            except (ConnectionError, http.client.HTTPException) as exc:
                answers.append((0, repr(exc), None))
                break
            if reply.status != 200:
                answers.append((reply.status, data.decode(), None))
                continue
            version = json.loads(data[:int(head)])["model_version"]
            answers.append((200, version, np.frombuffer(data[int(head):], np.float32).reshape(1, -1)))
        conn.close()

    with server:
        drivers = [threading.Thread(target=drive) for _ in range(4)]
        for driver in drivers:
            driver.start()
        try:
            server.wait_for(lambda s: len(answers) >= 20)
            publish(newer, str(model))
            server.wait_for(lambda s: s["model"]["generation"] == 2 and
                            all(w["generation"] == 2 for w in s["workers"] if w["state"] == "ready"))
            server.signal(signal.SIGTTIN)
            server.wait_for(lambda s: sum(w["state"] == "ready" for w in s["workers"]) == 2)
            server.signal(signal.SIGTTOU)
            server.wait_for(lambda s: len(s["workers"]) == 1)
            after = len(answers) + 20
            server.wait_for(lambda s: len(answers) >= after)
        finally:
            stop.set()
            for driver in drivers:
                driver.join()
    failed = [a[:2] for a in answers if a[0] != 200]
    assert not failed, failed[:5]
    assert {a[1] for a in answers} == {"1", "2"}
    assert not np.allclose(expected["1"], expected["2"], atol=1e-3)
    for _, version, output in answers:  # batched with others, a row's sums may round otherwise
        np.testing.assert_allclose(output, expected[version], rtol=1e-5, atol=1e-5)
