"""The front door's own connection layer, attacked by raw sockets: framing that smuggles,
pipelining, clients that never read or reset mid-way, bodies large enough to stall a server
that parsed them itself. Each is refused or served, nothing is lost, and nothing one client
does holds up another. And HTTP requests batch as ZeroMQ ones do.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import signal
import socket
import struct
import subprocess
import threading

import numpy as np
import pytest
from support import onnx_graphs
from support.server import Server
from support.sockets import free_port

import workerpool

pytestmark = pytest.mark.process
WIDTH = 256  # the small_model's input
SMUGGLED = b"GET /v2/models/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


def http_server(model, *args: str, workers: int = 2) -> tuple[Server, tuple[str, int]]:
    port = free_port()
    return Server(model, "--http", f"127.0.0.1:{port}", *args, workers=workers), ("127.0.0.1", port)


@pytest.fixture(scope="module")
def mlp(small_model):
    server, address = http_server(small_model, "--model-name", "mlp", "--http-timeout", "2",
                                  "--max-message-size", "64MiB")
    with server:
        yield server, address


def infer_body(x: np.ndarray, request_id: str = "") -> bytes:
    return json.dumps({"id": request_id, "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                                     "data": x.ravel().tolist()}]}).encode()


def post(body: bytes, path: bytes = b"/v2/models/mlp/infer", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (path, len(body), extra, body)


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` whole responses, in the order they arrive (fewer if the server closes)."""
    buffer, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in buffer:
            part = sock.recv(65536)
            if not part:
                return answers
            buffer += part
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(buffer) < length:
            part = sock.recv(65536)
            if not part:
                return answers
            buffer += part
        answers.append((int(lines[0].split()[1]), headers, buffer[:length]))
        buffer = buffer[length:]
    return answers


def exchange(address, data: bytes, timeout: float = 30.0) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``data`` on a new connection; its first response."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(data)
        return read_responses(sock, 1)


