"""Client and AsyncClient against a real ZeroMQ ROUTER scripted by each test (no mocks)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

import numpy as np
import pytest
import zmq

import workerpool
from workerpool.errors import ERRORS_BY_CODE
from workerpool.protocol import messages as protocol
from workerpool.protocol.transport import state_message_limit
from workerpool.units import MiB

GENERATION = 7
FAST = {"timeout": 0.2, "retries": 2}
T = TypeVar("T")


class FakeServer:
    """A ROUTER in a thread that doubles every input; the attributes script its misbehaviour.

    Set them before the client sends: ``drop`` ignores that many requests, ``error`` answers
    every request with that code, ``batch`` holds requests until that many arrived and answers
    them in reverse order, ``stale`` wraps each reply in replies the client never asked for,
    ``malformed`` answers ``"frame"``: a header promising an array it lacks; ``"json"``: not JSON;
    ``"v1"``: what a server of protocol version 1 answers (it reads the route frame as its header).
    """

    def __init__(self, limit: int | None = None) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if limit is not None:
            state_message_limit(self.socket, limit)
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.drop: float = 0
        self.error: str | None = None
        self.batch = 1
        self.stale = False
        self.malformed: str | None = None
        self.requests: list[dict] = []
        self.failure: BaseException | None = None
        self._arrived = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.socket.close()
        self.context.term()

    def wait_for_requests(self, count: int) -> list[dict]:
        """The headers received, once at least ``count`` have arrived."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.requests) >= count, timeout=5)
            return list(self.requests)

    def _serve(self) -> None:
        held: list[tuple[bytes, protocol.Message]] = []
        try:
            while not self._stop.is_set():
                if not self.socket.poll(10):
                    continue
                identity, delimiter, *frames = self.socket.recv_multipart()
                assert delimiter == b""
                message = protocol.decode_request(frames)
                with self._arrived:
                    self.requests.append(message.header)
                    self._arrived.notify_all()
                if self.drop:
                    self.drop -= 1
                    continue
                held.append((identity, message))
                if len(held) >= self.batch:
                    for identity, message in reversed(held):
                        self._answer(identity, message)
                    held.clear()
        except BaseException as exc:  # noqa: BLE001 - reported by the fixture, not lost in the thread
            self.failure = exc

    def _answer(self, identity: bytes, message: protocol.Message) -> None:
        request_id, pid = message.id, os.getpid()
        if self.malformed == "json":
            reply = [b"{not json"]
        elif self.malformed == "v1":
            # Its arrays promise a frame that is missing: another version's layout need not be ours.
            reply = [protocol.encode_header({"v": 1, "id": None, "status": "error",
                                             "arrays": [{"dtype": "<f4", "shape": [2]}],
                                             "error": {"code": "bad_request", "message": "header is not valid JSON"},
                                             "worker_pid": None, "generation": None})]
        elif self.malformed == "frame":
            header = {
                "v": protocol.VERSION,
                "id": request_id,
                "status": "ok",
                "arrays": [{"dtype": "<f4", "shape": [2]}],
            }
            reply = [protocol.encode_header(header)]
        elif self.error is not None:
            reply = protocol.encode_error(
                request_id, self.error, f"scripted {self.error}", worker_pid=pid
            )
        elif message.header["method"] == protocol.METHOD_INFO:
            reply = protocol.encode_reply(request_id, info={"model": "double"}, worker_pid=pid)
        else:
            payload = message.payload()
            doubled = (
                {k: v * 2 for k, v in payload.items()} if isinstance(payload, dict) else payload * 2
            )
            reply = protocol.encode_reply(
                request_id, doubled, worker_pid=pid, generation=GENERATION
            )
        if self.stale:
            never_sent = protocol.encode_reply(-request_id, np.zeros(1), worker_pid=pid)
            self.socket.send_multipart([identity, b"", *never_sent])
        self.socket.send_multipart([identity, b"", *reply])
        if self.stale:
            self.socket.send_multipart([identity, b"", *reply])


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
    assert fake.failure is None, f"the fake server failed: {fake.failure!r}"


@pytest.fixture
def client(server: FakeServer) -> Iterator[workerpool.Client]:
    with workerpool.Client(server.endpoint, **FAST) as c:
        yield c


def arange(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.float32)


# --- blocking client


def test_infer_round_trip_array(client: workerpool.Client) -> None:
    np.testing.assert_array_equal(client.infer(arange(5)), arange(5) * 2)


def test_infer_round_trip_scalar(client: workerpool.Client) -> None:
    output = client.infer(np.array(1.5))
    assert output.shape == ()
    assert output == 3.0


