"""Attacks on the pool as a whole, each against a real server on loopback or ipc.

Peers that pose as others, a control endpoint anyone could reach, requests that never end,
drains with requests still arriving, idle connections and exhausted descriptors, and the
leftovers of a killed server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq
from support.commands import cli
from support.keys import CurveKeys
from support.processes import Background
from support.server import Host, Server, refused_at_start
from support.sockets import dealer, free_backend, free_port, monitored_dealer, next_event
from support.status import pool_ready

import workerpool
from workerpool.control import client as control
from workerpool.protocol import messages as protocol

SLOW = ("--model", "slow_model:factory")  # doubles its input; x[0] < 0 sleeps -x[0] seconds


# A client past what the descriptor limit leaves room for is closed at once, and resends on
# each new connection until the idle ones ahead of it are dropped (after the handshake time).
PAST_THE_CEILING = {"retries": 200, "connect_timeout": 10}


def answer(endpoint: str, x: np.ndarray, **options) -> workerpool.Result:
    options = {"timeout": 10, "retries": 0, **options}
    with workerpool.Client(endpoint, **options) as client:
        return client.request(x)


def described(endpoint: str) -> dict:
    with workerpool.Client(endpoint, timeout=10) as client:
        return client.info()


def one_row(endpoint: str) -> np.ndarray:
    return np.zeros((1, described(endpoint)["inputs"][0]["shape"][1]), np.float32)


# Peers are who they say they are.


def test_a_remote_peer_claiming_a_local_pid_cannot_get_it_signalled(small_model, context):
    """A TCP peer registers with local=true and a real local worker's pid, then leaves: the
    supervisor signals nothing, and that worker keeps serving."""
    backend = free_backend()
    with Server(small_model, "--backend", backend, workers=1) as server:
        victim = server.worker_pids()[0]
        with dealer(context, backend, IDENTITY=b"forger") as forger:
            ready = {"pid": victim, "host": os.uname().nodename, "local": True,
                     "models": {"small": described(server.endpoint)}}
            forger.send_multipart([protocol.READY, json.dumps(ready).encode()])
            server.wait_for(lambda s: [w["pid"] for w in s["workers"]].count(victim) == 2)
            forger.send_multipart([protocol.BYE])
            server.wait_for(lambda s: [w["pid"] for w in s["workers"]] == [victim])
        assert psutil.pid_exists(victim)
        assert answer(server.endpoint, one_row(server.endpoint)).worker_pid == victim
        assert "killing worker" not in server.log()


def test_a_client_key_cannot_register_a_worker_host(small_model, tmp_path):
    keys = CurveKeys(tmp_path / "keys")
    alice_secret, host_secret = keys.client("alice"), keys.host("host")
    backend = free_backend()
    with Server(small_model, "--backend", backend, *keys.serve_args(), workers=1) as server:
        with Host(small_model, backend, *keys.host_args(host_secret), workers=1):
            server.wait_for(pool_ready(2))
            # The impostor's workers load and connect, but the handshake never admits them.
            with Host(small_model, backend, *keys.host_args(alice_secret), workers=1):
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    assert len(server.status()["workers"]) == 2
        # The host's key does not admit a client either.
        x = np.zeros((1, 64), np.float32)
        with workerpool.Client(server.endpoint, connect_timeout=1,
                               keys=workerpool.ClientKeys(host_secret, keys.server_public)) as client, \
                pytest.raises(workerpool.Unreachable, match="refused this client's key"):
            client.infer(x)


def test_a_secured_tcp_backend_still_serves_with_local_workers(small_model, tmp_path):
    keys = CurveKeys(tmp_path / "keys")
    alice_secret = keys.client("alice")
    with Server(small_model, "--backend", free_backend(), *keys.serve_args(), workers=2) as server:
        alice = workerpool.ClientKeys(alice_secret, keys.server_public)
        with workerpool.Client(server.endpoint, timeout=10, keys=alice) as client:
            width = client.info()["inputs"][0]["shape"][1]
            assert client.request(np.zeros((1, width), np.float32)).worker_pid in server.worker_pids()


def test_a_secured_tcp_backend_without_worker_keys_is_refused(small_model, tmp_path):
    keys = CurveKeys(tmp_path / "keys")
    keys.client("alice")
    server = Server(small_model, "--backend", free_backend(), "--curve-secret-key", keys.server_secret,
                    "--curve-client-keys", str(keys.clients), workers=1)
    refused_at_start(server, "needs --curve-worker-keys")


# Control is local and owned.


@pytest.mark.parametrize(("kind", "message"), [
    ("tcp", "the control socket is an ipc://PATH"),
    ("abstract", "an abstract @name is open to every user"),
    ("open directory", "mode 0700"),
])
def test_a_control_endpoint_others_could_reach_is_refused(small_model, tmp_path, kind, message):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    endpoint = {"tcp": "tcp://127.0.0.1:*", "abstract": f"ipc://@wp-{tmp_path.name}"}.get(
        kind, f"ipc://{shared}/control")
    refused_at_start(Server(small_model, "--control", endpoint, workers=1), message)


def test_check_answers_only_for_the_served_directory(small_model, tmp_path):
    with Server(small_model, workers=1) as server:
        for path in ("/etc/shadow", "/etc/hostname", str(tmp_path / "missing.bpk")):
            with pytest.raises(control.ControlError, match="only looks at files in"):
                control.call(server.control, "check", path=path)
        beside = Path(small_model).with_name("beside.bpk")
        beside.write_bytes(Path(small_model).read_bytes())
        assert control.call(server.control, "check", path=str(beside))["result"] == "ok"


# Requests that never end.


def test_a_request_past_the_time_limit_is_answered_and_its_worker_replaced(small_model):
    with Server(small_model, *SLOW, "--request-timeout", "1", workers=2) as server:
        before = set(server.worker_pids())
        stuck = np.full((1, 2), -1000.0, np.float32)  # sleeps 1000 s: as good as a loop
        with workerpool.Client(server.endpoint) as client:  # the default timeout and retries
            started = time.monotonic()
            with pytest.raises(workerpool.RequestTimeout, match="--request-timeout 1s"):
                client.request(stuck)
            assert time.monotonic() - started < 10
            status = server.wait_for(pool_ready(2))
            now = {w["pid"] for w in status["workers"]}
            assert len(before - now) == 1, "exactly one worker was replaced"
            # The same request again is refused at once rather than fed to another worker.
            with pytest.raises(workerpool.WorkerFailed, match="identical request"):
                client.request(stuck)
            assert {w["pid"] for w in server.status()["workers"]} == now
            np.testing.assert_array_equal(client.infer(np.ones((1, 2), np.float32)), 2)


# Draining answers everything.


def test_every_request_sent_during_a_drain_is_answered(small_model):
    """Four clients keep sending while a SIGTERM drain runs and until the server is gone: each
    request is answered (a result or shutting_down), none is lost to the race with the
    server's exit (ConnectionLost or a time-out), and the server's own count of the requests it
    read is the count the clients were answered."""
    with Server(small_model, *SLOW, "--graceful-timeout", "20", workers=2) as server:
        busy = [Background(lambda: answer(server.endpoint, np.full((1, 2), -1.5, np.float32)))
                for _ in range(2)]
        server.wait_for(lambda s: s["queue"]["in_flight"] == 2)
        lost: list[Exception] = []

        def keep_sending() -> tuple[int, int]:
            answered = not_sent = 0
            with workerpool.Client(server.endpoint, timeout=3, retries=0) as client:
                while server.proc.poll() is None:
                    try:
                        client.request(np.ones((1, 2), np.float32))
                        answered += 1
                    except workerpool.ShuttingDown as exc:
                        not_sent += "was not sent" in str(exc)
                        answered += "was not sent" not in str(exc)
                        if not_sent:  # it knows: nothing more goes out until the server is gone
                            break
                    except (workerpool.Timeout, workerpool.ConnectionLost, workerpool.Unreachable) as exc:
                        lost.append(exc)
            return answered, not_sent

        senders = [Background(keep_sending) for _ in range(4)]
        server.signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0
        counts = [sender.join(60) for sender in senders]
        for call in busy:
            assert call.join(20).outputs[0, 0] == -3.0
        assert lost == []
        assert all(not_sent for _, not_sent in counts)
        read = re.search(r"(\d+) requests read, (\d+) answered", server.log())
        assert read is not None and read[1] == read[2]
        assert int(read[1]) == sum(answered for answered, _ in counts) + len(busy)


# Connections and descriptors.


def test_requests_past_the_connection_cap_are_answered_overloaded_without_a_reconnect(small_model, context):
    """With --max-connections 4: idle connections take no place, nor do clients that send and
    close at once; a fifth connection that sends is answered overloaded at once, request after
    request, on the one connection it opened; it is served once a served connection closes.
    Over HTTP, a connection past the cap is answered 503."""
    port = free_port()
    with Server(small_model, "--max-connections", "4", "--http", f"127.0.0.1:{port}", workers=1) as server:
        host, zmq_port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
        x = one_row(server.endpoint)
        hasty_context = zmq.Context()
        try:
            for request_id in range(40):  # gone, some before their requests are read: they keep no place
                with dealer(hasty_context, server.endpoint) as hasty:
                    hasty.send_multipart(protocol.encode_request(request_id, x))
                    hasty.close(linger=1000)
        finally:
            hasty_context.term()  # waits out each linger: no hasty request is still on its way below
        # A place is freed once libzmq says its connection went: then none of them holds one.
        server.wait_for(lambda s: s["connections"] == {"served": 0, "open": 0, "max": 4})
        idle = [socket.create_connection((host, int(zmq_port))) for _ in range(50)]
        served = [workerpool.Client(server.endpoint, timeout=10, retries=0) for _ in range(4)]
        try:
            for client in served:
                assert client.request(x).outputs.shape[0] == 1
            with monitored_dealer(context, server.endpoint) as (sock, monitor):
                for request_id in range(20):
                    sock.send_multipart(protocol.encode_request(request_id, x))
                    assert sock.poll(10_000), "no answer past the connection cap"
                    reply = protocol.decode_header(sock.recv_multipart()[1])
                    assert reply["id"] == request_id and reply["error"]["code"] == "overloaded"
                    assert "at the server's --max-connections 4" in reply["error"]["message"]
                assert next_event(monitor) == zmq.EVENT_CONNECTED
                assert next_event(monitor, timeout=0.1) is None  # no drop, no reconnect
                served.pop().close()
                server.wait_for(lambda s: s["connections"]["served"] == 3)
                sock.send_multipart(protocol.encode_request(20, x))
                assert sock.poll(10_000)
                assert protocol.decode_header(sock.recv_multipart()[1])["status"] == "ok"
            assert server.status(memory=False)["connections"]["open"] >= 50 + 3
            keep_alive = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
            try:
                response = http_get(port, "/v2/health/live")
                assert response.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in response
                assert b"--max-connections 4" in response
            finally:
                for sock in keep_alive:
                    sock.close()
        finally:
            for client in served:
                client.close()
            for sock in idle:
                sock.close()
        assert "answering requests on others overloaded" in server.log()


def http_get(port: int, path: str) -> bytes:
    """One GET on a raw socket, everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        while part := sock.recv(65536):
            received += part
        return received


