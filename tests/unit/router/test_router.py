"""The router with its shell in-process: real ZeroMQ sockets over inproc:// and real links, a
test driving its loop.

Workers here are the worker's end of a link (local) or DEALER sockets (remote) that speak the
backend protocol by hand, so every routing rule is checked without starting a process.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import time
from collections.abc import Callable

import numpy as np
import pytest
import zmq

from workerpool.events.loop import Loop
from workerpool.protocol import link
from workerpool.protocol import messages as protocol
from workerpool.protocol.link import Link
from workerpool.router.batching import BatchPolicy
from workerpool.router.core import Router
from workerpool.router.links import RouterLinks
from workerpool.router.local_links import LocalLinks
from workerpool.router.registry import WorkerRecord
from workerpool.router.sockets import bind_sockets

SIGNATURE = {"inputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}],
             "outputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}]}
_endpoints = itertools.count()
_pools: list[Pool] = []


@pytest.fixture(autouse=True)
def _close_links():
    yield
    while _pools:
        _pools.pop().close()


class Pool:
    """A router with the events it reported, driven by ``pump``."""

    def __init__(self, context: zmq.Context, **options) -> None:
        n = next(_endpoints)
        self.context = context
        self.events: list[tuple[str, int]] = []
        self.stopped_pids: set[int] = set()  # what /proc would say is stopped
        sockets = bind_sockets(context, frontend=f"inproc://front-{n}", remote_backend=f"inproc://remote-{n}",
                               max_message_size=1 << 20)
        self.signature = options.pop("signature", SIGNATURE)
        policy = {key: options.pop(key) for key in ("max_rows", "wait", "budget") if key in options}
        self.router = Router(self, max_queue=options.pop("max_queue", 8), max_message_size=1 << 20, **options)
        self.router.add_model("m", self.signature, max_rows=policy.get("max_rows", 1), wait=policy.get("wait", 0.0),
                              budget=policy.get("budget", 0.0))
        self.loop = Loop(idle_timeout=0.01)
        self.ends: list[LinkWorker] = []  # the workers' ends of the links, closed after the test
        _pools.append(self)
        self.links = RouterLinks(sockets, self.router, LocalLinks(self.loop, self.router))
        self.remote_endpoint = f"inproc://remote-{n}"
        self.loop.read(self.links.frontend, self.links.on_frontend)
        self.loop.read(self.links.remote, self.links.on_remote_backend)
        self.loop.after_each_turn(self.links.flush)

    def worker_ready(self, worker: WorkerRecord) -> None:
        self.events.append(("ready", worker.pid))

    def worker_lost(self, worker: WorkerRecord, why: str) -> None:
        self.events.append(("lost", worker.pid))

    def reload_failed(self, worker: WorkerRecord, model: str, why: str) -> None:
        self.events.append(("reload failed", worker.pid))

    def models_changed(self, worker: WorkerRecord) -> None:
        self.events.append(("models", worker.pid))

    def started_here(self, token: str | None) -> bool:
        return token != "forged"

    def stopped(self, worker: WorkerRecord) -> bool:
        return worker.pid in self.stopped_pids

    def pump(self, until: Callable[[], bool], timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "condition not met"
            self.loop.turn()
            self.router.tick()
            self.links.flush()

    def client(self) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.connect(self.links.endpoint)
        return sock

    def worker(self, pid: int, *, remote: bool = False, **ready) -> zmq.Socket | LinkWorker:
        sock = self.remote_worker(pid) if remote else self.local_worker()
        model = {"generation": 1, "model": "m", "batching": ready.pop("batching", False), **self.signature}
        model.update({key: ready.pop(key) for key in ("inputs", "generation") if key in ready})
        info = {"pid": pid, "host": "h", "models": {"m": model}, **ready}
        sock.send_multipart([protocol.READY, json.dumps(info).encode()])
        return sock

    def local_worker(self) -> LinkWorker:
        """A new link: the router reads one end, the test speaks for the worker at the other."""
        ours, theirs = link.pair()
        self.links.local.attach(ours)
        self.ends.append(LinkWorker(theirs))
        return self.ends[-1]

    def close(self) -> None:
        self.links.local.close()
        for end in self.ends:
            end.close()

    def remote_worker(self, pid: int) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, f"w{pid}".encode())
        sock.connect(self.remote_endpoint)
        return sock

    def registered(self) -> set[int]:
        return {w.pid for w in self.router.workers}


class LinkWorker:
    """A local worker's end of its link, read and written as the tests read a DEALER."""

    def __init__(self, sock: socket.socket) -> None:
        self.link = Link(sock)

    def send_multipart(self, frames: list) -> None:
        self.link.send(frames)

    def recv_multipart(self) -> list[bytes]:
        frames = self.link.receive()
        assert frames is not None
        return [frame.bytes for frame in frames]

    def poll(self, timeout: int = 0) -> bool:
        return bool(select.select([self.link.sock], [], [], timeout / 1000)[0])

    def close(self, linger: int | None = None) -> None:
        self.link.close()