def test_infer_round_trip_large_array(client: workerpool.Client) -> None:
    x = np.random.default_rng(0).standard_normal((512, 512))  # 2 MiB: sent without a copy
    np.testing.assert_array_equal(client.infer(x), x * 2)


def test_infer_round_trip_named_arrays(client: workerpool.Client) -> None:
    outputs = client.infer({"a": arange(3), "b": np.array([[1, 2]], dtype=np.int64)})
    assert set(outputs) == {"a", "b"}
    np.testing.assert_array_equal(outputs["a"], arange(3) * 2)
    np.testing.assert_array_equal(outputs["b"], [[2, 4]])
    assert outputs["b"].dtype == np.int64


def test_request_carries_worker_pid_and_generation(client: workerpool.Client) -> None:
    result = client.request(arange(2))
    assert isinstance(result, workerpool.Result)
    assert (result.worker_pid, result.generation) == (os.getpid(), GENERATION)


def test_info(client: workerpool.Client, server: FakeServer) -> None:
    assert client.info() == {"model": "double"}
    assert server.requests[-1]["method"] == "info"


def test_deadline_is_sent_in_milliseconds(client: workerpool.Client, server: FakeServer) -> None:
    client.infer(arange(1), deadline=0.5)
    client.infer(arange(1))
    first, second = server.wait_for_requests(2)
    assert 0 < first["deadline_ms"] <= 500
    assert "deadline_ms" not in second


@pytest.mark.parametrize("code", sorted(ERRORS_BY_CODE))
def test_error_codes_map_to_classes(
    client: workerpool.Client, server: FakeServer, code: str
) -> None:
    server.error = code
    with pytest.raises(ERRORS_BY_CODE[code]) as caught:
        client.infer(arange(1))
    assert type(caught.value) is ERRORS_BY_CODE[code]
    assert caught.value.message == f"scripted {code}"
    assert caught.value.worker_pid == os.getpid()


def test_unknown_error_code_is_remote_error(client: workerpool.Client, server: FakeServer) -> None:
    server.error = "teapot"
    with pytest.raises(workerpool.RemoteError) as caught:
        client.infer(arange(1))
    assert type(caught.value) is workerpool.RemoteError
    assert caught.value.code == "teapot"


def test_malformed_reply_is_internal_error(client: workerpool.Client, server: FakeServer) -> None:
    server.malformed = "frame"
    with pytest.raises(workerpool.InternalError, match="malformed reply"):
        client.infer(arange(1))


def test_unattributable_reply_is_dropped_and_retried(server: FakeServer) -> None:
    server.malformed = "json"
    client = workerpool.Client(server.endpoint, timeout=0.1, retries=1)
    with client, pytest.raises(workerpool.Timeout):
        client.infer(arange(1))
    assert len(server.wait_for_requests(2)) == 2


def test_a_server_of_another_protocol_version_fails_every_call_once(server: FakeServer) -> None:
    """Its error names no request (it could not read one), yet no call waits out its timeout
    or is sent again: every outstanding call fails naming both versions."""
    server.malformed = "v1"
    server.batch = 2
    with workerpool.Client(server.endpoint, timeout=60, retries=3) as client, \
            pytest.raises(workerpool.BadRequest, match="protocol version 1 and this client version 3"):
        list(client.infer_many([arange(1), arange(2)], window=2))
    assert len(server.wait_for_requests(2)) == 2


def test_timeout_after_every_retry(client: workerpool.Client, server: FakeServer) -> None:
    server.drop = math.inf
    with pytest.raises(workerpool.Timeout):
        client.infer(arange(1))
    requests = server.wait_for_requests(FAST["retries"] + 1)
    assert len(requests) == FAST["retries"] + 1
    assert len({r["id"] for r in requests}) == len(requests), "each attempt has a fresh id"


def test_retry_succeeds_after_a_dropped_request(
    client: workerpool.Client, server: FakeServer
) -> None:
    server.drop = 1
    np.testing.assert_array_equal(client.infer(arange(3)), arange(3) * 2)
    assert len(server.requests) == 2


def test_retry_resends_only_the_unanswered_pipeline_requests(
    client: workerpool.Client, server: FakeServer
) -> None:
    server.drop = 1
    outputs = client.infer_many((arange(1, i) for i in range(6)), window=4)
    assert [int(y[0]) for y in outputs] == [2 * i for i in range(6)]
    assert len(server.requests) == 6 + 1


def test_deadline_passed_before_a_retry(client: workerpool.Client, server: FakeServer) -> None:
    server.drop = math.inf
    with pytest.raises(workerpool.DeadlineExceeded, match="before the request could be retried"):
        client.infer(arange(1), deadline=0.1)
    assert len(server.wait_for_requests(1)) == 1


