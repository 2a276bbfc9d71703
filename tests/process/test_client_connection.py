"""The client library fails fast and typed when no server is there or its server goes away, and
rides through a server restart: real servers, real sockets, real kills."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import numpy as np
import pytest
import zmq
from support.keys import CurveKeys
from support.models import SLOW
from support.processes import Background
from support.server import Server
from support.sockets import free_backend, free_port

import workerpool
from workerpool import security
from workerpool.client.base import CONNECT_TIMEOUT

SLACK = 4.0  # seconds a loaded machine may add to any wait measured here


def timed(call):
    started = time.monotonic()
    with pytest.raises(workerpool.WorkerpoolError) as raised:
        call()
    return raised.value, time.monotonic() - started


@pytest.mark.parametrize("endpoint", [
    "127.0.0.1:5555", "localhost:5555", "http://127.0.0.1:8000/v2", "tcp://[::1]:5555",
    "tcp://127.0.0.1:0", "tcp://127.0.0.1:70000", "tcp://127.0.0.1", "inproc://pool", "ipc://",
])
def test_endpoint_mistakes_are_value_errors_at_construction(endpoint):
    for client_class in (workerpool.Client, workerpool.AsyncClient):
        with pytest.raises(ValueError, match="write|not supported|port from 1 to 65535|use tcp"):
            client_class(endpoint)


def test_no_server_is_unreachable_after_the_connect_timeout():
    endpoint = free_backend()
    with workerpool.Client(endpoint) as client:
        error, waited = timed(client.info)
    assert isinstance(error, workerpool.Unreachable) and isinstance(error, ConnectionError)
    assert "connection refused" in str(error)
    assert CONNECT_TIMEOUT - 0.1 <= waited < CONNECT_TIMEOUT + SLACK


def test_no_server_is_unreachable_for_the_async_client_too(tmp_path):
    async def ask(endpoint: str) -> list[BaseException]:
        async with workerpool.AsyncClient(endpoint, connect_timeout=1) as client:
            return await asyncio.gather(client.info(), client.infer(np.ones((1, 4), np.float32)),
                                        return_exceptions=True)

    started = time.monotonic()
    errors = asyncio.run(ask(f"ipc://{tmp_path}/none.sock"))
    assert all(isinstance(e, workerpool.Unreachable) and "does not exist" in str(e) for e in errors)
    assert time.monotonic() - started < 1 + SLACK


def test_a_listener_that_never_speaks_zeromq_is_unreachable():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        accepted: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            listener.settimeout(0.1)
            while not stop.is_set():
                try:
                    accepted.append(listener.accept()[0])
                except TimeoutError:
                    pass

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            with workerpool.Client(f"tcp://127.0.0.1:{listener.getsockname()[1]}",
                                   connect_timeout=1) as client:
                error, waited = timed(client.info)
        finally:
            stop.set()
            acceptor.join(5)
            for conn in accepted:
                conn.close()
    assert isinstance(error, workerpool.Unreachable), error
    assert "accepted the connection but completed no ZeroMQ handshake" in str(error)
    assert waited < 1 + SLACK


def test_a_refused_client_key_is_named(small_model, tmp_path):
    keys = CurveKeys(tmp_path / "keys")
    keys.client("alice")
    _, stranger = security.generate(str(tmp_path / "strangers"), "mallory")
    with Server(small_model, "--backend", free_backend(), *keys.serve_args(), workers=0) as server, \
            workerpool.Client(server.endpoint, connect_timeout=1,
                              keys=security.ClientKeys(stranger, keys.server_public)) as client:
        error, _ = timed(client.info)
    assert isinstance(error, workerpool.Unreachable) and "refused this client's key" in str(error)


@pytest.mark.parametrize("front_end", ["sync", "async"])
def test_a_server_killed_mid_request_fails_it_fast_with_connection_lost(small_model, front_end):
    """SIGKILL of the whole server while a request runs: the client hears the drop from its
    socket monitor, finds no server to resend to, and says so within the connect timeout."""
    x = np.full((1, 2), -20.0, np.float32)  # sleeps 20 s on its worker: far past the wait

    def sync_request() -> workerpool.Result:
        with workerpool.Client(server.endpoint) as client:
            return client.request(x)

    async def async_request() -> workerpool.Result:
        async with workerpool.AsyncClient(server.endpoint) as client:
            return await client.request(x)

    with Server(small_model, *SLOW, workers=1) as server:
        call = Background(sync_request if front_end == "sync" else lambda: asyncio.run(async_request()))
        server.wait_for(lambda s: s["queue"]["in_flight"] == 1)
        server.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(workerpool.ConnectionLost, match="no server took it back"):
            call.join(CONNECT_TIMEOUT + SLACK + 5)
        assert time.monotonic() - killed < CONNECT_TIMEOUT + SLACK


def test_a_server_restarted_under_a_client_is_reached_transparently(small_model, local_model):
    """SIGTERM, then a new server on the same port: a client sending all along sees no error,
    whether its request was in flight, answered shutting_down, or sent while nothing listened."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    x = np.ones((1, local_model.input_shape[1]), np.float32)
    answered: list[int] = []
    done = threading.Event()

    def keep_sending() -> None:
        with workerpool.Client(endpoint, connect_timeout=30) as client:
            while not done.is_set():
                answered.append(client.request(x).worker_pid or 0)

    first = Server(small_model, "--bind", endpoint, workers=1).start()
    second = Server(small_model, "--bind", endpoint, workers=1)
    try:
        first_workers = set(first.worker_pids())
        sender = Background(keep_sending)
        first.wait_for(lambda s: len(answered) >= 20)
        assert first.stop() == 0
        second.start()
        before = len(answered)
        second.wait_for(lambda s: len(answered) >= before + 20
                        and set(answered[-5:]).isdisjoint(first_workers))
        done.set()
        sender.join(30)  # raises what the client raised, if anything
    finally:
        done.set()
        first.stop()
        second.stop()


