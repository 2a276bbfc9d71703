"""The queue in-process: fairness between clients, both limits, retries and deadlines.

``RequestQueue`` is checked directly; the intake over real ZeroMQ sockets on inproc://, in a
router with no worker, so every request has to wait.
"""

from __future__ import annotations

import itertools
import json

import pytest
import zmq

from workerpool.protocol import messages as protocol
from workerpool.protocol.route import read_route, route_for
from workerpool.protocol.transport import receive_batch
from workerpool.router.core import Router
from workerpool.router.queue import BYTES, COUNT, QueueFull, RequestQueue
from workerpool.router.requests import Part, Request

_endpoints = itertools.count()


ROUTE = read_route(protocol.encode_request(0, None)[1])


def request(client: str, number: int, size: int = 1, expires: float | None = None) -> Request:
    """A request of one row, received at its number (the newest has the highest)."""
    return Request(client.encode(), [f"{client}{number}".encode()], ROUTE, "m", float(number), size=size,
                   expires=expires)


def retried(client: str, number: int, **options) -> Part:
    return Part(request(client, number, **options), 0, 1, 0)


def names(items: list[Request | Part]) -> list[bytes]:
    return [(item.request if isinstance(item, Part) else item).frames[0] for item in items]


def admit(queue: RequestQueue, request: Request) -> list[bytes]:
    """Queue ``request`` as the backlog does; the names of the requests it evicted."""
    queue.check_room(request)
    evicted = queue.make_room(request)
    queue.put(request)
    return names(evicted)


def take(queue: RequestQueue) -> Part:
    return queue.take("m", 1)


def take_all(queue: RequestQueue) -> list[bytes]:
    """Everything queued, in the order workers take it."""
    taken = []
    while queue.has_work("m"):
        taken.append(take(queue))
    return names(taken)


# The queue.


def test_clients_are_served_in_turn():
    queue = RequestQueue(100)
    for number in (1, 2, 3):
        admit(queue, request("a", number))
    admit(queue, request("b", 1))
    admit(queue, request("c", 1))
    assert take_all(queue) == [b"a1", b"b1", b"c1", b"a2", b"a3"]


def test_a_newcomer_goes_before_a_flooders_second_request():
    queue = RequestQueue(1000)
    for number in range(1, 501):
        admit(queue, request("flood", number))
    assert names([take(queue)]) == [b"flood1"]
    admit(queue, request("late", 1))
    assert names([take(queue), take(queue)]) == [b"flood2", b"late1"]


def test_one_client_alone_fills_the_whole_count():
    queue = RequestQueue(5)
    for number in range(1, 6):
        assert admit(queue, request("a", number)) == []
    with pytest.raises(QueueFull) as full:
        queue.check_room(request("a", 6))
    assert full.value.limit == COUNT
    assert len(queue) == 5


def test_a_full_queue_evicts_the_newest_request_of_the_biggest_holder():
    queue = RequestQueue(4)
    for number in (1, 2, 3):
        admit(queue, request("a", number))
    admit(queue, request("b", 1))
    assert admit(queue, request("c", 1)) == [b"a3"]
    assert admit(queue, request("d", 1)) == [b"a2"]
    with pytest.raises(QueueFull):  # a holds one of four, its share among four clients
        queue.check_room(request("a", 4))
    with pytest.raises(QueueFull):
        queue.check_room(request("d", 2))
    assert take_all(queue) == [b"a1", b"b1", b"c1", b"d1"]


def test_a_client_evicted_of_its_last_request_loses_its_turn():
    queue = RequestQueue(100, max_bytes=1000)
    admit(queue, request("a", 1, size=600))
    assert admit(queue, request("b", 1, size=500)) == [b"a1"]
    assert queue.holders == 1
    admit(queue, request("a", 2, size=100))
    assert take_all(queue) == [b"b1", b"a2"]


def test_the_byte_limit_bounds_the_queue_and_is_shared_fairly():
    queue = RequestQueue(100, max_bytes=1000)
    admit(queue, request("a", 1, size=400))
    admit(queue, request("a", 2, size=400))
    with pytest.raises(QueueFull) as full:
        queue.check_room(request("a", 3, size=400))
    assert full.value.limit == BYTES
    assert admit(queue, request("b", 1, size=100)) == []  # it fits
    with pytest.raises(QueueFull):  # 400 bytes is more than a third of the limit
        queue.check_room(request("c", 1, size=400))
    assert admit(queue, request("c", 1, size=300)) == [b"a2"]
    assert queue.nbytes == 800 and len(queue) == 3
    with pytest.raises(QueueFull):  # larger than the whole limit
        queue.check_room(request("d", 1, size=1001))