def test_stale_and_duplicate_replies_are_discarded(
    client: workerpool.Client, server: FakeServer
) -> None:
    server.stale = True
    for start in range(3):
        np.testing.assert_array_equal(client.infer(arange(2, start)), arange(2, start) * 2)


def test_abandoned_pipeline_replies_are_discarded(
    client: workerpool.Client, server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="workerpool.client")
    for _ in client.infer_many(arange(1, i) for i in range(4)):
        break
    np.testing.assert_array_equal(client.infer(arange(1, 100)), [200])
    discarded = [r for r in caplog.records if "not outstanding" in r.getMessage()]
    assert len(discarded) == 3


def test_infer_many_keeps_order_with_out_of_order_replies(
    client: workerpool.Client, server: FakeServer
) -> None:
    server.batch = 4  # answers only when the whole window is in flight, in reverse
    outputs = list(client.infer_many((arange(2, i) for i in range(12)), window=4))
    for i, output in enumerate(outputs):
        np.testing.assert_array_equal(output, arange(2, i) * 2)
    assert len(outputs) == 12


def test_infer_many_reads_inputs_lazily(client: workerpool.Client) -> None:
    consumed = []

    def inputs() -> Iterator[np.ndarray]:
        for i in range(10):
            consumed.append(i)
            yield arange(1, i)

    outputs = client.infer_many(inputs(), window=3)
    assert consumed == []
    assert int(next(outputs)[0]) == 0
    assert len(consumed) == 3
    assert [int(y[0]) for y in outputs] == [2 * i for i in range(1, 10)]


def test_infer_many_raises_at_the_failing_item(client: workerpool.Client) -> None:
    inputs = [arange(1, 0), arange(1, 1), np.array(["bad"]), arange(1, 3)]
    outputs = client.infer_many(inputs, window=4)
    assert [int(next(outputs)[0]) for _ in range(2)] == [0, 2]
    with pytest.raises(workerpool.BadRequest):
        next(outputs)


def test_calls_interleave_with_a_pipeline(client: workerpool.Client) -> None:
    seen = []
    for y in client.infer_many((arange(1, i) for i in range(6)), window=3):
        seen.append(int(y[0]))
        assert client.info() == {"model": "double"}  # while pipeline requests are in flight
    assert seen == [2 * i for i in range(6)]


def test_unsupported_dtype_raises_bad_request_without_sending(
    client: workerpool.Client, server: FakeServer
) -> None:
    for bad in (np.array(["text"]), np.array([1 + 2j]), {"x": np.array([object()])}):
        with pytest.raises(workerpool.BadRequest):
            client.infer(bad)
    client.infer(arange(1))
    assert len(server.wait_for_requests(1)) == 1


def test_a_request_over_the_stated_limit_fails_unsent_after_one_info() -> None:
    fake = FakeServer(limit=protocol.MIN_MESSAGE_SIZE)
    fake.start()
    try:
        with workerpool.Client(fake.endpoint, **FAST) as client:
            small = arange(1000)
            np.testing.assert_array_equal(client.infer(small), small * 2)
            for _ in range(2):
                with pytest.raises(workerpool.RequestTooLarge, match=r"over the --max-message-size .* 1\.0 MiB"):
                    client.infer(np.zeros(MiB, np.uint8))
        assert [header["method"] for header in fake.requests] == ["infer"]  # the reply stated it
    finally:
        fake.stop()


def test_a_large_request_asks_a_server_that_states_no_limit_once(
    client: workerpool.Client, server: FakeServer
) -> None:
    big = np.zeros(2 * MiB, np.uint8)
    for _ in range(2):
        np.testing.assert_array_equal(client.infer(big), big * 2)
    assert [header["method"] for header in server.requests] == ["info", "infer", "infer"]


def test_closed_client_refuses_requests(server: FakeServer) -> None:
    client = workerpool.Client(server.endpoint)
    client.close()
    client.close()
    with pytest.raises(workerpool.WorkerpoolError, match="closed"):
        client.infer(arange(1))


# --- asyncio client


def run_async(server: FakeServer, body: Callable[[workerpool.AsyncClient], Awaitable[T]]) -> T:
    """Run ``body(client)`` on a fresh event loop with an AsyncClient for ``server``."""

    async def main() -> T:
        async with workerpool.AsyncClient(server.endpoint, **FAST) as client:
            return await body(client)

    return asyncio.run(main())


def test_async_round_trip(server: FakeServer) -> None:
    async def body(client: workerpool.AsyncClient) -> None:
        np.testing.assert_array_equal(await client.infer(arange(4)), arange(4) * 2)
        outputs = await client.infer({"a": arange(2)})
        np.testing.assert_array_equal(outputs["a"], arange(2) * 2)
        result = await client.request(arange(1))
        assert (result.worker_pid, result.generation) == (os.getpid(), GENERATION)
        assert await client.info() == {"model": "double"}

    run_async(server, body)