def test_idle_connections_cannot_exhaust_a_low_descriptor_limit(small_model):
    """With a hard limit of 256 descriptors the connection cap is lowered to fit beside the
    workers, so 400 idle connections still leave room for a real client."""
    server = Server(small_model, "--max-connections", "1024", workers=1)
    server.command = ["prlimit", "--nofile=256:256", *server.command]
    with server:
        host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
        x = one_row(server.endpoint)
        idle = [socket.create_connection((host, int(port))) for _ in range(400)]
        try:
            assert answer(server.endpoint, x, **PAST_THE_CEILING).outputs.shape[0] == 1
            assert "more than the open file limit leaves room for" in server.log()
        finally:
            for sock in idle:
                sock.close()


# Found by a second round of attacks.


def test_a_message_of_a_million_frames_is_dropped_cheaply_and_answered(small_model, context):
    with Server(small_model, workers=2) as server:
        pids = set(server.worker_pids())
        supervisor = psutil.Process(server.proc.pid)
        before = supervisor.memory_info().rss
        with dealer(context, server.endpoint) as sock:
            sock.send_multipart([b""] * 1_000_000)
            assert sock.poll(60_000), "a message of too many frames got no answer"
            header = protocol.decode_header(sock.recv_multipart()[1])
        assert header["error"]["code"] == "bad_request" and "1000000 frames" in header["error"]["message"]
        assert "refused a message of 1000001 frames, the routing id included" in server.log()
        assert supervisor.memory_info().rss - before < 64 * 1024 * 1024
        # Reading it stalls the loop for seconds on a busy machine, which can outlast a worker's
        # heartbeat: the pool must be whole again, if not with the same workers.
        server.wait_for(pool_ready(len(pids)))
        assert answer(server.endpoint, one_row(server.endpoint)).worker_pid in server.worker_pids()