def test_a_restart_while_the_client_idles_costs_no_retry(small_model, local_model):
    """The drop seen while idle is taken in before the next request, which therefore goes to
    the new server and is not counted as lost: retries=0 still succeeds."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    x = np.ones((1, local_model.input_shape[1]), np.float32)
    with workerpool.Client(endpoint, retries=0) as client:
        with Server(small_model, "--bind", endpoint, workers=1):
            np.testing.assert_allclose(client.infer(x), local_model(x), rtol=1e-5, atol=1e-5)
        with Server(small_model, "--bind", endpoint, workers=1):
            np.testing.assert_allclose(client.infer(x), local_model(x), rtol=1e-5, atol=1e-5)
        error, _ = timed(lambda: client.request(x))  # stopped while idle: nothing was in flight
    assert isinstance(error, workerpool.Unreachable), error


def test_the_reply_is_awaited_from_the_handshake_not_from_the_send(small_model, local_model):
    """A request sent before its server starts waits for it (connect_timeout), then for the
    reply (timeout) from when the server connected, however long the start took."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    x = np.ones((1, local_model.input_shape[1]), np.float32)
    with workerpool.Client(endpoint, connect_timeout=60, timeout=0.5, retries=0) as client:
        call = Background(lambda: client.infer(x))
        with Server(small_model, "--bind", endpoint, workers=1):
            np.testing.assert_allclose(call.join(60), local_model(x), rtol=1e-5, atol=1e-5)


def test_requests_that_found_no_server_are_not_delivered_later(context):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with workerpool.Client(endpoint, connect_timeout=0.2) as client:
        for _ in range(5):
            with pytest.raises(workerpool.Unreachable):
                client.info()
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(endpoint)
        try:
            late = Background(lambda: client.info())
            assert router.poll(10_000), "the new request never arrived"
            first = router.recv_multipart()
            assert not router.poll(500), "a request that had failed was delivered after all"
            assert b'"method":"info"' in first[-1].replace(b" ", b"")
        finally:
            router.close()
        with pytest.raises(workerpool.ConnectionLost):  # unanswered when the router went
            late.join(10)


def test_a_request_over_the_servers_limit_is_refused_before_it_is_sent(small_model, local_model):
    """80 MB against a 1 MiB limit: one typed error at once, never a resend or a dropped
    connection; the client asked for the limit once, and the connection serves on."""
    width = local_model.input_shape[1]
    big = np.ones((5000, 4096), np.float32)
    with Server(small_model, "--max-message-size", "1MiB", workers=1) as server:
        with workerpool.Client(server.endpoint, timeout=10, retries=2) as client:
            error, waited = timed(lambda: client.infer(big))
            assert type(error) is workerpool.RequestTooLarge and isinstance(error, workerpool.BadRequest)
            assert "the request is 78.1 MiB (81920" in str(error) and ", 1.0 MiB (1048576 bytes): " in str(error)
            assert "not sent" in str(error) and waited < SLACK
            timed(lambda: client.infer({"x": big}))  # the limit is known now: no second info
            assert client.infer(np.ones((1, width), np.float32)).shape == (1, 10)

        async def ask() -> list:
            async with workerpool.AsyncClient(server.endpoint, timeout=10) as client:
                return await asyncio.gather(*(client.infer(big) for _ in range(3)),
                                            client.infer(np.ones((1, width), np.float32)),
                                            return_exceptions=True)

        *refused, answered = asyncio.run(ask())
        assert all(type(error) is workerpool.RequestTooLarge for error in refused), refused
        assert answered.shape == (1, 10)
        server.stop()
    # Read by the server: the sync client's info and small request, the async client's one
    # shared info and its small request; none of the large ones.
    assert "4 requests read, 4 answered" in server.log(), server.log()


def test_a_server_restarted_with_a_lower_limit_is_asked_again(small_model):
    """The limit belongs to a connection: after a restart with a lower one, the first large
    request asks again and is refused unsent, never dropped with the connection."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    mid = np.ones((1500, 512), np.float32)  # 3 MiB, of a width the model does not take
    first = Server(small_model, "--bind", endpoint, "--max-message-size", "8MiB", workers=1).start()
    second = Server(small_model, "--bind", endpoint, "--max-message-size", "1MiB", workers=1)
    try:
        with workerpool.Client(endpoint, connect_timeout=30) as client:
            with pytest.raises(workerpool.BadRequest) as sent:
                client.infer(mid)
            assert type(sent.value) is workerpool.BadRequest  # a worker's answer: it was sent
            assert first.stop() == 0
            second.start()
            error, _ = timed(lambda: client.infer(mid))
            assert type(error) is workerpool.RequestTooLarge, error
    finally:
        first.stop()
        second.stop()