def request(client: zmq.Socket, request_id: int, rows: int = 1, **kwargs) -> None:
    client.send_multipart(protocol.encode_request(request_id, np.zeros((rows, 4), np.float32), **kwargs))


def received(sock: zmq.Socket | LinkWorker) -> Callable[[], bool]:
    return lambda: bool(sock.poll(0))


def reply_to(worker: zmq.Socket) -> int:
    """Answer the request waiting on a fake worker; returns its id."""
    frames = worker.recv_multipart()
    assert frames[0] == protocol.REQUEST
    request_id = protocol.decode_header(frames[5])["id"]
    worker.send_multipart([protocol.REPLY, frames[2], b"ok", *protocol.encode_reply(request_id)])
    return request_id


def answer(client: zmq.Socket) -> dict:
    frames = client.recv_multipart()
    return protocol.decode_reply(frames[1:]).header


def answers(pool: Pool, client: zmq.Socket, count: int) -> list[dict]:
    replies = []
    for _ in range(count):
        pool.pump(received(client))
        replies.append(answer(client))
    return replies


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
    assert [(w.served, w.failed_last) for w in pool.router.workers] == [(1, False)]
    request(client, 8)
    pool.pump(received(worker))
    frames = worker.recv_multipart()
    worker.send_multipart([protocol.REPLY, frames[2], b"err",
                           *protocol.encode_error(8, "internal", "the model failed")])
    pool.pump(received(client))
    assert answer(client)["error"]["code"] == "internal"
    assert [(w.served, w.errors, w.failed_last) for w in pool.router.workers] == [(2, 1, True)]


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

    def sent() -> bool:  # handed to a worker, not merely put in the outbox
        return pool.router.in_flight == 1 and not pool.router.outbox

    pool.pump(sent)
    busy = next(w for w in pool.router.workers if w.inflight)
    pool.router.lose(busy.key, "test")
    pool.pump(sent)
    retried = next(w for w in pool.router.workers if w.inflight)
    assert retried.pid != busy.pid
    pool.router.lose(retried.key, "test")
    pool.pump(received(client))
    assert answer(client)["error"]["code"] == "worker_failed"
    assert ("lost", 1) in pool.events and ("lost", 2) in pool.events
    first.close(0)
    second.close(0)


def test_a_worker_whose_model_does_not_fit_is_refused(context):
    pool = Pool(context)
    worker = pool.worker(5, inputs=[{"name": None, "dtype": "<f4", "shape": [None, 8]}])
    pool.pump(received(worker))
    frames = worker.recv_multipart()
    assert frames[0] == protocol.REFUSE and b"input" in frames[1]
    assert pool.registered() == set()


@pytest.mark.parametrize("ready", [b"not json", b"{}", b'{"pid": "1", "host": "h", "models": {"m": {"generation": 1}}}',
                                   b'{"pid": 1, "host": "h", "models": {"m": {"generation": "1"}}}',
                                   b'{"pid": 1, "host": "h", "models": {}}'])
def test_a_malformed_ready_is_ignored(context, ready):
    pool = Pool(context)
    sock = pool.local_worker()
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


# Batching: what a free worker is sent when requests wait.


def batched_pool(context: zmq.Context, max_rows: int = 8, **options) -> Pool:
    return Pool(context, max_queue=64, max_rows=max_rows, **options)


def queued(pool: Pool, count: int) -> Callable[[], bool]:
    return lambda: pool.router.queue_depth == count


def next_message(pool: Pool, worker: zmq.Socket) -> list[bytes]:
    """The next message a fake worker is sent, heartbeats skipped."""
    while True:
        pool.pump(received(worker))
        frames = worker.recv_multipart()
        if frames[0] != protocol.HEARTBEAT:
            return frames


def batch_ids(pool: Pool, worker: zmq.Socket) -> list[int]:
    """The ids of the next message a fake worker is sent: one for a REQUEST, all of a BATCH."""
    frames = next_message(pool, worker)
    if frames[0] == protocol.REQUEST:
        return [protocol.decode_header(frames[5])["id"]]
    assert frames[:3] == [protocol.BATCH, b"m", b"5"] and len(frames) % 5 == 3
    return [protocol.decode_header(frames[i + 3])["id"] for i in range(3, len(frames), 5)]


