"""A client that floods the server must neither starve the others nor fill the supervisor's
memory: a real server with 2 workers on loopback, a bounded flood from one DEALER.

Figures (latency, memory growth) are printed for ``pytest -s``; the assertions are generous
bounds on behaviour, not timings.
"""

from __future__ import annotations

import time

import numpy as np
import zmq
from support.commands import cli
from support.models import SLOW
from support.processes import vm_hwm
from support.server import Server
from support.sockets import dealer, f32, flood, free_port, raw_request, reply_header
from test_operate import scrape

import workerpool
from workerpool.control import client as control
from workerpool.protocol.route import route_for
from workerpool.units import MiB


def test_a_flooding_client_does_not_starve_another(small_model, context):
    """3000 requests of 0.2 s each from a client that never reads would keep both workers busy
    for 5 minutes; a second client is still served at once, in its turn."""
    with (
        Server(small_model, *SLOW, "--graceful-timeout", "1", workers=2) as server,
        dealer(context, server.endpoint, RCVHWM=1, RCVBUF=4096) as flooder,
    ):
        assert flood(flooder, np.full((1, 2), -0.2, np.float32), 3000) == 3000
        server.wait_for(lambda s: s["queue"]["depth"] >= 512)
        latencies = []
        with workerpool.Client(server.endpoint, timeout=10, retries=0) as client:
            for _ in range(3):
                started = time.monotonic()
                result = client.request(np.ones((1, 2), np.float32))
                latencies.append(time.monotonic() - started)
                assert np.array_equal(result.outputs, np.full((1, 2), 2.0, np.float32))
        depth = server.status()["queue"]["depth"]
        print(f"\nbeside the flooder ({depth} queued), requests answered in "
              f"{', '.join(f'{t:.3f}' for t in latencies)} s")
        assert max(latencies) < 10


def test_queued_bytes_are_bounded_and_the_rest_answered_overloaded(small_model, context):
    """6000 requests of 16 KiB (94 MiB) against a queue of unbounded count: --max-queue-bytes
    alone keeps the supervisor's memory near its bound, and answers the rest ``overloaded``.
    The slack is for the interpreter, the replies and the requests on their way in."""
    limit, count = 16 * MiB, 6000
    x = np.full((1, 4096), -0.2, np.float32)
    with Server(small_model, *SLOW, "--max-queue", "100000", "--max-queue-bytes", str(limit),
                "--graceful-timeout", "1", workers=2) as server:
        baseline = vm_hwm(server.proc.pid)
        with dealer(context, server.endpoint) as flooder:
            replies = flood_in_rounds(server, flooder, x, count)
            growth = vm_hwm(server.proc.pid) - baseline
            depth = server.status()["queue"]["depth"]
        refused = [r for r in replies if r["status"] == "error"]
        print(f"\n{count} requests of {x.nbytes} bytes: {depth} queued, {len(refused)} refused; "
              f"supervisor peak memory grew by {growth / MiB:.1f} MiB")
        assert growth < limit + 24 * MiB
        assert depth * x.nbytes <= limit
        assert refused and all(r["error"]["code"] == "overloaded" for r in refused), refused[:3]
        assert f"--max-queue-bytes {limit}" in refused[0]["error"]["message"], refused[0]


def flood_in_rounds(server: Server, sock: zmq.Socket, x: np.ndarray, count: int,
                    size: int = 100) -> list[dict]:
    """Send ``count`` requests for ``x``, ``size`` at a time, each round once the server has
    taken in the last (each request answered, queued or in flight), so that no reply is
    dropped and what the server holds is what it queued; the replies received."""
    request = [*raw_request(0, [f32(list(x.shape))]), x]
    replies: list[dict] = []
    sent = 0
    while sent < count:
        batch = min(size, count - sent)
        for _ in range(batch):
            sock.send_multipart(request, copy=False)
        sent += batch
        take_in(server, sock, sent, replies)
    return replies


def take_in(server: Server, sock: zmq.Socket, sent: int, replies: list[dict],
            timeout: float = 30.0) -> None:
    """Read ``sock``'s replies into ``replies`` until the server has taken in ``sent`` requests.
    Replies are read before each status, so a request answered in between is missed, never
    counted twice."""
    deadline = time.monotonic() + timeout
    while True:
        while sock.poll(0):
            replies.append(reply_header(sock.recv_multipart()))
        queue = control.call(server.control, "status", timeout=5.0, memory=False)["queue"]
        if len(replies) + queue["depth"] + queue["in_flight"] >= sent:
            return
        assert time.monotonic() < deadline, f"taken in: {len(replies)} replies and {queue}"
        sock.poll(50)


def test_rows_are_counted_as_workers_ran_them_never_as_route_frames_claim(small_model, context):
    """A raw client's route frames that lie about a request's rows (2**64 - 1 of them, 2**32,
    none, more than it holds) reach the worker, which refuses them (the model declares a batch
    axis and is never cut into parts, so the router checks no bytes): ``status`` and ``/metrics``
    count none of those rows; an honest request of 3 rows counts 3."""
    model = "hostile_models:factory"  # float32 [B, 4] in; [[0, ...]] rows are answered
    with Server(small_model, "--model", model, "--http", f"127.0.0.1:{free_port()}", workers=1) as server, \
            dealer(context, server.endpoint) as sock:
        one = np.zeros((1, 4), np.float32)
        for request_id, claimed in enumerate(([2**64 - 1, 4], [2**32, 4], [0, 4], [3, 4]), 1):
            _, _, header = raw_request(request_id, [f32([1, 4])])
            lie = route_for({"method": "infer", "arrays": [f32(claimed)]})
            sock.send_multipart([b"", lie, header, one.tobytes()])
            assert sock.poll(10_000), "no reply"
            assert reply_header(sock.recv_multipart())["error"]["code"] == "bad_request"
        sock.send_multipart([*raw_request(9, [f32([3, 4])]), np.zeros((3, 4), np.float32).tobytes()])
        assert sock.poll(10_000), "no reply"
        assert reply_header(sock.recv_multipart())["status"] == "ok"
        worker = server.status(memory=False)["workers"][0]
        assert (worker["served"], worker["errors"], worker["rows"], worker["batch_sizes"]) == (5, 4, 3, {"4": 1})
        samples = scrape(server.status(memory=False)["http"])
        served = (("model", "small"),)
        assert samples["workerpool_batch_rows_sum"][served] == 3
        assert samples["workerpool_batch_rows_count"][served] == 1
        shown = cli("status", "--control", server.control, timeout=30)
        assert shown.returncode == 0 and "batches: 1 carrying 3 rows" in shown.stdout, shown.stdout