def test_a_large_request_evicts_as_many_as_it_needs():
    queue = RequestQueue(100, max_bytes=1000)
    for number in range(1, 11):
        admit(queue, request("a", number, size=100))
    assert admit(queue, request("b", 1, size=350)) == [b"a10", b"a9", b"a8", b"a7"]
    assert queue.nbytes == 950


def test_without_a_byte_limit_only_the_count_bounds():
    queue = RequestQueue(3)
    for number in (1, 2, 3):
        admit(queue, request("a", number, size=1 << 40))
    assert queue.nbytes == 3 << 40


def test_retried_parts_go_first_and_are_never_evicted():
    queue = RequestQueue(3)
    admit(queue, request("a", 1))
    admit(queue, request("a", 2))
    queue.put_back(retried("r", 1))
    assert admit(queue, request("b", 1)) == [b"a2"]
    queue.put_back(retried("r", 2))  # past the limit: a retry is never refused
    assert len(queue) == 4
    with pytest.raises(QueueFull):  # the two retries leave room for one request, a's
        queue.check_room(request("c", 1))
    assert take_all(queue) == [b"r2", b"r1", b"a1", b"b1"]


def test_a_part_put_back_keeps_its_place():
    queue = RequestQueue(10)
    for client in "abc":
        admit(queue, request(client, 1))
    queue.put_back(take(queue))  # it could not be sent
    assert take_all(queue) == [b"a1", b"b1", b"c1"]


def test_a_request_in_parts_stays_at_the_head_of_its_line_and_its_turn_passes():
    queue = RequestQueue(10)
    big = request("a", 1)
    big.rows, big.split = 5, True
    admit(queue, big)
    admit(queue, request("b", 1))
    parts = [take(queue), take(queue), take(queue)]
    assert [(p.request.client, p.start, p.stop) for p in parts] == [(b"a", 0, 1), (b"b", 0, 1), (b"a", 1, 2)]
    assert len(queue) == 1 and queue.take("m", 3).stop == 5 and len(queue) == 0


def test_a_request_that_already_runs_is_never_evicted():
    queue = RequestQueue(2)
    started = request("a", 1)
    started.rows, started.split = 4, True
    admit(queue, started)
    take(queue)  # its first part runs; the rest waits
    admit(queue, request("a", 2))
    assert admit(queue, request("b", 1)) == [b"a2"]  # a's newest request that has not started
    assert take_all(queue) == [b"a1", b"b1", b"a1", b"a1"]


def test_when_started_requests_hold_the_room_a_newcomer_is_refused_and_nothing_is_evicted():
    """Evicting what may go would not make room: nothing goes, and the newcomer is told why."""
    queue = RequestQueue(10, max_bytes=100)
    started = request("a", 1, size=80)
    started.rows, started.split = 4, True
    admit(queue, started)
    take(queue)  # its first part runs: it may not be evicted
    admit(queue, request("a", 2, size=10))
    newcomer = request("b", 1, size=40)
    queue.check_room(newcomer)  # b holds nothing: within its share
    with pytest.raises(QueueFull) as full:
        queue.make_room(newcomer)
    assert full.value.started and full.value.limit == BYTES
    assert (len(queue), queue.nbytes) == (2, 90) and take_all(queue) == [b"a1", b"a1", b"a1", b"a2"]


def test_expired_requests_are_taken_out_of_every_line():
    queue = RequestQueue(10, max_bytes=1000)
    admit(queue, request("a", 1, size=10, expires=5.0))
    admit(queue, request("a", 2, size=20))
    admit(queue, request("b", 1, size=40, expires=5.0))
    queue.put_back(retried("r", 1, size=80, expires=5.0))
    admit(queue, request("c", 1, size=160))
    assert queue.take_expired(4.0) == []
    assert sorted(names(queue.take_expired(6.0))) == [b"a1", b"b1", b"r1"]
    assert (len(queue), queue.nbytes, queue.holders) == (2, 180, 2)
    assert take_all(queue) == [b"a2", b"c1"]