@pytest.mark.parametrize("code", [*sorted(ERRORS_BY_CODE), "teapot"])
def test_async_error_codes(server: FakeServer, code: str) -> None:
    server.error = code

    async def body(client: workerpool.AsyncClient) -> None:
        with pytest.raises(workerpool.RemoteError) as caught:
            await client.infer(arange(1))
        assert type(caught.value) is ERRORS_BY_CODE.get(code, workerpool.RemoteError)
        assert caught.value.worker_pid == os.getpid()

    run_async(server, body)


def test_async_timeout_after_every_retry(server: FakeServer) -> None:
    server.drop = math.inf

    async def body(client: workerpool.AsyncClient) -> None:
        with pytest.raises(workerpool.Timeout):
            await client.infer(arange(1))

    run_async(server, body)
    assert len(server.wait_for_requests(FAST["retries"] + 1)) == FAST["retries"] + 1


def test_async_retry_succeeds_after_a_dropped_request(server: FakeServer) -> None:
    server.drop = 1

    async def body(client: workerpool.AsyncClient) -> None:
        np.testing.assert_array_equal(await client.infer(arange(3)), arange(3) * 2)

    run_async(server, body)
    assert len(server.requests) == 2


def test_async_stale_replies_are_discarded(server: FakeServer) -> None:
    server.stale = True

    async def body(client: workerpool.AsyncClient) -> None:
        for start in range(3):
            np.testing.assert_array_equal(
                await client.infer(arange(2, start)), arange(2, start) * 2
            )

    run_async(server, body)


def test_async_cancelled_call_leaves_the_client_usable(server: FakeServer) -> None:
    server.batch = 2  # the first request waits for a second one, then both are answered

    async def body(client: workerpool.AsyncClient) -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.infer(arange(1, 1)), 0.05)
        np.testing.assert_array_equal(await client.infer(arange(1, 2)), [4])
        server.batch = 1
        np.testing.assert_array_equal(await client.infer(arange(1, 3)), [6])

    run_async(server, body)


def test_async_concurrent_calls_are_pipelined(server: FakeServer) -> None:
    server.batch = 5  # nothing is answered until all five are in flight on the one socket

    async def body(client: workerpool.AsyncClient) -> list:
        return await asyncio.gather(*(client.infer(arange(2, i)) for i in range(5)))

    for i, output in enumerate(run_async(server, body)):
        np.testing.assert_array_equal(output, arange(2, i) * 2)


def test_async_infer_many_order_with_sync_and_async_inputs(server: FakeServer) -> None:
    server.batch = 3

    async def numbered() -> AsyncIterator[np.ndarray]:
        for i in range(9):
            yield arange(1, i)

    async def body(client: workerpool.AsyncClient) -> None:
        from_sync = [
            int(y[0]) async for y in client.infer_many([arange(1, i) for i in range(9)], window=3)
        ]
        from_async = [int(y[0]) async for y in client.infer_many(numbered(), window=3)]
        assert from_sync == from_async == [2 * i for i in range(9)]

    run_async(server, body)


def test_async_unsupported_dtype_raises_bad_request_without_sending(server: FakeServer) -> None:
    async def body(client: workerpool.AsyncClient) -> None:
        with pytest.raises(workerpool.BadRequest):
            await client.infer(np.array(["text"]))
        await client.infer(arange(1))

    run_async(server, body)
    assert len(server.wait_for_requests(1)) == 1


def test_async_close_fails_waiting_calls(server: FakeServer) -> None:
    server.drop = math.inf

    async def main() -> None:
        client = workerpool.AsyncClient(server.endpoint, timeout=30)
        waiting = asyncio.ensure_future(client.infer(arange(1)))
        await asyncio.to_thread(server.wait_for_requests, 1)
        await client.close()
        with pytest.raises(workerpool.WorkerpoolError, match="closed"):
            await waiting

    asyncio.run(main())


@pytest.mark.parametrize("client_class", [workerpool.Client, workerpool.AsyncClient])
def test_an_http_address_is_refused_naming_the_zeromq_endpoint(client_class: type) -> None:
    """``--http`` serves HTTP clients (KServe v2, OpenAI embeddings), not only metrics: the error
    says so and points at the ``tcp://`` endpoint of ``--bind``, which this client speaks to."""
    with pytest.raises(ValueError) as refused:
        client_class("http://127.0.0.1:8002")
    message = str(refused.value)
    assert "tcp://HOST:PORT, the server's --bind" in message
    assert "KServe v2" in message and "OpenAI embeddings" in message