def busy_with_one(pool: Pool, client: zmq.Socket, **ready) -> zmq.Socket:
    """A batching worker, busy with request 0 while the test queues more."""
    worker = pool.worker(1, batching=True, **ready)
    pool.pump(lambda: pool.registered() == {1})
    request(client, 0)
    assert batch_ids(pool, worker) == [0]
    return worker


def three_queued(pool: Pool) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket]:
    """Requests 1 and 2 of one client and 3 of another, queued behind a busy batching worker."""
    client, other = pool.client(), pool.client()
    worker = busy_with_one(pool, client)
    for request_id in (1, 2):
        request(client, request_id)
    request(other, 3)
    pool.pump(queued(pool, 3))
    return client, other, worker


def test_requests_queued_behind_a_busy_worker_go_to_it_as_one_batch_answered_in_order(context):
    pool = batched_pool(context)
    client, other, worker = three_queued(pool)
    assert sorted(batch_ids_after_reply(pool, worker)) == [1, 2, 3]
    assert pool.router.in_flight == 3
    for part in list(pool.router.workers[0].inflight):
        worker.send_multipart([protocol.REPLY, part.request.client, b"ok",
                               *protocol.encode_reply(part.request.id)])
    pool.pump(lambda: pool.router.in_flight == 0 and client.poll(0) and other.poll(0))
    assert [answer(client)["id"] for _ in range(3)] == [0, 1, 2]
    assert answer(other)["id"] == 3
    record = pool.router.workers[0]
    assert (record.served, record.batches, record.rows, record.batch_sizes) == (4, 2, 4, {1: 1, 4: 1})


def test_max_batch_bounds_rows_and_a_larger_request_runs_in_parts(context):
    pool = batched_pool(context, max_rows=4, signature={**SIGNATURE, "batching": True})
    client = pool.client()
    worker = busy_with_one(pool, client)
    for request_id, rows in ((1, 1), (2, 2), (3, 2), (4, 6)):
        request(client, request_id, rows)
    pool.pump(queued(pool, 4))
    # request 4's first part fills the pass request 3 leaves room in; its other 4 rows go next
    assert [batch_ids_after_reply(pool, worker) for _ in range(3)] == [[1, 2], [3, 4], [4]]
    assert pool.router.workers[0].batch_sizes == {1: 1, 4: 2}  # the last, not answered yet, is not counted


def test_a_request_that_does_not_fit_ends_the_batch_and_waits_its_turn(context):
    pool = batched_pool(context)
    client = pool.client()
    worker = busy_with_one(pool, client)
    request(client, 1)
    client.send_multipart(protocol.encode_request(2, np.zeros((1, 4), np.float64)))  # another dtype
    request(client, 3)
    pool.pump(queued(pool, 3))
    assert batch_ids_after_reply(pool, worker) == [1]
    assert batch_ids_after_reply(pool, worker) == [2]
    assert batch_ids_after_reply(pool, worker) == [3]


def batch_ids_after_reply(pool: Pool, worker: zmq.Socket) -> list[int]:
    """Answer everything the fake worker holds; the ids of what it is sent next."""
    record = pool.router.workers[0]
    held = record.inflight
    while held and record.inflight is held:
        count = len(held)
        worker.send_multipart([protocol.REPLY, held[0].request.client, b"ok", *protocol.encode_reply(0)])
        pool.pump(lambda count=count: len(held) != count)
    return batch_ids(pool, worker)


def test_a_worker_that_does_not_batch_is_sent_one_request_at_a_time(context):
    pool = batched_pool(context)
    client = pool.client()
    worker = pool.worker(1)  # says nothing of batching
    pool.pump(lambda: pool.registered() == {1})
    for request_id in range(4):
        request(client, request_id)
    pool.pump(lambda: pool.router.queue_depth == 3)
    assert batch_ids(pool, worker) == [0]
    assert [batch_ids_after_reply(pool, worker) for _ in range(3)] == [[1], [2], [3]]


def test_a_queued_request_past_its_deadline_is_answered_not_batched(context):
    pool = batched_pool(context)
    client = pool.client()
    worker = busy_with_one(pool, client)
    request(client, 1, deadline_ms=30)
    request(client, 2)
    pool.pump(queued(pool, 2))
    expired = time.monotonic() + 0.05
    pool.pump(lambda: time.monotonic() > expired or pool.router.queue_depth < 2)
    assert batch_ids_after_reply(pool, worker) == [2]
    replies = {h["id"]: h for h in answers(pool, client, 2)}
    assert replies[0]["status"] == "ok" and replies[1]["error"]["code"] == "deadline_exceeded"