# The intake, over real sockets.


class Front:
    """A router with no worker, its client socket an inproc ROUTER."""

    def __init__(self, context: zmq.Context, **limits: int) -> None:
        self.context = context
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.endpoint = f"inproc://intake-{next(_endpoints)}"
        self.socket.bind(self.endpoint)
        self.router = Router(self, max_message_size=1 << 20, max_queue=limits.get("max_queue", 8),
                             max_queue_bytes=limits.get("max_queue_bytes"))
        self.router.add_model("m", {"inputs": []}, max_rows=1)
        self.queue = self.router.queue

    def client(self) -> zmq.Socket:
        sock = self.context.socket(zmq.DEALER)
        sock.connect(self.endpoint)
        return sock

    def send(self, sock: zmq.Socket, request_id: int, payload: bytes = b"") -> None:
        header = {"v": protocol.VERSION, "id": request_id, "method": "infer", "arrays": []}
        self.deliver(sock, [b"", route_for(header), json.dumps(header).encode(), payload])

    def deliver(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        """``frames`` sent by ``sock``, taken in by the intake, and what it answered sent back."""
        sock.send_multipart(frames)
        assert self.socket.poll(2000), "the request did not arrive"
        receive_batch(self.socket, self.router.receive, self.router.intake.overlong)
        while (reply := self.router.outbox.take()) is not None:  # what the router's shell does
            _, client, frames, _ = reply
            self.socket.send_multipart([client, b"", *frames])

    def queued_ids(self) -> list[int]:
        ids = []
        while self.queue.has_work("m"):
            ids.append(self.queue.take("m", 1).request.id)
        return ids


def refusal(sock: zmq.Socket) -> dict:
    assert sock.poll(2000), "no reply"
    frames = sock.recv_multipart()
    header = json.loads(frames[1])
    assert header["status"] == "error" and header["error"]["code"] == "overloaded", header
    return header


def test_a_flooders_newest_request_is_answered_overloaded_for_a_newcomer(context):
    front = Front(context, max_queue=3)
    flooder, newcomer = front.client(), front.client()
    for request_id in (1, 2, 3):
        front.send(flooder, request_id)
    front.send(flooder, 4)
    refused = refusal(flooder)
    assert refused["id"] == 4
    assert refused["error"]["message"] == "3 requests already queued (--max-queue 3)"
    front.send(newcomer, 100)
    evicted = refusal(flooder)
    assert evicted["id"] == 3 and "gave way" in evicted["error"]["message"]
    assert not newcomer.poll(0)
    assert front.queued_ids() == [1, 100, 2]


def test_a_request_past_the_byte_limit_is_refused_naming_the_flag(context):
    front = Front(context, max_queue=100, max_queue_bytes=10_000)
    sock = front.client()
    front.send(sock, 1, b"x" * 6000)
    front.send(sock, 2, b"x" * 6000)
    message = refusal(sock)["error"]["message"]
    assert "--max-queue-bytes 10000" in message, message
    assert front.queued_ids() == [1]


def test_a_queued_request_copies_its_small_frames(context):
    """A small frame libzmq received may share a receive buffer with others; a queued request
    keeps a copy instead, so what it holds is what the byte limit counts."""
    front = Front(context)
    sock = front.client()
    front.send(sock, 1, b"x" * (64 * 1024))
    route, header, payload = front.queue.take("m", 1).request.frames
    assert isinstance(route, bytes) and isinstance(header, bytes) and isinstance(payload, zmq.Frame)


def test_a_request_of_protocol_version_1_is_answered_with_its_id_and_what_to_do(context):
    """A version 1 client sends its JSON header where the route frame belongs."""
    front = Front(context)
    sock = front.client()
    front.deliver(sock, [b"", json.dumps({"v": 1, "id": 41, "method": "info"}).encode()])
    assert sock.poll(2000), "no reply"
    header = json.loads(sock.recv_multipart()[1])
    assert header["id"] == 41 and header["error"]["code"] == "bad_request"
    assert "protocol version 1" in header["error"]["message"] and "upgrade the client" in header["error"]["message"]
    assert len(front.queue) == 0
