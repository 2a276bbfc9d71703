"""The connection caps over a real bound ROUTER and real peers on ipc."""

from __future__ import annotations

import socket
import time

import zmq

from workerpool.router.connections import IDLE_SECONDS, ConnectionLimit


def wait_for(condition, limit: ConnectionLimit) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the monitor never said so"
        limit.monitor.poll(100)
        limit.on_event()


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closes within a few seconds (after what libzmq sent: its greeting)."""
    sock.settimeout(1.5)
    try:
        while sock.recv(100):
            pass
    except TimeoutError:
        return False
    return True


def test_peers_that_send_nothing_make_room_once_idle_and_only_then(tmp_path):
    """Junk that libzmq takes for an old protocol's handshake is never dropped by libzmq: past
    the cap it is shut down once idle, and a connection that sent something is kept."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp_path}/router")
    limit = ConnectionLimit(router, 1, 16)
    junk = [socket.socket(socket.AF_UNIX) for _ in range(3)]
    try:
        for sock in junk:
            sock.connect(f"{tmp_path}/router")
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        wait_for(lambda: len(limit.open) == 3, limit)
        limit.sweep()
        assert len(limit.open) == 3  # not idle long enough yet
        asked = next(iter(limit.open))
        limit._asked.add(asked)  # as admit() records a connection that sent a request
        for fd in limit.open:  # as if accepted that long ago, and looked at again a second later
            limit.open[fd] -= IDLE_SECONDS + 1
        limit._next_sweep -= 1
        limit.sweep()
        assert list(limit.open) == [asked]
        assert sum(closed_by_peer(sock) for sock in junk) == 2
    finally:
        for sock in junk:
            sock.close()
        limit.close()
        router.close(linger=0)
        context.term()