def test_a_lost_batch_is_retried_request_by_request_without_blaming_its_clients(context):
    pool = batched_pool(context)
    client, other, worker = three_queued(pool)
    assert batch_ids_after_reply(pool, worker) == [1, 3, 2]  # the clients' lines in turn
    spare = pool.worker(2, batching=True)
    pool.pump(lambda: pool.registered() == {1, 2})
    pool.router.lose(next(w for w in pool.router.workers if w.pid == 1).key, "test")
    sent = []
    for _ in range(3):  # each alone, in the order they had
        frames = next_message(pool, spare)
        assert frames[0] == protocol.REQUEST
        sent.append(protocol.decode_header(frames[5])["id"])
        spare.send_multipart([protocol.REPLY, frames[2], b"ok", *protocol.encode_reply(sent[-1])])
    assert sent == [1, 3, 2]
    pool.pump(lambda: pool.router.in_flight == 0)
    assert not pool.router.backlog.quarantine  # nothing tells which of the two clients killed it
    assert sorted(h["id"] for h in answers(pool, client, 3)) == [0, 1, 2]
    assert answers(pool, other, 1)[0]["id"] == 3


def test_a_lost_batch_of_one_clients_requests_blames_it_for_nothing(context):
    pool = batched_pool(context)
    client = pool.client()
    worker = busy_with_one(pool, client)
    request(client, 1)
    request(client, 2)
    pool.pump(queued(pool, 2))
    assert batch_ids_after_reply(pool, worker) == [1, 2]
    record = pool.router.workers[0]
    pool.router.lose(record.key, "test")
    assert not pool.router.backlog.quarantine


def test_a_batch_holds_only_clients_that_may_see_the_worker_generation(context):
    pool = batched_pool(context)
    client, newer, third = pool.client(), pool.client(), pool.client()
    worker = busy_with_one(pool, client, remote=True)  # a worker host: the rollout leaves it be
    local = pool.worker(2)  # kept busy, so that the rollout stays under way
    pool.pump(lambda: pool.registered() == {1, 2})
    request(third, 9)
    pool.pump(lambda: pool.router.in_flight == 2)
    pool.router.begin_rollout("m", 2, b"{}")
    request(client, 1)
    request(newer, 2)
    pool.pump(queued(pool, 2))
    newcomer = next(r.client for r in pool.router.queue.everything() if r.client != worker_client(pool))
    pool.router.scheduler.models["m"].rollout.answered(newcomer, 2)  # this client already saw generation 2
    assert batch_ids_after_reply(pool, worker) == [1]
    assert pool.router.queue_depth == 1  # request 2 waits for a worker of generation 2
    local.close(0)


def worker_client(pool: Pool) -> bytes:
    return pool.router.workers[0].inflight[0].request.client


def test_local_workers_past_the_running_cap_wait_and_the_queue_goes_as_one_batch(context):
    pool = batched_pool(context, running_cap=1)
    pool.router.policies["m"].service = 60.0  # a run "takes" a minute: nothing is released early
    client = pool.client()
    worker = busy_with_one(pool, client)
    idle = pool.worker(2, batching=True)
    pool.pump(lambda: pool.registered() == {1, 2})
    for request_id in (1, 2, 3):
        request(client, request_id)
    pool.pump(queued(pool, 3))
    settled = time.monotonic() + 0.05
    pool.pump(lambda: time.monotonic() > settled)
    assert not idle.poll(0)  # free, but one local worker already uses the only core
    worker.send_multipart([protocol.REPLY, worker_client(pool), b"ok", *protocol.encode_reply(0)])
    pool.pump(lambda: pool.router.in_flight == 3)
    assert sorted(len(w.inflight) for w in pool.router.workers) == [0, 3]  # one batch of all three


def test_a_request_held_past_a_typical_run_goes_to_an_idle_worker(context):
    pool = batched_pool(context, running_cap=1)
    pool.router.policies["m"].service = 0.05
    client = pool.client()
    busy_with_one(pool, client)  # and never answers
    idle = pool.worker(2, batching=True)
    pool.pump(lambda: pool.registered() == {1, 2})
    request(client, 1)
    assert batch_ids(pool, idle) == [1]


