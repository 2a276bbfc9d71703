"""Raw ZeroMQ sockets and hand-made protocol frames, for tests that speak the wire themselves."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from workerpool.protocol import messages as protocol
from workerpool.protocol.route import route_for


@contextlib.contextmanager
def dealer(context: zmq.Context, endpoint: str, **options: int) -> Iterator[zmq.Socket]:
    """A raw DEALER connected to ``endpoint``, always closed."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    try:
        sock.connect(endpoint)
        yield sock
    finally:
        sock.close(linger=0)


@contextlib.contextmanager
def monitored_dealer(
    context: zmq.Context, endpoint: str
) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A raw DEALER and a monitor of its connections, set up before it connects."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(endpoint)
        yield sock, monitor
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def next_event(monitor: zmq.Socket, timeout: float = 5.0) -> int | None:
    if not monitor.poll(timeout * 1000):
        return None
    return recv_monitor_message(monitor)["event"]


def exchange(
    context: zmq.Context, endpoint: str, frames: list[bytes], timeout: float = 5.0
) -> list[bytes] | None:
    """Send ``frames`` on a fresh DEALER; the reply's frames, or None if none came in time."""
    with dealer(context, endpoint) as sock:
        sock.send_multipart(frames)
        if not sock.poll(timeout * 1000):
            return None
        return sock.recv_multipart()


def collect(sock: zmq.Socket, count: int, timeout: float = 10.0) -> list[list[bytes]]:
    """Up to ``count`` replies from ``sock``, waiting at most ``timeout`` for each."""
    replies: list[list[bytes]] = []
    while len(replies) < count and sock.poll(timeout * 1000):
        replies.append(sock.recv_multipart())
    return replies


def reply_header(frames: list[bytes] | None) -> dict[str, Any]:
    assert frames is not None, "no reply"
    assert len(frames) >= 2 and frames[0] == b"", f"reply is not [b'', header, ...]: {frames[:2]}"
    header = json.loads(frames[1])
    assert isinstance(header, dict)
    return header


def header(
    request_id: Any, arrays: list | None = None, method: str = "infer", **extra: Any
) -> bytes:
    return json.dumps(_fields(request_id, arrays, method, extra)).encode()


def raw_request(
    request_id: Any, arrays: list | None = None, method: str = "infer", **extra: Any
) -> list[bytes]:
    """The delimiter, route frame and header of a hand-made request; its arrays follow. The
    route frame is the one a client sends with this header, or a plain one for a header no
    client could send: what such a test is about is the header's fault."""
    fields = _fields(request_id, arrays, method, extra)
    try:
        protocol.deadline_of(fields)
        route = route_for(fields)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, struct.error):
        route = route_for({"method": "info"})
    return [b"", route, json.dumps(fields).encode()]


def _fields(request_id: Any, arrays: list | None, method: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"v": protocol.VERSION, "id": request_id, "method": method, "arrays": arrays or [], **extra}


def f32(shape: list[int]) -> dict[str, Any]:
    return {"dtype": "<f4", "shape": shape}


def flood(sock: zmq.Socket, x: np.ndarray, count: int) -> int:
    """Send ``count`` requests for ``x`` without reading a reply; how many were sent."""
    request = [*raw_request(0, [f32(list(x.shape))]), x]
    sent = 0
    while sent < count:
        try:
            sock.send_multipart(request, flags=zmq.NOBLOCK, copy=False)
            sent += 1
        except zmq.Again:
            if not sock.poll(5000, zmq.POLLOUT):
                break  # the server stopped reading
    return sent


def free_port() -> int:
    """A loopback TCP port free right now: nothing listens there until a test binds it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_backend() -> str:
    """A loopback TCP endpoint on a port free right now, for a worker backend (or as an
    endpoint where nothing listens)."""
    return f"tcp://127.0.0.1:{free_port()}"


def from_every_worker(endpoint: str, x: np.ndarray, workers: int, *, rounds: int = 200,
                      timeout: float = 10.0) -> dict[int, Any]:
    """One successful reply's outputs from each of ``workers`` workers, by pid. Requests go out
    ``workers`` at a time: the router hands a request to the most recently freed worker, so
    requests sent one after another would all reach the same one."""
    seen: dict[int, Any] = {}
    with dealer(zmq.Context.instance(), endpoint) as sock:
        for number in range(rounds):
            for i in range(workers):
                sock.send_multipart(protocol.encode_request(number * workers + i, x))
            for frames in collect(sock, workers, timeout):
                reply = protocol.decode_reply(frames[1:])
                assert reply.header["status"] == "ok", reply.header
                seen.setdefault(reply.header["worker_pid"], reply.payload())
            if len(seen) == workers:
                return seen
    raise AssertionError(f"{len(seen)} of {workers} workers answered in {rounds} rounds")