def closed_after(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("attack, status", [
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\n{}{}", 400),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 0x4\r\n\r\n{}{}", 400),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
    (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n", 400),
    (b"GET /v2 HTTP/1.1\nHost: x\n\n", 400),
    (b"GET http://elsewhere/v2 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /v2\x00 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /v2\r\n\r\n", 505),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
])
def test_framing_attacks_get_one_json_answer_and_a_closed_connection(mlp, attack, status):
    server, address = mlp
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(attack + SMUGGLED)
        answers = read_responses(sock, 2)
        assert [a[0] for a in answers] == [status], answers
        assert json.loads(answers[0][2])["error"] and answers[0][1]["connection"] == "close"
        assert closed_after(sock)
    assert "Traceback" not in server.log()


def test_a_hundred_pipelined_requests_in_one_write_are_answered_in_order(mlp):
    _, address = mlp
    rng = np.random.default_rng(3)
    rows = [rng.random((1, WIDTH), dtype=np.float32) for _ in range(100)]
    data = b"".join(post(infer_body(x, str(i))) for i, x in enumerate(rows))
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(data + b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        answers = read_responses(sock, 101)
    assert [a[0] for a in answers] == [200] * 101
    assert [json.loads(a[2])["id"] for a in answers[:100]] == [str(i) for i in range(100)]
    assert answers[100][1]["connection"] == "close"  # HTTP/1.0: served, then closed


def test_bad_values_are_json_400s_not_500s(mlp):
    _, address = mlp
    good = infer_body(np.ones((1, WIDTH), np.float32))
    cases = [
        post(good, extra="Inference-Header-Content-Length: ²\r\n".encode()),
        post(good, extra=b"Inference-Header-Content-Length: " + b"9" * 4000 + b"\r\n"),
        post(good, extra=b"Timeout: 1e306\r\n"),
        post(json.dumps({"inputs": [{"name": "input", "shape": [1, WIDTH], "datatype": "FP32",
                                     "data": [0.5] * WIDTH}], "parameters": {"timeout": int("9" * 400)}}).encode()),
        post(json.dumps({"inputs": [{"name": "input", "shape": [2**40, 2**40, 0], "datatype": "FP32",
                                     "data": []}]}).encode()),
    ]
    for case in cases:
        answers = exchange(address, case)
        assert answers[0][0] == 400 and json.loads(answers[0][2])["error"], (case[:120], answers)


def test_inferences_refused_at_the_door_are_counted_read_as_well_as_answered(small_model):
    """The shutdown line accounts for every request: one the front door refuses itself (a body
    it cannot read, a model not served, texts to a model of arrays) was read as well as answered."""
    server, address = http_server(small_model, "--model-name", "mlp", workers=1)
    with server:
        cases = [post(b"not json"), post(b"{}", b"/v2/models/nosuch/infer"),
                 post(b'{"input": "x", "model": "mlp"}', b"/v1/embeddings"),
                 post(infer_body(np.ones((1, WIDTH), np.float32)))]
        assert [exchange(address, case)[0][0] for case in cases] == [400, 404, 400, 200]
        server.signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
    assert "4 requests read, 4 answered" in server.log(), server.log()


def test_a_bearer_credential_of_any_bytes_is_refused_cleanly(small_model, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server, address = http_server(small_model, "--model-name", "mlp", "--http-token-file", str(token), workers=1)
    with server:
        for credential in ("Bearer s3cr\u00e9t".encode(), b"Bearer \xff\xfe", "Bearer s3cret€".encode()):
            answers = exchange(address, b"GET /v2/models/mlp HTTP/1.1\r\nAuthorization: " + credential + b"\r\n\r\n")
            assert answers[0][0] == 401 and json.loads(answers[0][2])["error"]
        assert exchange(address, b"GET /v2/models/mlp HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n")[0][0] == 200


def test_expect_100_continue_is_answered_before_the_body_is_sent(mlp):
    _, address = mlp
    body = infer_body(np.ones((1, WIDTH), np.float32))
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert read_responses(sock, 1)[0][0] == 200


def test_a_client_that_never_reads_holds_bounded_buffers_and_others_are_served(mlp):
    server, address = mlp
    x = np.ones((64, WIDTH), np.float32)  # each answer some 30 KB of JSON
    request = post(infer_body(x))
    stuck = socket.create_connection(address)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        stuck.setblocking(False)
        sent = 0
        try:
            for _ in range(2000):  # until the server stops reading it
                sent += stuck.send(request)
        except BlockingIOError:
            pass
        assert sent < 2000 * len(request)  # the server stopped reading: it buffers no more
        with workerpool.Client(server.endpoint) as client:
            assert client.infer(np.ones((1, WIDTH), np.float32)).shape == (1, 10)
        assert exchange(address, post(infer_body(np.ones((1, WIDTH), np.float32))))[0][0] == 200
    finally:
        stuck.close()  # with its answers unread: its connection is reset under the server's writes
    assert exchange(address, post(infer_body(np.ones((1, WIDTH), np.float32))))[0][0] == 200
    assert "Traceback" not in server.log()


def test_a_partial_head_behind_an_answered_request_is_closed_after_the_timeout(mlp):
    _, address = mlp
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(post(infer_body(np.ones((1, WIDTH), np.float32))) + b"POST /v2/models/mlp/infer HTTP/1.1\r\nX-Sl")
        assert read_responses(sock, 1)[0][0] == 200
        assert closed_after(sock)  # within --http-timeout (2 s) of the answer, not never


def abort(sock: socket.socket) -> None:
    """Close with a reset (RST), as a crashed client's kernel would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_resets_mid_body_and_mid_reply_lose_nothing_for_others(mlp):
    server, address = mlp
    body = infer_body(np.ones((256, WIDTH), np.float32))
    for _ in range(5):
        mid_body = socket.create_connection(address)
        mid_body.sendall(post(body)[:len(body) // 2])
        abort(mid_body)
        mid_reply = socket.create_connection(address)
        mid_reply.sendall(post(body))
        abort(mid_reply)
    assert exchange(address, post(infer_body(np.ones((1, WIDTH), np.float32))))[0][0] == 200
    status = server.status(memory=False)
    assert all(w["state"] != "lost" for w in status["workers"]) and status["queue"]["depth"] == 0
    assert "Traceback" not in server.log()


def test_a_huge_json_body_stalls_no_other_client(mlp):
    """50 MB of JSON is decoded by the worker that runs it; the other worker, and the
    supervisor's loop, serve everyone else meanwhile."""
    server, address = mlp
    big = json.dumps({"inputs": [{"name": "input", "shape": [12_000, WIDTH], "datatype": "FP32",
                                  "data": [0.123456] * (12_000 * WIDTH)}]}).encode()
    assert len(big) > 30_000_000
    order: list[str] = []

    def send_big() -> None:
        order.append(f"big:{exchange(address, post(big), timeout=120)[0][0]}")

    sender = threading.Thread(target=send_big)
    sender.start()
    server.wait_for(lambda s: s["queue"]["in_flight"] == 1, timeout=60)
    small = post(infer_body(np.ones((1, WIDTH), np.float32)))
    with workerpool.Client(server.endpoint) as client:
        for _ in range(3):
            assert exchange(address, small)[0][0] == 200
            client.infer(np.ones((1, WIDTH), np.float32))
            order.append("small")
    sender.join(120)
    assert order[:3] == ["small"] * 3 and order[3] == "big:200", order


def test_one_row_http_requests_to_a_single_input_onnx_model_are_batched(tmp_path):
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp())
    server, address = http_server(path, "--model-name", "net", "--batch-wait", "300", "--max-batch", "16",
                                  workers=1)
    rows = np.random.default_rng(5).random((8, 16), dtype=np.float32)
    with server:
        sockets = [socket.create_connection(address, timeout=30) for _ in rows]
        try:
            for sock, x in zip(sockets, rows):
                sock.sendall(post(json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                                          "data": x.tolist()}]}).encode(), b"/v2/models/net/infer"))
            answers = [read_responses(sock, 1)[0] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        with workerpool.Client(server.endpoint) as client:
            alone = [client.infer({"x": x[None]}) for x in rows]
        sizes = server.status(memory=False)["workers"][0]["batch_sizes"]
    assert [a[0] for a in answers] == [200] * 8, answers
    assert max(map(int, sizes)) >= 4, sizes  # they shared passes
    for answer, expected in zip(answers, alone):
        output = json.loads(answer[2])["outputs"][0]
        np.testing.assert_allclose(np.array(output["data"], np.float32).reshape(output["shape"]),
                                   expected["y"] if isinstance(expected, dict) else expected, rtol=1e-5, atol=1e-5)


def test_a_flood_of_cheap_pipelined_requests_never_read_holds_up_no_one(mlp):
    """Requests that cost no body (no reservation) and no worker, a megabyte of them in one
    write whose answers are never read: the connection is answered a few at a time and then no
    longer read; the workers keep their heartbeats and others are served."""
    server, address = mlp
    workers = {w["pid"] for w in server.status(memory=False)["workers"]}
    flood = socket.create_connection(address)
    try:
        flood.setblocking(False)
        data = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" * 20_000
        with contextlib.suppress(BlockingIOError):
            flood.sendall(data)
        for _ in range(5):
            assert exchange(address, post(infer_body(np.ones((1, WIDTH), np.float32))), timeout=10)[0][0] == 200
        assert {w["pid"] for w in server.status(memory=False)["workers"]} == workers
    finally:
        flood.close()


def test_requests_without_a_body_reserve_nothing(mlp):
    _, address = mlp
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3000)
        assert [a[0] for a in read_responses(sock, 3000)] == [200] * 3000