def test_batch_wait_lets_requests_arriving_together_share_a_pass(context):
    pool = batched_pool(context, wait=0.2)
    client = pool.client()
    worker = pool.worker(1, batching=True)
    pool.pump(lambda: pool.registered() == {1})
    for request_id in (1, 2, 3):
        request(client, request_id)
    assert batch_ids(pool, worker) == [1, 2, 3]


def test_empty_requests_count_as_a_row_each_against_max_batch(context):
    pool = batched_pool(context, max_rows=2)
    client = pool.client()
    worker = busy_with_one(pool, client)
    for request_id in (1, 2, 3):
        request(client, request_id, rows=0)
    pool.pump(queued(pool, 3))
    assert batch_ids_after_reply(pool, worker) == [1, 2]
    assert batch_ids_after_reply(pool, worker) == [3]


@pytest.mark.parametrize("case", ["worker does not batch", "info request", "deadline before the wait ends",
                                  "more rows than max-batch"])
def test_a_request_that_cannot_share_a_pass_is_not_held_for_one(context, case):
    pool = batched_pool(context, max_rows=4, wait=60.0)  # a held request would wait a minute
    client = pool.client()
    worker = pool.worker(1, batching=case != "worker does not batch")
    pool.pump(lambda: pool.registered() == {1})
    if case == "info request":
        client.send_multipart(protocol.encode_request(1, None, method="info"))
    else:
        request(client, 1, rows=8 if case == "more rows than max-batch" else 1,
                deadline_ms=1000 if case == "deadline before the wait ends" else None)
    assert batch_ids(pool, worker) == [1]


def test_texts_batch_as_one_list_of_texts(context):
    pool = Pool(context, max_queue=64, signature={"inputs": [{"name": None, "dtype": "text", "shape": [None]}]},
                max_rows=4)
    client = pool.client()
    worker = busy_with_one(pool, client)  # request 0: an array, which a text model refuses alone
    for request_id, texts in ((1, ["a", "b"]), (2, ["c"]), (3, ["d", "e"])):
        client.send_multipart(protocol.encode_request(request_id, texts))
    pool.pump(queued(pool, 3))
    record = pool.router.workers[0]
    worker.send_multipart([protocol.REPLY, record.inflight[0].request.client, b"ok", *protocol.encode_reply(0)])
    frames = next_message(pool, worker)
    assert frames[:3] == [protocol.BATCH, b"m", b"5"] and len(frames) == 13  # client, part, route, header, texts
    assert [bytes(frames[i]) for i in (7, 12)] == [b"ab", b"c"]
    assert sum(part.rows for part in record.inflight) == 3  # three texts; ["d", "e"] would make five


def test_texts_join_a_message_only_while_the_pass_budget_has_room(context):
    pool = Pool(context, max_queue=64, signature={"inputs": [{"name": None, "dtype": "text", "shape": [None]}]},
                max_rows=32, budget=0.03)
    policy = pool.router.policies["m"]
    policy.row_seconds = 0.01  # as measured: a text takes 10 ms, so 3 fit in 30 ms
    client = pool.client()
    worker = busy_with_one(pool, client)
    for request_id, texts in ((1, ["a", "b", "c", "d"]), *((n, [str(n)]) for n in range(2, 6))):
        client.send_multipart(protocol.encode_request(request_id, texts))
    pool.pump(queued(pool, 5))
    record = pool.router.workers[0]
    worker.send_multipart([protocol.REPLY, record.inflight[0].request.client, b"ok", *protocol.encode_reply(0)])
    next_message(pool, worker)
    assert [part.rows for part in record.inflight] == [4]  # the head goes whole, over the budget, alone
    worker.send_multipart([protocol.REPLY, record.inflight[0].request.client, b"ok", *protocol.encode_reply(1)])
    next_message(pool, worker)  # that pass taught the policy a text takes a little less: still 3 fit
    assert 0.0075 < policy.row_seconds <= 0.01
    assert [part.rows for part in record.inflight] == [1, 1, 1]  # the fourth waits for the next pass


def test_the_pass_budget_bounds_texts_only_and_by_the_measured_time_per_text():
    texts = BatchPolicy(max_rows=32, budget=0.025, text=True)
    assert texts.batch_rows == 32  # nothing measured yet
    texts.finished(0.05, 5)
    assert texts.row_seconds == 0.01 and texts.batch_rows == 2
    texts.budget = 0.0
    assert texts.batch_rows == 32
    arrays = BatchPolicy(max_rows=32, budget=0.025, rank=2)
    arrays.finished(0.05, 5)
    assert arrays.batch_rows == 32