def test_requests_that_differ_only_in_frame_boundaries_are_not_the_same():
    from workerpool.router.quarantine import fingerprint

    route = b"route"  # read by the router alone, never part of what a request is
    head = json.dumps({"v": 2, "id": 1, "method": "infer", "arrays": []}).encode()
    assert fingerprint([route, head, b"ab", b"c"]) != fingerprint([route, head, b"a", b"bc"])
    other_id = head.replace(b'"id": 1', b'"id": 2')
    assert fingerprint([route, head, b"ab", b"c"]) == fingerprint([route, other_id, b"ab", b"c"])


def test_text_requests_are_told_apart_by_their_texts():
    from workerpool.protocol import messages as protocol
    from workerpool.router.quarantine import fingerprint

    def texts(request_id: int, *text: str) -> list[bytes]:
        return protocol.encode_request(request_id, list(text))[1:]

    assert fingerprint(texts(1, "a killer")) != fingerprint(texts(1, "an innocent"))
    assert fingerprint(texts(1, "same")) == fingerprint(texts(2, "same"))


def test_connections_past_the_cap_never_cut_a_client_already_served(small_model):
    with Server(small_model, *SLOW, "--max-connections", "5", workers=1) as server:
        slow = Background(lambda: answer(server.endpoint, np.full((1, 2), -1.0, np.float32)))
        server.wait_for(lambda s: s["queue"]["in_flight"] == 1)
        host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(20)]
        try:
            assert slow.join(20).outputs[0, 0] == -2.0
        finally:
            for sock in idle:
                sock.close()