def test_the_token_is_asked_for_before_a_body_is_taken_and_trailers_carry_none(small_model, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    server, address = http_server(small_model, "--model-name", "mlp", "--http-token-file", str(token), workers=1)
    body = infer_body(np.ones((1, WIDTH), np.float32))
    with server:
        with socket.create_connection(address, timeout=30) as sock:
            sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nExpect: 100-continue\r\n"
                         b"Content-Length: 800000\r\n\r\n")
            answer = read_responses(sock, 1)[0]  # no "100 Continue": the 401 at once
            assert answer[0] == 401 and answer[1]["connection"] == "close"
        chunked = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n"
                   b"0\r\nAuthorization: Bearer s3cret\r\n\r\n" % (len(body), body))
        assert exchange(address, chunked)[0][0] == 401


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_asking_for_http2_over_cleartext_is_served_its_post_in_http_1_1(mlp):
    _, address = mlp
    done = subprocess.run(["curl", "-s", "--http2", "-H", "Content-Type: application/json", "--data-binary",
                           infer_body(np.ones((1, WIDTH), np.float32)).decode(),
                           f"http://{address[0]}:{address[1]}/v2/models/mlp/infer"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert json.loads(done.stdout)["outputs"][0]["shape"] == [1, 10], done


def test_an_early_refusal_is_read_by_the_client_not_lost_to_a_reset(small_model):
    server, address = http_server(small_model, "--model-name", "mlp", "--max-message-size", "1MiB", workers=1)
    with server:
        conn = http.client.HTTPConnection(*address, timeout=30)
        conn.request("POST", "/v2/models/mlp/infer", b"x" * 20_000_000)
        assert conn.getresponse().status == 413
        conn.close()


def test_sigterm_under_keep_alive_load_answers_every_request_it_read(small_model):
    server, address = http_server(small_model, "--model-name", "mlp", workers=2)
    body = infer_body(np.ones((1, WIDTH), np.float32))
    outcomes: list[str] = []
    with server:
        def drive() -> None:
            conn = http.client.HTTPConnection(*address, timeout=30)
            try:
                send_until_stopped(conn)
            finally:
                conn.close()  # whichever connection it ends on: nothing left to the collector

        def send_until_stopped(conn: http.client.HTTPConnection) -> None:
            fresh = True  # a connection that carried no request yet
            while True:
                try:
                    conn.request("POST", "/v2/models/mlp/infer", body)
                except ConnectionRefusedError:  # the server is gone: this request was never sent
                    return
                except ConnectionResetError:  # the listener closed with it still in its backlog
                    if fresh:  # so no request on it was read
                        return
                    outcomes.append("send: reset on a kept-alive connection")
                    return
                except OSError as exc:
                    outcomes.append(f"send: {exc!r}")
                    return
                fresh = False
                try:
                    reply = conn.getresponse()
                    reply.read()
                except (OSError, http.client.HTTPException) as exc:
                    outcomes.append(f"sent, no answer: {exc!r}")
                    return
                outcomes.append(str(reply.status))
                if reply.getheader("Connection") == "close":
                    conn.close()  # http.client opens a new socket for the next request
                    fresh = True

        drivers = [threading.Thread(target=drive) for _ in range(16)]
        for driver in drivers:
            driver.start()
        server.wait_for(lambda s: len(outcomes) >= 200)
        server.signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0, server.log()
        for driver in drivers:
            driver.join(30)
    lost = [o for o in outcomes if o not in ("200", "503")]
    assert not lost, lost[:5]
