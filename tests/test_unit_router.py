"""The router in-process: real ZeroMQ sockets over inproc://, a test driving its loop.

Workers here are DEALER sockets that speak the backend protocol by hand, so every routing rule
is checked without starting a process.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq

from workerpool import protocol
from workerpool.registry import WorkerRecord
from workerpool.router import Router

SIGNATURE = {"input_shape": [None, 4], "input_dtype": "<f4"}
_endpoints = itertools.count()


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


class Pool:
    """A router with the events it reported, driven by ``pump``."""

    def __init__(self, context: zmq.Context, **options) -> None:
        n = next(_endpoints)
        self.context = context
        self.events: list[tuple[str, int]] = []
        self.router = Router(
            context, self, frontend=f"inproc://front-{n}", backend=f"inproc://back-{n}",
            remote_backend=f"inproc://remote-{n}", max_queue=options.pop("max_queue", 8),
            max_message_size=1 << 20, signature=SIGNATURE, **options,
        )
        self.remote_endpoint = f"inproc://remote-{n}"
        self.poller = zmq.Poller()
        for sock in (self.router.frontend, self.router.backend, self.router.remote):
            self.poller.register(sock, zmq.POLLIN)

    def worker_ready(self, worker: WorkerRecord) -> None:
        self.events.append(("ready", worker.pid))

    def worker_lost(self, worker: WorkerRecord, why: str) -> None:
        self.events.append(("lost", worker.pid))

    def reload_failed(self, worker: WorkerRecord, why: str) -> None:
        self.events.append(("reload failed", worker.pid))

    def started_here(self, token: str | None) -> bool:
        return token != "forged"

    def pump(self, until: Callable[[], bool], timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "condition not met"
            events = dict(self.poller.poll(10))
            if self.router.frontend in events:
                self.router.intake.on_readable()
            if self.router.backend in events:
                self.router.on_backend()
            if self.router.remote in events:
                self.router.on_remote_backend(self.router.remote)
            self.router.tick()

    def client(self) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.connect(self.router.endpoint)
        return sock

    def worker(self, pid: int, *, remote: bool = False, **ready) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, f"w{pid}".encode())
        sock.connect(self.remote_endpoint if remote else self.router.backend_endpoint)
        info = {"pid": pid, "host": "h", "generation": 1, "model": "m", **SIGNATURE, **ready}
        sock.send_multipart([protocol.READY, json.dumps(info).encode()])
        return sock

    def registered(self) -> set[int]:
        return {w.pid for w in self.router.workers}


def request(client: zmq.Socket, request_id: int, **kwargs) -> None:
    client.send_multipart(protocol.encode_request(request_id, np.zeros((1, 4), np.float32), **kwargs))


def received(sock: zmq.Socket) -> Callable[[], bool]:
    return lambda: bool(sock.poll(0))


def reply_to(worker: zmq.Socket) -> int:
    """Answer the request waiting on a fake worker; returns its id."""
    frames = worker.recv_multipart()
    assert frames[0] == protocol.REQUEST
    request_id = protocol.decode_header(frames[2])["id"]
    worker.send_multipart([protocol.REPLY, frames[1], b"ok", *protocol.encode_reply(request_id)])
    return request_id


def answer(client: zmq.Socket) -> dict:
    frames = client.recv_multipart()
    return protocol.decode_reply(frames[1:]).header


def test_a_request_goes_to_a_free_worker_and_the_reply_comes_back(context):
    pool = Pool(context)
    worker = pool.worker(101)
    pool.pump(lambda: pool.registered() == {101})
    assert pool.events == [("ready", 101)]
    client = pool.client()
    request(client, 7)
    pool.pump(received(worker))
    assert reply_to(worker) == 7
    pool.pump(received(client))
    assert answer(client)["id"] == 7
    assert [w.served for w in pool.router.workers] == [1]


def test_a_busy_worker_is_skipped_and_requests_wait_for_a_free_one(context):
    pool = Pool(context)
    first, second = pool.worker(1), pool.worker(2)
    pool.pump(lambda: pool.registered() == {1, 2})
    client = pool.client()
    for request_id in (1, 2, 3):
        request(client, request_id)
    pool.pump(lambda: pool.router.in_flight == 2 and pool.router.queue_depth == 1)
    assert {reply_to(first), reply_to(second)} == {1, 2}
    pool.pump(lambda: pool.router.queue_depth == 0 and pool.router.in_flight == 1)


def test_a_full_queue_answers_overloaded(context):
    pool = Pool(context, max_queue=1)
    client = pool.client()
    request(client, 1)
    request(client, 2)
    pool.pump(received(client))
    header = answer(client)
    assert (header["id"], header["error"]["code"]) == (2, "overloaded")
    assert pool.router.queue_depth == 1


def test_a_lost_worker_request_is_retried_once_then_fails(context):
    pool = Pool(context)
    first, second = pool.worker(1), pool.worker(2)
    pool.pump(lambda: pool.registered() == {1, 2})
    client = pool.client()
    request(client, 9)
    pool.pump(lambda: pool.router.in_flight == 1)
    busy = next(w for w in pool.router.workers if w.inflight is not None)
    pool.router.lose(busy.key, "test")
    pool.pump(lambda: pool.router.in_flight == 1)
    retried = next(w for w in pool.router.workers if w.inflight is not None)
    assert retried.pid != busy.pid
    pool.router.lose(retried.key, "test")
    pool.pump(received(client))
    assert answer(client)["error"]["code"] == "worker_failed"
    assert ("lost", 1) in pool.events and ("lost", 2) in pool.events
    first.close(0)
    second.close(0)


def test_a_worker_whose_model_does_not_fit_is_refused(context):
    pool = Pool(context)
    worker = pool.worker(5, input_shape=[None, 8])
    pool.pump(received(worker))
    frames = worker.recv_multipart()
    assert frames[0] == protocol.REFUSE and b"input" in frames[1]
    assert pool.registered() == set()


@pytest.mark.parametrize("ready", [b"not json", b"{}", b'{"pid": "1", "generation": 1, "host": "h", "model": "m"}'])
def test_a_malformed_ready_is_ignored(context, ready):
    pool = Pool(context)
    sock = context.socket(zmq.DEALER)
    sock.connect(pool.router.backend_endpoint)
    sock.send_multipart([protocol.READY, ready])
    sock.send_multipart([protocol.HEARTBEAT])
    pool.pump(received(sock))
    assert sock.recv_multipart() == [protocol.WHO]  # still unknown, so asked who it is
    assert pool.registered() == set()


def test_the_socket_not_the_message_says_whether_a_worker_is_local(context):
    pool = Pool(context)
    pool.worker(3, token="t3")
    pool.worker(3, remote=True, local=True, token="t3")  # same routing id, pid and token
    pool.pump(lambda: len(pool.router.workers) == 2)
    by_locality = {w.local: w for w in pool.router.workers}
    assert by_locality[True].token == "t3" and by_locality[False].token is None
    pool.router.worker_exited("t3", "exited")  # the supervisor reaped the child it gave t3
    assert [w.local for w in pool.router.workers] == [False]


def test_a_local_worker_this_pool_did_not_start_is_refused(context):
    pool = Pool(context)
    forger = pool.worker(4, token="forged")
    pool.pump(received(forger))
    assert forger.recv_multipart()[0] == protocol.REFUSE
    pool.worker(5, remote=True, token="forged")  # a worker host's workers prove themselves by CURVE
    pool.pump(lambda: pool.registered() == {5})


def test_after_stop_accepting_new_requests_are_answered_shutting_down(context):
    pool = Pool(context)
    pool.router.stop_accepting()
    client = pool.client()
    request(client, 4)
    pool.pump(received(client))
    assert answer(client)["error"]["code"] == "shutting_down"


def test_a_queued_request_past_its_deadline_is_answered_deadline_exceeded(context):
    pool = Pool(context)
    client = pool.client()
    request(client, 6, deadline_ms=20)
    pool.pump(received(client))
    assert answer(client)["error"]["code"] == "deadline_exceeded"
    assert pool.router.queue_depth == 0


def test_fail_all_answers_queued_and_in_flight_requests(context):
    pool = Pool(context)
    pool.worker(1)
    pool.pump(lambda: pool.registered() == {1})
    client = pool.client()
    request(client, 1)
    request(client, 2)
    pool.pump(lambda: pool.router.unfinished == 2)
    pool.router.fail_all("shutting_down", "bye")
    pool.pump(lambda: client.poll(0) and pool.router.unfinished == 0)
    codes = {answer(client)["error"]["code"] for _ in range(2)}
    assert codes == {"shutting_down"}