def test_a_memory_limit_below_an_idle_worker_is_a_clear_error(small_model):
    server = Server(small_model, "--max-worker-memory", "8MiB", "--max-message-size", "1MiB", workers=1)
    try:
        with pytest.raises(RuntimeError):
            server.start(timeout=8)
        assert "is below this worker's own private memory once ready" in server.log()
    finally:
        server.stop()


def test_control_commands_with_bad_arguments_are_answered_not_fatal(small_model):
    with Server(small_model, workers=1) as server:
        for path in ("/tmp/a\x00b", "", 7, None):
            with pytest.raises(control.ControlError, match="check needs a path"):
                control.call(server.control, "check", path=path)
        assert server.status()["workers"]


@pytest.mark.parametrize("option, message", [
    (("--request-timeout", "0"), "more than 0 seconds"),
    (("--request-timeout", "nan"), "not a number of seconds"),
    (("--graceful-timeout", "-1"), "not a number of seconds"),
    (("--max-connections", "0"), "at least 1"),
    (("--max-message-size", "0"), "more than 0 bytes"),
    (("--max-message-size", "64KiB"), "below 1.0 MiB, the size up to which clients send"),
    (("--max-message-size", "100000000000000GiB"), "too large"),
    (("--workers", "0"), "give --backend"),
])
def test_limits_out_of_range_are_refused_with_a_clear_error(small_model, option, message):
    done = cli("serve", small_model, *option, timeout=30)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr
